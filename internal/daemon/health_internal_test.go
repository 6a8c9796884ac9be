package daemon

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// The backend's log lines these tests watch.
const (
	lineReady    = "backend ready"
	lineNotReady = "backend not ready; answering per --on-backend-failure until it is"
	lineFailing  = "backend failing; answering per --on-backend-failure"
	lineBack     = "backend answers again"
)

// TestBackendLinesFollowHealth: the line that says the backend's first
// preparation ended ("backend ready", or "backend not ready" in a failure
// mode that answers anyway) is logged once gRPC health already says
// SERVING, so that whoever waits for it (an operator, a test harness)
// finds the replica in rotation.
func TestBackendLinesFollowHealth(t *testing.T) {
	tests := []struct {
		name      string
		redisDown bool
		mode      failover.Mode
		line      string
	}{
		{"Redis up", false, failover.Error, lineReady},
		{"Redis down, failure mode allow", true, failover.Allow, lineNotReady},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.Start(t)
			if tt.redisDown {
				srv.Stop()
			}
			w := watchLines(t, Config{Redis: Redis{URL: "redis://" + srv.Addr}, Failure: failover.Options{Mode: tt.mode}},
				"domain: api\n", tt.line)
			w.await(tt.line, healthpb.HealthCheckResponse_SERVING, nil)
		})
	}
}

// TestBreakerLinesFollowHealth: in failure mode error, "backend failing"
// is logged once gRPC health says NOT_SERVING, and "backend answers
// again" once it says SERVING again (the breaker closed by its background
// probe after Redis came back).
func TestBreakerLinesFollowHealth(t *testing.T) {
	srv := redistest.Start(t)
	cfg := Config{
		Redis:   Redis{URL: "redis://" + srv.Addr, DialTimeout: 50 * time.Millisecond},
		Failure: failover.Options{Mode: failover.Error, Timeout: 20 * time.Millisecond, OpenFor: 50 * time.Millisecond},
	}
	const yaml = "domain: api\ndescriptors:\n  - {key: client, rate_limit: {unit: hour, requests_per_unit: 1000}}\n"
	w := watchLines(t, cfg, yaml, lineReady, lineFailing, lineBack)
	w.await(lineReady, healthpb.HealthCheckResponse_SERVING, nil)

	srv.Stop()
	req := servertest.Request("api", servertest.Desc("client", "a"))
	call := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		w.d.srv.ShouldRateLimit(ctx, req) // fails while Redis is down: what opens the breaker
	}
	w.await(lineFailing, healthpb.HealthCheckResponse_NOT_SERVING, call)

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	w.await(lineBack, healthpb.HealthCheckResponse_SERVING, nil)
}

// lineWatch is a running daemon whose log handler reads gRPC health
// ("ratelimit") as each watched line is logged, from the goroutine that
// logs it: what a reader of that line would find.
type lineWatch struct {
	t      *testing.T
	d      *Daemon
	health map[string]chan healthpb.HealthCheckResponse_ServingStatus // line → health when first logged
}

// watchLines runs a daemon of cfg (loopback ports, yaml as its one
// descriptor file) until the test ends, watching lines.
func watchLines(t *testing.T, cfg Config, yaml string, lines ...string) *lineWatch {
	t.Helper()
	dir := servertest.DescriptorDir(t, map[string]string{"api.yaml": yaml})
	cfg.ConfigPath, cfg.GRPCAddr, cfg.HTTPAddr = dir, "127.0.0.1:0", "127.0.0.1:0"
	w := &lineWatch{t: t, health: map[string]chan healthpb.HealthCheckResponse_ServingStatus{}}
	for _, l := range lines {
		w.health[l] = make(chan healthpb.HealthCheckResponse_ServingStatus, 1)
	}
	var running atomic.Pointer[Daemon]
	log := slog.New(recordFunc(func(r slog.Record) {
		c, ok := w.health[r.Message]
		if !ok {
			return
		}
		resp, err := running.Load().health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err != nil {
			t.Errorf("health Check as %q is logged: %v", r.Message, err)
		}
		select {
		case c <- resp.GetStatus():
		default:
		}
	}))
	d, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	w.d = d
	running.Store(d)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v after its context ended, want nil", err)
		}
	})
	return w
}

// await waits up to 20 s for line, running meanwhile (unless nil) about
// every 10 ms, and checks that health was want as it was logged.
func (w *lineWatch) await(line string, want healthpb.HealthCheckResponse_ServingStatus, meanwhile func()) {
	w.t.Helper()
	end := time.Now().Add(20 * time.Second)
	for {
		select {
		case st := <-w.health[line]:
			if st != want {
				w.t.Errorf("gRPC health as %q is logged = %v, want %v", line, st, want)
			}
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(end) {
			w.t.Fatalf("%q not logged within 20s", line)
		}
		if meanwhile != nil {
			meanwhile()
		}
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
