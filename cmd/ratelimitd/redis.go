package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// openRedis connects the Redis backend the flags describe. It does not
// fail when Redis is down at start: /readyz says so, and calls answer
// UNAVAILABLE until it answers.
func openRedis(ctx context.Context, r redisFlags) (backend, error) {
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
	return backend{
		store: store,
		name:  name,
		ready: func(ctx context.Context) error { return client.Ping(ctx).Err() },
		close: client.Close,
	}, nil
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
