package daemon_test

import (
	"context"
	"errors"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// heldConfig lets a call wait up to 5 s for a token that comes every 3 s.
const heldConfig = `domain: agents
descriptors:
  - key: agent
    rate_limit: {unit: minute, requests_per_unit: 20, burst: 1, max_wait: 5s}
`

// takeThenHold makes req's call, which must be admitted, then the same
// call in the background, held for the next token; that call's error
// comes on the channel. Both calls end with ctx.
func takeThenHold(ctx context.Context, t *testing.T, rls rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) <-chan error {
	t.Helper()
	if resp, err := rls.ShouldRateLimit(ctx, req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first call = %v, %v; want OK", resp.GetOverallCode(), err)
	}
	held := make(chan error, 1)
	go func() {
		_, err := rls.ShouldRateLimit(ctx, req)
		held <- err
	}()
	return held
}

// TestRunReportsACutDrain: a call held for its token (about 3 s) when the
// context ends is answered UNAVAILABLE and Run returns ErrDrainCut when
// ShutdownTimeout is shorter than the hold; with a longer one it is
// answered OK and Run returns nil.
func TestRunReportsACutDrain(t *testing.T) {
	tests := []struct {
		name     string
		timeout  time.Duration
		wantCut  bool
		wantCode codes.Code
	}{
		{"cut short", 200 * time.Millisecond, true, codes.Unavailable},
		{"clean", time.Minute, false, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, daemon.Config{ShutdownTimeout: tt.timeout}, heldConfig)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			rls := rlsv3.NewRateLimitServiceClient(r.conn)
			req := servertest.Request("agents", servertest.Desc("agent", "a"))
			held := takeThenHold(ctx, t, rls, req)
			time.Sleep(300 * time.Millisecond) // for the call to reach the server; it waits 3 s
			err := r.stop()
			if got := errors.Is(err, daemon.ErrDrainCut); got != tt.wantCut {
				t.Errorf("Run = %v; ErrDrainCut %v, want %v", err, got, tt.wantCut)
			}
			if !tt.wantCut && err != nil {
				t.Errorf("Run = %v after a clean drain, want nil", err)
			}
			select {
			case err := <-held:
				if got := status.Code(err); got != tt.wantCode {
					t.Errorf("the held call = %v, want code %v", err, tt.wantCode)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the held call was not answered")
			}
		})
	}
}
