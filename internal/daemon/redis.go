package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/timerlag"
	"github.com/ratelimitd/ratelimitd/internal/tlsreload"
	"github.com/ratelimitd/ratelimitd/internal/tokenlease"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// probeEvery is how often, at most, the daemon probes the open breakers
// (failover.Store.Probe), so that a backend that answers again is used
// within that much of its breaker's OpenFor ending: a probe is one round
// trip per open breaker, and nothing when none is open.
const probeEvery = 25 * time.Millisecond

// Redis selects the Redis backend and tunes it: exactly one of URL,
// SentinelMaster (with SentinelAddrs) or ClusterAddrs; none keeps buckets
// in memory. Zero sizes and durations mean the defaults of
// redisstore.ClientOptions, redisstore.Options and denialcache.Options.
type Redis struct {
	URL            string
	SentinelMaster string
	SentinelAddrs  []string
	ClusterAddrs   []string
	// Username and Password authenticate to Sentinel-managed or Cluster
	// nodes (a URL carries its own); with Sentinels, Password is theirs too.
	Username, Password string
	// TLSCAFile, TLSCertFile and TLSKeyFile: the CA of the servers'
	// certificates and a client certificate (TLS: a rediss:// URL, or any
	// Sentinel or Cluster address).
	TLSCAFile, TLSCertFile, TLSKeyFile string
	Prefix                             string
	PoolSize                           int
	DialTimeout, ReadTimeout           time.Duration
	WriteTimeout, PoolTimeout          time.Duration
	BatchMax                           int
	BatchWait                          time.Duration
	// TestBatchHold is redisstore.Options.TestBatchHold: tests only.
	TestBatchHold time.Duration
	// DenialCache denies locally what Redis just denied; DenialCacheSize
	// bounds the buckets it remembers.
	DenialCache     bool
	DenialCacheSize int
	// TokenLeases serves busy buckets from slices of their tokens
	// (internal/tokenlease), in front of the failure handling: a slice
	// answers while Redis fails, then the failure mode does.
	TokenLeases bool
}

// Enabled reports whether r selects a Redis backend.
func (r Redis) Enabled() bool {
	return r.URL != "" || r.SentinelMaster != "" || len(r.ClusterAddrs) > 0
}

// redisBackend keeps buckets in Redis, shared by every replica. The chain
// of stores is: denial cache (front) → failover → denial cache (learning)
// → Redis store (coalescing). The cache learns only from Redis's own
// answers, never from the failure mode's, and answers before the failover
// layer, so that local denials neither reach nor count for the breaker.
type redisBackend struct {
	name       string
	front      limiter.Store
	failover   *failover.Store
	leases     *failover.Leases // the store's lease pools, failing as buckets do
	store      *redisstore.Store
	client     redis.UniversalClient // for the lease pub/sub
	closeAll   func() error
	collectors []prometheus.Collector
}

