package main

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRedisFlagsRejected: Redis flags that select no backend, select
// several, or would be ignored by the one selected are usage errors that
// name the flags as the operator gave them (on the command line or in the
// environment); a malformed --redis-url says what is wrong without its
// password.
func TestRedisFlagsRejected(t *testing.T) {
	const secret = "s3cret"
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string // all in the error
	}{
		{"URL: bad port", []string{"--redis-url", "redis://:s3cretpw@redis:6379x/0"}, nil,
			[]string{`--redis-url: parse "redis://:xxxxx@redis:6379x/0": invalid port ":6379x" after host`}},
		{"URL: bad port, user and password", []string{"--redis-url", "rediss://rl:s3cretpw@redis:63z79"}, nil,
			[]string{`--redis-url: `, `rl:xxxxx@`, `invalid port ":63z79"`}},
		{"URL: bad database", []string{"--redis-url", "redis://rl:s3cretpw@redis:6379/zero"}, nil,
			[]string{`--redis-url: `, `invalid database number: "zero"`}},
		{"URL: bad scheme", []string{"--redis-url", "http://:s3cretpw@redis:6379"}, nil,
			[]string{`--redis-url: `, `invalid URL scheme: http`}},
		{"URL: bad query", []string{"--redis-url", "redis://:s3cretpw@redis:6379?dial_timeout=soon"}, nil,
			[]string{`--redis-url: `, `invalid dial_timeout duration`}},
		{"URL: no scheme", []string{"--redis-url", ":s3cretpw@redis:6379"}, nil,
			[]string{`--redis-url: parse ":xxxxx@redis:6379": missing protocol scheme`}},
		{"URL: bad IPv6 host", []string{"--redis-url", "redis://:s3cretpw@[::1:6379"}, nil,
			[]string{`--redis-url: parse "redis://:xxxxx@[::1:6379"`}},
		// url.Parse would quote the piece before the '/' as a port.
		{"URL: password with an unencoded /", []string{"--redis-url", "redis://:s3cret/pw@redis:6379"}, nil,
			[]string{`--redis-url: the password in redis://:xxxxx@redis:6379 cannot be parsed: percent-encode`}},
		{"URL: password with a bad escape", []string{"--redis-url", "redis://:s3cret%zz@redis:6379"}, nil,
			[]string{`--redis-url: the password in redis://:xxxxx@redis:6379 cannot be parsed`}},
		{"URL from the environment", nil, map[string]string{"RATELIMITD_REDIS_URL": "redis://:s3cretpw@redis:6379x/0"},
			[]string{`RATELIMITD_REDIS_URL: parse "redis://:xxxxx@redis:6379x/0": invalid port`}},

		{"Sentinel addresses without a master", []string{"--redis-sentinel-addrs", "s1:26379,s2:26379", "--redis-password", secret}, nil,
			[]string{"--redis-sentinel-addrs needs --redis-sentinel-master"}},
		{"Sentinel master without addresses", []string{"--redis-sentinel-master", "mymaster"}, nil,
			[]string{"--redis-sentinel-master needs --redis-sentinel-addrs"}},
		{"password alone", []string{"--redis-password", secret}, nil,
			[]string{"--redis-password set, but no Redis backend: give --redis-url, --redis-sentinel-master with --redis-sentinel-addrs, or --redis-cluster-addrs"}},
		{"tuning alone", []string{"--redis-username", "rl", "--redis-tls-ca", "ca.pem", "--redis-pool-size", "4", "--redis-prefix", "rl:"}, nil,
			[]string{"--redis-pool-size, --redis-prefix, --redis-tls-ca, --redis-username set, but no Redis backend"}},
		{"password alone, from the environment", nil, map[string]string{"RATELIMITD_REDIS_PASSWORD": secret},
			[]string{"RATELIMITD_REDIS_PASSWORD set, but no Redis backend"}},
		{"password with a URL", []string{"--redis-url", "redis://redis:6379", "--redis-password", secret}, nil,
			[]string{"--redis-password: not used with --redis-url, which carries its own credentials: put them in the URL"}},
		{"user and password with a URL", []string{"--redis-url", "redis://redis:6379", "--redis-username", "rl"},
			map[string]string{"RATELIMITD_REDIS_PASSWORD": secret},
			[]string{"--redis-username and RATELIMITD_REDIS_PASSWORD: not used with --redis-url"}},
		{"URL and Cluster", []string{"--redis-url", "redis://redis:6379", "--redis-cluster-addrs", "n1:6379"}, nil,
			[]string{"--redis-url and --redis-cluster-addrs each select a Redis backend: give one"}},
		{"Sentinel and Cluster", []string{"--redis-sentinel-master", "m", "--redis-sentinel-addrs", "s1:26379", "--redis-cluster-addrs", "n1:6379"}, nil,
			[]string{"--redis-sentinel-master with --redis-sentinel-addrs and --redis-cluster-addrs each select"}},
		{"TLS files with redis://", []string{"--redis-url", "redis://redis:6379", "--redis-tls-ca", "ca.pem"}, nil,
			[]string{"--redis-tls-ca given, but --redis-url does not speak TLS: use a rediss:// URL"}},
		{"client certificate without its key", []string{"--redis-cluster-addrs", "n1:6379", "--redis-tls-cert", "c.pem"}, nil,
			[]string{"--redis-tls-cert and --redis-tls-key go together"}},
		{"Cluster with no address", []string{"--redis-cluster-addrs", " , "}, nil,
			[]string{`--redis-cluster-addrs " , ": no address in it`}},
		{"negative sizes and timeouts", []string{"--redis-cluster-addrs", "n1:6379", "--redis-pool-size", "-1", "--redis-read-timeout", "-1s", "--redis-batch-max", "-2"}, nil,
			[]string{"--redis-pool-size -1: must not be negative", "--redis-read-timeout -1s: must not be negative", "--redis-batch-max -2: must not be negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			_, err := parseServeFlags(append([]string{"--config", "x"}, tt.args...), getenv, io.Discard)
			var usage usageError
			if err == nil || !errors.As(err, &usage) {
				t.Fatalf("parseServeFlags(%q, %v) = %v, want a usage error", tt.args, tt.env, err)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("parseServeFlags(%q, %v) = %v, want an error containing %q", tt.args, tt.env, err, want)
				}
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("parseServeFlags(%q, %v) = %v: contains the password", tt.args, tt.env, err)
			}
		})
	}
}

