package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/internal/envcompat"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/runtimetune"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
)

// serveConfig is everything the serve command reads from flags and the
// environment, once, at start: the daemon's Config (its Redis is set from
// redis once the flags are checked), and what only the command uses.
type serveConfig struct {
	daemon.Config
	redis     daemon.RedisFlags
	logLevel  slog.Level
	logFormat string
	// ignoredFlags are flags given (as given spells them) that only the
	// Redis backend reads, while the memory backend is in use: serve warns.
	ignoredFlags []string
	// envCompat is the environment read: envcompat.Native (RATELIMITD_*
	// only) or envcompat.Envoyproxy (envoyproxy/ratelimit's names too).
	envCompat string
	// unhonoured are the envoyproxy/ratelimit settings given that are not
	// honoured (with envcompat.Envoyproxy), each "NAME=value: why"; serve
	// names them all in one warning.
	unhonoured []string
	// foreignVars are envoyproxy/ratelimit's settings found in the
	// environment but not read (envcompat.Native): serve warns of them.
	foreignVars []string
	// showVersion is --version: print the version line, serve nothing.
	showVersion bool
}

func parseServeFlags(args []string, getenv func(string) string, stderr io.Writer) (serveConfig, error) {
	var c serveConfig
	defLimits := server.DefaultRequestLimits()
	fs := flag.NewFlagSet("ratelimitd serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.ConfigPath, "config", "", "descriptor file, or directory of *.yaml files (required, unless --config-xds-addr)")
	fs.StringVar(&c.envCompat, "env-compat", envcompat.Native, "also read envoyproxy/ratelimit's environment variables (REDIS_URL, GRPC_PORT, ...) with its defaults: envoyproxy; the default when the binary runs as \"ratelimit\"")
	finishDropIn := envcompat.AddDropInFlags(fs, &c.Config)
	finishGuards := addGuardFlags(fs, &c)
	addTestFlags(fs, &c)
	addVersionFlag(fs, &c.showVersion)
	fs.StringVar(&c.GRPCAddr, "grpc-addr", daemon.DefaultGRPCAddr, "gRPC listen address (RateLimitService v3 and grpc.health.v1)")
	fs.StringVar(&c.HTTPAddr, "http-addr", daemon.DefaultHTTPAddr, "HTTP listen address (/healthz, /readyz, /metrics, /limits, /limits.json, and /debug/pprof/ with --pprof)")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", daemon.DefaultShutdownTimeout, "how long to drain in-flight calls on SIGTERM")
	retryAfter := fs.String("retry-after", "send", "Retry-After on OVER_LIMIT answers: send, or omit (for Envoys with enable_retry_after_header)")
	rlHeaders := fs.String("ratelimit-headers", "off", "rate-limit headers computed by the service: off (leave them to Envoy), draft03 (X-RateLimit-*), ietf (RateLimit-Policy and RateLimit, draft-ietf-httpapi-ratelimit-headers-11) or incumbent (envoyproxy/ratelimit's RateLimit-Limit, -Remaining and -Reset)")
	defNames := server.DefaultRateLimitHeaderNames()
	headerNames := fs.String("ratelimit-header-names", "", fmt.Sprintf("with --ratelimit-headers incumbent, the names of its three headers: limit,remaining,reset (default %s,%s,%s)", defNames.Limit, defNames.Remaining, defNames.Reset))
	metadata := fs.String("dynamic-metadata", "notable", "which answers name their rules in dynamic_metadata (for access logs): all, notable (denials, shadow denials, above burst, waits, full queues, quota-mode rules over their limit) or off")
	fs.IntVar(&c.Limits.MaxDescriptors, "max-descriptors", defLimits.MaxDescriptors, "most descriptors in one request")
	fs.IntVar(&c.Limits.MaxEntries, "max-entries", defLimits.MaxEntries, "most entries in one descriptor")
	fs.IntVar(&c.Limits.MaxKeyBytes, "max-key-bytes", defLimits.MaxKeyBytes, "longest descriptor entry key")
	fs.IntVar(&c.Limits.MaxValueBytes, "max-value-bytes", defLimits.MaxValueBytes, "longest descriptor entry value kept as it is; a longer one is limited under a stand-in (its first bytes, length and SHA-256)")
	fs.IntVar(&c.Limits.MaxDomainBytes, "max-domain-bytes", defLimits.MaxDomainBytes, "longest domain")
	fs.Uint64Var(&c.Limits.MaxHits, "max-hits", defLimits.MaxHits, "largest hits_addend")
	fs.IntVar(&c.MaxMessageBytes, "max-message-bytes", daemon.DefaultMaxMessageBytes, "largest gRPC request message")
	fs.IntVar(&c.StreamWorkers, "grpc-stream-workers", daemon.DefaultStreamWorkers, "goroutines kept to handle gRPC calls, so that their grown stacks are reused; calls beyond them get their own goroutine (0: none kept)")
	fs.DurationVar(&c.MaxWait, "max-wait", daemon.DefaultMaxWait, "cap on every limit's max_wait: the longest a call is held for reserved tokens")
	fs.BoolVar(&c.Pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on the HTTP port")
	fs.Float64Var(&c.NearLimitRatio, "near-limit-ratio", daemon.DefaultNearLimitRatio, "metrics: an admitted descriptor is near_limit when more than this share of its burst is in use (1 turns near_limit off)")
	fs.IntVar(&c.MaxMetricValues, "metrics-max-values", daemon.DefaultMaxMetricValues, "metrics: distinct values labelled per detailed_metric rule; the rest count as _other")
	fs.StringVar(&c.redis.URL, "redis-url", "", "Redis backend: redis:// or rediss:// URL (user, password, db); empty means in-memory")
	fs.StringVar(&c.redis.SentinelMaster, "redis-sentinel-master", "", "Redis backend through Sentinel: the master's name")
	fs.StringVar(&c.redis.SentinelAddrs, "redis-sentinel-addrs", "", "comma-separated Sentinel addresses, with --redis-sentinel-master")
	fs.StringVar(&c.redis.ClusterAddrs, "redis-cluster-addrs", "", "Redis Cluster backend: comma-separated seed addresses")
	fs.StringVar(&c.redis.Password, "redis-password", "", "password for Sentinel or Cluster nodes (for a URL, put it in the URL)")
	fs.StringVar(&c.redis.Username, "redis-username", "", "ACL user for Sentinel or Cluster nodes (for a URL, put it in the URL)")
	fs.StringVar(&c.redis.TLSCA, "redis-tls-ca", "", "PEM file of the CA that signed the Redis servers' certificates (TLS: rediss:// URL, or any Sentinel/Cluster address)")
	fs.StringVar(&c.redis.TLSCert, "redis-tls-cert", "", "PEM client certificate for Redis servers that require one (with --redis-tls-key)")
	fs.StringVar(&c.redis.TLSKey, "redis-tls-key", "", "PEM key of --redis-tls-cert")
	fs.StringVar(&c.redis.Prefix, "redis-prefix", redisstore.DefaultPrefix, "prefix of every Redis key")
	fs.IntVar(&c.redis.PoolSize, "redis-pool-size", 0, "most connections per Redis node (0: 32)")
	fs.DurationVar(&c.redis.DialTimeout, "redis-dial-timeout", 0, fmt.Sprintf("Redis dial timeout (0: %v)", redisstore.DefaultDialTimeout))
	fs.DurationVar(&c.redis.ReadTimeout, "redis-read-timeout", 0, fmt.Sprintf("how long Redis may hold a round trip before it has failed it (0: %v)", redisstore.DefaultReadTimeout))
	fs.DurationVar(&c.redis.WriteTimeout, "redis-write-timeout", 0, fmt.Sprintf("Redis write timeout (0: %v)", redisstore.DefaultWriteTimeout))
	fs.DurationVar(&c.redis.PoolTimeout, "redis-pool-timeout", 0, fmt.Sprintf("how long a call waits for a free Redis connection (0: %v)", redisstore.DefaultPoolTimeout))
	fs.IntVar(&c.redis.BatchMax, "redis-batch-max", 0, fmt.Sprintf("most Redis calls coalesced into one round trip (0: %d; 1: no coalescing)", redisstore.DefaultBatchMax))
	fs.DurationVar(&c.redis.BatchWait, "redis-batch-wait", 0, fmt.Sprintf("the longest a batch collects calls while another round trip is in flight and has not landed (0: %v; negative: not at all)", redisstore.DefaultBatchWait))
	fs.BoolVar(&c.redis.DenialCache, "denial-cache", true, "deny locally, until Redis's own retry-after, single-descriptor requests for buckets Redis just denied")
	fs.IntVar(&c.redis.DenialEntries, "denial-cache-size", 0, fmt.Sprintf("most buckets the denial cache remembers (0: %d)", denialcache.DefaultMaxEntries))
	fs.BoolVar(&c.redis.TokenLeases, "token-leases", false, "serve a bucket this replica sees at 500 hits a second or more from slices of its tokens taken from Redis (at most a sixteenth of its burst, for 20 ms, up to 320 ms while the bucket has plenty to spare), instead of one Redis call a request; every admission still within rate·t + burst")
	onFailure := fs.String("on-backend-failure", "error", "answer while Redis fails: error (gRPC UNAVAILABLE: Envoy's failure_mode_deny decides), allow, deny, or local (in-process buckets)")
	fs.DurationVar(&c.Failure.Timeout, "backend-timeout", failover.DefaultTimeout, "how long Redis may hold what it was sent before it counts as a Redis failure (reported to the breaker then, whatever the callers' deadlines; on a Cluster, against that node); a call is decided by Redis whenever it answers within the caller's deadline, and time spent queued here never counts against Redis")
	fs.DurationVar(&c.Failure.DefaultDeadline, "default-deadline", failover.DefaultDeadline, "the deadline of a call that comes without one (Envoy sends its ratelimit filter's timeout, 20ms by default, unless it is 0)")
	fs.IntVar(&c.Failure.FailureThreshold, "breaker-failures", failover.DefaultFailureThreshold, "consecutive Redis failures that open the circuit breaker")
	fs.DurationVar(&c.Failure.FailingFor, "breaker-failing-for", 0, "how long Redis must keep failing, with no call succeeding, before the breaker opens (0: --backend-timeout; negative: no minimum)")
	fs.DurationVar(&c.Failure.OpenFor, "breaker-open-for", failover.DefaultOpenFor, "how long the open breaker answers without Redis before the background probe tries it again")
	fs.Int64Var(&c.Failure.ReplicasHint, "replicas-hint", 1, "local mode: each rate and burst is divided by this (the number of replicas)")
	fs.DurationVar(&c.Failure.Grace, "failure-grace", 0, "local mode: how long an outage is answered per --failure-grace-mode before limiting locally")
	fs.BoolVar(&c.WatchConfig, "watch", true, "reload the config when its files change (SIGHUP reloads it in any case)")
	fs.StringVar(&c.GRPCTLS.CertFile, "grpc-tls-cert", "", "gRPC over TLS: PEM certificate chain file, re-read when it changes (with --grpc-tls-key)")
	fs.StringVar(&c.GRPCTLS.KeyFile, "grpc-tls-key", "", "gRPC over TLS: PEM private key file, re-read when it changes")
	fs.StringVar(&c.GRPCTLS.ClientCAFile, "grpc-client-ca", "", "mutual TLS: PEM file of the CAs whose client certificates are accepted; clients without one are refused")
	fs.BoolVar(&c.AdaptiveProcs, "adaptive-procs", true, "run on one P (GOMAXPROCS=1) while goroutines seldom wait for one, on all of them as soon as they do: less CPU and latency under light load. Ignored when GOMAXPROCS is set")
	gcFloorMiB := fs.Int("gc-heap-floor-mib", runtimetune.DefaultHeapFloor>>20, "let the heap grow to this many MiB between garbage collections while the live heap is smaller (fewer collections under load); 0: GOGC alone. Ignored when GOGC is set")
	graceMode := fs.String("failure-grace-mode", "error", "local mode: the answer during --failure-grace: error, allow or deny")

	if err := fs.Parse(args); err != nil {
		return c, usageError{err} // flag.ErrHelp for --help: run treats it as success
	}
	if c.showVersion {
		return c, nil // nothing else is read, so nothing else can fail
	}
	if fs.NArg() > 0 {
		return c, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if !flagGiven(fs, "env-compat") {
		c.envCompat = getenv(envcompat.CompatVar)
	}
	inc, foreign, err := envcompat.ForMode(c.envCompat, getenv)
	if err != nil {
		return c, usageError{err}
	}
	c.unhonoured, c.foreignVars = inc.Unhonoured, foreign
	fromEnv, err := inc.Apply(fs, getenv, versionFlag)
	if err != nil {
		return c, usageError{err}
	}
	given := envcompat.Given(fs, fromEnv)
	if c.envCompat == envcompat.Envoyproxy {
		c.Tracing = inc.Tracing
	} else {
		tc, terr := tracing.ConfigFromEnv(getenv)
		if terr != nil {
			return c, usageError{terr}
		}
		c.Tracing = tc
	}
	if c.NearLimitRatio <= 0 || c.NearLimitRatio > 1 {
		return c, usageError{fmt.Errorf("%s %v: want more than 0 and at most 1", envcompat.Spelling(given, "near-limit-ratio"), c.NearLimitRatio)}
	}
	if err := finishDropIn(given); err != nil {
		return c, usageError{err}
	}
	if err := finishGuards(given); err != nil {
		return c, usageError{err}
	}
	if c.StreamWorkers < 0 || c.StreamWorkers > 1<<16 {
		return c, usageError{fmt.Errorf("--grpc-stream-workers %d: want 0 to 65536", c.StreamWorkers)}
	}
	if c.ShutdownTimeout <= 0 {
		// Zero would end every call in flight at once on SIGTERM.
		return c, usageError{fmt.Errorf("--shutdown-timeout %v: want more than 0 (how long SIGTERM waits for calls in flight)", c.ShutdownTimeout)}
	}
	if err := c.redis.Check(given); err != nil {
		return c, usageError{err}
	}
	if !c.redis.Enabled() {
		c.ignoredFlags = daemon.RedisOnlyGiven(given)
	}
	c.Redis = c.redis.Config()
	if c.StreamWorkers == 0 {
		c.StreamWorkers = -1 // none kept (0 is the daemon's default)
	}
	if c.RetryAfter, err = envcompat.Choose("retry-after", *retryAfter,
		[]string{"send", "omit"},
		[]server.RetryAfter{server.RetryAfterSend, server.RetryAfterOmit}); err != nil {
		return c, usageError{err}
	}
	if c.RateLimitHeaders, err = envcompat.Choose("ratelimit-headers", *rlHeaders,
		[]string{"off", "draft03", "ietf", "incumbent"},
		[]server.RateLimitHeaders{server.RateLimitHeadersOff, server.RateLimitHeadersDraft03, server.RateLimitHeadersIETF, server.RateLimitHeadersIncumbent}); err != nil {
		return c, usageError{err}
	}
	if c.RateLimitHeaderNames, err = inc.HeaderNames(given, c.RateLimitHeaders, *headerNames); err != nil {
		return c, usageError{err}
	}
	if c.DynamicMetadata, err = envcompat.Choose("dynamic-metadata", *metadata,
		[]string{"all", "notable", "off"},
		[]server.DynamicMetadata{server.DynamicMetadataAll, server.DynamicMetadataNotable, server.DynamicMetadataOff}); err != nil {
		return c, usageError{err}
	}
	logFormats := []string{"text", "json"}
	if c.logFormat, err = envcompat.Choose("log-format", c.logFormat, logFormats, logFormats); err != nil {
		return c, usageError{err}
	}
	modes := []failover.Mode{failover.Error, failover.Allow, failover.Deny, failover.Local}
	modeNames := make([]string, len(modes))
	for i, m := range modes {
		modeNames[i] = m.String()
	}
	if c.Failure.Mode, err = envcompat.Choose("on-backend-failure", *onFailure, modeNames, modes); err != nil {
		return c, usageError{err}
	}
	// The grace before local mode answers as one of the others.
	if c.Failure.GraceMode, err = envcompat.Choose("failure-grace-mode", *graceMode, modeNames[:3], modes[:3]); err != nil {
		return c, usageError{err}
	}
	if *gcFloorMiB < 0 || *gcFloorMiB > runtimetune.MaxHeapFloor>>20 {
		return c, usageError{fmt.Errorf("--gc-heap-floor-mib %d: want 0 to %d", *gcFloorMiB, runtimetune.MaxHeapFloor>>20)}
	}
	if getenv("GOGC") == "" { // the runtime read it; an operator's GOGC wins
		c.GCHeapFloor = uint64(*gcFloorMiB) << 20
	}
	if (c.GRPCTLS.CertFile == "") != (c.GRPCTLS.KeyFile == "") {
		return c, usageError{errors.New("--grpc-tls-cert and --grpc-tls-key go together")}
	}
	if c.GRPCTLS.ClientCAFile != "" && c.GRPCTLS.CertFile == "" {
		return c, usageError{errors.New("--grpc-client-ca needs --grpc-tls-cert and --grpc-tls-key")}
	}
	return c, nil
}

// flagGiven reports whether the flag name was given on the command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}
