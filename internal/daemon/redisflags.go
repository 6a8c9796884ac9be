package daemon

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// RedisFlags are the values of ratelimitd's --redis-* flags (and of the
// others that tune the Redis backend), as given: they select and tune the
// Redis backend; all empty means in-memory. Check finds what is wrong with
// them, naming the flags; Config is the Redis they select.
type RedisFlags struct {
	URL            string
	SentinelMaster string
	SentinelAddrs  string
	ClusterAddrs   string
	Password       string
	Username       string
	TLSCA          string
	TLSCert        string
	TLSKey         string
	Prefix         string
	PoolSize       int
	DialTimeout    time.Duration
	ReadTimeout    time.Duration
	WriteTimeout   time.Duration
	PoolTimeout    time.Duration
	BatchMax       int           // calls coalesced into one round trip; 0 the default, 1 none
	BatchWait      time.Duration // 0 the default
	BatchHold      time.Duration // tests only (TestBatchHold)
	DenialCache    bool
	DenialEntries  int // 0 the default
	TokenLeases    bool
}

// Enabled reports whether the flags select a Redis backend.
func (r RedisFlags) Enabled() bool {
	return r.URL != "" || r.SentinelMaster != "" || r.ClusterAddrs != ""
}

// Check returns the usage errors of the Redis flags, all of them, naming
// the flags as given maps them (flag name to its spelling, such as
// "--redis-url" or "RATELIMITD_REDIS_URL"): which backend they select,
// and flags that would be ignored for it. Without a backend, buckets are
// kept in each replica's memory, so a --redis-* flag given without one
// (most likely a backend flag forgotten or misspelt) is an error rather than
// a silent N-fold limit across N replicas.
func (r RedisFlags) Check(given map[string]string) error {
	name := func(flag string) string {
		if s, ok := given[flag]; ok {
			return s
		}
		return "--" + flag
	}
	var errs []error
	var backends []string
	if r.URL != "" {
		backends = append(backends, name("redis-url"))
	}
	if r.SentinelMaster != "" || r.SentinelAddrs != "" {
		backends = append(backends, name("redis-sentinel-master")+" with "+name("redis-sentinel-addrs"))
	}
	if r.ClusterAddrs != "" {
		backends = append(backends, name("redis-cluster-addrs"))
	}
	if len(backends) > 1 {
		last := len(backends) - 1
		errs = append(errs, fmt.Errorf("%s and %s each select a Redis backend: give one",
			strings.Join(backends[:last], ", "), backends[last]))
	}
	switch {
	case r.SentinelMaster != "" && r.SentinelAddrs == "":
		errs = append(errs, fmt.Errorf("%s needs %s (the Sentinels' host:port addresses)", name("redis-sentinel-master"), name("redis-sentinel-addrs")))
	case r.SentinelMaster == "" && r.SentinelAddrs != "":
		errs = append(errs, fmt.Errorf("%s needs %s (the name the Sentinels monitor the master by)", name("redis-sentinel-addrs"), name("redis-sentinel-master")))
	}
	for _, l := range []struct{ flag, value string }{{"redis-sentinel-addrs", r.SentinelAddrs}, {"redis-cluster-addrs", r.ClusterAddrs}} {
		if l.value != "" && len(SplitList(l.value)) == 0 {
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
	if r.URL != "" {
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
		o, err := redisstore.ParseURL(r.URL)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", name("redis-url"), err))
		case o.TLSConfig == nil && (r.TLSCA != "" || r.TLSCert != "" || r.TLSKey != ""):
			errs = append(errs, fmt.Errorf("%s given, but %s does not speak TLS: use a rediss:// URL", r.tlsFlagNames(name), name("redis-url")))
		}
	}
	if (r.TLSCert == "") != (r.TLSKey == "") {
		errs = append(errs, fmt.Errorf("%s and %s go together", name("redis-tls-cert"), name("redis-tls-key")))
	}
	for _, n := range []struct {
		flag     string
		negative bool
		value    any
	}{
		{"redis-pool-size", r.PoolSize < 0, r.PoolSize},
		{"redis-dial-timeout", r.DialTimeout < 0, r.DialTimeout},
		{"redis-read-timeout", r.ReadTimeout < 0, r.ReadTimeout},
		{"redis-write-timeout", r.WriteTimeout < 0, r.WriteTimeout},
		{"redis-pool-timeout", r.PoolTimeout < 0, r.PoolTimeout},
		{"redis-batch-max", r.BatchMax < 0, r.BatchMax},
	} {
		if n.negative {
			errs = append(errs, fmt.Errorf("%s %v: must not be negative (0 is the default)", name(n.flag), n.value))
		}
	}
	return errors.Join(errs...)
}

// tlsFlagNames names the --redis-tls-* flags that are set.
func (r RedisFlags) tlsFlagNames(name func(string) string) string {
	var set []string
	for _, f := range []struct{ flag, value string }{{"redis-tls-ca", r.TLSCA}, {"redis-tls-cert", r.TLSCert}, {"redis-tls-key", r.TLSKey}} {
		if f.value != "" {
			set = append(set, name(f.flag))
		}
	}
	return strings.Join(set, ", ")
}

// Config is the Redis config of these flags (Check has found them
// consistent).
func (r RedisFlags) Config() Redis {
	return Redis{
		URL:             r.URL,
		SentinelMaster:  r.SentinelMaster,
		SentinelAddrs:   SplitList(r.SentinelAddrs),
		ClusterAddrs:    SplitList(r.ClusterAddrs),
		Username:        r.Username,
		Password:        r.Password,
		TLSCAFile:       r.TLSCA,
		TLSCertFile:     r.TLSCert,
		TLSKeyFile:      r.TLSKey,
		Prefix:          r.Prefix,
		PoolSize:        r.PoolSize,
		DialTimeout:     r.DialTimeout,
		ReadTimeout:     r.ReadTimeout,
		WriteTimeout:    r.WriteTimeout,
		PoolTimeout:     r.PoolTimeout,
		BatchMax:        r.BatchMax,
		BatchWait:       r.BatchWait,
		TestBatchHold:   r.BatchHold,
		DenialCache:     r.DenialCache,
		DenialCacheSize: r.DenialEntries,
		TokenLeases:     r.TokenLeases,
	}
}

// SplitList splits a comma-separated flag value, as every list flag of the
// daemon reads it: items trimmed of the spaces around them, empty ones
// dropped (nil for none).
func SplitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// redisOnlyFlags are the flags outside --redis-* that only the Redis backend
// reads (its failure handling and denial cache). Given without Redis they
// change nothing: the memory backend never fails. Unlike --redis-* flags
// (see RedisFlags.Check) they are no error, since a deployment template may
// set them whatever the backend, but serve warns of them.
var redisOnlyFlags = []string{
	"on-backend-failure", "backend-timeout", "default-deadline", "breaker-failures", "breaker-failing-for", "breaker-open-for",
	"replicas-hint", "failure-grace", "failure-grace-mode", "denial-cache", "denial-cache-size", "token-leases",
}

// RedisOnlyGiven returns the flags among given (as in Check) outside
// --redis-* that only the Redis backend reads, as given spells them,
// sorted.
func RedisOnlyGiven(given map[string]string) []string {
	var out []string
	for _, f := range redisOnlyFlags {
		if spelt, ok := given[f]; ok {
			out = append(out, spelt)
		}
	}
	slices.Sort(out)
	return out
}