// openRedis connects the Redis backend r describes, behind the failure
// handling of failure. It does not fail when Redis is down at start: calls
// are answered per the failure mode until it answers. readWaits is how long
// requests wait in the sockets before they are read (nil: unknown), which,
// like how late timers fire, widens the margin a call's budget keeps before
// its deadline. onHealth is called each time Redis is found failing or
// working again; m counts every backend failure and failure-mode answer.
func openRedis(r Redis, failure failover.Options, readWaits func(time.Time) time.Duration, log *slog.Logger, m *metrics.Metrics, onHealth func(healthy bool)) (*redisBackend, error) {
	opts := redisstore.ClientOptions{
		URL:            r.URL,
		SentinelMaster: r.SentinelMaster,
		SentinelAddrs:  r.SentinelAddrs,
		ClusterAddrs:   r.ClusterAddrs,
		PoolSize:       r.PoolSize,
		DialTimeout:    r.DialTimeout,
		ReadTimeout:    r.ReadTimeout,
		WriteTimeout:   r.WriteTimeout,
		PoolTimeout:    r.PoolTimeout,
	}
	if r.URL == "" { // a URL carries its own
		opts.Username, opts.Password = r.Username, r.Password
	}
	if r.SentinelMaster != "" {
		opts.SentinelPassword = r.Password
	}
	if r.TLSCAFile != "" || r.TLSCertFile != "" || r.TLSKeyFile != "" {
		tc, err := tlsreload.ClientConfig("--redis-tls", r.TLSCAFile, r.TLSCertFile, r.TLSKeyFile)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig = tc
	}
	var cache *denialcache.Cache
	if r.DenialCache {
		var err error
		if cache, err = denialcache.New(denialcache.Options{MaxEntries: r.DenialCacheSize}); err != nil {
			return nil, fmt.Errorf("denial cache: %w", err)
		}
	}
	client, err := redisstore.Dial(opts)
	if err != nil {
		return nil, fmt.Errorf("open the Redis backend: %w", err)
	}
	queue := newQueueMetrics()
	// The failover Store, made below, hears what Redis did with the calls
	// their callers gave up on.
	var breaker atomic.Pointer[failover.Store]
	store, err := redisstore.New(client, redisstore.Options{Prefix: r.Prefix, BatchMax: r.BatchMax, BatchWait: r.BatchWait,
		TestBatchHold: r.TestBatchHold,
		QueueWait:     queue.wait, BatchCalls: queue.batch,
		// A call Redis holds for the backend timeout counts against it,
		// whatever its callers' deadlines (failover.Store.Observe).
		SlowAfter: failureTimeout(failure),
		OnBackend: func(node string, held time.Duration, err error) {
			if fs := breaker.Load(); fs != nil {
				fs.Observe(node, held, err)
			}
		}})
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("open the Redis backend: %w", err)
	}
	// The daemon's loop probes every open breaker (see probeEvery); no
	// call waits on a backend that may still be down.
	failure.ProbeInBackground = true
	// How late this process's timers fire, and how long requests waited
	// to be read, widen the margin a call's budget keeps before its
	// deadline (failover.Options.TimerLateness).
	lag := timerlag.Start(0, 0)
	failure.TimerLateness = lag.Lateness
	if readWaits != nil {
		failure.TimerLateness = func(now time.Time) time.Duration {
			return max(lag.Lateness(now), readWaits(now))
		}
	}
	b := &redisBackend{name: "redis", store: store, client: client, closeAll: func() error {
		lag.Stop()
		store.Close()
		return client.Close()
	}}
	switch {
	case len(r.ClusterAddrs) > 0:
		b.name = "redis-cluster"
	case r.SentinelMaster != "":
		b.name = "redis-sentinel"
	}
	var shared limiter.Store = store
	if cache != nil {
		shared = cache.Learn(store)
	}
	failure.OnChange = func(healthy bool, err error) {
		onHealth(healthy) // first, as awaitBackend: the line finds health changed
		if healthy {
			log.Info("backend answers again", "backend", b.name)
		} else {
			log.Error("backend failing; answering per --on-backend-failure", "backend", b.name, "mode", failure.Mode.String(), "err", err)
		}
	}
	if len(r.ClusterAddrs) > 0 {
		// One breaker per master: a node's fault is answered per the
		// failure mode for its slots alone.
		failure.Shard = store.Shard
		failure.PoolShard = store.PoolShard
		failure.ProbeShard = store.ProbeNode
		failure.OnShardChange = func(node string, healthy bool, err error) {
			m.NodeHealth(node, healthy)
			if healthy {
				log.Info("Redis Cluster node answers again", "backend", b.name, "node", node)
			} else {
				log.Error("Redis Cluster node failing; answering per --on-backend-failure for its slots", "backend", b.name,
					"node", node, "mode", failure.Mode.String(), "err", err)
			}
		}
		failure.OnShardDropped = func(node string) {
			m.NodeGone(node)
			log.Info("Redis Cluster node no longer serves slots; forgotten", "backend", b.name, "node", node)
		}
	}
	// The open breaker probes Redis in the background (Probe), so that a
	// replica no call reaches still finds it back; the probe decides on a
	// bucket of its own, so that a Redis that answers PING but cannot
	// decide (a read-only replica) keeps it open.
	failure.Probe = store.Probe
	failure.OnBackendFailure = m.BackendFailure
	mode := failure.Mode.String()
	failure.OnFallback = func(cause limiter.Fallback) { m.FailureModeAnswer(mode, cause) }
	fs, err := failover.New(shared, failure)
	if err != nil {
		b.closeAll()
		return nil, err
	}
	breaker.Store(fs)
	b.failover, b.front = fs, fs
	b.leases = fs.Leases(store)
	if r.TokenLeases {
		leaser, err := tokenlease.New(fs, tokenlease.Options{})
		if err != nil {
			b.closeAll()
			return nil, err
		}
		closeStore := b.closeAll
		b.closeAll = func() error {
			leaser.Close() // gives the slices back while Redis is still there
			return closeStore()
		}
		b.front = leaser
	}
	if cache != nil {
		b.front = cache.Front(b.front)
	}
	var cacheStats func() denialcache.Stats // nil: no cache
	if cache != nil {
		cacheStats = cache.Stats
	}
	b.collectors = append(redisCollectors(store.Stats, cacheStats), queue.wait, queue.batch)
	return b, nil
}

