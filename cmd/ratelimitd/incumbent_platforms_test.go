package main

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/envcompat"
	"github.com/ratelimitd/ratelimitd/internal/xdsconfig"
)

// egEnv is the environment Envoy Gateway renders for envoyproxy/ratelimit
// (internal/infrastructure/kubernetes/ratelimit/resource.go@d32f282942),
// with Redis and Prometheus on.
var egEnv = map[string]string{
	"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
	"LOG_LEVEL": "info", "USE_STATSD": "false",
	"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt",
	"GRPC_SERVER_USE_TLS":               "true", "GRPC_SERVER_TLS_CERT": "/certs/tls.crt", "GRPC_SERVER_TLS_KEY": "/certs/tls.key", "GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt",
	"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
	"REDIS_SOCKET_TYPE":                  "tcp", "REDIS_URL": "redis.redis-system.svc.cluster.local:6379",
	"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
}

// aiGatewayEnv is Envoy AI Gateway's (tests/e2e/testdata/backend_quota_ratelimit.yaml@c217da8a5).
var aiGatewayEnv = map[string]string{
	"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ai-gateway-ratelimit",
	"CONFIG_GRPC_XDS_SERVER_URL": "ai-gateway-controller.envoy-ai-gateway-system.svc.cluster.local:18002",
	"LOG_LEVEL":                  "debug", "USE_STATSD": "false", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.redis-system.svc.cluster.local:6379",
}

// istioEnv is Istio's sample (samples/ratelimit/rate-limit-service.yaml@1b76f51).
var istioEnv = map[string]string{
	"LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "USE_STATSD": "false",
	"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
	"HOST": "::", "GRPC_HOST": "::",
}

