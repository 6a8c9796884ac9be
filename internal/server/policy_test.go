package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// policyConfig: two calls a minute per user.
const policyConfig = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-user}
`

// guards records the Guard of each call.
func guards(c server.Call) string { return c.Guard.Cause + "/" + c.Guard.Action }

// startRegistered serves srv as the daemon does: Register, the Codec and
// gRPC's read limit from server.ReadLimit.
func startRegistered(t *testing.T, opts server.Options) (rlsv3.RateLimitServiceClient, *recorder[string]) {
	t.Helper()
	rec := &recorder[string]{keep: guards}
	opts.Store = limiter.NewMemoryStore(limiter.MemoryOptions{})
	opts.Now = clocktest.New().Now
	opts.Observer = rec
	srv, err := server.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(server.MustParse(t, policyConfig))
	sopts := []grpc.ServerOption{server.Codec()}
	if opts.MaxRequestBytes > 0 {
		sopts = append(sopts, grpc.MaxRecvMsgSize(server.ReadLimit(opts.MaxRequestBytes)))
	}
	return servertest.Start(t, servertest.Options{Register: func(g *grpc.Server) { srv.Register(g) }, ServerOptions: sopts}).Client(), rec
}

// TestInvalidOverridePolicy sends each kind of invalid override, on a
// descriptor of the per-user rule beside a valid one, under each policy,
// over a real gRPC connection: deny answers OVER_LIMIT naming the override
// and takes nothing; ignore decides by the rule; error answers
// INVALID_ARGUMENT naming the field. The valid descriptor's bucket shows
// what was taken.
func TestInvalidOverridePolicy(t *testing.T) {
	overrides := []struct {
		name    string
		o       *ratelimitv3.RateLimitDescriptor_RateLimitOverride
		wantErr string
	}{
		{"unit unknown", &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}, "descriptors[0].limit: unit UNKNOWN is not a unit of time"},
		{"requests_per_unit 0", &ratelimitv3.RateLimitDescriptor_RateLimitOverride{Unit: typev3.RateLimitUnit_SECOND}, "descriptors[0].limit: requests_per_unit must be at least 1"},
		{"unit_multiplier 0", &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(0)}, "descriptors[0].limit: unit_multiplier must be at least 1"},
		{"over the bound", &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(585)}, "descriptors[0].limit: unit_multiplier 585"},
	}
	policies := []struct {
		policy server.InvalidOverride
		// wantRemaining is the valid descriptor's bucket (2 a minute) on
		// the next call: 1 when the policy's call took nothing.
		wantRemaining uint32
		wantGuard     string
	}{
		{0, 1, "invalid_override/deny"}, // the default
		{server.InvalidOverrideDeny, 1, "invalid_override/deny"},
		{server.InvalidOverrideIgnore, 0, "invalid_override/ignore"},
		{server.InvalidOverrideError, 1, "invalid_override/error"},
	}
	for _, o := range overrides {
		for _, p := range policies {
			t.Run(fmt.Sprintf("%s/%v", o.name, p.policy), func(t *testing.T) {
				c, rec := startRegistered(t, server.Options{OnInvalidOverride: p.policy})
				bad := &ratelimitv3.RateLimitDescriptor{Entries: desc("user", "mallory").Entries, Limit: o.o}
				req := request("api", bad, desc("user", "alice"))
				resp, err := c.ShouldRateLimit(context.Background(), req)
				switch p.policy {
				case server.InvalidOverrideError:
					if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), o.wantErr) {
						t.Errorf("ShouldRateLimit = %v, want InvalidArgument containing %q", err, o.wantErr)
					}
				case server.InvalidOverrideIgnore:
					if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						t.Fatalf("ShouldRateLimit = %v, %v; want OK", resp.GetOverallCode(), err)
					}
					// The rule decides: its limit, its bucket.
					if cl := resp.GetStatuses()[0].GetCurrentLimit(); cl.GetName() != "per-user" || cl.GetRequestsPerUnit() != 2 {
						t.Errorf("status 0's current_limit = %v, want the rule's per-user 2 a minute", cl)
					}
				default: // deny
					if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
						t.Fatalf("ShouldRateLimit = %v, %v; want OVER_LIMIT", resp.GetOverallCode(), err)
					}
					st := resp.GetStatuses()
					if st[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st[0].GetCurrentLimit().GetName() != server.InvalidOverrideName ||
						st[0].GetCurrentLimit().GetRequestsPerUnit() != 0 {
						t.Errorf("status 0 = %v, want OVER_LIMIT with current_limit %q, 0 per unit", st[0], server.InvalidOverrideName)
					}
					if st[1].GetCode() != rlsv3.RateLimitResponse_OK || st[1].GetLimitRemaining() != 2 {
						t.Errorf("status 1 = %v, want OK with 2 remaining (checked, not taken)", st[1])
					}
					if header(resp, "retry-after") != "1" {
						t.Errorf("retry-after = %q, want 1", header(resp, "retry-after"))
					}
				}
				next, err := c.ShouldRateLimit(context.Background(), request("api", desc("user", "alice")))
				if err != nil || next.GetStatuses()[0].GetLimitRemaining() != p.wantRemaining {
					t.Errorf("next call for alice: remaining %d (%v), want %d", next.GetStatuses()[0].GetLimitRemaining(), err, p.wantRemaining)
				}
				rec.mu.Lock()
				defer rec.mu.Unlock()
				if want := []string{p.wantGuard, "/"}; strings.Join(rec.calls, " ") != strings.Join(want, " ") {
					t.Errorf("observed guards %q, want %q", rec.calls, want)
				}
			})
		}
	}
}

// TestInvalidOverrideWithoutRule: ignored, an invalid override on a
// descriptor no rule matches leaves it passing; denied, it denies.
func TestInvalidOverrideWithoutRule(t *testing.T) {
	bad := &ratelimitv3.RateLimitDescriptor{Entries: desc("tenant", "t1").Entries,
		Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{Unit: typev3.RateLimitUnit_MINUTE}}
	for policy, want := range map[server.InvalidOverride]rlsv3.RateLimitResponse_Code{
		server.InvalidOverrideIgnore: rlsv3.RateLimitResponse_OK,
		server.InvalidOverrideDeny:   rlsv3.RateLimitResponse_OVER_LIMIT,
	} {
		c, _ := startRegistered(t, server.Options{OnInvalidOverride: policy})
		resp, err := c.ShouldRateLimit(context.Background(), request("api", bad))
		if err != nil || resp.GetOverallCode() != want {
			t.Errorf("%v: ShouldRateLimit = %v, %v; want %v", policy, resp.GetOverallCode(), err, want)
		}
	}
}

// TestOversizedRequestPolicy sends requests around the size bound (1 KiB)
// over a real gRPC connection: within it they are decided; over it they
// are answered per the policy (deny: OVER_LIMIT without statuses; error:
// RESOURCE_EXHAUSTED) and take nothing; over the read limit (4 KiB) gRPC
// refuses them itself, whatever the policy.
func TestOversizedRequestPolicy(t *testing.T) {
	const bound = 1024
	withValue := func(n int) *rlsv3.RateLimitRequest {
		return request("api", desc("user", strings.Repeat("v", n)))
	}
	tests := []struct {
		policy    server.OversizedRequest
		wantOver  codes.Code // of the oversized request: OK (answered OVER_LIMIT) or ResourceExhausted
		wantGuard string
	}{
		{0, codes.OK, "oversized_request/deny"},
		{server.OversizedDeny, codes.OK, "oversized_request/deny"},
		{server.OversizedError, codes.ResourceExhausted, "oversized_request/error"},
	}
	for _, tt := range tests {
		t.Run(tt.policy.String(), func(t *testing.T) {
			c, rec := startRegistered(t, server.Options{OnOversizedRequest: tt.policy, MaxRequestBytes: bound})
			if resp, err := c.ShouldRateLimit(context.Background(), withValue(bound-100)); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 {
				t.Errorf("a request within the bound = %v, %v; want OK with its status", resp, err)
			}
			resp, err := c.ShouldRateLimit(context.Background(), withValue(bound+1))
			if status.Code(err) != tt.wantOver {
				t.Errorf("over the bound: %v, want code %v", err, tt.wantOver)
			}
			if tt.wantOver == codes.OK && (resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.GetStatuses()) != 0) {
				t.Errorf("over the bound: %v, want OVER_LIMIT without statuses", resp)
			}
			if tt.wantOver == codes.ResourceExhausted && !strings.Contains(status.Convert(err).Message(), "more than the 1024 allowed") {
				t.Errorf("over the bound: %v, want the size and the bound named", err)
			}
			// Past the read limit gRPC answers before the server sees it.
			if _, err := c.ShouldRateLimit(context.Background(), withValue(server.ReadLimit(bound)+1)); status.Code(err) != codes.ResourceExhausted {
				t.Errorf("over the read limit: %v, want ResourceExhausted from gRPC", err)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if want := []string{"/", tt.wantGuard}; strings.Join(rec.calls, " ") != strings.Join(want, " ") {
				t.Errorf("observed guards %q, want %q", rec.calls, want)
			}
		})
	}
}

// TestRegisterWithoutBound: with MaxRequestBytes 0, Register serves as
// rlsv3's registration does, up to gRPC's own limit.
func TestRegisterWithoutBound(t *testing.T) {
	c, _ := startRegistered(t, server.Options{})
	resp, err := c.ShouldRateLimit(context.Background(), request("api", desc("user", strings.Repeat("v", 100_000))))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit = %v, %v; want OK", resp.GetOverallCode(), err)
	}
}

func TestParsePolicies(t *testing.T) {
	for _, name := range []string{"deny", "ignore", "error"} {
		if p, err := server.ParseInvalidOverride(name); err != nil || p.String() != name {
			t.Errorf("ParseInvalidOverride(%q) = %v, %v", name, p, err)
		}
	}
	for _, name := range []string{"deny", "error"} {
		if p, err := server.ParseOversizedRequest(name); err != nil || p.String() != name {
			t.Errorf("ParseOversizedRequest(%q) = %v, %v", name, p, err)
		}
	}
	if _, err := server.ParseOversizedRequest("ignore"); err == nil || !strings.Contains(err.Error(), "want deny or error") {
		t.Errorf("ParseOversizedRequest(ignore) = %v, want an error listing deny and error", err)
	}
	if _, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), OnInvalidOverride: 9}); err == nil {
		t.Error("New accepted OnInvalidOverride 9")
	}
}

// TestRegisterTraced: served through Register with tracing's options, as
// the daemon serves it, a call and an oversized one each get their span,
// the decided one with its domain.
func TestRegisterTraced(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), MaxRequestBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(server.MustParse(t, policyConfig))
	opts := append(tracing.ServerOptions(tp), server.Codec(), grpc.MaxRecvMsgSize(server.ReadLimit(1024)))
	s := servertest.Start(t, servertest.Options{Register: func(g *grpc.Server) { srv.Register(g) }, ServerOptions: opts})
	c := s.Client()
	if resp, err := c.ShouldRateLimit(context.Background(), request("api", desc("user", "a"))); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit = %v, %v", resp.GetOverallCode(), err)
	}
	if resp, err := c.ShouldRateLimit(context.Background(), request("api", desc("user", strings.Repeat("v", 2000)))); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("oversized ShouldRateLimit = %v, %v; want OVER_LIMIT", resp.GetOverallCode(), err)
	}
	s.GracefulStop()
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	// Spans are exported as they end, and the first call's may end after
	// the second's: its handler returns once the answer is written.
	found := false
	for _, span := range spans {
		for _, a := range span.Attributes {
			found = found || a.Key == tracing.DomainKey && a.Value.AsString() == "api"
		}
	}
	if !found {
		t.Errorf("neither span carries the domain: %v; %v", spans[0].Attributes, spans[1].Attributes)
	}
}

// TestRegisterInterceptorReplacesRequest: served through Register with a
// unary interceptor, the handler decides the request the interceptor
// hands on, which may be another than the one decoded.
func TestRegisterInterceptorReplacesRequest(t *testing.T) {
	srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), Now: clocktest.New().Now})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(server.MustParse(t, policyConfig))
	// Every call is decided as user "b"'s: two a minute between them all.
	toB := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		return next(ctx, request("api", desc("user", "b")))
	}
	opts := []grpc.ServerOption{server.Codec(), grpc.UnaryInterceptor(toB)}
	c := servertest.Start(t, servertest.Options{Register: func(g *grpc.Server) { srv.Register(g) }, ServerOptions: opts}).Client()
	var got []rlsv3.RateLimitResponse_Code
	for _, user := range []string{"a", "c", "d"} {
		resp, err := c.ShouldRateLimit(context.Background(), request("api", desc("user", user)))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, resp.GetOverallCode())
	}
	if want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}; !slices.Equal(got, want) {
		t.Errorf("three users' calls, each replaced by user b's: %v, want %v", got, want)
	}
}