func (b *redisBackend) Store() limiter.Store              { return b.front }
func (b *redisBackend) Leases() limiter.LeaseStore        { return b.leases }
func (b *redisBackend) Name() string                      { return b.name }
func (b *redisBackend) Prepare(ctx context.Context) error { return b.store.Prepare(ctx) }
func (b *redisBackend) Ready(ctx context.Context) error   { return b.store.ProbeAny(ctx) }
func (b *redisBackend) Healthy() bool                     { return b.failover.Healthy() }
func (b *redisBackend) FailureMode() failover.Mode        { return b.failover.Mode() }
func (b *redisBackend) Probe(ctx context.Context) error   { return b.failover.Probe(ctx) }
func (b *redisBackend) Sweep(now time.Time) {
	b.failover.Sweep(now)
	b.store.SweepNodes(nodeIdle)
}
func (b *redisBackend) Collectors() []prometheus.Collector { return b.collectors }
func (b *redisBackend) Close() error                       { return b.closeAll() }

// nodeIdle is how long a Redis Cluster node no call went to keeps its
// batcher: a node that left the cluster is forgotten after it.
const nodeIdle = 5 * time.Minute

// failureTimeout is the backend timeout failure gives Redis, its default
// when unset.
func failureTimeout(failure failover.Options) time.Duration {
	if failure.Timeout > 0 {
		return failure.Timeout
	}
	return failover.DefaultTimeout
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
	counters := []struct {
		name, help string
		value      func(redisstore.Stats) int64
	}{
		{"ratelimitd_redis_takes_total", "Takes sent to Redis: the buckets of one request, taken all-or-nothing.", func(s redisstore.Stats) int64 { return s.Takes }},
		{"ratelimitd_redis_script_calls_total", "Script runs asked of Redis: one per Take (per hash slot on a Cluster), plus Cluster give-backs and refunds.", func(s redisstore.Stats) int64 { return s.Calls }},
		{"ratelimitd_redis_scripts_total", "Script commands sent: script calls, less those that travelled merged into one command with others.", func(s redisstore.Stats) int64 { return s.Scripts }},
		{"ratelimitd_redis_round_trips_total", "Round trips to Redis (one pipeline, to each node it names on a Cluster, counts once).", func(s redisstore.Stats) int64 { return s.RoundTrips }},
		{"ratelimitd_redis_direct_calls_total", "Script calls sent at once from their caller's goroutine, because no round trip was in flight or as a probe.", func(s redisstore.Stats) int64 { return s.Direct }},
		{"ratelimitd_redis_give_back_failures_total", "Cluster give-backs (a request across hash slots that one slot denied) that failed or missed the request's deadline: their tokens stay spent until they refill.", func(s redisstore.Stats) int64 { return s.GiveBackFailures }},
		{"ratelimitd_redis_denied_with_failures_total", "Requests across hash slots that one slot denied while another failed: answered OVER_LIMIT, the failure counted here.", func(s redisstore.Stats) int64 { return s.DeniedWithFailures }},
		{"ratelimitd_redis_late_answers_total", "Coalesced calls Redis answered after their caller had given up on them (its deadline came first).", func(s redisstore.Stats) int64 { return s.Late }},
		{"ratelimitd_redis_late_give_backs_total", "Late answers that admitted a Take, whose tokens were then given back: a caller told it failed spends nothing.", func(s redisstore.Stats) int64 { return s.LateGiveBacks }},
		{"ratelimitd_redis_late_give_back_failures_total", "Give-backs of late answers that failed: those tokens stay spent until they refill.", func(s redisstore.Stats) int64 { return s.LateGiveBackFailures }},
	}
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ratelimitd_redis_pending_calls",
			Help: "Redis script calls asked for and not yet answered (queued in this process or in flight), now."},
			func() float64 { return float64(store().Pending) }),
	}
	for _, c := range counters {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help},
			func() float64 { return float64(c.value(store())) }))
	}
	if cache != nil {
		cs = append(cs,
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimitd_denial_cache_denials_total",
				Help: "Descriptors denied by the local denial cache without asking Redis."},
				func() float64 { return float64(cache().LocalDenials) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimitd_denial_cache_learned_total",
				Help: "Denials from Redis the local denial cache remembered."},
				func() float64 { return float64(cache().Learned) }))
	}
	return cs
}