// TestPlatformEnvironments reads each platform's environment as the binary
// run as "ratelimit" does, and checks it gives the Config of the native
// flags an operator would write for the same deployment (the whole
// daemon.Config, field for field), and which settings the startup warning
// names.
func TestPlatformEnvironments(t *testing.T) {
	listeners := []string{"--http-addr", "0.0.0.0:8080", "--grpc-addr", "0.0.0.0:8081", "--debug-addr", "0.0.0.0:6070",
		"--grpc-max-connection-age", "24h", "--grpc-max-connection-age-grace", "1h", "--dynamic-metadata", "off", "--descriptor-metadata", "off", "--default-overdraft", "1"}
	xdsDefaults := []string{"--config-xds-retry-interval", "3s", "--config-xds-max-backoff", "60s"}
	tests := []struct {
		name       string
		env        map[string]string
		native     []string
		unhonoured []string // the names the warning lists
		check      func(t *testing.T, c serveConfig)
	}{
		{
			name: "Envoy Gateway",
			env:  egEnv,
			native: concat(listeners, xdsDefaults, []string{"--log-level", "info",
				"--config-xds-addr", "envoy-gateway:18001", "--config-xds-node-id", "envoy-ratelimit",
				"--config-xds-tls-cert", "/certs/tls.crt", "--config-xds-tls-key", "/certs/tls.key", "--config-xds-tls-ca", "/certs/ca.crt",
				"--start-without-config", "--grpc-tls-cert", "/certs/tls.crt", "--grpc-tls-key", "/certs/tls.key",
				"--redis-url", "redis://redis.redis-system.svc.cluster.local:6379", "--metrics-addr", ":19001", "--metrics-path", "/metrics", "--incumbent-metrics"}),
			unhonoured: []string{"GRPC_SERVER_TLS_CA_CERT", "PROMETHEUS_MAPPER_YAML"},
			check: func(t *testing.T, c serveConfig) {
				want := xdsconfig.Options{
					Addr: "envoy-gateway:18001", NodeID: "envoy-ratelimit",
					TLS:                  &xdsconfig.TLSFiles{CAFile: "/certs/ca.crt", CertFile: "/certs/tls.crt", KeyFile: "/certs/tls.key"},
					ConnectRetryInterval: 3 * time.Second, MaxBackoff: time.Minute,
				}
				if !reflect.DeepEqual(c.XDS, want) {
					t.Errorf("XDS = %+v (TLS %+v), want %+v (TLS %+v)", c.XDS, c.XDS.TLS, want, want.TLS)
				}
				if c.ConfigPath != "" || !c.StartWithoutConfig || c.MetricsAddr != ":19001" || c.DebugAddr != "0.0.0.0:6070" ||
					c.HTTPAddr != "0.0.0.0:8080" || c.GRPCAddr != "0.0.0.0:8081" || !c.IncumbentMetrics {
					t.Errorf("config %q, start without config %v, metrics %q, debug %q, http %q, grpc %q, incumbent metrics %v",
						c.ConfigPath, c.StartWithoutConfig, c.MetricsAddr, c.DebugAddr, c.HTTPAddr, c.GRPCAddr, c.IncumbentMetrics)
				}
				// GRPC_SERVER_TLS_CA_CERT is not read, as by envoyproxy/ratelimit.
				if c.GRPCTLS.CertFile != "/certs/tls.crt" || c.GRPCTLS.ClientCAFile != "" {
					t.Errorf("gRPC TLS %+v, want the server certificate and no client CA", c.GRPCTLS)
				}
				if c.Redis.URL != "redis://redis.redis-system.svc.cluster.local:6379" {
					t.Errorf("Redis URL %q", c.Redis.URL)
				}
			},
		},
		{
			name: "Envoy AI Gateway",
			env:  aiGatewayEnv,
			native: concat(listeners, xdsDefaults, []string{"--log-level", "debug",
				"--config-xds-addr", "ai-gateway-controller.envoy-ai-gateway-system.svc.cluster.local:18002", "--config-xds-node-id", "envoy-ai-gateway-ratelimit",
				"--redis-url", "redis://redis.redis-system.svc.cluster.local:6379"}),
			check: func(t *testing.T, c serveConfig) {
				if c.XDS.TLS != nil || c.XDS.NodeID != "envoy-ai-gateway-ratelimit" || c.StartWithoutConfig || c.MetricsAddr != "" {
					t.Errorf("XDS %+v, start without config %v, metrics %q; want plaintext, the AI Gateway's node id, no early start, no metrics listener",
						c.XDS, c.StartWithoutConfig, c.MetricsAddr)
				}
			},
		},
		{
			name: "Istio sample",
			env:  istioEnv,
			native: concat([]string{"--http-addr", "[::]:8080", "--grpc-addr", "[::]:8081", "--debug-addr", "0.0.0.0:6070",
				"--grpc-max-connection-age", "24h", "--grpc-max-connection-age-grace", "1h", "--dynamic-metadata", "off", "--descriptor-metadata", "off", "--default-overdraft", "1",
				"--log-level", "debug", "--config", "/data/ratelimit/config", "--redis-url", "redis://redis:6379"}),
			check: func(t *testing.T, c serveConfig) {
				if c.ConfigPath != "/data/ratelimit/config" || !c.WatchConfig || c.XDS.Enabled() {
					t.Errorf("config %q, watch %v, xDS %v; want /data/ratelimit/config, watched", c.ConfigPath, c.WatchConfig, c.XDS.Enabled())
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := incumbentParse(tt.env)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			want, err := parseServeFlags(tt.native, noEnv, io.Discard)
			if err != nil {
				t.Fatalf("parseServeFlags(%q): %v", tt.native, err)
			}
			if !reflect.DeepEqual(got.Config, want.Config) {
				t.Errorf("Config from the environment:\n%+v\nwant, from the native flags:\n%+v", got.Config, want.Config)
			}
			if got.logLevel != want.logLevel || got.logFormat != want.logFormat {
				t.Errorf("log %v %s, want %v %s", got.logLevel, got.logFormat, want.logLevel, want.logFormat)
			}
			var names []string
			for _, u := range got.unhonoured {
				names = append(names, strings.FieldsFunc(u, func(r rune) bool { return r == '=' || r == ':' })[0])
			}
			if !reflect.DeepEqual(names, tt.unhonoured) {
				t.Errorf("unhonoured %q, want %q", got.unhonoured, tt.unhonoured)
			}
			tt.check(t, got)
		})
	}
}

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// TestIncumbentDefaults: with none of its variables set, the Config is
// envoyproxy/ratelimit's defaults (settings.go@f2fb157).
func TestIncumbentDefaults(t *testing.T) {
	c, err := incumbentParse(baseEnv)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		what      string
		got, want any
	}{
		{"HTTP address", c.HTTPAddr, "0.0.0.0:8080"},
		{"gRPC address", c.GRPCAddr, "0.0.0.0:8081"},
		{"debug address", c.DebugAddr, "0.0.0.0:6070"},
		{"metrics address", c.MetricsAddr, ""},
		{"connection age", c.MaxConnectionAge, 24 * time.Hour},
		{"connection age grace", c.MaxConnectionAgeGrace, time.Hour},
		{"log level", c.logLevel.String(), "WARN"},
		{"config path", c.ConfigPath, "/srv/runtime_data/current/ratelimit/config"},
		{"Redis", c.Redis.URL, "unix:///var/run/nutcracker/ratelimit.sock"},
		{"denial cache", c.Redis.DenialCache, true}, // ratelimitd's own default: LOCAL_CACHE_SIZE_IN_BYTES unset
		{"near limit", c.NearLimitRatio, 0.8},
		{"tracing", c.Tracing.Enabled(), false},
		{"shadow mode", c.ShadowMode, false},
		{"warnings", len(c.unhonoured), 0},
	} {
		if !reflect.DeepEqual(f.got, f.want) {
			t.Errorf("%s = %#v, want %#v", f.what, f.got, f.want)
		}
	}
}

