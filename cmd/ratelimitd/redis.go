package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// openRedis connects the Redis backend the flags describe, behind the
// failure handling of --on-backend-failure. It does not fail when Redis is
// down at start: calls are answered per the failure mode until it answers.
// onHealth is called each time Redis is found failing or working again.
//
// The chain is: denial cache (front) → failover → denial cache (learning)
// → Redis store (coalescing). The cache learns only from Redis's own
// answers, never from the failure mode's, and answers before the failover
// layer, so that local denials neither reach nor count for the breaker.
func openRedis(r redisFlags, failure failover.Options, log *slog.Logger, m *metrics.Metrics, onHealth func(healthy bool)) (backend, error) {
	opts := redisstore.ClientOptions{
		URL:            r.url,
		SentinelMaster: r.sentinelMaster,
		SentinelAddrs:  splitList(r.sentinelAddrs),
		ClusterAddrs:   splitList(r.clusterAddrs),
		PoolSize:       r.poolSize,
		DialTimeout:    r.dialTimeout,
		ReadTimeout:    r.readTimeout,
		WriteTimeout:   r.writeTimeout,
		PoolTimeout:    r.poolTimeout,
	}
	if r.url == "" { // a URL carries its own (check refuses both)
		opts.Username, opts.Password = r.username, r.password
	}
	if r.sentinelMaster != "" {
		opts.SentinelPassword = r.password
	}
	tlsConfig, err := r.tlsConfig()
	if err != nil {
		return backend{}, err
	}
	opts.TLSConfig = tlsConfig
	var cache *denialcache.Cache
	if r.denialCache {
		if cache, err = denialcache.New(denialcache.Options{MaxEntries: r.denialEntries}); err != nil {
			return backend{}, fmt.Errorf("--denial-cache-size: %w", err)
		}
	}
	// check has put every mistake a flag can make in the flags' own terms;
	// what redisstore still finds, it says in its own.
	client, err := redisstore.Dial(opts)
	if err != nil {
		return backend{}, fmt.Errorf("open the Redis backend: %w", err)
	}
	queue := newQueueMetrics()
	// The failover Store, made below, hears what Redis did with the calls
	// their callers gave up on.
	var breaker atomic.Pointer[failover.Store]
	store, err := redisstore.New(client, redisstore.Options{Prefix: r.prefix, BatchMax: r.batchMax, BatchWait: r.batchWait,
		QueueWait: queue.wait, BatchCalls: queue.batch,
		OnAbandoned: func(err error) {
			if fs := breaker.Load(); fs != nil {
				fs.Observe(err)
			}
		}})
	if err != nil {
		client.Close()
		return backend{}, fmt.Errorf("open the Redis backend: %w", err)
	}
	closeAll := func() error {
		store.Close()
		return client.Close()
	}
	var shared limiter.Store = store
	if cache != nil {
		shared = cache.Learn(store)
	}
	name := "redis"
	switch {
	case r.clusterAddrs != "":
		name = "redis-cluster"
	case r.sentinelMaster != "":
		name = "redis-sentinel"
	}
	be := backend{name: name, close: closeAll, failureMode: failure.Mode}
	failure.OnChange = func(healthy bool, err error) {
		if healthy {
			log.Info("backend answers again", "backend", name)
		} else {
			log.Error("backend failing; answering per --on-backend-failure", "backend", name, "mode", failure.Mode.String(), "err", err)
		}
		onHealth(healthy)
	}
	// The open breaker probes Redis in the background (serve calls
	// be.probe), so that a replica no call reaches still finds it back; the
	// probe decides on a bucket of its own, so that a Redis that answers
	// PING but cannot decide (a read-only replica) keeps it open.
	failure.Check = store.Probe
	failure.OnBackendFailure = m.BackendFailure
	mode := failure.Mode.String()
	failure.OnFallback = func(cause limiter.Fallback) { m.FailureModeAnswer(mode, cause) }
	fs, err := failover.New(shared, failure)
	if err != nil {
		closeAll()
		return backend{}, err
	}
	breaker.Store(fs)
	be.store, be.sweep, be.healthy, be.probe = fs, fs.Sweep, fs.Healthy, fs.Probe
	if cache != nil {
		be.store = cache.Front(fs)
	}
	be.ready = store.Probe
	be.prepare = store.Prepare
	var cacheStats func() denialcache.Stats // nil: no cache
	if cache != nil {
		cacheStats = cache.Stats
	}
	be.collectors = append(redisCollectors(store.Stats, cacheStats), queue.wait, queue.batch)
	return be, nil
}

// queueMetrics are the histograms of how coalesced calls queue in this
// process before Redis has them: the first sign of a saturated replica,
// before any deadline is missed.
type queueMetrics struct {
	wait, batch prometheus.Histogram
}

