package envcompat

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/xdsconfig"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// xdsFlags are the --config-xds-* flags: the descriptor config from an xDS
// management server (see internal/xdsconfig), instead of --config.
type xdsFlags struct {
	addr, nodeID, nodeMetadata, headers string
	tls                                 bool
	ca, cert, key, serverName           string
	retryInterval, maxBackoff           time.Duration
	maxMessageBytes                     int
}

// AddDropInFlags registers the flags of what envoyproxy/ratelimit's
// deployments need beside ratelimitd's own (the flags its variables map
// to, see Read): the debug and metrics
// listeners, gRPC connection ageing, its metric names, global shadow mode,
// the xDS config source and starting without a config. finish, called
// once the flags are set, checks them and fills c; its errors name the
// flags as given spells them (see Given).
func AddDropInFlags(fs *flag.FlagSet, c *daemon.Config) (finish func(given map[string]string) error) {
	var x xdsFlags
	quotaMode := fs.String("quota-mode", "per-rule", "which descriptors are quota-mode descriptors (a request is denied only when all of them are over): per-rule (those whose rule sets quota_mode) or all (envoyproxy/ratelimit's QUOTA_MODE=true)")
	overdraft := fs.Int64("default-overdraft", 0, "record every charge, even one that overdraws its bucket, on limits that declare no overdraft: their debt may reach this many bursts (envoyproxy/ratelimit counts every hit; its files and the xDS proto cannot say overdraft); 0: off, a denied request spends nothing")
	overdraftCounting := fs.String("default-overdraft-counting", "always", "with --default-overdraft, what a denied request's charges record: always (every bucket, as envoyproxy/ratelimit counts) or where-denied (only the buckets that denied it, its STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true)")
	overdraftDomains := fs.String("default-overdraft-domains", "", "with --default-overdraft, only these domains (comma-separated); empty: every domain")
	refunds := fs.String("refunds", "taken", "what is_negative_hits may give back: taken (only tokens this bucket's calls took, on counts: tokens limits) or unbounded (anything, on any limit: envoyproxy/ratelimit's behaviour, which lets a caller mint tokens)")
	descMetadata := fs.String("descriptor-metadata", "passed", "what dynamic_metadata carries beside ratelimitd.*: passed (the config metadata of the descriptors that passed, under \"metadata\"), incumbent (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA keys: domain, descriptors, hitsAddend, metadata) or off")
	fs.StringVar(&c.DebugAddr, "debug-addr", "", "HTTP listen address of the operators' endpoints envoyproxy/ratelimit keeps on its debug port (/rlconfig, and /debug/pprof/ with --pprof); empty: none")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "a listen address of its own for /metrics (as well as --http-addr), like envoyproxy/ratelimit's PROMETHEUS_ADDR; empty: none")
	fs.StringVar(&c.MetricsPath, "metrics-path", daemon.DefaultMetricsPath, "the path of the metrics on --metrics-addr (--http-addr serves them at /metrics whatever it is)")
	fs.DurationVar(&c.MaxConnectionAge, "grpc-max-connection-age", 0, "close each gRPC connection after about this long (±10%), so that Envoy's connections spread over new replicas; 0: never")
	fs.DurationVar(&c.MaxConnectionAgeGrace, "grpc-max-connection-age-grace", 0, "how long an aged gRPC connection's calls may take to finish before it is closed")
	fs.BoolVar(&c.IncumbentMetrics, "incumbent-metrics", false, "also export envoyproxy/ratelimit's metric names (ratelimit_service_*), for dashboards written for it")
	fs.BoolVar(&c.ShadowMode, "shadow-mode", false, "make every rule a shadow rule: counted, never denying")
	fs.BoolVar(&c.StartWithoutConfig, "start-without-config", false, "with --config-xds-addr: serve before the first config arrives, answering as for an unknown domain")
	fs.StringVar(&x.addr, "config-xds-addr", "", "take the descriptor config from this xDS management server (host:port; SotW ADS of RateLimitConfig) instead of --config")
	fs.StringVar(&x.nodeID, "config-xds-node-id", xdsconfig.DefaultNodeID, "node id sent to the xDS server (its snapshot cache is keyed on it)")
	fs.StringVar(&x.nodeMetadata, "config-xds-node-metadata", "", "node metadata sent to the xDS server: k=v,k2=v2")
	fs.StringVar(&x.headers, "config-xds-headers", "", "extra gRPC metadata on the xDS stream: k=v,k2=v2")
	fs.BoolVar(&x.tls, "config-xds-tls", false, "dial the xDS server over TLS (implied by the other --config-xds-tls-* flags)")
	fs.StringVar(&x.ca, "config-xds-tls-ca", "", "PEM file of the CA that signed the xDS server's certificate (empty: the system's roots)")
	fs.StringVar(&x.cert, "config-xds-tls-cert", "", "PEM client certificate presented to the xDS server (with --config-xds-tls-key)")
	fs.StringVar(&x.key, "config-xds-tls-key", "", "PEM key of --config-xds-tls-cert")
	fs.StringVar(&x.serverName, "config-xds-tls-server-name", "", "name checked in the xDS server's certificate (default: the host of --config-xds-addr)")
	fs.DurationVar(&x.retryInterval, "config-xds-retry-interval", 0, fmt.Sprintf("first wait before connecting to the xDS server again; the waits grow with jitter (0: %v)", xdsconfig.DefaultConnectRetryInterval))
	fs.DurationVar(&x.maxBackoff, "config-xds-max-backoff", 0, fmt.Sprintf("longest wait between attempts to connect to the xDS server (0: %v)", xdsconfig.DefaultMaxBackoff))
	fs.IntVar(&x.maxMessageBytes, "config-xds-max-message-bytes", 0, fmt.Sprintf("largest DiscoveryResponse accepted (0: %d)", xdsconfig.DefaultMaxMessageBytes))
	return func(given map[string]string) error {
		name := func(flag string) string { return Spelling(given, flag) }
		var errs []error
		var err error
		if c.QuotaMode, err = Choose("quota-mode", *quotaMode, []string{"per-rule", "all"},
			[]server.QuotaMode{server.QuotaModePerRule, server.QuotaModeAll}); err != nil {
			errs = append(errs, err)
		}
		switch {
		case *overdraft < 0:
			errs = append(errs, fmt.Errorf("%s %d: must not be negative", name("default-overdraft"), *overdraft))
		case *overdraft > 0:
			c.Overdraft = server.Overdraft{On: true, Bursts: *overdraft, Domains: daemon.SplitList(*overdraftDomains)}
			if c.Overdraft.Counting, err = Choose("default-overdraft-counting", *overdraftCounting, []string{"always", "where-denied"},
				[]limiter.Counting{limiter.CountAlways, limiter.CountWhereDenied}); err != nil {
				errs = append(errs, err)
			}
		case given["default-overdraft-counting"] != "" || given["default-overdraft-domains"] != "":
			errs = append(errs, fmt.Errorf("%s and %s need %s", name("default-overdraft-counting"), name("default-overdraft-domains"), name("default-overdraft")))
		}
		if c.Refunds, err = Choose("refunds", *refunds, []string{"taken", "unbounded"},
			[]server.RefundPolicy{server.RefundsTaken, server.RefundsUnbounded}); err != nil {
			errs = append(errs, err)
		}
		if c.DescriptorMetadata, err = Choose("descriptor-metadata", *descMetadata, []string{"passed", "incumbent", "off"},
			[]server.DescriptorMetadata{server.DescriptorMetadataPassed, server.DescriptorMetadataIncumbent, server.DescriptorMetadataOff}); err != nil {
			errs = append(errs, err)
		}
		for _, d := range []struct {
			flag string
			v    time.Duration
		}{
			{"grpc-max-connection-age", c.MaxConnectionAge}, {"grpc-max-connection-age-grace", c.MaxConnectionAgeGrace},
			{"config-xds-retry-interval", x.retryInterval}, {"config-xds-max-backoff", x.maxBackoff},
		} {
			if d.v < 0 {
				errs = append(errs, fmt.Errorf("%s %v: must not be negative", name(d.flag), d.v))
			}
		}
		if !strings.HasPrefix(c.MetricsPath, "/") {
			errs = append(errs, fmt.Errorf("%s %q: want a path starting with /", name("metrics-path"), c.MetricsPath))
		}
		if x.maxMessageBytes < 0 {
			errs = append(errs, fmt.Errorf("%s %d: must not be negative", name("config-xds-max-message-bytes"), x.maxMessageBytes))
		}
		o, err := x.options(name)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		c.XDS = o
		switch {
		case o.Enabled() && c.ConfigPath != "":
			errs = append(errs, fmt.Errorf("%s and %s each select the config's source: give one", name("config"), name("config-xds-addr")))
		case !o.Enabled() && c.ConfigPath == "":
			errs = append(errs, fmt.Errorf("--config is required (or %s), or --config-xds-addr", VarName("config")))
		case !o.Enabled() && c.StartWithoutConfig:
			errs = append(errs, fmt.Errorf("%s needs --config-xds-addr (a file config is loaded before serving)", name("start-without-config")))
		}
		return errors.Join(errs...)
	}
}

