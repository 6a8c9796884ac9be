package daemon

import (
	"time"

	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/redact"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
	"github.com/ratelimitd/ratelimitd/internal/xdsconfig"
)

// Defaults of Config, for the zero value of each field and for the flags
// and help text that describe them.
const (
	DefaultGRPCAddr        = "127.0.0.1:8081"
	DefaultHTTPAddr        = "127.0.0.1:8080"
	DefaultShutdownTimeout = 10 * time.Second
	DefaultMaxMessageBytes = 1 << 20
	// DefaultStreamWorkers covers the concurrency of a busy replica: the
	// goroutines kept to handle gRPC calls, whose grown stacks are reused
	// (runtime.newstack was 7% of the CPU under load without them).
	DefaultStreamWorkers = 128
	DefaultMaxWait       = 5 * time.Second
	// DefaultNearLimitRatio and DefaultMaxMetricValues are the metrics'.
	DefaultNearLimitRatio  = 0.8
	DefaultMaxMetricValues = 100
)

// Config is what a Daemon runs with: everything the serve command reads
// from its flags and environment, and nothing of how they were spelled.
// The zero value of each field means its documented default, except
// ConfigPath, which is required.
type Config struct {
	// ConfigPath is the descriptor file, or directory of *.yaml files.
	ConfigPath string
	// WatchConfig reloads the config when its files change (SIGHUP, sent
	// to the process, reloads it in any case; see Daemon.Reload).
	WatchConfig bool
	// XDS, when XDS.Addr is set, takes the descriptor config from an xDS
	// management server instead of files: ConfigPath must then be empty.
	XDS xdsconfig.Options
	// StartWithoutConfig serves before the first config has arrived from
	// XDS, answering every call as for an unknown domain; without it the
	// daemon reports NOT_SERVING until then.
	StartWithoutConfig bool

	// GRPCAddr and HTTPAddr are the listen addresses; default
	// DefaultGRPCAddr and DefaultHTTPAddr. Port 0 picks a free one.
	GRPCAddr, HTTPAddr string
	// DebugAddr, when set, is a third HTTP listener with the operators'
	// endpoints envoyproxy/ratelimit keeps on its debug port (6070):
	// /rlconfig and, with Pprof, /debug/pprof/. MetricsAddr, when set,
	// serves /metrics on a listener of its own (envoyproxy/ratelimit's
	// PROMETHEUS_ADDR, :19001) as well as on HTTPAddr.
	DebugAddr, MetricsAddr string
	// MetricsPath is the path of the metrics on MetricsAddr
	// (envoyproxy/ratelimit's PROMETHEUS_PATH); default DefaultMetricsPath.
	// HTTPAddr serves them at /metrics whatever it is.
	MetricsPath string
	// MaxConnectionAge, when positive, closes each gRPC connection (GOAWAY)
	// after about that long (grpc-go adds a random ±10%), giving its calls
	// in flight MaxConnectionAgeGrace to finish (0: as long as they take),
	// so that Envoy, which keeps its connections for ever, spreads over new
	// replicas.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// IncumbentMetrics also exports envoyproxy/ratelimit's metric names
	// (ratelimit_service_*), as its default Prometheus mapper shapes them,
	// so that dashboards and alerts written for it keep working.
	IncumbentMetrics bool
	// QuotaMode and DescriptorMetadata are envoyproxy/ratelimit's
	// QUOTA_MODE and RESPONSE_DYNAMIC_METADATA (see server.Options; zero
	// means its default).
	QuotaMode          server.QuotaMode
	DescriptorMetadata server.DescriptorMetadata
	// Refunds says what is_negative_hits may give back (server.Options;
	// zero means server.RefundsTaken).
	Refunds server.RefundPolicy
	// ShadowMode makes every rule a shadow rule: counted, never denying
	// (envoyproxy/ratelimit's SHADOW_MODE; see server.Options.ShadowMode).
	ShadowMode bool
	// GRPCTLS, when CertFile is set, serves gRPC over TLS.
	GRPCTLS TLSFiles
	// MaxMessageBytes bounds a gRPC request; default DefaultMaxMessageBytes.
	// A larger one, up to 4 times as large (server.ReadLimit), is answered
	// per OnOversizedRequest; gRPC refuses still larger ones itself.
	MaxMessageBytes int
	// OnInvalidOverride and OnOversizedRequest answer the requests Envoy
	// would let through on an error (see server.InvalidOverride and
	// server.OversizedRequest); zero means deny.
	OnInvalidOverride  server.InvalidOverride
	OnOversizedRequest server.OversizedRequest
	// MaxConfigBytes caps the total size of a config, all its files (or an
	// xDS push) together; default config.DefaultMaxTotalBytes (16 MiB).
	MaxConfigBytes int64
	// StreamWorkers is how many goroutines are kept to handle gRPC calls;
	// default DefaultStreamWorkers; negative keeps none.
	StreamWorkers int
	// ShutdownTimeout bounds the drain of calls in flight once Run's
	// context is done; default DefaultShutdownTimeout.
	ShutdownTimeout time.Duration

	// RetryAfter, RateLimitHeaders, DynamicMetadata and Limits shape the
	// answers (see server.Options; zero means its default).
	RetryAfter           server.RetryAfter
	RateLimitHeaders     server.RateLimitHeaders
	RateLimitHeaderNames server.HeaderNames
	DynamicMetadata      server.DynamicMetadata
	Limits               server.RequestLimits
	// MaxWait caps every limit's max_wait; default DefaultMaxWait.
	MaxWait time.Duration
	// Overdraft records every charge even when it overdraws, for limits
	// that declare no overdraft (server.Overdraft); zero is off.
	Overdraft server.Overdraft

	// Redis selects the Redis backend; its zero value (Redis.Enabled
	// false) keeps buckets in this process's memory.
	Redis Redis
	// Failure is what the Redis backend does when Redis fails (the memory
	// backend never does); OnChange, Probe, OnBackendFailure and OnFallback
	// are the daemon's own and must be nil.
	Failure failover.Options

	// NearLimitRatio and MaxMetricValues tune the metrics; default
	// DefaultNearLimitRatio and DefaultMaxMetricValues.
	NearLimitRatio  float64
	MaxMetricValues int
	// RedactValues is how request values show on /limits, /limits.json
	// and the metrics' value labels; zero means redact.Off.
	RedactValues redact.Mode
	// Tracing exports spans (tracing.ConfigFromEnv reads it).
	Tracing tracing.Config
	// Pprof serves Go's profiler at /debug/pprof/ on the HTTP port.
	Pprof bool

	// GCHeapFloor is the heap, in bytes, the collector lets grow between
	// collections while the live heap is smaller; 0 leaves GOGC alone.
	GCHeapFloor uint64
	// AdaptiveProcs runs on one P while goroutines seldom wait for one
	// (see runtimetune.ProcsTuner).
	AdaptiveProcs bool
}

// TLSFiles name the PEM files of a TLS server: certificate chain and key,
// and, for mutual TLS, the CAs whose client certificates are accepted. They
// are re-read when they change.
type TLSFiles struct {
	CertFile, KeyFile, ClientCAFile string
}

// withDefaults is c with each zero field set to its default.
func (c Config) withDefaults() Config {
	if c.GRPCAddr == "" {
		c.GRPCAddr = DefaultGRPCAddr
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultHTTPAddr
	}
	if c.MetricsPath == "" {
		c.MetricsPath = DefaultMetricsPath
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	switch {
	case c.StreamWorkers == 0:
		c.StreamWorkers = DefaultStreamWorkers
	case c.StreamWorkers < 0:
		c.StreamWorkers = 0
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.NearLimitRatio == 0 {
		c.NearLimitRatio = DefaultNearLimitRatio
	}
	if c.MaxMetricValues <= 0 {
		c.MaxMetricValues = DefaultMaxMetricValues
	}
	return c
}
