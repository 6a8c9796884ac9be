package envcompat

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// incumbentSettings are the envoyproxy/ratelimit settings ratelimitd reads,
// parsed (src/settings/settings.go@f2fb157 names their types and
// defaults). set holds the names given in the environment.
type incumbentSettings struct {
	set map[string]bool

	host, debugHost, grpcHost       string
	port, debugPort, grpcPort       int64
	grpcMaxAge, grpcMaxAgeGrace     time.Duration
	grpcUseTLS                      bool
	grpcCert, grpcKey, grpcClientCA string
	logLevel, logFormat             string

	configType, backendType string
	forceStart              bool
	xdsNodeID, xdsMetadata  string
	xdsURL, xdsHeaders      string
	xdsRetry, xdsMaxBackoff time.Duration
	xdsTLS                  bool
	xdsCert, xdsKey         string
	xdsCA, xdsSAN           string
	xdsMaxMsg               int64

	usePrometheus        bool
	promAddr, promPath   string
	runtimeRoot          string
	runtimeSub           string
	runtimeApp           string
	ignoreDotFiles       bool
	watchRoot            bool
	localCacheBytes      int64
	nearLimitRatio       float64
	cacheKeyPrefix       string
	stopIncrement        bool
	limitHeaders         bool
	limitHeaderNames     [3]string // LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER
	shadowMode           bool
	quotaMode            bool
	dynamicMetadata      bool
	redisSocket          string
	redisType, redisURL  string
	redisPool            int64
	redisAuth            string
	redisSentinelAuth    string
	redisTLS             bool
	redisCert, redisKey  string
	redisCA              string
	redisSkipVerify      bool
	redisPipelineWindow  time.Duration
	redisTimeout         time.Duration
	tracingEnabled       bool
	tracingName          string
	tracingNamespace     string
	tracingInstance      string
	tracingProtocol      string
	tracingRate          float64
	otlpEndpoint         string
	unhonoured, refusals []string
}

// incumbentVar is one of envoyproxy/ratelimit's settings and what
// ratelimitd does with it: read parses its value (def when unset) into the
// settings, or, for a setting ratelimitd does not honour, names it among
// the unhonoured (a warning) or the refusals when it is set to a value
// that would matter. Every setting of settings.go@f2fb157 has a row, so
// that none is dropped in silence; docs/replacing-envoyproxy-ratelimit.md
// has a row for each, and a test checks that the two agree.
type incumbentVar struct {
	name, def string
	read      func(s *incumbentSettings, name, v string) error
}

// The row builders: each parses the value as envoyproxy/ratelimit's
// envconfig does (strconv.ParseBool, ParseInt base 0, ParseFloat,
// time.ParseDuration) into a field of the settings.

func str(f func(*incumbentSettings) *string) func(*incumbentSettings, string, string) error {
	return func(s *incumbentSettings, _, v string) error { *f(s) = v; return nil }
}

func boolean(f func(*incumbentSettings) *bool) func(*incumbentSettings, string, string) error {
	return parsed(strconv.ParseBool, "want true or false", f)
}

func integer(f func(*incumbentSettings) *int64) func(*incumbentSettings, string, string) error {
	return parsed(func(v string) (int64, error) { return strconv.ParseInt(v, 0, 64) }, "want an integer", f)
}

func float(f func(*incumbentSettings) *float64) func(*incumbentSettings, string, string) error {
	return parsed(func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }, "want a number", f)
}

func duration(f func(*incumbentSettings) *time.Duration) func(*incumbentSettings, string, string) error {
	return parsed(time.ParseDuration, "want a duration such as 10s or 1h", f)
}

// parsed is the row builder of a setting parse reads into the field f
// selects; a value parse refuses is the error want.
func parsed[T any](parse func(string) (T, error), want string, f func(*incumbentSettings) *T) func(*incumbentSettings, string, string) error {
	return func(s *incumbentSettings, _, v string) error {
		x, err := parse(v)
		if err != nil {
			return errors.New(want)
		}
		*f(s) = x
		return nil
	}
}

