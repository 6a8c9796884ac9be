package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// openRedis connects the Redis backend the flags describe, behind the
// failure handling of --on-backend-failure. It does not fail when Redis is
// down at start: calls are answered per the failure mode until it answers.
// onHealth is called each time Redis is found failing or working again.
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
	client, err := redisstore.Dial(opts)
	if err != nil {
		return backend{}, fmt.Errorf("redis: %w", err)
	}
	store, err := redisstore.New(client, redisstore.Options{Prefix: r.prefix})
	if err != nil {
		client.Close()
		return backend{}, fmt.Errorf("redis: %w", err)
	}
	name := "redis"
	switch {
	case r.clusterAddrs != "":
		name = "redis-cluster"
	case r.sentinelMaster != "":
		name = "redis-sentinel"
	}
	be := backend{name: name, close: client.Close, failureMode: failure.Mode}
	failure.OnChange = func(healthy bool, err error) {
		if healthy {
			log.Info("backend answers again", "backend", name)
		} else {
			log.Error("backend failing; answering per --on-backend-failure", "backend", name, "mode", failure.Mode.String(), "err", err)
		}
		onHealth(healthy)
	}
	fs, err := failover.New(store, failure)
	if err != nil {
		client.Close()
		return backend{}, err
	}
	be.store, be.sweep, be.healthy = fs, fs.Sweep, fs.Healthy
	be.ready = func(ctx context.Context) error { return client.Ping(ctx).Err() }
	return be, nil
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
