package daemon_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/proctest"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// running is a daemon started by run, its client and how to stop it.
type running struct {
	d    *daemon.Daemon
	conn *grpc.ClientConn
	// stop ends Run's context and returns Run's error (once; later calls
	// return nil).
	stop func() error
}

// run starts a daemon of cfg on loopback ports with the descriptor file
// yaml (none if yaml is "", for a config from xDS), stopped (if the test did not) when the test ends.
func run(t *testing.T, cfg daemon.Config, yaml string) *running {
	t.Helper()
	if yaml != "" {
		cfg.ConfigPath = servertest.DescriptorDir(t, map[string]string{"api.yaml": yaml})
	}
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	d, err := daemon.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(15 * time.Second):
			t.Error("Run did not return within 15s of its context ending")
			return nil
		}
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run = %v after its context ended, want nil", err)
		}
	})
	return &running{d: d, conn: servertest.Dial(t, d.GRPCAddr().String()), stop: stop}
}

// healthOf is the gRPC health status under the name "ratelimit".
func healthOf(t *testing.T, conn *grpc.ClientConn) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatalf("health Check(ratelimit): %v", err)
	}
	return resp.GetStatus()
}

// TestHealthcheckFollowsRedis: /healthcheck is envoyproxy/ratelimit's: 500
// with no body while the Redis backend is down at start, in step with
// gRPC health (NOT_SERVING under "ratelimit") and /readyz (503); 200 "OK"
// once Redis is up, with SERVING and /readyz 200.
func TestHealthcheckFollowsRedis(t *testing.T) {
	redis := redistest.Start(t)
	redis.Stop()
	r := run(t, daemon.Config{Redis: daemon.Redis{URL: "redis://" + redis.Addr}, IncumbentMetrics: true}, oneAnHour)
	base := "http://" + r.d.HTTPAddr().String()
	// inStep checks that gRPC health and /readyz say what /healthcheck
	// said.
	inStep := func(when string, health healthpb.HealthCheckResponse_ServingStatus, readyz int) {
		t.Helper()
		if st := healthOf(t, r.conn); st != health {
			t.Errorf("%s: gRPC health = %v, want %v", when, st, health)
		}
		if code, body := servertest.Get(t, base+"/readyz"); code != readyz {
			t.Errorf("%s: GET /readyz = %d %q, want %d", when, code, body, readyz)
		}
	}

	code, body := servertest.Get(t, base+"/healthcheck")
	if code != http.StatusInternalServerError || body != "" {
		t.Errorf("Redis down: GET /healthcheck = %d %q, want 500 with no body", code, body)
	}
	inStep("Redis down", healthpb.HealthCheckResponse_NOT_SERVING, http.StatusServiceUnavailable)
	// A call meanwhile fails, and counts as the incumbent's redis_error.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(r.conn).ShouldRateLimit(ctx, servertest.Request("api", servertest.Desc("client", "a"))); status.Code(err) != codes.Unavailable {
		t.Errorf("Redis down: ShouldRateLimit = %v, want UNAVAILABLE (failure mode error)", err)
	}
	if got := scrape(t, base+"/metrics")[`ratelimit_service_should_rate_limit_error{err_type="redis_error"}`]; got != 1 {
		t.Errorf("Redis down: should_rate_limit_error{redis_error} = %v after one failed call, want 1", got)
	}

	if err := redis.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body = servertest.Get(t, base+"/healthcheck")
		if code == http.StatusOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code != http.StatusOK || body != "OK" {
		t.Fatalf("Redis up: GET /healthcheck = %d %q, want 200 \"OK\" within 15s", code, body)
	}
	inStep("Redis up", healthpb.HealthCheckResponse_SERVING, http.StatusOK)
	// Any method, as the incumbent's router answers.
	resp, err := http.Head(base + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("HEAD /healthcheck = %d, want 200", resp.StatusCode)
	}
}

// waitsTwoSeconds has one token every 2s, and lets a call wait for it.
const waitsTwoSeconds = `domain: api
descriptors:
  - key: client
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 1, max_wait: 5s}
`