// TestIncumbentPrecedence: a flag on the command line beats its RATELIMITD_
// variable, which beats envoyproxy/ratelimit's.
func TestIncumbentPrecedence(t *testing.T) {
	env := withEnv(istioEnv, "GRPC_PORT", "9000", "RATELIMITD_GRPC_ADDR", "127.0.0.1:9001", "RATELIMITD_ON_BACKEND_FAILURE", "allow")
	c, err := incumbentParse(env)
	if err != nil {
		t.Fatal(err)
	}
	if c.GRPCAddr != "127.0.0.1:9001" || c.Failure.Mode.String() != "allow" {
		t.Errorf("gRPC %q, failure mode %v; want RATELIMITD_'s 127.0.0.1:9001 and allow", c.GRPCAddr, c.Failure.Mode)
	}
	c, err = incumbentParse(env, "--grpc-addr", "127.0.0.1:9002")
	if err != nil {
		t.Fatal(err)
	}
	if c.GRPCAddr != "127.0.0.1:9002" {
		t.Errorf("gRPC %q, want the command line's 127.0.0.1:9002", c.GRPCAddr)
	}
	// A mistake in a value passed on is named by its variable.
	_, err = incumbentParse(withEnv(istioEnv, "REDIS_POOL_SIZE", "-3"))
	if err == nil || !strings.Contains(err.Error(), "REDIS_POOL_SIZE") {
		t.Errorf("REDIS_POOL_SIZE=-3: error %v, want one naming REDIS_POOL_SIZE", err)
	}
}

// TestEnvCompatSwitch: the program name "ratelimit", RATELIMITD_ENV_COMPAT
// and --env-compat select the environment read.
func TestEnvCompatSwitch(t *testing.T) {
	env := map[string]string{"GRPC_PORT": "9000", "RUNTIME_SUBDIRECTORY": "ratelimit", "RATELIMITD_CONFIG": "x"}
	get := func(extra ...string) func(string) string {
		m := withEnv(env, extra...)
		return func(k string) string { return m[k] }
	}
	tests := []struct {
		name   string
		prog   string
		getenv func(string) string
		args   []string
		want   string // gRPC address
	}{
		{"ratelimitd", "/bin/ratelimitd", get(), []string{"--config", "x"}, "127.0.0.1:8081"},
		{"ratelimit", "/bin/ratelimit", get("RATELIMITD_CONFIG", ""), nil, "0.0.0.0:9000"},
		{"ratelimit, told native", "ratelimit", get("RATELIMITD_ENV_COMPAT", "", "RATELIMITD_ENV_COMPAT", ""), []string{"--env-compat", "", "--config", "x"}, "127.0.0.1:8081"},
		{"ratelimitd, RATELIMITD_ENV_COMPAT", "ratelimitd", get("RATELIMITD_ENV_COMPAT", "envoyproxy", "RATELIMITD_CONFIG", ""), nil, "0.0.0.0:9000"},
		{"ratelimitd serve --env-compat", "ratelimitd", get("RATELIMITD_CONFIG", ""), []string{"--env-compat=envoyproxy"}, "0.0.0.0:9000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseServeFlags(tt.args, envcompat.ProgramGetenv(tt.prog, tt.getenv), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if c.GRPCAddr != tt.want {
				t.Errorf("gRPC address %q, want %q", c.GRPCAddr, tt.want)
			}
		})
	}
	if _, err := parseServeFlags([]string{"--env-compat", "lyft"}, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), "envoyproxy") {
		t.Errorf("--env-compat lyft: error %v, want one listing envoyproxy", err)
	}
}

