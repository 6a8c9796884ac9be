package daemon_test

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// oneAnHour has one token an hour for each client: the second call is
// denied.
const oneAnHour = `domain: api
descriptors:
  - {key: client, rate_limit: {unit: hour, requests_per_unit: 1, name: hourly}}
`

// start runs a daemon of cfg (on the memory backend, loopback ports, the
// descriptor file oneAnHour) until the test ends, and returns a client of
// it and its HTTP address. It checks that Run returns nil once told to stop.
func start(t *testing.T, cfg daemon.Config) (*grpc.ClientConn, string) {
	t.Helper()
	r := run(t, cfg, oneAnHour)
	return r.conn, r.d.HTTPAddr().String()
}

// TestConfigReachesTheAnswers: each answer-shaping field of Config is what
// the service answers with (the flags that set them are cmd/ratelimitd's
// table tests): two calls on a one-token bucket, the second denied.
func TestConfigReachesTheAnswers(t *testing.T) {
	tests := []struct {
		name         string
		cfg          daemon.Config
		wantMetadata [2]bool // dynamic_metadata on the admission, on the denial
		wantRetry    bool    // Retry-After on the denial
		wantXHeaders bool    // X-RateLimit-* on the denial
		wantLimit    string  // with incumbent headers, the limit header's name on the denial
	}{
		{"defaults", daemon.Config{}, [2]bool{false, true}, true, false, ""},
		{"dynamic metadata on every answer", daemon.Config{DynamicMetadata: server.DynamicMetadataAll}, [2]bool{true, true}, true, false, ""},
		{"no dynamic metadata", daemon.Config{DynamicMetadata: server.DynamicMetadataOff}, [2]bool{false, false}, true, false, ""},
		{"Retry-After left to Envoy", daemon.Config{RetryAfter: server.RetryAfterOmit}, [2]bool{false, true}, false, false, ""},
		{"draft-03 headers", daemon.Config{RateLimitHeaders: server.RateLimitHeadersDraft03}, [2]bool{false, true}, true, true, ""},
		{"the incumbent's headers, renamed", daemon.Config{RateLimitHeaders: server.RateLimitHeadersIncumbent,
			RateLimitHeaderNames: server.HeaderNames{Limit: "A-Limit", Remaining: "A-Remaining", Reset: "A-Reset"}}, [2]bool{false, true}, true, false, "A-Limit"},
	}
	req := servertest.Request("api", servertest.Desc("client", "a"))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, _ := start(t, tt.cfg)
			rls := rlsv3.NewRateLimitServiceClient(conn)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			first, err := rls.ShouldRateLimit(ctx, req)
			if err != nil || first.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("first call = %v, %v; want OK", first.GetOverallCode(), err)
			}
			if got := first.GetDynamicMetadata() != nil; got != tt.wantMetadata[0] {
				t.Errorf("admission: dynamic_metadata present %v, want %v", got, tt.wantMetadata[0])
			}
			second, err := rls.ShouldRateLimit(ctx, req)
			if err != nil || second.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("second call = %v, %v; want OVER_LIMIT", second.GetOverallCode(), err)
			}
			if got := second.GetDynamicMetadata() != nil; got != tt.wantMetadata[1] {
				t.Errorf("denial: dynamic_metadata present %v, want %v", got, tt.wantMetadata[1])
			}
			headers := map[string]bool{}
			for _, h := range second.GetResponseHeadersToAdd() {
				headers[http.CanonicalHeaderKey(h.GetKey())] = true
			}
			if headers["Retry-After"] != tt.wantRetry || headers["X-Ratelimit-Limit"] != tt.wantXHeaders {
				t.Errorf("denial's headers %v: want Retry-After %v, X-RateLimit-Limit %v", headers, tt.wantRetry, tt.wantXHeaders)
			}
			if tt.wantLimit != "" && (!headers[tt.wantLimit] || headers["Ratelimit-Limit"]) {
				t.Errorf("denial's headers %v: want %s, not RateLimit-Limit", headers, tt.wantLimit)
			}
		})
	}
}

// TestHealthAndReadiness: on the memory backend a daemon is SERVING under
// every health name and ready at once.
func TestHealthAndReadiness(t *testing.T) {
	conn, httpAddr := start(t, daemon.Config{})
	hc := healthpb.NewHealthClient(conn)
	for _, name := range daemon.HealthNames {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q = %v, %v; want SERVING", name, resp.GetStatus(), err)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := servertest.Get(t, "http://"+httpAddr+path); code != http.StatusOK {
			t.Errorf("GET %s = %d %q, want 200", path, code, body)
		}
	}
}

// TestNewRejectsAMissingConfig: New without a config path, or with one that
// does not load, fails and opens nothing.
func TestNewRejectsAMissingConfig(t *testing.T) {
	for _, path := range []string{"", filepath.Join(t.TempDir(), "missing")} {
		if _, err := daemon.New(daemon.Config{ConfigPath: path, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler)); err == nil {
			t.Errorf("New(ConfigPath %q) succeeded, want an error", path)
		}
	}
}
