// Package envcompat is ratelimitd's environment: it sets ratelimitd's
// flags from their RATELIMITD_* variables (Env.Apply) and, as --env-compat
// says (ForMode), from envoyproxy/ratelimit's environment (its settings.go
// variables, with its defaults), so that ratelimitd runs unchanged where
// that project ran: Envoy Gateway's and Istio's Deployments. Each of that
// project's settings is honoured (mapped to a flag), warned of (set, but
// not what ratelimitd does), or refused (set to a value that would matter
// and cannot be honoured); the table is in vars.go and
// docs/replacing-envoyproxy-ratelimit.md lists every row. It also has the
// flags that project's deployments need (AddDropInFlags) and the check of
// its config directory's layout (CheckConfigLayout). It reads the
// environment only through the getenv it is given.
package envcompat

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
)

// The values of --env-compat (CompatVar). Running the binary under the
// name "ratelimit" (the image's /bin/ratelimit, which Envoy Gateway's and
// Istio's Deployments run) defaults it to envoyproxy.
const (
	// CompatVar is the variable of --env-compat.
	CompatVar  = "RATELIMITD_ENV_COMPAT"
	Native     = ""
	Envoyproxy = "envoyproxy"
	// Program is the binary name that selects Envoyproxy.
	Program = "ratelimit"
)

// Env is what ratelimitd makes of envoyproxy/ratelimit's environment:
// values for its own flags, as if they were RATELIMITD_* variables of
// lower precedence (a flag on the command line, or its RATELIMITD_
// variable, wins), and what it does not honour.
type Env struct {
	// Flags maps flag names to values.
	Flags map[string]string
	// Spelt maps each flag in Flags to the variables it came from, for
	// messages ("REDIS_URL", "HOST and PORT").
	Spelt map[string]string
	// Tracing is the exporter of the TRACING_* settings.
	Tracing tracing.Config
	// Unhonoured are the settings given that ratelimitd does not honour,
	// each "NAME=value: why", for the one startup warning.
	Unhonoured []string
}

// set gives flag the value v, from the variables spelt.
func (e *Env) set(flag, v, spelt string) {
	e.Flags[flag] = v
	e.Spelt[flag] = spelt
}

// flagVar is a flag, the value a variable gave it and that variable's
// name.
type flagVar struct{ flag, v, spelt string }

// setGiven sets each of fs whose variable was given (not empty).
func (e *Env) setGiven(fs ...flagVar) {
	for _, f := range fs {
		if f.v != "" {
			e.set(f.flag, f.v, f.spelt)
		}
	}
}

// Read reads envoyproxy/ratelimit's settings through getenv,
// with its defaults (src/settings/settings.go@f2fb157), and maps them onto
// ratelimitd's flags. Every problem is returned, each naming its variable.
func Read(getenv func(string) string) (Env, error) {
	s := incumbentSettings{set: map[string]bool{}}
	var errs []error
	for _, v := range incumbentVars {
		val := getenv(v.name)
		if val != "" {
			s.set[v.name] = true
		} else {
			val = v.def
		}
		if s.set[v.name] || val != "" {
			if err := v.read(&s, v.name, val); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", v.name, val, err))
			}
		}
	}
	e := Env{Flags: map[string]string{}, Spelt: map[string]string{}}
	if len(errs) == 0 {
		errs = append(errs, e.mapListeners(&s)...)
		errs = append(errs, e.mapConfigSource(&s)...)
		errs = append(errs, e.mapBackend(&s)...)
		errs = append(errs, e.mapAnswers(&s)...)
		errs = append(errs, e.mapTracing(&s)...)
	}
	for _, r := range s.refusals {
		errs = append(errs, errors.New(r))
	}
	e.Unhonoured = s.unhonoured
	return e, errors.Join(errs...)
}

