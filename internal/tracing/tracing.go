// Package tracing adds OpenTelemetry spans to the gRPC server: one span per
// ShouldRateLimit call (otelgrpc's stats handler), with the request's
// domain and the answer's overall code as attributes. Nothing is set up,
// and nothing costs anything, unless an OTLP endpoint is configured; no
// global tracer provider is ever installed.
package tracing

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// The span attributes ratelimitd adds.
const (
	// DomainKey is the request's domain.
	DomainKey = attribute.Key("ratelimit.domain")
	// OverallCodeKey is the answer's overall_code (OK, OVER_LIMIT), absent
	// when the call failed.
	OverallCodeKey = attribute.Key("ratelimit.overall_code")
	// DescriptorsKey is the number of descriptors in the request.
	DescriptorsKey = attribute.Key("ratelimit.descriptors")
)

// The environment variables Config reads (the OpenTelemetry SDK's names).
const (
	EnvEndpoint    = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvServiceName = "OTEL_SERVICE_NAME"
	EnvSamplerArg  = "OTEL_TRACES_SAMPLER_ARG"
)

// Protocol is the OTLP transport. The zero value means ProtocolGRPC.
type Protocol int

const (
	// ProtocolGRPC exports over OTLP/gRPC (collectors listen on 4317).
	ProtocolGRPC Protocol = iota
	// ProtocolHTTP exports over OTLP/HTTP with protobuf bodies (4318):
	// envoyproxy/ratelimit's default, TRACING_EXPORTER_PROTOCOL=http.
	ProtocolHTTP
)

// Config selects the exporter. The zero value means tracing off.
type Config struct {
	// Endpoint is the collector's URL (http: plaintext, https: TLS); ""
	// turns tracing off. With ProtocolGRPC it is the collector itself, e.g.
	// http://127.0.0.1:4317; with ProtocolHTTP it is the base URL, as
	// OTEL_EXPORTER_OTLP_ENDPOINT is, and spans are posted to its path
	// followed by /v1/traces, e.g. http://127.0.0.1:4318/v1/traces.
	Endpoint string
	// Protocol is the transport; default ProtocolGRPC.
	Protocol Protocol
	// ServiceName is the resource's service.name; default "ratelimitd".
	// ServiceNamespace and ServiceInstanceID, when set, are its
	// service.namespace and service.instance.id.
	ServiceName, ServiceNamespace, ServiceInstanceID string
	// SampleRatio is the share of root spans sampled, in [0, 1]; spans
	// whose parent (Envoy's) is sampled are always sampled. Default 1.
	SampleRatio float64
}

// ConfigFromEnv reads Config from the environment through getenv, once.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{Endpoint: getenv(EnvEndpoint), ServiceName: getenv(EnvServiceName), SampleRatio: 1}
	if v := getenv(EnvSamplerArg); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r < 0 || r > 1 {
			return c, fmt.Errorf("%s=%q: want a ratio between 0 and 1", EnvSamplerArg, v)
		}
		c.SampleRatio = r
	}
	return c, nil
}

// Enabled reports whether c asks for tracing.
func (c Config) Enabled() bool { return c.Endpoint != "" }

// Setup returns the gRPC server options that trace calls to an OTLP
// exporter, and a shutdown func that flushes it. When c is not Enabled it
// returns no options and a no-op shutdown, and creates nothing.
func Setup(ctx context.Context, c Config) ([]grpc.ServerOption, func(context.Context) error, error) {
	if !c.Enabled() {
		return nil, func(context.Context) error { return nil }, nil
	}
	exp, err := newExporter(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	name := c.ServiceName
	if name == "" {
		name = "ratelimitd"
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	if c.ServiceNamespace != "" {
		attrs = append(attrs, attribute.String("service.namespace", c.ServiceNamespace))
	}
	if c.ServiceInstanceID != "" {
		attrs = append(attrs, attribute.String("service.instance.id", c.ServiceInstanceID))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
	)
	return ServerOptions(tp), tp.Shutdown, nil
}

// newExporter returns the OTLP exporter of c's protocol (it connects
// lazily).
func newExporter(ctx context.Context, c Config) (*otlptrace.Exporter, error) {
	switch c.Protocol {
	case ProtocolGRPC:
		exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(c.Endpoint))
		if err != nil {
			return nil, fmt.Errorf("OTLP/gRPC exporter for %s: %w", c.Endpoint, err)
		}
		return exp, nil
	case ProtocolHTTP:
		u, err := TracesURL(c.Endpoint)
		if err != nil {
			return nil, err
		}
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u))
		if err != nil {
			return nil, fmt.Errorf("OTLP/HTTP exporter for %s: %w", u, err)
		}
		return exp, nil
	default:
		return nil, fmt.Errorf("tracing: invalid Protocol %d", c.Protocol)
	}
}

// TracesURL is the URL OTLP/HTTP spans are posted to for the base URL
// endpoint, as the OpenTelemetry SDKs read OTEL_EXPORTER_OTLP_ENDPOINT: its
// path followed by /v1/traces.
func TracesURL(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("OTLP endpoint %q: want an http:// or https:// URL with a host", endpoint)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	return u.String(), nil
}

// ServerOptions returns the gRPC server options that trace ShouldRateLimit
// calls with tp: otelgrpc's stats handler (W3C trace context from Envoy's
// metadata), and an interceptor that adds the domain and overall code.
// Health checks are not traced.
func ServerOptions(tp trace.TracerProvider) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(tp),
			otelgrpc.WithMeterProvider(noop.NewMeterProvider()),
			otelgrpc.WithPropagators(propagation.TraceContext{}),
			otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
				return info.FullMethodName == shouldRateLimit
			}),
		)),
		grpc.ChainUnaryInterceptor(annotate),
	}
}

var shouldRateLimit = "/" + rlsv3.RateLimitService_ServiceDesc.ServiceName + "/ShouldRateLimit"

// annotate adds ratelimitd's attributes to the call's span.
func annotate(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return resp, err
	}
	if r, ok := req.(*rlsv3.RateLimitRequest); ok {
		span.SetAttributes(DomainKey.String(r.GetDomain()), DescriptorsKey.Int(len(r.GetDescriptors())))
	}
	if r, ok := resp.(*rlsv3.RateLimitResponse); ok && err == nil {
		span.SetAttributes(OverallCodeKey.String(r.GetOverallCode().String()))
	}
	return resp, err
}