// unhonoured is the row of a setting ratelimitd does not honour: set to a
// value other than ok (compared case-insensitively; booleans as parsed),
// it is named in the startup warning with why.
func unhonoured(why string, ok ...string) func(*incumbentSettings, string, string) error {
	return notHonoured(false, why, ok)
}

// refused is the row of a setting ratelimitd does not honour where
// ignoring it would change what is limited (or who may call): set to a
// value other than ok, it stops the start with why.
func refused(why string, ok ...string) func(*incumbentSettings, string, string) error {
	return notHonoured(true, why, ok)
}

func notHonoured(refuse bool, why string, ok []string) func(*incumbentSettings, string, string) error {
	return func(s *incumbentSettings, name, v string) error {
		if !s.set[name] || sameValue(v, ok) {
			return nil
		}
		msg := fmt.Sprintf("%s=%q: %s", name, v, why)
		if refuse {
			s.refusals = append(s.refusals, msg)
		} else {
			s.unhonoured = append(s.unhonoured, msg)
		}
		return nil
	}
}

// sameValue reports whether v is one of ok, as a boolean or a string
// (case-insensitively).
func sameValue(v string, ok []string) bool {
	for _, o := range ok {
		vb, verr := strconv.ParseBool(v)
		ob, oerr := strconv.ParseBool(o)
		if verr == nil && oerr == nil && vb == ob || strings.EqualFold(strings.TrimSpace(v), o) {
			return true
		}
	}
	return false
}

const (
	noStatsd    = "ratelimitd sends no statsd; its metrics are Prometheus's, at /metrics (and at PROMETHEUS_ADDR with USE_PROMETHEUS=true)"
	noMemcache  = "ratelimitd has no memcache backend (BACKEND_TYPE=memcache is refused)"
	noPerSecond = "ratelimitd keeps per-second limits in the one Redis of REDIS_URL"
)

