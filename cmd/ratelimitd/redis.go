package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

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

// config is the daemon's Redis config for these flags (check has found
// them consistent).
func (r redisFlags) config() daemon.Redis {
	return daemon.Redis{
		URL:             r.url,
		SentinelMaster:  r.sentinelMaster,
		SentinelAddrs:   splitList(r.sentinelAddrs),
		ClusterAddrs:    splitList(r.clusterAddrs),
		Username:        r.username,
		Password:        r.password,
		TLSCAFile:       r.tlsCA,
		TLSCertFile:     r.tlsCert,
		TLSKeyFile:      r.tlsKey,
		Prefix:          r.prefix,
		PoolSize:        r.poolSize,
		DialTimeout:     r.dialTimeout,
		ReadTimeout:     r.readTimeout,
		WriteTimeout:    r.writeTimeout,
		PoolTimeout:     r.poolTimeout,
		BatchMax:        r.batchMax,
		BatchWait:       r.batchWait,
		TestBatchHold:   r.batchHold,
		DenialCache:     r.denialCache,
		DenialCacheSize: r.denialEntries,
	}
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
