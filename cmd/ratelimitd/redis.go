package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/internal/failover"
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
func openRedis(r redisFlags, failure failover.Options, log *slog.Logger, onHealth func(healthy bool)) (backend, error) {
	opts := redisstore.ClientOptions{
		URL:            r.url,
		SentinelMaster: r.sentinelMaster,
		SentinelAddrs:  splitList(r.sentinelAddrs),
		ClusterAddrs:   splitList(r.clusterAddrs),
		Password:       r.password,
		PoolSize:       r.poolSize,
		DialTimeout:    r.dialTimeout,
		ReadTimeout:    r.readTimeout,
		WriteTimeout:   r.writeTimeout,
		PoolTimeout:    r.poolTimeout,
	}
	if r.sentinelMaster != "" {
		opts.SentinelPassword = r.password
	}
	opts.Username = r.username
	tlsConfig, err := r.tlsConfig()
	if err != nil {
		return backend{}, err
	}
	opts.TLSConfig = tlsConfig
	if r.batchMax < 0 {
		return backend{}, fmt.Errorf("--redis-batch-max %d: must be 0 (the default), 1 (no coalescing) or more", r.batchMax)
	}
	var cache *denialcache.Cache
	if r.denialCache {
		if cache, err = denialcache.New(denialcache.Options{MaxEntries: r.denialEntries}); err != nil {
			return backend{}, fmt.Errorf("--denial-cache-size: %w", err)
		}
	}
	client, err := redisstore.Dial(opts)
	if err != nil {
		return backend{}, fmt.Errorf("redis: %w", err)
	}
	store, err := redisstore.New(client, redisstore.Options{Prefix: r.prefix, BatchMax: r.batchMax, BatchWait: r.batchWait})
	if err != nil {
		client.Close()
		return backend{}, fmt.Errorf("redis: %w", err)
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
	fs, err := failover.New(shared, failure)
	if err != nil {
		closeAll()
		return backend{}, err
	}
	be.store, be.sweep, be.healthy = fs, fs.Sweep, fs.Healthy
	if cache != nil {
		be.store = cache.Front(fs)
	}
	be.ready = func(ctx context.Context) error { return client.Ping(ctx).Err() }
	var cacheStats func() denialcache.Stats // nil: no cache
	if cache != nil {
		cacheStats = cache.Stats
	}
	be.collectors = redisCollectors(store.Stats, cacheStats)
	return be, nil
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