func newQueueMetrics() queueMetrics {
	return queueMetrics{
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimitd_redis_queue_wait_seconds",
			Help:    "How long each coalesced Redis call waited in this process, from its request to the write of its round trip (time Redis is not to blame for).",
			Buckets: []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5},
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimitd_redis_batch_calls",
			Help:    "Script calls carried by each coalesced round trip to Redis.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
	}
}

// redisCollectors are the counters of the Redis store (how well calls
// coalesce) and of the denial cache (nil: off), read from their Stats when
// scraped.
func redisCollectors(store func() redisstore.Stats, cache func() denialcache.Stats) []prometheus.Collector {
	counter := func(name, help string, value func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(value()) })
	}
	cs := []prometheus.Collector{
		counter("ratelimitd_redis_takes_total",
			"Takes sent to Redis: the buckets of one request, taken all-or-nothing.",
			func() int64 { return store().Takes }),
		counter("ratelimitd_redis_script_calls_total",
			"Script runs asked of Redis: one per Take (per hash slot on a Cluster), plus Cluster give-backs and refunds.",
			func() int64 { return store().Calls }),
		counter("ratelimitd_redis_scripts_total",
			"Script commands sent: script calls, less those that travelled merged into one command with others.",
			func() int64 { return store().Scripts }),
		counter("ratelimitd_redis_round_trips_total",
			"Round trips to Redis (one pipeline, to each node it names on a Cluster, counts once).",
			func() int64 { return store().RoundTrips }),
		counter("ratelimitd_redis_direct_calls_total",
			"Script calls sent at once from their caller's goroutine because no round trip was in flight.",
			func() int64 { return store().Direct }),
		counter("ratelimitd_redis_give_back_failures_total",
			"Cluster give-backs (a request across hash slots that one slot denied) that failed or missed the request's deadline: their tokens stay spent until they refill.",
			func() int64 { return store().GiveBackFailures }),
		counter("ratelimitd_redis_denied_with_failures_total",
			"Requests across hash slots that one slot denied while another failed: answered OVER_LIMIT, the failure counted here.",
			func() int64 { return store().DeniedWithFailures }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ratelimitd_redis_pending_calls",
			Help: "Redis script calls asked for and not yet answered (queued in this process or in flight), now."},
			func() float64 { return float64(store().Pending) }),
		counter("ratelimitd_redis_late_answers_total",
			"Coalesced calls Redis answered after their caller had given up on them (its deadline came first).",
			func() int64 { return store().Late }),
		counter("ratelimitd_redis_late_give_backs_total",
			"Late answers that admitted a Take, whose tokens were then given back: a caller told it failed spends nothing.",
			func() int64 { return store().LateGiveBacks }),
		counter("ratelimitd_redis_late_give_back_failures_total",
			"Give-backs of late answers that failed: those tokens stay spent until they refill.",
			func() int64 { return store().LateGiveBackFailures }),
	}
	if cache != nil {
		cs = append(cs,
			counter("ratelimitd_denial_cache_denials_total",
				"Descriptors denied by the local denial cache without asking Redis.",
				func() int64 { return cache().LocalDenials }),
			counter("ratelimitd_denial_cache_learned_total",
				"Denials from Redis the local denial cache remembered.",
				func() int64 { return cache().Learned }))
	}
	return cs
}