// TestRedisFlagsAccepted: the ways docs/redis.md gives to select each
// backend, and flags set to their defaults (as a template with an empty
// variable writes them), are not errors.
func TestRedisFlagsAccepted(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // RedisFlags.Enabled: "" for the in-memory backend
	}{
		{"nothing", nil, nil, ""},
		{"empty URL and defaults", []string{"--redis-url", "", "--redis-password", "", "--redis-prefix", "ratelimitd:", "--redis-pool-size", "0"}, nil, ""},
		{"URL with credentials", []string{"--redis-url", "redis://rl:p%2Fw@redis:6379/1", "--redis-pool-size", "4"}, nil, "url"},
		{"rediss URL with TLS files", []string{"--redis-url", "rediss://rl:pw@redis:6380", "--redis-tls-ca", "ca.pem", "--redis-tls-cert", "c.pem", "--redis-tls-key", "k.pem"}, nil, "url"},
		{"Sentinel with credentials", []string{"--redis-sentinel-master", "mymaster", "--redis-sentinel-addrs", "s1:26379,s2:26379", "--redis-password", "pw", "--redis-username", "rl"}, nil, "sentinel"},
		{"Cluster from the environment", nil, map[string]string{"RATELIMITD_REDIS_CLUSTER_ADDRS": "n1:6379,n2:6379", "RATELIMITD_REDIS_PASSWORD": "pw"}, "cluster"},
		{"Cluster, batching off", []string{"--redis-cluster-addrs", "n1:6379", "--redis-batch-wait", "-1s", "--redis-batch-max", "1"}, nil, "cluster"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			c, err := parseServeFlags(append([]string{"--config", "x"}, tt.args...), getenv, io.Discard)
			if err != nil {
				t.Fatalf("parseServeFlags(%q, %v) = %v, want no error", tt.args, tt.env, err)
			}
			got := ""
			switch {
			case c.redis.URL != "":
				got = "url"
			case c.redis.SentinelMaster != "":
				got = "sentinel"
			case c.redis.ClusterAddrs != "":
				got = "cluster"
			}
			if got != tt.want || c.redis.Enabled() != (tt.want != "") {
				t.Errorf("parseServeFlags(%q, %v) selects %q (enabled %v), want %q", tt.args, tt.env, got, c.redis.Enabled(), tt.want)
			}
		})
	}
}

// TestRedisOnlyFlagsOnMemory: failure-handling and denial-cache flags given
// without a Redis backend are listed (as given, from flags or environment)
// for serve to warn of, not refused; with Redis, or not given, none are.
func TestRedisOnlyFlagsOnMemory(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"none given", nil, nil, nil},
		{"defaults left alone", []string{"--log-level", "debug"}, nil, nil},
		{"flags and environment", []string{"--on-backend-failure", "deny", "--breaker-open-for", "1s"},
			map[string]string{"RATELIMITD_DENIAL_CACHE": "false"},
			[]string{"--breaker-open-for", "--on-backend-failure", "RATELIMITD_DENIAL_CACHE"}},
		{"with Redis they are read", []string{"--redis-url", "redis://127.0.0.1:6379", "--on-backend-failure", "deny"}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseServeFlags(append([]string{"--config", "x"}, tt.args...), func(k string) string { return tt.env[k] }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.ignoredFlags, tt.want) {
				t.Errorf("ignored flags %q, want %q", c.ignoredFlags, tt.want)
			}
		})
	}
}

// TestServeWarnsOfIgnoredFlags: serve on the memory backend logs one warning
// naming the Redis-only flags it was given.
func TestServeWarnsOfIgnoredFlags(t *testing.T) {
	logs := newAddrWatcher()
	dir := writeConfig(t, map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--config", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json",
			"--adaptive-procs=false", "--on-backend-failure", "allow"}, func(string) string { return "" }, io.Discard, logs)
	}()
	select {
	case <-logs.ready:
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs)
	case <-time.After(10 * time.Second):
		t.Fatalf("not serving in 10 s\n%s", logs)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `"msg":"flags only the Redis backend reads are ignored on the memory backend","flags":"--on-backend-failure"`) {
		t.Errorf("no warning naming --on-backend-failure in\n%s", logs)
	}
}
