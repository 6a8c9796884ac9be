package main

import (
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/envcompat"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
	"github.com/ratelimitd/ratelimitd/internal/xdsconfig"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// incumbentParse parses the serve configuration from env alone, as the
// binary run as "ratelimit" does.
func incumbentParse(env map[string]string, args ...string) (serveConfig, error) {
	getenv := envcompat.ProgramGetenv("/bin/ratelimit", func(k string) string { return env[k] })
	return parseServeFlags(args, getenv, io.Discard)
}

// withEnv is base with the pairs kv added (kv overriding).
func withEnv(base map[string]string, kv ...string) map[string]string {
	m := map[string]string{}
	for k, v := range base {
		m[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// baseEnv is the smallest environment envoyproxy/ratelimit starts with in
// file mode (RUNTIME_WATCH_ROOT=true, its default, needs a subdirectory).
var baseEnv = map[string]string{"RUNTIME_SUBDIRECTORY": "ratelimit"}

// Outcomes of one incumbent variable in TestIncumbentVariables.
const (
	read    = "read"
	warned  = "warned"
	refusal = "refused"
)

// TestIncumbentVariables sets each of envoyproxy/ratelimit's settings (on
// top of baseEnv) and checks what ratelimitd does with it: read (the
// field of the Config it lands in), warned about (named in the startup
// warning), or refused (named in the error). Every setting in
// envcompat's table has at least one case (TestIncumbentVariablesAllCovered),
// and docs/replacing-envoyproxy-ratelimit.md one row
// (TestReplacingDocListsEveryVariable).
func TestIncumbentVariables(t *testing.T) {
	xds := withEnv(baseEnv, "CONFIG_TYPE", "GRPC_XDS_SOTW")
	redisTCP := withEnv(baseEnv, "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "redis:6379")
	tracingOn := withEnv(baseEnv, "TRACING_ENABLED", "true")
	field := func(f func(serveConfig) any) func(serveConfig) any { return f }
	tests := []struct {
		name  string // the variable
		env   map[string]string
		value string
		what  string
		field func(serveConfig) any // for read
		want  any
	}{
		{"HOST", baseEnv, "::", read, field(func(c serveConfig) any { return c.HTTPAddr }), "[::]:8080"},
		{"PORT", baseEnv, "9080", read, field(func(c serveConfig) any { return c.HTTPAddr }), "0.0.0.0:9080"},
		{"PORT", baseEnv, "70000", refusal, nil, nil},
		{"DEBUG_HOST", baseEnv, "127.0.0.1", read, field(func(c serveConfig) any { return c.DebugAddr }), "127.0.0.1:6070"},
		{"DEBUG_PORT", baseEnv, "16070", read, field(func(c serveConfig) any { return c.DebugAddr }), "0.0.0.0:16070"},
		{"GRPC_UDS", baseEnv, "/tmp/rl.sock", refusal, nil, nil},
		{"GRPC_HOST", baseEnv, "::", read, field(func(c serveConfig) any { return c.GRPCAddr }), "[::]:8081"},
		{"GRPC_PORT", baseEnv, "18081", read, field(func(c serveConfig) any { return c.GRPCAddr }), "0.0.0.0:18081"},
		{"GRPC_PORT", baseEnv, "grpc", refusal, nil, nil},
		{"GRPC_MAX_CONNECTION_AGE", baseEnv, "30m", read, field(func(c serveConfig) any { return c.MaxConnectionAge }), 30 * time.Minute},
		{"GRPC_MAX_CONNECTION_AGE_GRACE", baseEnv, "5m", read, field(func(c serveConfig) any { return c.MaxConnectionAgeGrace }), 5 * time.Minute},
		{"GRPC_SERVER_USE_TLS", withEnv(baseEnv, "GRPC_SERVER_TLS_CERT", "/c/tls.crt", "GRPC_SERVER_TLS_KEY", "/c/tls.key"), "true", read,
			field(func(c serveConfig) any { return c.GRPCTLS.CertFile + " " + c.GRPCTLS.KeyFile }), "/c/tls.crt /c/tls.key"},
		{"GRPC_SERVER_USE_TLS", baseEnv, "true", refusal, nil, nil}, // without the files
		{"GRPC_SERVER_TLS_CERT", withEnv(baseEnv, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_KEY", "/c/k"), "/c/crt", read,
			field(func(c serveConfig) any { return c.GRPCTLS.CertFile }), "/c/crt"},
		{"GRPC_SERVER_TLS_CERT", baseEnv, "/c/crt", warned, nil, nil}, // without GRPC_SERVER_USE_TLS
		{"GRPC_SERVER_TLS_KEY", withEnv(baseEnv, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "/c/crt"), "/c/k", read,
			field(func(c serveConfig) any { return c.GRPCTLS.KeyFile }), "/c/k"},
		{"GRPC_CLIENT_TLS_CACERT", withEnv(baseEnv, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "/c/crt", "GRPC_SERVER_TLS_KEY", "/c/k"), "/c/ca", read,
			field(func(c serveConfig) any { return c.GRPCTLS.ClientCAFile }), "/c/ca"},
		{"GRPC_CLIENT_TLS_SAN", baseEnv, "envoy", refusal, nil, nil},
		{"GRPC_SERVER_TLS_CA_CERT", baseEnv, "/certs/ca.crt", warned, nil, nil},
		{"LOG_LEVEL", baseEnv, "info", read, field(func(c serveConfig) any { return c.logLevel.String() }), "INFO"},
		{"LOG_LEVEL", baseEnv, "WARNING", read, field(func(c serveConfig) any { return c.logLevel.String() }), "WARN"},
		{"LOG_LEVEL", baseEnv, "trace", warned, nil, nil},
		{"LOG_LEVEL", baseEnv, "loud", refusal, nil, nil},
		{"LOG_FORMAT", baseEnv, "JSON", read, field(func(c serveConfig) any { return c.logFormat }), "json"},
		{"CONFIG_TYPE", baseEnv, "GRPC_XDS_SOTW", read, field(func(c serveConfig) any { return c.XDS.Addr + "|" + c.ConfigPath }), "localhost:18000|"},
		{"CONFIG_TYPE", baseEnv, "GRPC_XDS_DELTA", refusal, nil, nil},
		{"FORCE_START_WITHOUT_INITIAL_CONFIG", xds, "true", read, field(func(c serveConfig) any { return c.StartWithoutConfig }), true},
		{"FORCE_START_WITHOUT_INITIAL_CONFIG", baseEnv, "true", warned, nil, nil}, // with FILE
		{"CONFIG_GRPC_XDS_NODE_ID", xds, "envoy-ratelimit", read, field(func(c serveConfig) any { return c.XDS.NodeID }), "envoy-ratelimit"},
		{"CONFIG_GRPC_XDS_NODE_METADATA", xds, "zone=a,team=edge", read, field(func(c serveConfig) any { return c.XDS.NodeMetadata }), map[string]string{"zone": "a", "team": "edge"}},
		{"CONFIG_GRPC_XDS_NODE_METADATA", xds, "zone:a,team=edge", warned, field(func(c serveConfig) any { return c.XDS.NodeMetadata }), map[string]string{"team": "edge"}},
		{"CONFIG_GRPC_XDS_SERVER_URL", xds, "envoy-gateway:18001", read, field(func(c serveConfig) any { return c.XDS.Addr }), "envoy-gateway:18001"},
		{"CONFIG_GRPC_XDS_SERVER_URL", baseEnv, "envoy-gateway:18001", warned, nil, nil}, // with FILE
		{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", xds, "1s", read, field(func(c serveConfig) any { return c.XDS.ConnectRetryInterval }), time.Second},
		{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", xds, "x-token:abc,x-team:edge", read, field(func(c serveConfig) any { return c.XDS.Headers }), map[string]string{"x-token": "abc", "x-team": "edge"}},
		{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", xds, "x-token", refusal, nil, nil},
		{"CONFIG_GRPC_XDS_SERVER_USE_TLS", xds, "true", read, field(func(c serveConfig) any { return *c.XDS.TLS }), xdsconfig.TLSFiles{}},
		{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", withEnv(xds, "CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/k"), "/c", read, field(func(c serveConfig) any { return c.XDS.TLS.CertFile }), "/c"},
		{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", withEnv(xds, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/k"), "/c", warned, nil, nil},   // without USE_TLS
		{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", withEnv(xds, "CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"), "/k", refusal, nil, nil}, // without the cert
		{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", withEnv(xds, "CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"), "/ca", read, field(func(c serveConfig) any { return c.XDS.TLS.CAFile }), "/ca"},
		{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", withEnv(xds, "CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"), "eg.example", read, field(func(c serveConfig) any { return c.XDS.TLS.ServerName }), "eg.example"},
		{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", xds, "5s", warned, nil, nil},
		{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", xds, "2m", read, field(func(c serveConfig) any { return c.XDS.MaxBackoff }), 2 * time.Minute},
		{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", xds, "0.2", warned, nil, nil},
		{"XDS_CLIENT_BACKOFF_JITTER", xds, "false", warned, nil, nil},
		{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", xds, "8388608", read, field(func(c serveConfig) any { return c.XDS.MaxMessageBytes }), 8 << 20},
		{"USE_DOG_STATSD", baseEnv, "true", warned, nil, nil},
		{"USE_DOG_STATSD_MOGRIFIERS", baseEnv, "a,b", warned, nil, nil},
		{"USE_STATSD", baseEnv, "true", warned, nil, nil},
		{"USE_STATSD", baseEnv, "false", read, field(func(c serveConfig) any { return len(c.unhonoured) }), 0},
		{"STATSD_HOST", baseEnv, "statsd", warned, nil, nil},
		{"STATSD_PORT", baseEnv, "9125", warned, nil, nil},
		{"EXTRA_TAGS", baseEnv, "env:prod", warned, nil, nil},
		{"STATS_FLUSH_INTERVAL", baseEnv, "1s", warned, nil, nil},
		{"DISABLE_STATS", baseEnv, "true", warned, nil, nil},
		{"USE_PROMETHEUS", baseEnv, "true", read, field(func(c serveConfig) any { return c.MetricsAddr + " " + boolStr(c.IncumbentMetrics) }), ":9090 true"},
		{"PROMETHEUS_ADDR", withEnv(baseEnv, "USE_PROMETHEUS", "true"), ":19001", read, field(func(c serveConfig) any { return c.MetricsAddr }), ":19001"},
		{"PROMETHEUS_ADDR", baseEnv, ":19001", warned, nil, nil}, // without USE_PROMETHEUS
		{"PROMETHEUS_PATH", withEnv(baseEnv, "USE_PROMETHEUS", "true"), "/stats/prometheus", read, field(func(c serveConfig) any { return c.MetricsPath }), "/stats/prometheus"},
		{"PROMETHEUS_PATH", withEnv(baseEnv, "USE_PROMETHEUS", "true"), "metrics", refusal, nil, nil},
		{"PROMETHEUS_PATH", baseEnv, "/stats/prometheus", warned, nil, nil}, // without USE_PROMETHEUS
		{"PROMETHEUS_MAPPER_YAML", withEnv(baseEnv, "USE_PROMETHEUS", "true"), "/etc/statsd-exporter/conf.yaml", warned, nil, nil},
		{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", baseEnv, "true", warned, nil, nil},
		{"RUNTIME_ROOT", baseEnv, "/data", read, field(func(c serveConfig) any { return c.ConfigPath }), "/data/ratelimit/config"},
		{"RUNTIME_SUBDIRECTORY", baseEnv, "rl", read, field(func(c serveConfig) any { return c.ConfigPath }), "/srv/runtime_data/current/rl/config"},
		{"RUNTIME_SUBDIRECTORY", withEnv(baseEnv, "RUNTIME_WATCH_ROOT", "false"), "", read, field(func(c serveConfig) any { return c.ConfigPath }), "/srv/runtime_data/current/config"},
		{"RUNTIME_SUBDIRECTORY", map[string]string{}, "", refusal, nil, nil}, // empty with RUNTIME_WATCH_ROOT=true
		{"RUNTIME_APPDIRECTORY", baseEnv, "limits", read, field(func(c serveConfig) any { return c.ConfigPath }), "/srv/runtime_data/current/ratelimit/limits"},
		{"RUNTIME_IGNOREDOTFILES", baseEnv, "true", read, field(func(c serveConfig) any { return len(c.unhonoured) }), 0},
		{"RUNTIME_IGNOREDOTFILES", baseEnv, "false", warned, nil, nil},
		{"RUNTIME_WATCH_ROOT", baseEnv, "false", read, field(func(c serveConfig) any { return c.WatchConfig }), true},
		{"RUNTIME_WATCH_ROOT", baseEnv, "true", read, field(func(c serveConfig) any { return c.WatchConfig }), true},
		{"EXPIRATION_JITTER_MAX_SECONDS", baseEnv, "60", warned, nil, nil},
		{"LOCAL_CACHE_SIZE_IN_BYTES", baseEnv, "0", read, field(func(c serveConfig) any { return c.Redis.DenialCache }), false},
		{"LOCAL_CACHE_SIZE_IN_BYTES", baseEnv, "1048576", read, field(func(c serveConfig) any { return c.Redis.DenialCacheSize }), 4096},
		{"LOCAL_CACHE_SIZE_IN_BYTES", baseEnv, "-1", refusal, nil, nil},
		{"NEAR_LIMIT_RATIO", baseEnv, "0.9", read, field(func(c serveConfig) any { return c.NearLimitRatio }), 0.9},
		{"NEAR_LIMIT_RATIO", baseEnv, "1.5", refusal, nil, nil},
		{"CACHE_KEY_PREFIX", baseEnv, "team-a:", read, field(func(c serveConfig) any { return c.Redis.Prefix }), "team-a:"},
		{"BACKEND_TYPE", baseEnv, "redis", read, field(func(c serveConfig) any { return c.Redis.URL }), "unix:///var/run/nutcracker/ratelimit.sock"},
		{"BACKEND_TYPE", baseEnv, "memory", read, field(func(c serveConfig) any { return c.Redis.Enabled() }), false},
		{"BACKEND_TYPE", baseEnv, "memcache", refusal, nil, nil},
		{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", baseEnv, "false", read, field(func(c serveConfig) any { return c.Overdraft }),
			server.Overdraft{On: true, Bursts: 1, Counting: limiter.CountAlways}},
		{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", baseEnv, "true", read, field(func(c serveConfig) any { return c.Overdraft }),
			server.Overdraft{On: true, Bursts: 1, Counting: limiter.CountWhereDenied}},
		{"LIMIT_RESPONSE_HEADERS_ENABLED", baseEnv, "true", read, field(func(c serveConfig) any { return c.RateLimitHeaders }), server.RateLimitHeadersIncumbent},
		{"LIMIT_RESPONSE_HEADERS_ENABLED", baseEnv, "true", read, field(func(c serveConfig) any { return c.RateLimitHeaderNames }), server.DefaultRateLimitHeaderNames()},
		{"LIMIT_RESPONSE_HEADERS_ENABLED", baseEnv, "false", read, field(func(c serveConfig) any { return c.RateLimitHeaders }), server.RateLimitHeadersOff},
		{"LIMIT_LIMIT_HEADER", withEnv(baseEnv, "LIMIT_RESPONSE_HEADERS_ENABLED", "true"), "X-Limit", read, field(func(c serveConfig) any { return c.RateLimitHeaderNames }),
			server.HeaderNames{Limit: "X-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}},
		{"LIMIT_REMAINING_HEADER", withEnv(baseEnv, "LIMIT_RESPONSE_HEADERS_ENABLED", "true"), "X-Remaining", read, field(func(c serveConfig) any { return c.RateLimitHeaderNames }),
			server.HeaderNames{Limit: "RateLimit-Limit", Remaining: "X-Remaining", Reset: "RateLimit-Reset"}},
		{"LIMIT_RESET_HEADER", withEnv(baseEnv, "LIMIT_RESPONSE_HEADERS_ENABLED", "true"), "X-Reset", read, field(func(c serveConfig) any { return c.RateLimitHeaderNames }),
			server.HeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "X-Reset"}},
		{"LIMIT_RESET_HEADER", withEnv(baseEnv, "LIMIT_RESPONSE_HEADERS_ENABLED", "true"), "X Reset", refusal, nil, nil},
		{"LIMIT_LIMIT_HEADER", baseEnv, "X-Limit", read, field(func(c serveConfig) any { return c.RateLimitHeaders }), server.RateLimitHeadersOff}, // not read without LIMIT_RESPONSE_HEADERS_ENABLED, as by the incumbent
		{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", baseEnv, "true", warned, nil, nil},
		{"REDIS_SOCKET_TYPE", withEnv(baseEnv, "REDIS_URL", "redis:6379"), "tcp", read, field(func(c serveConfig) any { return c.Redis.URL }), "redis://redis:6379"},
		{"REDIS_SOCKET_TYPE", baseEnv, "udp", refusal, nil, nil},
		{"REDIS_TYPE", withEnv(redisTCP, "REDIS_URL", "mymaster,s1:26379,s2:26379"), "SENTINEL", read,
			field(func(c serveConfig) any {
				return c.Redis.SentinelMaster + " " + strings.Join(c.Redis.SentinelAddrs, ",")
			}), "mymaster s1:26379,s2:26379"},
		{"REDIS_TYPE", withEnv(redisTCP, "REDIS_URL", "r1:7000,r2:7000"), "cluster", read, field(func(c serveConfig) any { return c.Redis.ClusterAddrs }), []string{"r1:7000", "r2:7000"}},
		{"REDIS_TYPE", withEnv(redisTCP, "REDIS_URL", "s1:26379"), "sentinel", refusal, nil, nil}, // no master name
		{"REDIS_TYPE", redisTCP, "ring", refusal, nil, nil},
		{"REDIS_URL", withEnv(baseEnv, "REDIS_SOCKET_TYPE", "tcp"), "10.0.0.7:6379", read, field(func(c serveConfig) any { return c.Redis.URL }), "redis://10.0.0.7:6379"},
		{"REDIS_URL", withEnv(baseEnv, "REDIS_SOCKET_TYPE", "tcp"), "redis://10.0.0.7:6379", refusal, nil, nil},
		{"REDIS_POOL_SIZE", redisTCP, "20", read, field(func(c serveConfig) any { return c.Redis.PoolSize }), 20},
		{"REDIS_AUTH", redisTCP, "s3cret", read, field(func(c serveConfig) any { return c.Redis.URL }), "redis://:s3cret@redis:6379"},
		{"REDIS_AUTH", redisTCP, "rl:s3cret", read, field(func(c serveConfig) any { return c.Redis.URL }), "redis://rl:s3cret@redis:6379"},
		{"REDIS_AUTH", withEnv(redisTCP, "REDIS_TYPE", "cluster"), "rl:s3cret", read, field(func(c serveConfig) any { return c.Redis.Username + " " + c.Redis.Password }), "rl s3cret"},
		{"REDIS_SENTINEL_AUTH", withEnv(redisTCP, "REDIS_TYPE", "sentinel", "REDIS_URL", "m,s1:26379", "REDIS_AUTH", "pw"), "pw", read, field(func(c serveConfig) any { return c.Redis.Password }), "pw"},
		{"REDIS_SENTINEL_AUTH", withEnv(redisTCP, "REDIS_TYPE", "sentinel", "REDIS_URL", "m,s1:26379", "REDIS_AUTH", "pw"), "other", refusal, nil, nil},
		{"REDIS_SENTINEL_AUTH", redisTCP, "pw", warned, nil, nil}, // not Sentinel
		{"REDIS_TLS", redisTCP, "true", read, field(func(c serveConfig) any { return c.Redis.URL }), "rediss://redis:6379"},
		{"REDIS_TLS", withEnv(redisTCP, "REDIS_TYPE", "cluster"), "true", refusal, nil, nil}, // no file to turn TLS on with
		{"REDIS_TLS_CLIENT_CERT", withEnv(redisTCP, "REDIS_TLS", "true", "REDIS_TLS_CLIENT_KEY", "/rc/tls.key"), "/rc/tls.crt", read,
			field(func(c serveConfig) any { return c.Redis.TLSCertFile + " " + c.Redis.TLSKeyFile }), "/rc/tls.crt /rc/tls.key"},
		{"REDIS_TLS_CLIENT_CERT", redisTCP, "/rc/tls.crt", warned, nil, nil},                               // without REDIS_TLS
		{"REDIS_TLS_CLIENT_KEY", withEnv(redisTCP, "REDIS_TLS", "true"), "/rc/tls.key", refusal, nil, nil}, // without the cert
		{"REDIS_TLS_CACERT", withEnv(redisTCP, "REDIS_TLS", "true"), "/rc/ca.crt", read, field(func(c serveConfig) any { return c.Redis.TLSCAFile }), "/rc/ca.crt"},
		{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", withEnv(redisTCP, "REDIS_TLS", "true"), "true", refusal, nil, nil},
		{"REDIS_PIPELINE_WINDOW", redisTCP, "150us", read, field(func(c serveConfig) any { return c.Redis.BatchWait }), 150 * time.Microsecond},
		{"REDIS_PIPELINE_LIMIT", redisTCP, "8", warned, nil, nil},
		{"REDIS_CLUSTER_PIPELINE_PARALLELISM", redisTCP, "4", warned, nil, nil},
		{"REDIS_PERSECOND", redisTCP, "true", warned, nil, nil},
		{"REDIS_PERSECOND_SOCKET_TYPE", redisTCP, "tcp", warned, nil, nil},
		{"REDIS_PERSECOND_TYPE", redisTCP, "CLUSTER", warned, nil, nil},
		{"REDIS_PERSECOND_URL", redisTCP, "redis-ps:6379", warned, nil, nil},
		{"REDIS_PERSECOND_POOL_SIZE", redisTCP, "5", warned, nil, nil},
		{"REDIS_PERSECOND_AUTH", redisTCP, "pw", warned, nil, nil},
		{"REDIS_PERSECOND_TLS", redisTCP, "true", warned, nil, nil},
		{"REDIS_PERSECOND_SENTINEL_AUTH", redisTCP, "pw", warned, nil, nil},
		{"REDIS_PERSECOND_PIPELINE_WINDOW", redisTCP, "1ms", warned, nil, nil},
		{"REDIS_PERSECOND_PIPELINE_LIMIT", redisTCP, "4", warned, nil, nil},
		{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", redisTCP, "2", warned, nil, nil},
		{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", redisTCP, "false", warned, nil, nil},
		{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", redisTCP, "true", read, field(func(c serveConfig) any { return len(c.unhonoured) }), 0},
		{"REDIS_TIMEOUT", redisTCP, "2s", read, field(func(c serveConfig) any {
			return []time.Duration{c.Redis.DialTimeout, c.Redis.ReadTimeout, c.Redis.WriteTimeout}
		}), []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}},
		{"REDIS_PERSECOND_TIMEOUT", redisTCP, "1s", warned, nil, nil},
		{"REDIS_POOL_ON_EMPTY_BEHAVIOR", redisTCP, "ERROR", warned, nil, nil},
		{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", redisTCP, "CREATE", warned, nil, nil},
		{"REDIS_STARTUP_INITIAL_INTERVAL", redisTCP, "2s", warned, nil, nil},
		{"REDIS_STARTUP_MAX_INTERVAL", redisTCP, "1m", warned, nil, nil},
		{"REDIS_STARTUP_MAX_ELAPSED_TIME", redisTCP, "5m", warned, nil, nil},
		{"MEMCACHE_HOST_PORT", baseEnv, "mc:11211", warned, nil, nil},
		{"MEMCACHE_MAX_IDLE_CONNS", baseEnv, "4", warned, nil, nil},
		{"MEMCACHE_SRV", baseEnv, "_mc._tcp.example", warned, nil, nil},
		{"MEMCACHE_SRV_REFRESH", baseEnv, "1m", warned, nil, nil},
		{"MEMCACHE_TLS", baseEnv, "true", warned, nil, nil},
		{"MEMCACHE_TLS_CLIENT_CERT", baseEnv, "/m/c", warned, nil, nil},
		{"MEMCACHE_TLS_CLIENT_KEY", baseEnv, "/m/k", warned, nil, nil},
		{"MEMCACHE_TLS_CACERT", baseEnv, "/m/ca", warned, nil, nil},
		{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", baseEnv, "true", warned, nil, nil},
		{"SHADOW_MODE", baseEnv, "true", read, field(func(c serveConfig) any { return c.ShadowMode }), true},
		{"QUOTA_MODE", baseEnv, "false", read, field(func(c serveConfig) any { return c.QuotaMode }), server.QuotaModePerRule},
		{"QUOTA_MODE", baseEnv, "true", read, field(func(c serveConfig) any { return c.QuotaMode }), server.QuotaModeAll},
		{"RESPONSE_DYNAMIC_METADATA", baseEnv, "false", read, field(func(c serveConfig) any { return [2]any{c.DynamicMetadata, c.DescriptorMetadata} }),
			[2]any{server.DynamicMetadataOff, server.DescriptorMetadataOff}},
		{"RESPONSE_DYNAMIC_METADATA", baseEnv, "true", read, field(func(c serveConfig) any { return [2]any{c.DynamicMetadata, c.DescriptorMetadata} }),
			[2]any{server.DynamicMetadataAll, server.DescriptorMetadataIncumbent}},
		{"MERGE_DOMAIN_CONFIG", baseEnv, "true", read, field(func(c serveConfig) any { return len(c.unhonoured) }), 0},
		{"MERGE_DOMAIN_CONFIG", baseEnv, "sometimes", refusal, nil, nil},
		{"TRACING_ENABLED", baseEnv, "true", read, field(func(c serveConfig) any { return c.Tracing }),
			tracing.Config{Endpoint: "http://localhost:4318", Protocol: tracing.ProtocolHTTP, ServiceName: "RateLimit", SampleRatio: 1}},
		{"TRACING_SERVICE_NAME", tracingOn, "envoy-ratelimit", read, field(func(c serveConfig) any { return c.Tracing.ServiceName }), "envoy-ratelimit"},
		{"TRACING_SERVICE_NAME", baseEnv, "envoy-ratelimit", warned, nil, nil}, // without TRACING_ENABLED
		{"TRACING_SERVICE_NAMESPACE", tracingOn, "envoy-gateway-system", read, field(func(c serveConfig) any { return c.Tracing.ServiceNamespace }), "envoy-gateway-system"},
		{"TRACING_SERVICE_INSTANCE_ID", tracingOn, "envoy-ratelimit-7d9f", read, field(func(c serveConfig) any { return c.Tracing.ServiceInstanceID }), "envoy-ratelimit-7d9f"},
		{"TRACING_EXPORTER_PROTOCOL", tracingOn, "grpc", read, field(func(c serveConfig) any { return [2]any{c.Tracing.Protocol, c.Tracing.Endpoint} }), [2]any{tracing.ProtocolGRPC, "http://localhost:4317"}},
		{"TRACING_EXPORTER_PROTOCOL", tracingOn, "zipkin", refusal, nil, nil},
		{"TRACING_SAMPLING_RATE", tracingOn, "0.1", read, field(func(c serveConfig) any { return c.Tracing.SampleRatio }), 0.1},
		{"TRACING_SAMPLING_RATE", tracingOn, "5", read, field(func(c serveConfig) any { return c.Tracing.SampleRatio }), 1.0},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", tracingOn, "http://otel-collector.monitoring:4318", read, field(func(c serveConfig) any { return c.Tracing.Endpoint }), "http://otel-collector.monitoring:4318"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", tracingOn, "otel-collector:4318", refusal, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value+"/"+tt.what, func(t *testing.T) {
			env := withEnv(tt.env, tt.name, tt.value)
			c, err := incumbentParse(env)
			switch tt.what {
			case read:
				if err != nil {
					t.Fatalf("parse: %v", err)
				}
				if got := tt.field(c); !reflect.DeepEqual(got, tt.want) {
					t.Errorf("%s=%s: got %#v, want %#v", tt.name, tt.value, got, tt.want)
				}
			case warned:
				if err != nil {
					t.Fatalf("parse: %v", err)
				}
				if !slices.ContainsFunc(c.unhonoured, func(w string) bool { return strings.HasPrefix(w, tt.name+"=") || strings.HasPrefix(w, tt.name+":") }) {
					t.Errorf("%s=%s: the startup warning does not name it: %q", tt.name, tt.value, c.unhonoured)
				}
			case refusal:
				if err == nil || !strings.Contains(err.Error(), tt.name) {
					t.Errorf("%s=%s: error %v, want one naming %s", tt.name, tt.value, err, tt.name)
				}
			}
		})
	}
	t.Run("every variable has a case", func(t *testing.T) {
		cased := map[string]bool{}
		for _, tt := range tests {
			cased[tt.name] = true
		}
		for _, name := range envcompat.Names() {
			if !cased[name] {
				t.Errorf("%s: no case in TestIncumbentVariables", name)
			}
		}
	})
}

func boolStr(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// TestReplacingDocListsEveryVariable checks that the settings table of
// docs/replacing-envoyproxy-ratelimit.md has exactly one row per setting
// in envcompat's table (which TestIncumbentVariables covers).
func TestReplacingDocListsEveryVariable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/replacing-envoyproxy-ratelimit.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Z0-9_]+)` \\|").FindAllStringSubmatch(string(doc), -1) {
		rows[m[1]]++
	}
	for _, name := range envcompat.Names() {
		switch rows[name] {
		case 1:
		case 0:
			t.Errorf("%s: no row in the doc's table", name)
		default:
			t.Errorf("%s: %d rows in the doc's table, want 1", name, rows[name])
		}
		delete(rows, name)
	}
	for name := range rows {
		t.Errorf("%s: a row in the doc's table, but not a setting ratelimitd reads", name)
	}
}

// TestRateLimitHeaderNames: how --ratelimit-header-names is read, from the
// command line, ratelimitd's environment and the incumbent's, and that a
// mode chosen on the command line wins over the incumbent's
// LIMIT_RESPONSE_HEADERS_ENABLED, names and all.
func TestRateLimitHeaderNames(t *testing.T) {
	custom := server.HeaderNames{Limit: "A-Limit", Remaining: "A-Remaining", Reset: "A-Reset"}
	incumbentOn := withEnv(baseEnv, "LIMIT_RESPONSE_HEADERS_ENABLED", "true", "LIMIT_LIMIT_HEADER", "A-Limit",
		"LIMIT_REMAINING_HEADER", "A-Remaining", "LIMIT_RESET_HEADER", "A-Reset")
	tests := []struct {
		name      string
		parse     func() (serveConfig, error)
		wantMode  server.RateLimitHeaders
		wantNames server.HeaderNames
		wantErr   string
	}{
		{"the command line, spaces after commas", func() (serveConfig, error) {
			return parseServeFlags([]string{"--config", "x", "--ratelimit-headers", "incumbent", "--ratelimit-header-names", "A-Limit, A-Remaining, A-Reset"}, noEnv, io.Discard)
		}, server.RateLimitHeadersIncumbent, custom, ""},
		{"ratelimitd's environment", func() (serveConfig, error) {
			env := map[string]string{"RATELIMITD_RATELIMIT_HEADERS": "incumbent", "RATELIMITD_RATELIMIT_HEADER_NAMES": "A-Limit,A-Remaining,A-Reset"}
			return parseServeFlags([]string{"--config", "x"}, func(k string) string { return env[k] }, io.Discard)
		}, server.RateLimitHeadersIncumbent, custom, ""},
		{"ratelimitd's environment, another mode", func() (serveConfig, error) {
			env := map[string]string{"RATELIMITD_RATELIMIT_HEADER_NAMES": "A-Limit,A-Remaining,A-Reset"}
			return parseServeFlags([]string{"--config", "x", "--ratelimit-headers", "ietf"}, func(k string) string { return env[k] }, io.Discard)
		}, 0, server.HeaderNames{}, "RATELIMITD_RATELIMIT_HEADER_NAMES: only with --ratelimit-headers incumbent"},
		{"the incumbent's environment", func() (serveConfig, error) { return incumbentParse(incumbentOn) },
			server.RateLimitHeadersIncumbent, custom, ""},
		{"the incumbent's environment, another mode on the command line", func() (serveConfig, error) {
			return incumbentParse(incumbentOn, "--ratelimit-headers", "draft03")
		}, server.RateLimitHeadersDraft03, server.HeaderNames{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.parse()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.RateLimitHeaders != tt.wantMode || c.RateLimitHeaderNames != tt.wantNames {
				t.Errorf("mode %v names %+v, want %v %+v", c.RateLimitHeaders, c.RateLimitHeaderNames, tt.wantMode, tt.wantNames)
			}
			for _, u := range c.unhonoured {
				if strings.HasPrefix(u, "LIMIT_") {
					t.Errorf("warned of %q: the incumbent's header settings are honoured", u)
				}
			}
		})
	}
}

// TestEnvCompatVariable: the variable envcompat defaults under the
// incumbent's program name is --env-compat's own.
func TestEnvCompatVariable(t *testing.T) {
	if got := envcompat.VarName("env-compat"); got != envcompat.CompatVar {
		t.Errorf("envcompat.VarName(env-compat) = %s, envcompat.CompatVar = %s: want the same", got, envcompat.CompatVar)
	}
}
