package tracing_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
	"github.com/ratelimitd/ratelimitd/limiter"
)

func TestOffWithoutEndpoint(t *testing.T) {
	before := otel.GetTracerProvider()
	c, err := tracing.ConfigFromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	opts, shutdown, err := tracing.Setup(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if c.Enabled() || len(opts) != 0 {
		t.Errorf("without %s: enabled %v, %d server options; want off and none", tracing.EnvEndpoint, c.Enabled(), len(opts))
	}
	if err := shutdown(context.Background()); err != nil {
		t.Errorf("shutdown = %v", err)
	}
	if otel.GetTracerProvider() != before {
		t.Errorf("Setup installed a global tracer provider")
	}
}

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		env     map[string]string
		want    tracing.Config
		wantErr bool
	}{
		{map[string]string{}, tracing.Config{SampleRatio: 1}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SERVICE_NAME": "rl", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
			tracing.Config{Endpoint: "http://127.0.0.1:4317", ServiceName: "rl", SampleRatio: 0.25}, false},
		{map[string]string{"OTEL_TRACES_SAMPLER_ARG": "2"}, tracing.Config{}, true},
	}
	for _, tt := range tests {
		got, err := tracing.ConfigFromEnv(func(k string) string { return tt.env[k] })
		if (err != nil) != tt.wantErr || !tt.wantErr && got != tt.want {
			t.Errorf("ConfigFromEnv(%v) = %+v, %v; want %+v, error %v", tt.env, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestSetupWithEndpointDoesNotDial(t *testing.T) {
	// The exporter connects lazily: Setup succeeds with no collector.
	opts, shutdown, err := tracing.Setup(context.Background(), tracing.Config{Endpoint: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(opts) == 0 {
		t.Errorf("Setup with an endpoint returned no server options")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // do not wait to flush to a collector that is not there
	shutdown(ctx)
}

// serveTraced serves ratelimitd's handler, traced with tp, on a loopback
// port, and returns a client and a stop function that returns once every
// call's span has ended (a span ends after its answer is sent).
func serveTraced(t *testing.T, tp *sdktrace.TracerProvider) (rlsv3.RateLimitServiceClient, func()) {
	t.Helper()
	s := serveModelLimit(t, tracing.ServerOptions(tp))
	t.Cleanup(s.GracefulStop)
	return s.Client(), s.GracefulStop
}

// serveModelLimit serves ratelimitd's handler, with the gRPC server
// options opts, on a loopback port with one rule in domain api: model, 1
// a minute, on the memory store.
func serveModelLimit(t *testing.T, opts []grpc.ServerOption) *servertest.Server {
	t.Helper()
	set := servertest.ParseConfig(t, "api.yaml", `
domain: api
descriptors:
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(set)
	return servertest.Start(t, servertest.Options{RateLimit: srv, ServerOptions: opts})
}

func TestSpanHasDomainAndCode(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	client, stop := serveTraced(t, tp)
	req := servertest.Request("api", servertest.Desc("model", "x"))
	for _, want := range []string{"OK", "OVER_LIMIT"} {
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil || resp.GetOverallCode().String() != want {
			t.Fatalf("ShouldRateLimit = %v, %v; want %s", resp.GetOverallCode(), err, want)
		}
	}

	stop()
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2: %v", len(spans), spans)
	}
	// Spans are exported as they end, which need not be in call order.
	var codes []string
	for i, s := range spans {
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range s.Attributes {
			attrs[a.Key] = a.Value
		}
		if s.Name != "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" ||
			attrs[tracing.DomainKey].AsString() != "api" || attrs[tracing.DescriptorsKey].AsInt64() != 1 {
			t.Errorf("span %d: %s %v; want ShouldRateLimit with domain api and 1 descriptor", i, s.Name, attrs)
		}
		codes = append(codes, attrs[tracing.OverallCodeKey].AsString())
	}
	slices.Sort(codes)
	if !slices.Equal(codes, []string{"OK", "OVER_LIMIT"}) {
		t.Errorf("spans' overall codes = %v, want OK and OVER_LIMIT", codes)
	}
}

// TestSpanJoinsEnvoysTrace: a call carrying Envoy's W3C traceparent gets a
// span in that trace, under Envoy's span.
func TestSpanJoinsEnvoysTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	client, stop := serveTraced(t, tp)

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	req := servertest.Request("api", servertest.Desc("model", "x"))
	if _, err := client.ShouldRateLimit(ctx, req); err != nil {
		t.Fatal(err)
	}
	stop()
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1: %v", len(spans), spans)
	}
	s := spans[0]
	if got := s.SpanContext.TraceID().String(); got != traceID {
		t.Errorf("span's trace = %s, want Envoy's %s", got, traceID)
	}
	if got := s.Parent.SpanID().String(); got != parentID || !s.Parent.IsRemote() {
		t.Errorf("span's parent = %s (remote %v), want Envoy's span %s", got, s.Parent.IsRemote(), parentID)
	}
}

func TestTracesURL(t *testing.T) {
	tests := []struct{ endpoint, want string }{
		{"http://otel-collector:4318", "http://otel-collector:4318/v1/traces"},
		{"http://otel-collector:4318/", "http://otel-collector:4318/v1/traces"},
		{"https://c.example/otlp", "https://c.example/otlp/v1/traces"},
	}
	for _, tt := range tests {
		if got, err := tracing.TracesURL(tt.endpoint); err != nil || got != tt.want {
			t.Errorf("TracesURL(%q) = %q, %v; want %q", tt.endpoint, got, err, tt.want)
		}
	}
	for _, bad := range []string{"otel-collector:4318", "grpc://c:4317", "http://"} {
		if got, err := tracing.TracesURL(bad); err == nil {
			t.Errorf("TracesURL(%q) = %q, want an error", bad, got)
		}
	}
}

// TestHTTPExporterPostsToTheCollector traces a call through Setup with
// ProtocolHTTP and a real OTLP/HTTP endpoint (an HTTP server on loopback):
// the span arrives at /v1/traces under the base URL, with the resource's
// service attributes.
func TestHTTPExporterPostsToTheCollector(t *testing.T) {
	posts := make(chan *http.Request, 10)
	bodies := make(chan []byte, 10)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		posts <- r
		bodies <- b
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	opts, shutdown, err := tracing.Setup(context.Background(), tracing.Config{
		Endpoint: collector.URL, Protocol: tracing.ProtocolHTTP,
		ServiceName: "envoy-ratelimit", ServiceNamespace: "envoy-gateway-system", ServiceInstanceID: "pod-1", SampleRatio: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := serveModelLimit(t, opts)
	req := servertest.Request("api", servertest.Desc("model", "x"))
	if _, err := s.Client().ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	s.GracefulStop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil { // flushes the batch
		t.Fatalf("shutdown: %v", err)
	}
	select {
	case r := <-posts:
		body := <-bodies
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("collector got %s %s (%s), want POST /v1/traces application/x-protobuf", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		}
		for _, want := range []string{"envoy-ratelimit", "envoy-gateway-system", "pod-1", "ShouldRateLimit"} {
			if !bytes.Contains(body, []byte(want)) {
				t.Errorf("exported body has no %q", want)
			}
		}
	default:
		t.Fatal("no OTLP/HTTP post reached the collector")
	}
}
