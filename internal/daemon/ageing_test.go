package daemon_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// ageingConfig has a bucket a call waits about 2s on (held) and one that
// never runs dry (fast).
const ageingConfig = `domain: api
descriptors:
  - key: held
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 1, max_wait: 5s}
  - key: fast
    rate_limit: {unit: second, requests_per_unit: 1000000}
`

// connCounter counts the client's connections (transports) opened.
type connCounter struct{ begun atomic.Int64 }

func (c *connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (c *connCounter) HandleRPC(context.Context, stats.RPCStats)                         {}
func (c *connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (c *connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		c.begun.Add(1)
	}
}

// TestMaxConnectionAge: with MaxConnectionAge the server closes each
// connection (GOAWAY) after about that long; the client reconnects, and a
// steady stream of calls sees no failure; a call in flight at the GOAWAY
// is answered if it finishes within MaxConnectionAgeGrace, and cut off if
// it does not.
func TestMaxConnectionAge(t *testing.T) {
	tests := []struct {
		name     string
		grace    time.Duration
		wantHeld codes.Code
	}{
		{"held call within grace", 5 * time.Second, codes.OK},
		{"held call past grace", 200 * time.Millisecond, codes.Unavailable},
	}
	entry := func(key string) *rlsv3.RateLimitRequest { return servertest.Request("api", servertest.Desc(key, "a")) }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const age = 300 * time.Millisecond
			r := run(t, daemon.Config{MaxConnectionAge: age, MaxConnectionAgeGrace: tt.grace}, ageingConfig)
			conns := &connCounter{}
			rls := rlsv3.NewRateLimitServiceClient(servertest.Dial(t, r.d.GRPCAddr().String(), grpc.WithStatsHandler(conns)))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			// The held call takes the token, the next one waits for the
			// next: about 2s, past the first connection's age.
			held := takeThenHold(ctx, t, rls, entry("held"))

			// Calls every 10ms for 2.5s (at most 250): about eight ages.
			start, calls := time.Now(), 0
			for ; calls < 250 && time.Since(start) < 2500*time.Millisecond; calls++ {
				resp, err := rls.ShouldRateLimit(ctx, entry("fast"))
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("call %d after %v = %v, %v; want OK: ageing must not fail a call", calls, time.Since(start), resp.GetOverallCode(), err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got := conns.begun.Load(); got < 3 {
				t.Errorf("%d connections over %v of calls with MaxConnectionAge %v, want at least 3 (the server closes each)", got, time.Since(start), age)
			}
			if got := status.Code(<-held); got != tt.wantHeld {
				t.Errorf("held call with grace %v = %v, want %v", tt.grace, got, tt.wantHeld)
			}
		})
	}
}
