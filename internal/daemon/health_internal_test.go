package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// TestBackendLinesFollowHealth: the line that says the backend's first
// preparation ended ("backend ready", or "backend not ready" in a failure
// mode that answers anyway) is logged once gRPC health already says
// SERVING, so that whoever waits for it (an operator, a test harness)
// finds the replica in rotation. The log handler reads the health server
// as the line is logged, from the goroutine that logs it.
func TestBackendLinesFollowHealth(t *testing.T) {
	tests := []struct {
		name      string
		redisDown bool
		mode      failover.Mode
		line      string
	}{
		{"Redis up", false, failover.Error, "backend ready"},
		{"Redis down, failure mode allow", true, failover.Allow, "backend not ready; answering per --on-backend-failure until it is"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.Start(t)
			if tt.redisDown {
				srv.Stop()
			}
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte("domain: api\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			var daemon atomic.Pointer[Daemon]
			logged := make(chan healthpb.HealthCheckResponse_ServingStatus, 1)
			log := slog.New(recordFunc(func(r slog.Record) {
				if r.Message != tt.line {
					return
				}
				resp, err := daemon.Load().health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
				if err != nil {
					t.Errorf("health Check as %q is logged: %v", tt.line, err)
				}
				select {
				case logged <- resp.GetStatus():
				default:
				}
			}))
			cfg := Config{
				ConfigPath: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
				Redis:   Redis{URL: "redis://" + srv.Addr},
				Failure: failover.Options{Mode: tt.mode},
			}
			d, err := New(cfg, log)
			if err != nil {
				t.Fatal(err)
			}
			daemon.Store(d)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- d.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run = %v after its context ended, want nil", err)
				}
			}()
			select {
			case st := <-logged:
				if st != healthpb.HealthCheckResponse_SERVING {
					t.Errorf("gRPC health as %q is logged = %v, want SERVING", tt.line, st)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%q not logged within 20s", tt.line)
			}
		})
	}
}

// recordFunc is a slog.Handler that hands every record to itself.
type recordFunc func(slog.Record)

func (f recordFunc) Enabled(context.Context, slog.Level) bool { return true }

func (f recordFunc) Handle(_ context.Context, r slog.Record) error {
	f(r)
	return nil
}

func (f recordFunc) WithAttrs([]slog.Attr) slog.Handler { return f }
func (f recordFunc) WithGroup(string) slog.Handler      { return f }