// hostPort joins the host and port settings hostVar and portVar.
func hostPort(host string, port int64, portVar string) (string, error) {
	if port < 0 || port > 65535 {
		return "", fmt.Errorf("%s=%d: want a port, 0 to 65535", portVar, port)
	}
	return net.JoinHostPort(host, strconv.FormatInt(port, 10)), nil
}

// mapListeners maps the listeners, gRPC TLS and ageing, logging and the
// Prometheus listener; settings that only matter with another one unset
// (the TLS files without GRPC_SERVER_USE_TLS) are unhonoured, as they are
// ignored by envoyproxy/ratelimit too.
func (e *Env) mapListeners(s *incumbentSettings) []error {
	var errs []error
	for _, l := range []struct {
		flag, hostVar, portVar string
		host                   string
		port                   int64
	}{
		{"http-addr", "HOST", "PORT", s.host, s.port},
		{"grpc-addr", "GRPC_HOST", "GRPC_PORT", s.grpcHost, s.grpcPort},
		{"debug-addr", "DEBUG_HOST", "DEBUG_PORT", s.debugHost, s.debugPort},
	} {
		addr, err := hostPort(l.host, l.port, l.portVar)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		e.set(l.flag, addr, l.hostVar+" and "+l.portVar)
	}
	e.set("grpc-max-connection-age", s.grpcMaxAge.String(), "GRPC_MAX_CONNECTION_AGE")
	e.set("grpc-max-connection-age-grace", s.grpcMaxAgeGrace.String(), "GRPC_MAX_CONNECTION_AGE_GRACE")
	if s.grpcUseTLS {
		if s.grpcCert == "" || s.grpcKey == "" {
			errs = append(errs, errors.New("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"))
		}
		e.set("grpc-tls-cert", s.grpcCert, "GRPC_SERVER_TLS_CERT")
		e.set("grpc-tls-key", s.grpcKey, "GRPC_SERVER_TLS_KEY")
		if s.grpcClientCA != "" {
			e.set("grpc-client-ca", s.grpcClientCA, "GRPC_CLIENT_TLS_CACERT")
		}
	} else {
		s.notUsedWithout("GRPC_SERVER_USE_TLS=true", ": gRPC is served in plaintext", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT")
	}
	// logrus's levels: slog has no trace, fatal or panic.
	switch lvl := strings.ToLower(s.logLevel); lvl {
	case "debug", "info", "warn", "error":
		e.set("log-level", lvl, "LOG_LEVEL")
	case "warning":
		e.set("log-level", "warn", "LOG_LEVEL")
	case "trace":
		e.set("log-level", "debug", "LOG_LEVEL")
		s.unhonoured = append(s.unhonoured, "LOG_LEVEL=\""+s.logLevel+"\": logged at debug, ratelimitd's lowest level")
	case "fatal", "panic":
		e.set("log-level", "error", "LOG_LEVEL")
		s.unhonoured = append(s.unhonoured, "LOG_LEVEL=\""+s.logLevel+"\": logged at error, ratelimitd's highest level")
	default:
		errs = append(errs, fmt.Errorf("LOG_LEVEL=%q: want trace, debug, info, warn, error, fatal or panic", s.logLevel))
	}
	// envoyproxy/ratelimit logs JSON for "json" in any case, text otherwise.
	format := "text"
	if strings.EqualFold(s.logFormat, "json") {
		format = "json"
	}
	e.set("log-format", format, "LOG_FORMAT")
	if s.usePrometheus {
		e.set("metrics-addr", s.promAddr, "PROMETHEUS_ADDR")
		e.set("metrics-path", s.promPath, "PROMETHEUS_PATH")
		e.set("incumbent-metrics", "true", "USE_PROMETHEUS")
	} else {
		s.notUsedWithout("USE_PROMETHEUS=true", "; ratelimitd's own metrics are at /metrics on HOST:PORT", "PROMETHEUS_ADDR", "PROMETHEUS_PATH")
	}
	return errs
}

// notUsedWithout records, for each of names the environment sets, that it
// is not honoured without the switch on ("USE_PROMETHEUS=true"), as in
// envoyproxy/ratelimit; rest (": gRPC is served in plaintext", or empty)
// ends the note.
func (s *incumbentSettings) notUsedWithout(on, rest string, names ...string) {
	for _, name := range names {
		if s.set[name] {
			s.unhonoured = append(s.unhonoured, name+": not used without "+on+" (as in envoyproxy/ratelimit)"+rest)
		}
	}
}

// mapConfigSource maps CONFIG_TYPE: the file directory of the RUNTIME_*
// settings, or the xDS client of the CONFIG_GRPC_XDS_* ones.
func (e *Env) mapConfigSource(s *incumbentSettings) []error {
	var errs []error
	switch strings.ToUpper(s.configType) {
	case "FILE":
		// envoyproxy/ratelimit's file provider loads ROOT/SUBDIRECTORY/APPDIRECTORY
		// (src/provider/file_provider.go@f2fb157, through goruntime): with
		// RUNTIME_WATCH_ROOT=true it loads ROOT/SUBDIRECTORY and keeps the
		// keys under APPDIRECTORY, which are the same files; but an empty
		// SUBDIRECTORY then gives goruntime's nil loader, and no config.
		if s.watchRoot && s.runtimeSub == "" {
			errs = append(errs, errors.New("RUNTIME_SUBDIRECTORY is empty with RUNTIME_WATCH_ROOT=true: envoyproxy/ratelimit loads no config at all then; set RUNTIME_SUBDIRECTORY (the config is read from RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY)"))
			break
		}
		e.set("config", filepath.Join(s.runtimeRoot, s.runtimeSub, s.runtimeApp), "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY")
		// Both of envoyproxy/ratelimit's watches are ratelimitd's one: the
		// directory, a ConfigMap's ..data swap in it, and any link above it
		// (RUNTIME_ROOT) being swapped.
		e.set("watch", "true", "RUNTIME_WATCH_ROOT")
		for _, name := range xdsVarNames {
			if s.set[name] {
				s.unhonoured = append(s.unhonoured, name+": not used with CONFIG_TYPE=FILE")
			}
		}
	case "GRPC_XDS_SOTW":
		errs = append(errs, e.mapXDS(s)...)
	default:
		errs = append(errs, fmt.Errorf("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", s.configType))
	}
	if !s.ignoreDotFiles && s.set["RUNTIME_IGNOREDOTFILES"] {
		s.unhonoured = append(s.unhonoured, "RUNTIME_IGNOREDOTFILES=false: ratelimitd always skips names starting with \".\" in the config directory")
	}
	return errs
}

// xdsVarNames are the settings only CONFIG_TYPE=GRPC_XDS_SOTW reads.
var xdsVarNames = []string{
	"FORCE_START_WITHOUT_INITIAL_CONFIG", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_SERVER_URL",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_USE_TLS",
	"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
	"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
}

// mapXDS maps the CONFIG_GRPC_XDS_* and XDS_CLIENT_* settings onto the
// --config-xds-* flags.
func (e *Env) mapXDS(s *incumbentSettings) []error {
	var errs []error
	e.set("config-xds-addr", s.xdsURL, "CONFIG_GRPC_XDS_SERVER_URL")
	e.set("config-xds-node-id", s.xdsNodeID, "CONFIG_GRPC_XDS_NODE_ID")
	if s.xdsMetadata != "" {
		// The incumbent drops an item without "=" (its own settings
		// comment shows key1:val1): so does ratelimitd, naming it in the
		// warning rather than refusing to start.
		var kept, dropped []string
		for _, item := range daemon.SplitList(s.xdsMetadata) {
			if strings.Contains(item, "=") {
				kept = append(kept, item)
			} else {
				dropped = append(dropped, item)
			}
		}
		if len(kept) > 0 {
			e.set("config-xds-node-metadata", strings.Join(kept, ","), "CONFIG_GRPC_XDS_NODE_METADATA")
		}
		if len(dropped) > 0 {
			s.unhonoured = append(s.unhonoured, fmt.Sprintf("CONFIG_GRPC_XDS_NODE_METADATA: items without \"=\" are dropped, as by envoyproxy/ratelimit: %q", dropped))
		}
	}
	if s.xdsHeaders != "" {
		// envconfig's map syntax: k1:v1,k2:v2.
		var pairs []string
		for _, item := range daemon.SplitList(s.xdsHeaders) {
			k, v, ok := strings.Cut(item, ":")
			if !ok || strings.TrimSpace(k) == "" {
				errs = append(errs, fmt.Errorf("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=%q: %q is not key:value (want k1:v1,k2:v2)", s.xdsHeaders, item))
				continue
			}
			pairs = append(pairs, strings.TrimSpace(k)+"="+v)
		}
		e.set("config-xds-headers", strings.Join(pairs, ","), "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")
	}
	e.set("config-xds-retry-interval", s.xdsRetry.String(), "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")
	e.set("config-xds-max-backoff", s.xdsMaxBackoff.String(), "XDS_CLIENT_BACKOFF_MAX_INTERVAL")
	if s.xdsMaxMsg != 0 {
		e.set("config-xds-max-message-bytes", strconv.FormatInt(s.xdsMaxMsg, 10), "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
	}
	if s.xdsTLS {
		e.set("config-xds-tls", "true", "CONFIG_GRPC_XDS_SERVER_USE_TLS")
		e.setGiven(
			flagVar{"config-xds-tls-cert", s.xdsCert, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"},
			flagVar{"config-xds-tls-key", s.xdsKey, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"},
			flagVar{"config-xds-tls-ca", s.xdsCA, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"},
			flagVar{"config-xds-tls-server-name", s.xdsSAN, "CONFIG_GRPC_XDS_SERVER_TLS_SAN"},
		)
	} else {
		s.notUsedWithout("CONFIG_GRPC_XDS_SERVER_USE_TLS=true", ": the xDS server is dialled in plaintext", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN")
	}
	if s.forceStart {
		e.set("start-without-config", "true", "FORCE_START_WITHOUT_INITIAL_CONFIG")
	}
	return errs
}

// mapBackend maps BACKEND_TYPE and the REDIS_* settings, in
// envoyproxy/ratelimit's syntax (bare host:port, comma lists, REDIS_AUTH
// as pass or user:pass), onto the --redis-* flags, and
// LOCAL_CACHE_SIZE_IN_BYTES onto the denial cache.
func (e *Env) mapBackend(s *incumbentSettings) []error {
	var errs []error
	switch strings.ToLower(s.backendType) {
	case "redis":
	case "memory":
		// ratelimitd's own: buckets in this process's memory (one replica).
		for _, name := range redisVarNames {
			if s.set[name] {
				s.unhonoured = append(s.unhonoured, name+": not used with BACKEND_TYPE=memory")
			}
		}
		return nil
	case "memcache":
		return []error{errors.New("BACKEND_TYPE=memcache: ratelimitd has no memcache backend; use redis")}
	default:
		return []error{fmt.Errorf("BACKEND_TYPE=%q: want redis (or memory, ratelimitd's in-process buckets)", s.backendType)}
	}
	user, pass, hasUser := strings.Cut(s.redisAuth, ":")
	if !hasUser {
		user, pass = "", s.redisAuth
	}
	socket, typ := strings.ToLower(s.redisSocket), strings.ToLower(s.redisType)
	if socket != "tcp" && socket != "unix" {
		errs = append(errs, fmt.Errorf("REDIS_SOCKET_TYPE=%q: want tcp or unix", s.redisSocket))
	}
	if strings.Contains(s.redisURL, "://") {
		errs = append(errs, fmt.Errorf("REDIS_URL=%q: want host:port (or a socket path with REDIS_SOCKET_TYPE=unix), as envoyproxy/ratelimit reads it, not a URL", s.redisURL))
	}
	if s.redisSkipVerify {
		errs = append(errs, errors.New("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true: ratelimitd always checks the Redis server's name; give REDIS_TLS_CACERT the CA that signed its certificate"))
	}
	switch typ {
	case "single":
		u := url.URL{Scheme: "redis", Host: s.redisURL}
		if socket == "unix" {
			u = url.URL{Scheme: "unix", Path: s.redisURL}
		}
		if s.redisTLS {
			if socket == "unix" {
				errs = append(errs, errors.New("REDIS_TLS=true with REDIS_SOCKET_TYPE=unix: ratelimitd speaks TLS to Redis over TCP only"))
			}
			u.Scheme = "rediss"
		}
		if s.redisAuth != "" {
			u.User = url.UserPassword(user, pass)
		}
		e.set("redis-url", u.String(), "REDIS_URL")
	case "sentinel":
		parts := daemon.SplitList(s.redisURL)
		if len(parts) < 2 {
			errs = append(errs, fmt.Errorf("REDIS_URL=%q with REDIS_TYPE=sentinel: want the master's name and the Sentinels, master,host:port,host:port", s.redisURL))
			break
		}
		e.set("redis-sentinel-master", parts[0], "REDIS_URL")
		e.set("redis-sentinel-addrs", strings.Join(parts[1:], ","), "REDIS_URL")
		switch {
		case s.redisSentinelAuth != "" && s.redisSentinelAuth != pass:
			errs = append(errs, errors.New("REDIS_SENTINEL_AUTH differs from REDIS_AUTH's password: ratelimitd authenticates to the Sentinels with the nodes' password; give them one password"))
		case s.redisSentinelAuth == "" && pass != "":
			s.unhonoured = append(s.unhonoured, "REDIS_SENTINEL_AUTH is empty: ratelimitd sends REDIS_AUTH's password to the Sentinels too")
		}
	case "cluster":
		e.set("redis-cluster-addrs", s.redisURL, "REDIS_URL")
	default:
		errs = append(errs, fmt.Errorf("REDIS_TYPE=%q: want single, sentinel or cluster", s.redisType))
	}
	if typ != "single" {
		if socket == "unix" {
			errs = append(errs, fmt.Errorf("REDIS_SOCKET_TYPE=unix with REDIS_TYPE=%s: ratelimitd reaches Sentinels and Cluster nodes over TCP", typ))
		}
		if user != "" {
			e.set("redis-username", user, "REDIS_AUTH")
		}
		if pass != "" {
			e.set("redis-password", pass, "REDIS_AUTH")
		}
		if s.redisTLS && s.redisCA == "" && s.redisCert == "" {
			errs = append(errs, fmt.Errorf("REDIS_TLS=true with REDIS_TYPE=%s needs REDIS_TLS_CACERT or REDIS_TLS_CLIENT_CERT: ratelimitd turns on TLS to Sentinels and Cluster nodes through those files", typ))
		}
	}
	if s.redisSentinelAuth != "" && typ != "sentinel" {
		s.unhonoured = append(s.unhonoured, "REDIS_SENTINEL_AUTH: not used without REDIS_TYPE=sentinel")
	}
	if s.redisTLS {
		e.setGiven(
			flagVar{"redis-tls-cert", s.redisCert, "REDIS_TLS_CLIENT_CERT"},
			flagVar{"redis-tls-key", s.redisKey, "REDIS_TLS_CLIENT_KEY"},
			flagVar{"redis-tls-ca", s.redisCA, "REDIS_TLS_CACERT"},
		)
	} else {
		s.notUsedWithout("REDIS_TLS=true", "", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT")
	}
	if s.set["REDIS_POOL_SIZE"] {
		e.set("redis-pool-size", strconv.FormatInt(s.redisPool, 10), "REDIS_POOL_SIZE")
	}
	if s.set["REDIS_TIMEOUT"] {
		for _, flag := range []string{"redis-dial-timeout", "redis-read-timeout", "redis-write-timeout"} {
			e.set(flag, s.redisTimeout.String(), "REDIS_TIMEOUT")
		}
	}
	if s.redisPipelineWindow > 0 {
		e.set("redis-batch-wait", s.redisPipelineWindow.String(), "REDIS_PIPELINE_WINDOW")
	}
	if s.cacheKeyPrefix != "" {
		e.set("redis-prefix", s.cacheKeyPrefix, "CACHE_KEY_PREFIX")
	}
	if s.set["LOCAL_CACHE_SIZE_IN_BYTES"] {
		switch {
		case s.localCacheBytes < 0:
			errs = append(errs, fmt.Errorf("LOCAL_CACHE_SIZE_IN_BYTES=%d: must not be negative", s.localCacheBytes))
		case s.localCacheBytes == 0:
			e.set("denial-cache", "false", "LOCAL_CACHE_SIZE_IN_BYTES")
		default:
			e.set("denial-cache", "true", "LOCAL_CACHE_SIZE_IN_BYTES")
			entries := min(max(s.localCacheBytes/denialcache.BytesPerEntry, 64), denialcache.MaxEntriesLimit)
			e.set("denial-cache-size", strconv.FormatInt(entries, 10), "LOCAL_CACHE_SIZE_IN_BYTES")
		}
	}
	return errs
}

// redisVarNames are the settings only BACKEND_TYPE=redis reads.
var redisVarNames = []string{
	"REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_POOL_SIZE", "REDIS_AUTH", "REDIS_SENTINEL_AUTH", "REDIS_TLS",
	"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_PIPELINE_WINDOW", "REDIS_TIMEOUT",
	"LOCAL_CACHE_SIZE_IN_BYTES", "CACHE_KEY_PREFIX",
}

// mapAnswers maps the settings that shape answers: near limit, shadow
// mode, headers, dynamic metadata, and refuses those not yet built.
func (e *Env) mapAnswers(s *incumbentSettings) []error {
	var errs []error
	if s.nearLimitRatio <= 0 || s.nearLimitRatio > 1 {
		errs = append(errs, fmt.Errorf("NEAR_LIMIT_RATIO=%v: want more than 0 and at most 1", s.nearLimitRatio))
	}
	e.set("near-limit-ratio", strconv.FormatFloat(s.nearLimitRatio, 'g', -1, 64), "NEAR_LIMIT_RATIO")
	if s.shadowMode {
		e.set("shadow-mode", "true", "SHADOW_MODE")
	}
	if s.quotaMode {
		e.set("quota-mode", "all", "QUOTA_MODE")
	}
	// The incumbent counts every hit (INCRBY), so a charge that finds the
	// bucket too low is never lost: the default overdraft, counting on
	// every bucket of a denied request, or with
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true only on those that
	// denied it (docs/how-it-decides.md).
	e.set("default-overdraft", "1", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")
	if s.stopIncrement {
		e.set("default-overdraft-counting", "where-denied", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")
	}
	// The incumbent's three headers, named as it names them; without
	// LIMIT_RESPONSE_HEADERS_ENABLED it reads no name either.
	if s.limitHeaders {
		for i, name := range []string{"LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER"} {
			if !httpguts.ValidHeaderFieldName(s.limitHeaderNames[i]) {
				errs = append(errs, fmt.Errorf("%s=%q: not an HTTP header name", name, s.limitHeaderNames[i]))
			}
		}
		e.set("ratelimit-headers", "incumbent", "LIMIT_RESPONSE_HEADERS_ENABLED")
		e.set("ratelimit-header-names", strings.Join(s.limitHeaderNames[:], ","), "LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER")
	}
	// envoyproxy/ratelimit sends dynamic metadata only when asked: its
	// keys (domain, descriptors, hitsAddend, the passed descriptors'
	// metadata), beside which ratelimitd puts its own (ratelimitd.*,
	// docs/how-it-decides.md#dynamic-metadata); unasked, neither.
	if s.dynamicMetadata {
		e.set("descriptor-metadata", "incumbent", "RESPONSE_DYNAMIC_METADATA")
		e.set("dynamic-metadata", "all", "RESPONSE_DYNAMIC_METADATA")
	} else {
		e.set("descriptor-metadata", "off", "RESPONSE_DYNAMIC_METADATA")
		e.set("dynamic-metadata", "off", "RESPONSE_DYNAMIC_METADATA")
	}
	return errs
}

// The OTLP endpoints envoyproxy/ratelimit's exporters use when
// OTEL_EXPORTER_OTLP_ENDPOINT is not set (the OpenTelemetry SDK's).
const (
	defaultOTLPHTTP = "http://localhost:4318"
	defaultOTLPGRPC = "http://localhost:4317"
)

// mapTracing maps TRACING_* and OTEL_EXPORTER_OTLP_ENDPOINT onto a
// tracing.Config, with the OpenTelemetry SDK's default endpoints.
func (e *Env) mapTracing(s *incumbentSettings) []error {
	if !s.tracingEnabled {
		e.Tracing = tracing.Config{SampleRatio: 1} // off, as tracing.ConfigFromEnv's
		s.notUsedWithout("TRACING_ENABLED=true", "", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE", "OTEL_EXPORTER_OTLP_ENDPOINT")
		return nil
	}
	var errs []error
	c := tracing.Config{
		Endpoint: s.otlpEndpoint, ServiceName: s.tracingName,
		ServiceNamespace: s.tracingNamespace, ServiceInstanceID: s.tracingInstance,
		// envoyproxy/ratelimit samples everything at 1 or more and nothing
		// at 0 or less.
		SampleRatio: min(max(s.tracingRate, 0), 1),
	}
	switch strings.ToLower(s.tracingProtocol) {
	case "http", "":
		c.Protocol = tracing.ProtocolHTTP
		if c.Endpoint == "" {
			c.Endpoint = defaultOTLPHTTP
		}
	case "grpc":
		c.Protocol = tracing.ProtocolGRPC
		if c.Endpoint == "" {
			c.Endpoint = defaultOTLPGRPC
		}
	default:
		errs = append(errs, fmt.Errorf("TRACING_EXPORTER_PROTOCOL=%q: want http or grpc", s.tracingProtocol))
	}
	if _, err := tracing.TracesURL(c.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT=%q: want an http:// or https:// URL", c.Endpoint))
	}
	e.Tracing = c
	return errs
}

// VarsIn returns the names of envoyproxy/ratelimit's settings
// set in the environment, sorted; OTEL_EXPORTER_OTLP_ENDPOINT, which
// ratelimitd reads under its own name too, is left out.
func VarsIn(getenv func(string) string) []string {
	var names []string
	for _, v := range incumbentVars {
		if v.name != "OTEL_EXPORTER_OTLP_ENDPOINT" && getenv(v.name) != "" {
			names = append(names, v.name)
		}
	}
	slices.Sort(names)
	return names
}

// ProgramGetenv is getenv for the program named prog (os.Args[0]): under
// the name "ratelimit" RATELIMITD_ENV_COMPAT defaults to envoyproxy.
func ProgramGetenv(prog string, getenv func(string) string) func(string) string {
	if strings.TrimSuffix(filepath.Base(prog), ".exe") != Program {
		return getenv
	}
	return func(name string) string {
		if v := getenv(name); v != "" || name != CompatVar {
			return v
		}
		return Envoyproxy
	}
}

// Names returns the names of every envoyproxy/ratelimit setting Read
// knows, in its table's order.
func Names() []string {
	names := make([]string, len(incumbentVars))
	for i, v := range incumbentVars {
		names[i] = v.name
	}
	return names
}
