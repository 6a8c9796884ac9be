package daemon_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
)

// heldConfig lets a call wait up to 5 s for a token that comes every 3 s.
const heldConfig = `domain: agents
descriptors:
  - key: agent
    rate_limit: {unit: minute, requests_per_unit: 20, burst: 1, max_wait: 5s}
`

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
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "agents.yaml"), []byte(heldConfig), 0o600); err != nil {
				t.Fatal(err)
			}
			d, err := daemon.New(daemon.Config{ConfigPath: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
				ShutdownTimeout: tt.timeout}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- d.Run(ctx) }()
			conn, err := grpc.NewClient(d.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			rls := rlsv3.NewRateLimitServiceClient(conn)
			req := &rlsv3.RateLimitRequest{Domain: "agents", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "agent", Value: "a"}},
			}}}
			if resp, err := rls.ShouldRateLimit(ctx, req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("first call = %v, %v; want OK", resp.GetOverallCode(), err)
			}
			held := make(chan error, 1)
			go func() {
				callCtx, callCancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer callCancel()
				_, err := rls.ShouldRateLimit(callCtx, req)
				held <- err
			}()
			time.Sleep(300 * time.Millisecond) // for the call to reach the server; it waits 3 s
			cancel()
			select {
			case err := <-ran:
				if got := errors.Is(err, daemon.ErrDrainCut); got != tt.wantCut {
					t.Errorf("Run = %v; ErrDrainCut %v, want %v", err, got, tt.wantCut)
				}
				if !tt.wantCut && err != nil {
					t.Errorf("Run = %v after a clean drain, want nil", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return within 20 s of its context ending")
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