// incumbentVars are all the settings of envoyproxy/ratelimit's
// src/settings/settings.go@f2fb157, in its order, plus
// GRPC_SERVER_TLS_CA_CERT (which Envoy Gateway sets, and the incumbent
// does not read) and OTEL_EXPORTER_OTLP_ENDPOINT (which its tracing reads).
var incumbentVars = []incumbentVar{
	{"HOST", "0.0.0.0", str(func(s *incumbentSettings) *string { return &s.host })},
	{"PORT", "8080", integer(func(s *incumbentSettings) *int64 { return &s.port })},
	{"DEBUG_HOST", "0.0.0.0", str(func(s *incumbentSettings) *string { return &s.debugHost })},
	{"DEBUG_PORT", "6070", integer(func(s *incumbentSettings) *int64 { return &s.debugPort })},
	{"GRPC_UDS", "", refused("ratelimitd serves gRPC over TCP only: set GRPC_HOST and GRPC_PORT", "")},
	{"GRPC_HOST", "0.0.0.0", str(func(s *incumbentSettings) *string { return &s.grpcHost })},
	{"GRPC_PORT", "8081", integer(func(s *incumbentSettings) *int64 { return &s.grpcPort })},
	{"GRPC_MAX_CONNECTION_AGE", "24h", duration(func(s *incumbentSettings) *time.Duration { return &s.grpcMaxAge })},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "1h", duration(func(s *incumbentSettings) *time.Duration { return &s.grpcMaxAgeGrace })},
	{"GRPC_SERVER_USE_TLS", "false", boolean(func(s *incumbentSettings) *bool { return &s.grpcUseTLS })},
	{"GRPC_SERVER_TLS_CERT", "", str(func(s *incumbentSettings) *string { return &s.grpcCert })},
	{"GRPC_SERVER_TLS_KEY", "", str(func(s *incumbentSettings) *string { return &s.grpcKey })},
	{"GRPC_CLIENT_TLS_CACERT", "", str(func(s *incumbentSettings) *string { return &s.grpcClientCA })},
	{"GRPC_CLIENT_TLS_SAN", "", refused("ratelimitd does not check a client certificate's SAN; it accepts every client certificate GRPC_CLIENT_TLS_CACERT's CAs signed", "")},
	{"GRPC_SERVER_TLS_CA_CERT", "", unhonoured("not read, as envoyproxy/ratelimit does not read it either (it reads GRPC_CLIENT_TLS_CACERT): client certificates are not required; set GRPC_CLIENT_TLS_CACERT to require them", "")},
	{"LOG_LEVEL", "WARN", str(func(s *incumbentSettings) *string { return &s.logLevel })},
	{"LOG_FORMAT", "text", str(func(s *incumbentSettings) *string { return &s.logFormat })},
	{"CONFIG_TYPE", "FILE", str(func(s *incumbentSettings) *string { return &s.configType })},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "false", boolean(func(s *incumbentSettings) *bool { return &s.forceStart })},
	{"CONFIG_GRPC_XDS_NODE_ID", "default", str(func(s *incumbentSettings) *string { return &s.xdsNodeID })},
	{"CONFIG_GRPC_XDS_NODE_METADATA", "", str(func(s *incumbentSettings) *string { return &s.xdsMetadata })},
	{"CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000", str(func(s *incumbentSettings) *string { return &s.xdsURL })},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s", duration(func(s *incumbentSettings) *time.Duration { return &s.xdsRetry })},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "", str(func(s *incumbentSettings) *string { return &s.xdsHeaders })},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "false", boolean(func(s *incumbentSettings) *bool { return &s.xdsTLS })},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", str(func(s *incumbentSettings) *string { return &s.xdsCert })},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", str(func(s *incumbentSettings) *string { return &s.xdsKey })},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", str(func(s *incumbentSettings) *string { return &s.xdsCA })},
	{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", str(func(s *incumbentSettings) *string { return &s.xdsSAN })},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s", unhonoured("ratelimitd has one backoff for dialling and for broken streams, starting at CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")},
	{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s", duration(func(s *incumbentSettings) *time.Duration { return &s.xdsMaxBackoff })},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5", unhonoured("ratelimitd's backoff always has jitter of its own", "0.5")},
	{"XDS_CLIENT_BACKOFF_JITTER", "true", unhonoured("ratelimitd's backoff always has jitter", "true")},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "", integer(func(s *incumbentSettings) *int64 { return &s.xdsMaxMsg })},
	{"USE_DOG_STATSD", "false", unhonoured(noStatsd, "false")},
	{"USE_DOG_STATSD_MOGRIFIERS", "", unhonoured(noStatsd, "")},
	{"USE_STATSD", "true", unhonoured(noStatsd, "false")},
	{"STATSD_HOST", "localhost", unhonoured(noStatsd)},
	{"STATSD_PORT", "8125", unhonoured(noStatsd)},
	{"EXTRA_TAGS", "", unhonoured("ratelimitd adds no extra labels to its metrics", "")},
	{"STATS_FLUSH_INTERVAL", "10s", unhonoured("Prometheus metrics are read when scraped; there is nothing to flush")},
	{"DISABLE_STATS", "false", unhonoured("ratelimitd's metrics are always kept (they cost a few atomic adds per call)", "false")},
	{"USE_PROMETHEUS", "false", boolean(func(s *incumbentSettings) *bool { return &s.usePrometheus })},
	{"PROMETHEUS_ADDR", ":9090", str(func(s *incumbentSettings) *string { return &s.promAddr })},
	{"PROMETHEUS_PATH", "/metrics", str(func(s *incumbentSettings) *string { return &s.promPath })},
	{"PROMETHEUS_MAPPER_YAML", "", unhonoured("not read: the metric names are those of envoyproxy/ratelimit's default mapper (which Envoy Gateway's statsd_conf.yaml repeats)", "")},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false", unhonoured("ratelimit_service_response_time_seconds is in seconds", "false")},
	{"RUNTIME_ROOT", "/srv/runtime_data/current", str(func(s *incumbentSettings) *string { return &s.runtimeRoot })},
	{"RUNTIME_SUBDIRECTORY", "", str(func(s *incumbentSettings) *string { return &s.runtimeSub })},
	{"RUNTIME_APPDIRECTORY", "config", str(func(s *incumbentSettings) *string { return &s.runtimeApp })},
	{"RUNTIME_IGNOREDOTFILES", "false", boolean(func(s *incumbentSettings) *bool { return &s.ignoreDotFiles })},
	{"RUNTIME_WATCH_ROOT", "true", boolean(func(s *incumbentSettings) *bool { return &s.watchRoot })},
	{"EXPIRATION_JITTER_MAX_SECONDS", "300", unhonoured("ratelimitd's Redis keys expire when their bucket is full again, without jitter")},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "0", integer(func(s *incumbentSettings) *int64 { return &s.localCacheBytes })},
	{"NEAR_LIMIT_RATIO", "0.8", float(func(s *incumbentSettings) *float64 { return &s.nearLimitRatio })},
	{"CACHE_KEY_PREFIX", "", str(func(s *incumbentSettings) *string { return &s.cacheKeyPrefix })},
	{"BACKEND_TYPE", "redis", str(func(s *incumbentSettings) *string { return &s.backendType })},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", boolean(func(s *incumbentSettings) *bool { return &s.stopIncrement })},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "false", boolean(func(s *incumbentSettings) *bool { return &s.limitHeaders })},
	{"LIMIT_LIMIT_HEADER", "RateLimit-Limit", str(func(s *incumbentSettings) *string { return &s.limitHeaderNames[0] })},
	{"LIMIT_REMAINING_HEADER", "RateLimit-Remaining", str(func(s *incumbentSettings) *string { return &s.limitHeaderNames[1] })},
	{"LIMIT_RESET_HEADER", "RateLimit-Reset", str(func(s *incumbentSettings) *string { return &s.limitHeaderNames[2] })},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false", unhonoured("ratelimitd's readiness has its own rule (docs/running.md): ready once a config is loaded, or at once with FORCE_START_WITHOUT_INITIAL_CONFIG")},
	{"REDIS_SOCKET_TYPE", "unix", str(func(s *incumbentSettings) *string { return &s.redisSocket })},
	{"REDIS_TYPE", "SINGLE", str(func(s *incumbentSettings) *string { return &s.redisType })},
	{"REDIS_URL", "/var/run/nutcracker/ratelimit.sock", str(func(s *incumbentSettings) *string { return &s.redisURL })},
	{"REDIS_POOL_SIZE", "10", integer(func(s *incumbentSettings) *int64 { return &s.redisPool })},
	{"REDIS_AUTH", "", str(func(s *incumbentSettings) *string { return &s.redisAuth })},
	{"REDIS_TLS", "false", boolean(func(s *incumbentSettings) *bool { return &s.redisTLS })},
	{"REDIS_TLS_CLIENT_CERT", "", str(func(s *incumbentSettings) *string { return &s.redisCert })},
	{"REDIS_TLS_CLIENT_KEY", "", str(func(s *incumbentSettings) *string { return &s.redisKey })},
	{"REDIS_TLS_CACERT", "", str(func(s *incumbentSettings) *string { return &s.redisCA })},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false", boolean(func(s *incumbentSettings) *bool { return &s.redisSkipVerify })},
	{"REDIS_PIPELINE_WINDOW", "0", duration(func(s *incumbentSettings) *time.Duration { return &s.redisPipelineWindow })},
	{"REDIS_PIPELINE_LIMIT", "0", unhonoured("a no-op in envoyproxy/ratelimit too; ratelimitd's batches are bounded by --redis-batch-max", "0")},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "1", unhonoured("ratelimitd sends each Cluster node's batch on its own, all nodes at once")},
	{"REDIS_PERSECOND", "false", unhonoured(noPerSecond, "false")},
	{"REDIS_PERSECOND_SOCKET_TYPE", "unix", unhonoured(noPerSecond)},
	{"REDIS_PERSECOND_TYPE", "SINGLE", unhonoured(noPerSecond)},
	{"REDIS_PERSECOND_URL", "/var/run/nutcracker/ratelimitpersecond.sock", unhonoured(noPerSecond)},
	{"REDIS_PERSECOND_POOL_SIZE", "10", unhonoured(noPerSecond)},
	{"REDIS_PERSECOND_AUTH", "", unhonoured(noPerSecond, "")},
	{"REDIS_PERSECOND_TLS", "false", unhonoured(noPerSecond, "false")},
	{"REDIS_SENTINEL_AUTH", "", str(func(s *incumbentSettings) *string { return &s.redisSentinelAuth })},
	{"REDIS_PERSECOND_SENTINEL_AUTH", "", unhonoured(noPerSecond, "")},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "0", unhonoured(noPerSecond, "0")},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "0", unhonoured(noPerSecond, "0")},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "1", unhonoured(noPerSecond)},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false", unhonoured("ratelimitd's health always follows Redis (a failing Redis makes it not ready), whatever this says", "true")},
	{"REDIS_TIMEOUT", "10s", duration(func(s *incumbentSettings) *time.Duration { return &s.redisTimeout })},
	{"REDIS_PERSECOND_TIMEOUT", "10s", unhonoured(noPerSecond)},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT", unhonoured("a call waits for a free Redis connection up to --redis-pool-timeout", "WAIT")},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT", unhonoured(noPerSecond, "WAIT")},
	{"REDIS_STARTUP_INITIAL_INTERVAL", "1s", unhonoured("ratelimitd starts without waiting for Redis, answers per --on-backend-failure until it answers, and reconnects on its own")},
	{"REDIS_STARTUP_MAX_INTERVAL", "30s", unhonoured("ratelimitd starts without waiting for Redis, answers per --on-backend-failure until it answers, and reconnects on its own")},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", "0", unhonoured("ratelimitd starts without waiting for Redis, answers per --on-backend-failure until it answers, and reconnects on its own", "0")},
	{"MEMCACHE_HOST_PORT", "", unhonoured(noMemcache, "")},
	{"MEMCACHE_MAX_IDLE_CONNS", "2", unhonoured(noMemcache)},
	{"MEMCACHE_SRV", "", unhonoured(noMemcache, "")},
	{"MEMCACHE_SRV_REFRESH", "0", unhonoured(noMemcache, "0")},
	{"MEMCACHE_TLS", "false", unhonoured(noMemcache, "false")},
	{"MEMCACHE_TLS_CLIENT_CERT", "", unhonoured(noMemcache, "")},
	{"MEMCACHE_TLS_CLIENT_KEY", "", unhonoured(noMemcache, "")},
	{"MEMCACHE_TLS_CACERT", "", unhonoured(noMemcache, "")},
	{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "false", unhonoured(noMemcache, "false")},
	{"SHADOW_MODE", "false", boolean(func(s *incumbentSettings) *bool { return &s.shadowMode })},
	{"QUOTA_MODE", "false", boolean(func(s *incumbentSettings) *bool { return &s.quotaMode })},
	{"RESPONSE_DYNAMIC_METADATA", "false", boolean(func(s *incumbentSettings) *bool { return &s.dynamicMetadata })},
	{"MERGE_DOMAIN_CONFIG", "false", boolean(func(*incumbentSettings) *bool { return new(bool) })},
	{"TRACING_ENABLED", "false", boolean(func(s *incumbentSettings) *bool { return &s.tracingEnabled })},
	{"TRACING_SERVICE_NAME", "RateLimit", str(func(s *incumbentSettings) *string { return &s.tracingName })},
	{"TRACING_SERVICE_NAMESPACE", "", str(func(s *incumbentSettings) *string { return &s.tracingNamespace })},
	{"TRACING_SERVICE_INSTANCE_ID", "", str(func(s *incumbentSettings) *string { return &s.tracingInstance })},
	{"TRACING_EXPORTER_PROTOCOL", "http", str(func(s *incumbentSettings) *string { return &s.tracingProtocol })},
	{"TRACING_SAMPLING_RATE", "1", float(func(s *incumbentSettings) *float64 { return &s.tracingRate })},
	{"OTEL_EXPORTER_OTLP_ENDPOINT", "", str(func(s *incumbentSettings) *string { return &s.otlpEndpoint })},
}