// TestHealthcheckDuringShutdown: once shutdown has begun (gRPC health
// Watch says NOT_SERVING) and while a call in flight holds the drain,
// /healthcheck answers 500; the call is still answered.
func TestHealthcheckDuringShutdown(t *testing.T) {
	r := run(t, daemon.Config{}, waitsTwoSeconds)
	base := "http://" + r.d.HTTPAddr().String()
	if code, body := servertest.Get(t, base+"/healthcheck"); code != http.StatusOK || body != "OK" {
		t.Fatalf("GET /healthcheck = %d %q, want 200 \"OK\"", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	watch, err := healthpb.NewHealthClient(r.conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := watch.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch first = %v, %v; want SERVING", first.GetStatus(), err)
	}
	rls := rlsv3.NewRateLimitServiceClient(r.conn)
	req := servertest.Request("api", servertest.Desc("client", "a"))
	if _, err := rls.ShouldRateLimit(ctx, req); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() {
		resp, err := rls.ShouldRateLimit(ctx, req) // waits for the next token, about 2s
		if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("held call = %v, want OK after its wait", resp.GetOverallCode())
		}
		held <- err
	}()
	time.Sleep(300 * time.Millisecond) // let the held call reach the server
	stopped := make(chan error, 1)
	go func() { stopped <- r.stop() }()
	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch after shutdown began = %v, %v; want NOT_SERVING", st.GetStatus(), err)
	}
	if code, body := servertest.Get(t, base+"/healthcheck"); code != http.StatusInternalServerError {
		t.Errorf("shutting down: GET /healthcheck = %d %q, want 500", code, body)
	}
	if err := <-held; err != nil {
		t.Errorf("held call: %v, want an answer (drained)", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

// TestDebugAndMetricsListeners: DebugAddr serves the index, /rlconfig and
// /stats (pprof only with Pprof); HTTPAddr serves POST /json; MetricsAddr serves the metrics at
// MetricsPath (and nothing else), as HTTPAddr does at /metrics.
func TestDebugAndMetricsListeners(t *testing.T) {
	for _, pprof := range []bool{false, true} {
		r := run(t, daemon.Config{DebugAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", MetricsPath: "/prom", Pprof: pprof}, oneAnHour)
		debug := "http://" + r.d.DebugAddr().String()
		code, body := servertest.Get(t, debug+"/rlconfig")
		if want := "api.client: unit=HOUR requests_per_unit=1, shadow_mode: false"; code != http.StatusOK || !strings.Contains(body, want) ||
			!strings.Contains(body, "api.yaml:3)\n") || !strings.HasPrefix(body, "# source: file ") {
			t.Errorf("GET debug /rlconfig = %d %q, want 200 with %q", code, body, want)
		}
		// POST /json on the HTTP listener spends like a gRPC call.
		for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
			resp, err := http.Post("http://"+r.d.HTTPAddr().String()+"/json", "application/json",
				strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"client","value":"json"}]}]}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("POST /json call %d = %d, want %d (1 an hour)", i+1, resp.StatusCode, want)
			}
		}
		if code, body := servertest.Get(t, debug+"/stats"); code != http.StatusOK || !strings.Contains(body, "memstats: ") {
			t.Errorf("GET debug /stats = %d %q, want 200 with memstats", code, body)
		}
		code, body = servertest.Get(t, debug+"/")
		if code != http.StatusOK || !strings.Contains(body, "/rlconfig: ") || strings.Contains(body, "/debug/pprof/") != pprof {
			t.Errorf("Pprof %v: GET debug / = %d %q, want the index, /debug/pprof/ listed iff Pprof", pprof, code, body)
		}
		want := http.StatusNotFound
		if pprof {
			want = http.StatusOK
		}
		if code, _ := servertest.Get(t, debug+"/debug/pprof/"); code != want {
			t.Errorf("Pprof %v: GET debug /debug/pprof/ = %d, want %d", pprof, code, want)
		}

		metrics := "http://" + r.d.MetricsAddr().String()
		if code, body := servertest.Get(t, metrics+"/prom"); code != http.StatusOK || !strings.Contains(body, "ratelimitd_config_reloads_total") {
			t.Errorf("GET metrics /prom = %d, want 200 with ratelimitd_config_reloads_total", code)
		}
		if code, _ := servertest.Get(t, metrics+"/metrics"); code != http.StatusNotFound {
			t.Errorf("GET metrics /metrics = %d, want 404 (MetricsPath is /prom)", code)
		}
		if code, body := servertest.Get(t, "http://"+r.d.HTTPAddr().String()+"/metrics"); code != http.StatusOK || !strings.Contains(body, "ratelimitd_config_reloads_total") {
			t.Errorf("GET http /metrics = %d, want 200 with the metrics", code)
		}
		if err := r.stop(); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		for name, addr := range map[string]string{"debug": debug, "metrics": metrics} {
			if resp, err := http.Get(addr + "/"); err == nil {
				resp.Body.Close()
				t.Errorf("after Run returned: the %s listener still answers", name)
			}
		}
	}
}

// TestNewClosesListenersOnFailure: a listener that cannot open fails New
// and leaves every port it opened free again.
func TestNewClosesListenersOnFailure(t *testing.T) {
	taken := run(t, daemon.Config{}, oneAnHour)
	dir := servertest.DescriptorDir(t, map[string]string{"api.yaml": oneAnHour})
	// The gRPC, HTTP and debug listeners open; the metrics one, on a port
	// in use, fails.
	cfg := daemon.Config{ConfigPath: dir, GRPCAddr: proctest.FreeAddr(t), HTTPAddr: proctest.FreeAddr(t),
		DebugAddr: proctest.FreeAddr(t), MetricsAddr: taken.d.HTTPAddr().String()}
	if _, err := daemon.New(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "metrics") {
		t.Fatalf("New with the metrics port taken = %v, want an error naming the metrics listener", err)
	}
	for _, addr := range []string{cfg.GRPCAddr, cfg.HTTPAddr, cfg.DebugAddr} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("after New failed, %s is still in use: %v", addr, err)
			continue
		}
		l.Close()
	}
	// A bad MetricsPath is an error naming the field.
	cfg.MetricsAddr, cfg.MetricsPath = "127.0.0.1:0", "metrics"
	if _, err := daemon.New(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "MetricsPath") {
		t.Fatalf("New with MetricsPath %q = %v, want an error naming MetricsPath", cfg.MetricsPath, err)
	}
}

// TestShadowModeReachesTheServer: with Config.ShadowMode the call a
// one-token bucket would deny is admitted.
func TestShadowModeReachesTheServer(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		r := run(t, daemon.Config{ShadowMode: shadow}, oneAnHour)
		rls := rlsv3.NewRateLimitServiceClient(r.conn)
		req := servertest.Request("api", servertest.Desc("client", "a"))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var resp *rlsv3.RateLimitResponse
		var err error
		for range 2 {
			if resp, err = rls.ShouldRateLimit(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		want := rlsv3.RateLimitResponse_OVER_LIMIT
		if shadow {
			want = rlsv3.RateLimitResponse_OK
		}
		if got := resp.GetOverallCode(); got != want {
			t.Errorf("ShadowMode %v: second call = %v, want %v", shadow, got, want)
		}
	}
}