// TestNativeNameWarnsOfIncumbentVariables: under its own name ratelimitd
// reads none of envoyproxy/ratelimit's variables, and one startup warning
// names those set and the switch that reads them.
func TestNativeNameWarnsOfIncumbentVariables(t *testing.T) {
	env := map[string]string{"REDIS_URL": "127.0.0.1:6379", "USE_STATSD": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}
	c, err := parseServeFlags([]string{"--config", "x"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Redis.Enabled() {
		t.Errorf("REDIS_URL read under the native name: %+v", c.Redis)
	}
	if want := []string{"REDIS_URL", "USE_STATSD"}; !reflect.DeepEqual(c.foreignVars, want) {
		t.Errorf("foreign variables %q, want %q", c.foreignVars, want)
	}
	var buf bytes.Buffer
	envcompat.Warn(slog.New(slog.NewTextHandler(&buf, nil)), c.unhonoured, c.foreignVars)
	out := buf.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "level=WARN") || !strings.Contains(out, "variables=REDIS_URL,USE_STATSD") ||
		!strings.Contains(out, "RATELIMITD_ENV_COMPAT=envoyproxy") || !strings.Contains(out, "as ratelimit") {
		t.Errorf("warning:\n%s\nwant one WARN line naming REDIS_URL,USE_STATSD and the switches", out)
	}
	c, err = parseServeFlags([]string{"--config", "x"}, noEnv, io.Discard)
	if err != nil || len(c.foreignVars) != 0 {
		t.Errorf("without them: foreign %q, %v; want none", c.foreignVars, err)
	}
}

// TestCheckConfigLayout lays out config directories and checks what
// envcompat.CheckConfigLayout says of each.
func TestCheckConfigLayout(t *testing.T) {
	write := func(t *testing.T, dir string, files ...string) {
		for _, f := range files {
			p := filepath.Join(dir, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("domain: d\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name      string
		files     []string
		incumbent bool
		wantWarn  string // in the one warning; "" for none
		wantErr   string // in the error; "" for none
	}{
		{"plain", []string{"a.yaml", "b.yml", "README.md"}, false, "", ""},
		{"one level above the app directory", []string{"neighbour.yaml", "config/limits.yaml"}, false, "", "give --config"},
		{"one level above, nothing beside", []string{"config/limits.yaml"}, false, "", "one level above envoyproxy/ratelimit's app directory"},
		{"another subdirectory", []string{"a.yaml", "old/a.yaml"}, false, "which are not read", ""},
		{"a subdirectory without YAML", []string{"a.yaml", "notes/x.txt"}, false, "", ""},
		{"dot entries skipped", []string{"a.yaml", ".git/config.yaml", "..2026_12_01/a.yaml"}, true, "", ""},
		{"incumbent: a subdirectory", []string{"a.yaml", "team/b.yaml"}, true, "", "envoyproxy/ratelimit loads"},
		{"incumbent: a file not named .yaml", []string{"a.yaml", "limits.conf"}, true, "", "rename it to limits.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, tt.files...)
			warnings, err := envcompat.CheckConfigLayout(dir, tt.incumbent)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error %v, want one saying %q", err, tt.wantErr)
			}
			switch {
			case tt.wantWarn == "" && len(warnings) > 0:
				t.Errorf("warnings %q, want none", warnings)
			case tt.wantWarn != "" && (len(warnings) != 1 || !strings.Contains(warnings[0], tt.wantWarn)):
				t.Errorf("warnings %q, want one saying %q", warnings, tt.wantWarn)
			}
		})
	}
}

// TestConfigLayoutRefusedAtStart: serve refuses --config one level above
// the app directory before opening anything.
func TestConfigLayoutRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(dir, "stray.yaml"), filepath.Join(dir, "config", "limits.yaml")} {
		if err := os.WriteFile(f, []byte("domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	err := run(t.Context(), []string{"--config", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, noEnv, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "give --config "+filepath.Join(dir, "config")) {
		t.Errorf("run = %v, want the layout refused", err)
	}
}