// options are the xdsconfig.Options of the flags; none without addr, where
// any other --config-xds-* flag set is an error.
func (x xdsFlags) options(name func(flag string) string) (xdsconfig.Options, error) {
	md, err := parsePairs(name("config-xds-node-metadata"), x.nodeMetadata)
	if err != nil {
		return xdsconfig.Options{}, err
	}
	hd, err := parsePairs(name("config-xds-headers"), x.headers)
	if err != nil {
		return xdsconfig.Options{}, err
	}
	o := xdsconfig.Options{
		Addr: x.addr, NodeID: x.nodeID, NodeMetadata: md, Headers: hd,
		ConnectRetryInterval: x.retryInterval, MaxBackoff: x.maxBackoff, MaxMessageBytes: x.maxMessageBytes,
	}
	if x.tls || x.ca != "" || x.cert != "" || x.key != "" || x.serverName != "" {
		o.TLS = &xdsconfig.TLSFiles{CAFile: x.ca, CertFile: x.cert, KeyFile: x.key, ServerName: x.serverName}
	}
	if (x.cert == "") != (x.key == "") {
		return o, fmt.Errorf("%s and %s go together", name("config-xds-tls-cert"), name("config-xds-tls-key"))
	}
	if x.addr == "" && (o.TLS != nil || md != nil || hd != nil) {
		return xdsconfig.Options{}, errors.New("--config-xds-* flags given without --config-xds-addr")
	}
	return o, nil
}

// parsePairs parses k=v,k2=v2 (empty: nil); a pair without "=" or with an
// empty key is an error naming the flag as spelt.
func parsePairs(spelt, s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, item := range daemon.SplitList(s) {
		k, v, ok := strings.Cut(item, "=")
		if k = strings.TrimSpace(k); !ok || k == "" {
			return nil, fmt.Errorf("%s %q: %q is not key=value (want k=v,k2=v2)", spelt, s, item)
		}
		m[k] = v
	}
	return m, nil
}
