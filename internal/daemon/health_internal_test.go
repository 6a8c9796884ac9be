package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
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

// TestBreakerLinesFollowHealth: in failure mode error, "backend failing"
// is logged once gRPC health says NOT_SERVING, and "backend answers
// again" once it says SERVING again (the breaker closed by its background
// probe after Redis came back), read by the log handler as each line is
// logged.
func TestBreakerLinesFollowHealth(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	const yaml = "domain: api\ndescriptors:\n  - {key: client, rate_limit: {unit: hour, requests_per_unit: 1000}}\n"
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var daemon atomic.Pointer[Daemon]
	lines := map[string]chan healthpb.HealthCheckResponse_ServingStatus{
		"backend ready": make(chan healthpb.HealthCheckResponse_ServingStatus, 1),
		"backend failing; answering per --on-backend-failure": make(chan healthpb.HealthCheckResponse_ServingStatus, 1),
		"backend answers again":                               make(chan healthpb.HealthCheckResponse_ServingStatus, 1),
	}
	log := slog.New(recordFunc(func(r slog.Record) {
		c, ok := lines[r.Message]
		if !ok {
			return
		}
		resp, err := daemon.Load().health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err != nil {
			t.Errorf("health Check as %q is logged: %v", r.Message, err)
		}
		select {
		case c <- resp.GetStatus():
		default:
		}
	}))
	cfg := Config{
		ConfigPath: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Redis:   Redis{URL: "redis://" + srv.Addr, DialTimeout: 50 * time.Millisecond},
		Failure: failover.Options{Mode: failover.Error, Timeout: 20 * time.Millisecond, OpenFor: 50 * time.Millisecond},
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
	await := func(line string, want healthpb.HealthCheckResponse_ServingStatus, meanwhile func()) {
		t.Helper()
		end := time.Now().Add(20 * time.Second)
		for {
			select {
			case st := <-lines[line]:
				if st != want {
					t.Errorf("gRPC health as %q is logged = %v, want %v", line, st, want)
				}
				return
			case <-time.After(10 * time.Millisecond):
			}
			if time.Now().After(end) {
				t.Fatalf("%q not logged within 20s", line)
			}
			if meanwhile != nil {
				meanwhile()
			}
		}
	}
	await("backend ready", healthpb.HealthCheckResponse_SERVING, nil)

	srv.Stop()
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client", Value: "a"}},
	}}}
	call := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		d.srv.ShouldRateLimit(ctx, req) // fails while Redis is down: what opens the breaker
	}
	await("backend failing; answering per --on-backend-failure", healthpb.HealthCheckResponse_NOT_SERVING, call)

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	await("backend answers again", healthpb.HealthCheckResponse_SERVING, nil)
}