// check returns the usage errors of the Redis flags, all of them, naming
// the flags as given maps them (see givenFlags): which backend they select,
// and flags that would be ignored for it. Without a backend, buckets are
// kept in each replica's memory, so a --redis-* flag given without one
// (most likely a backend flag forgotten or misspelt) is an error rather than
// a silent N-fold limit across N replicas.
func (r redisFlags) check(given map[string]string) error {
	name := func(flag string) string {
		if s, ok := given[flag]; ok {
			return s
		}
		return "--" + flag
	}
	var errs []error
	var backends []string
	if r.url != "" {
		backends = append(backends, name("redis-url"))
	}
	if r.sentinelMaster != "" || r.sentinelAddrs != "" {
		backends = append(backends, name("redis-sentinel-master")+" with "+name("redis-sentinel-addrs"))
	}
	if r.clusterAddrs != "" {
		backends = append(backends, name("redis-cluster-addrs"))
	}
	if len(backends) > 1 {
		last := len(backends) - 1
		errs = append(errs, fmt.Errorf("%s and %s each select a Redis backend: give one",
			strings.Join(backends[:last], ", "), backends[last]))
	}
	switch {
	case r.sentinelMaster != "" && r.sentinelAddrs == "":
		errs = append(errs, fmt.Errorf("%s needs %s (the Sentinels' host:port addresses)", name("redis-sentinel-master"), name("redis-sentinel-addrs")))
	case r.sentinelMaster == "" && r.sentinelAddrs != "":
		errs = append(errs, fmt.Errorf("%s needs %s (the name the Sentinels monitor the master by)", name("redis-sentinel-addrs"), name("redis-sentinel-master")))
	}
	for _, l := range []struct{ flag, value string }{{"redis-sentinel-addrs", r.sentinelAddrs}, {"redis-cluster-addrs", r.clusterAddrs}} {
		if l.value != "" && len(splitList(l.value)) == 0 {
			errs = append(errs, fmt.Errorf("%s %q: no address in it (want host:port,host:port)", name(l.flag), l.value))
		}
	}
	if len(backends) == 0 {
		var ignored []string
		for flag, spelt := range given {
			if strings.HasPrefix(flag, "redis-") {
				ignored = append(ignored, spelt)
			}
		}
		if len(ignored) > 0 {
			slices.Sort(ignored)
			errs = append(errs, fmt.Errorf("%s set, but no Redis backend: give --redis-url, --redis-sentinel-master with --redis-sentinel-addrs, or --redis-cluster-addrs (without one, each replica keeps its own buckets in memory)",
				strings.Join(ignored, ", ")))
		}
	}
	if r.url != "" {
		var creds []string
		for _, flag := range []string{"redis-username", "redis-password"} {
			if _, ok := given[flag]; ok {
				creds = append(creds, name(flag))
			}
		}
		if len(creds) > 0 {
			errs = append(errs, fmt.Errorf("%s: not used with %s, which carries its own credentials: put them in the URL (redis://user:password@host:port/db, percent-encoded)",
				strings.Join(creds, " and "), name("redis-url")))
		}
		o, err := redisstore.ParseURL(r.url)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", name("redis-url"), err))
		case o.TLSConfig == nil && (r.tlsCA != "" || r.tlsCert != "" || r.tlsKey != ""):
			errs = append(errs, fmt.Errorf("%s given, but %s does not speak TLS: use a rediss:// URL", r.tlsFlagNames(name), name("redis-url")))
		}
	}
	if (r.tlsCert == "") != (r.tlsKey == "") {
		errs = append(errs, fmt.Errorf("%s and %s go together", name("redis-tls-cert"), name("redis-tls-key")))
	}
	for _, n := range []struct {
		flag     string
		negative bool
		value    any
	}{
		{"redis-pool-size", r.poolSize < 0, r.poolSize},
		{"redis-dial-timeout", r.dialTimeout < 0, r.dialTimeout},
		{"redis-read-timeout", r.readTimeout < 0, r.readTimeout},
		{"redis-write-timeout", r.writeTimeout < 0, r.writeTimeout},
		{"redis-pool-timeout", r.poolTimeout < 0, r.poolTimeout},
		{"redis-batch-max", r.batchMax < 0, r.batchMax},
	} {
		if n.negative {
			errs = append(errs, fmt.Errorf("%s %v: must not be negative (0 is the default)", name(n.flag), n.value))
		}
	}
	return errors.Join(errs...)
}

// tlsFlagNames names the --redis-tls-* flags that are set.
func (r redisFlags) tlsFlagNames(name func(string) string) string {
	var set []string
	for _, f := range []struct{ flag, value string }{{"redis-tls-ca", r.tlsCA}, {"redis-tls-cert", r.tlsCert}, {"redis-tls-key", r.tlsKey}} {
		if f.value != "" {
			set = append(set, name(f.flag))
		}
	}
	return strings.Join(set, ", ")
}

// tlsConfig is the TLS to speak to Redis with, or nil for the defaults: a
// rediss:// URL alone uses the system's roots.
func (r redisFlags) tlsConfig() (*tls.Config, error) {
	if r.tlsCA == "" && r.tlsCert == "" && r.tlsKey == "" {
		return nil, nil
	}
	return clientTLS("--redis-tls", r.tlsCA, r.tlsCert, r.tlsKey)
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// redisLogger carries go-redis's own log lines (a dial that failed, a
// connection found broken) into the process's slog logger, at debug level:
// failover already logs an outage once, at error, when Redis starts failing
// and again when it answers, so these per-connection lines are detail for
// whoever asks for --log-level debug, in the --log-format of the rest.
// go-redis has one logger per process (redis.SetLogger): main installs one
// redisLogger, once, and the serve command hands it its logger with use.
// Until then lines go to slog.Default(). It is safe for concurrent use.
type redisLogger struct {
	log atomic.Pointer[slog.Logger]
}

// use makes l the logger lines are written through from now on.
func (r *redisLogger) use(l *slog.Logger) { r.log.Store(l) }

// Printf implements go-redis's logging interface: it logs the formatted
// line, without its trailing newline, at debug level.
func (r *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l := r.log.Load()
	if l == nil {
		l = slog.Default()
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if !l.Enabled(ctx, slog.LevelDebug) {
		return // do not format what is not written
	}
	l.DebugContext(ctx, strings.TrimRight(fmt.Sprintf(format, v...), "\n"), "logger", "go-redis")
}
