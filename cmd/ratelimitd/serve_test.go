package main

// Tests of what serve does around the calls: health that follows the
// backend without calls, shutdown that waits for calls but not for health
// watchers, readiness during shutdown, and SIGHUP at any moment. They run
// on real time, in-process or as real processes; their bounds are generous.

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// holdConfig has one token every 3 s with a burst of one, and lets a call
// wait 5 s for its token: the second call in a row is held about 3 s.
const holdConfig = `domain: agents
descriptors:
  - key: agent
    rate_limit: {unit: minute, requests_per_unit: 20, burst: 1, max_wait: 5s, name: agent}
`

// callResult is a ShouldRateLimit's answer.
type callResult struct {
	resp *rlsv3.RateLimitResponse
	err  error
}

// holdCall takes holdConfig's token, then starts a call that waits for the
// next one, and returns once that call has surely reached the server (and
// is held there for about 3 s more). Its answer comes on the channel.
func holdCall(t *testing.T, conn *grpc.ClientConn) <-chan callResult {
	t.Helper()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := servertest.Request("agents", servertest.Desc("agent", "a"))
	if resp, err := rls.ShouldRateLimit(context.Background(), req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first ShouldRateLimit = %v, %v; want OK", resp.GetOverallCode(), err)
	}
	held := make(chan callResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := rls.ShouldRateLimit(ctx, req)
		held <- callResult{resp, err}
	}()
	time.Sleep(500 * time.Millisecond) // for the call to arrive; it is held 3 s
	select {
	case r := <-held:
		t.Fatalf("the second call was answered at once (%v, %v), want it held for its token", r.resp.GetOverallCode(), r.err)
	default:
	}
	return held
}

// checkHeldCall checks that a held call was answered OK.
func checkHeldCall(t *testing.T, held <-chan callResult) {
	t.Helper()
	select {
	case r := <-held:
		if r.err != nil || r.resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("the call held during shutdown = %v, %v; want OK", r.resp.GetOverallCode(), r.err)
		}
	case <-time.After(20 * time.Second):
		t.Error("the call held during shutdown was not answered within 20 s")
	}
}

// TestShutdownDoesNotWaitForHealthWatches: a health checker's open Watch
// stream is told NOT_SERVING and ended when shutdown begins, so shutdown
// returns once the calls in flight are answered, not after the whole
// --shutdown-timeout (GracefulStop waits for every open stream).
func TestShutdownDoesNotWaitForHealthWatches(t *testing.T) {
	grpcAddr, _, cancel, waitErr := startRunWith(t, map[string]string{"agents.yaml": holdConfig}, "--shutdown-timeout", "1m")
	conn := servertest.Dial(t, grpcAddr)
	watch, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch's first status = %v, %v; want SERVING", resp.GetStatus(), err)
	}
	held := holdCall(t, conn)

	start := time.Now()
	cancel()
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Watch at shutdown = %v, %v; want NOT_SERVING", resp.GetStatus(), err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- waitErr() }()
	select {
	case err := <-stopped:
		t.Logf("stopped %v after shutdown began", time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Errorf("run = %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		conn.Close() // ends the Watch, and so the shutdown
		t.Fatal("still shutting down 20 s after it began, with --shutdown-timeout 1m: waiting for the Watch stream")
	}
	checkHeldCall(t, held)
	if _, err := watch.Recv(); err == nil {
		t.Error("the Watch stream is still open after shutdown")
	}
}

// TestReadyzFailsDuringShutdown: once shutdown begins, /readyz answers 503
// "shutting down" (as gRPC health says NOT_SERVING) while the calls in
// flight are still being answered.
func TestReadyzFailsDuringShutdown(t *testing.T) {
	grpcAddr, httpAddr, cancel, waitErr := startRunWith(t, map[string]string{"agents.yaml": holdConfig}, "--shutdown-timeout", "1m")
	if code, body := servertest.Get(t, "http://"+httpAddr+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before shutdown = %d %q, want 200", code, body)
	}
	held := holdCall(t, servertest.Dial(t, grpcAddr))
	cancel()
	var code int
	var body string
	for {
		// The HTTP port serves until the held call is answered.
		code, body = servertest.Get(t, "http://"+httpAddr+"/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "shutting down") {
			break
		}
		select {
		case r := <-held:
			t.Fatalf("/readyz = %d %q all through the drain (the held call ended: %v, %v); want 503 shutting down",
				code, body, r.resp.GetOverallCode(), r.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	checkHeldCall(t, held)
	if err := waitErr(); err != nil {
		t.Errorf("run = %v, want nil", err)
	}
}

// TestSIGHUPNeverEndsTheProcess: SIGHUP reloads the config, and sent at a
// moment serve does not reload (while it starts, while it drains) it is
// ignored; it used to end the process (SIGHUP's default action) before
// serve took it and from when shutdown began.
func TestSIGHUPNeverEndsTheProcess(t *testing.T) {
	t.Run("while starting", func(t *testing.T) {
		// The gRPC certificate is a FIFO: serve blocks reading it, at a
		// known point of start-up, until the test writes it.
		dir := t.TempDir()
		ca := newTestCA(t, dir)
		certFile, keyFile := ca.issue("server", true)
		cert, err := os.ReadFile(certFile)
		if err != nil {
			t.Fatal(err)
		}
		fifo := filepath.Join(dir, "cert.fifo")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := writeConfig(t, map[string]string{"agents.yaml": holdConfig})
		l := launchProc(t, "--config", cfg, "--grpc-tls-cert", fifo, "--grpc-tls-key", keyFile)
		w := openWhenRead(t, l.p, fifo)
		if err := l.p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // for the signal to land while serve is blocked
		if _, err := w.Write(cert); err != nil {
			select {
			case exit := <-l.p.exited:
				l.p.exited <- exit
				t.Fatalf("ratelimitd ended on SIGHUP while starting: %v\n%s", exit, l.p.logs)
			case <-time.After(10 * time.Second):
				t.Fatalf("write the certificate: %v", err)
			}
		}
		w.Close()
		p := l.await(t)
		stopProc(t, p)
	})
	t.Run("while draining", func(t *testing.T) {
		cfg := writeConfig(t, map[string]string{"agents.yaml": holdConfig})
		p := startProc(t, "--config", cfg, "--shutdown-timeout", "1m")
		held := holdCall(t, servertest.Dial(t, p.grpcAddr))
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(p.logs.String(), `"msg":"shutting down"`) {
			if time.Now().After(deadline) {
				t.Fatalf("no 'shutting down' log line 10 s after SIGTERM:\n%s", p.logs)
			}
			time.Sleep(10 * time.Millisecond)
		}
		for range 3 {
			time.Sleep(100 * time.Millisecond)
			if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				break // it exited; reported below
			}
		}
		waitExit(t, p, "SIGTERM and SIGHUPs during the drain")
		checkHeldCall(t, held)
	})
}

// openWhenRead opens the FIFO path for writing once p has opened it for
// reading (so p is blocked on it), failing if p exits first or it takes
// more than 20 s.
func openWhenRead(t *testing.T, p *proc, path string) *os.File {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Non-blocking: ENXIO until a reader has the FIFO open.
		f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			t.Cleanup(func() { f.Close() })
			return f
		}
		if !errors.Is(err, syscall.ENXIO) {
			t.Fatalf("open %s: %v", path, err)
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("ratelimitd exited before reading %s: %v\n%s", path, err, p.logs)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("ratelimitd did not open %s in 20 s\n%s", path, p.logs)
		}
	}
}

// stopProc sends SIGTERM and checks that p exits 0.
func stopProc(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit(t, p, "SIGTERM")
}

// waitExit checks that p, sent SIGTERM, exits 0 within 20 s; after says
// what it was sent, for the message.
func waitExit(t *testing.T, p *proc, after string) {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		if err != nil {
			t.Errorf("exit after %s: %v, want status 0\n%s", after, err, p.logs)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("still running 20 s after SIGTERM\n%s", p.logs)
	}
}

// TestHealthStaysDownOnReadOnlyRedis: a Redis that answers PING but
// refuses writes (a master turned replica by a failover) fails every call,
// so the replica reports NOT_SERVING, and keeps doing so without calls
// until the Redis takes writes again: the background probe writes. With a
// PING for probe, health went back to SERVING every --breaker-open-for,
// and every call then failed again.
func TestHealthStaysDownOnReadOnlyRedis(t *testing.T) {
	srv := redistest.Start(t)
	gone := redistest.Start(t) // the master it follows, not there
	gone.Stop()
	dir := writeConfig(t, map[string]string{"mesh.yaml": meshConfig})
	p := startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr, "--on-backend-failure", "error",
		"--backend-timeout", "50ms", "--breaker-open-for", "50ms")
	conn := servertest.Dial(t, p.grpcAddr)
	// health says whether gRPC health is SERVING and /readyz 200.
	health := func() (serving, ready bool) {
		t.Helper()
		h, code, _ := p.readiness(t, conn)
		return h == healthpb.HealthCheckResponse_SERVING, code == http.StatusOK
	}
	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := servertest.Request("mesh", servertest.Desc("k", "probe"))
	redisDo := func(args ...any) {
		t.Helper()
		if err := srv.Client().Do(context.Background(), args...).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// startProc waited for "backend ready", logged once health says so.
	if serving, ready := health(); !serving || !ready {
		t.Fatalf("backend ready, Redis writable: SERVING %v, /readyz 200 %v; want both\n%s", serving, ready, p.logs)
	}
	redisDo("REPLICAOF", "127.0.0.1", gone.Port)
	deadline := time.Now().Add(10 * time.Second)
	for serving, _ := health(); serving; serving, _ = health() {
		rls.ShouldRateLimit(context.Background(), req)
		if time.Now().After(deadline) {
			t.Fatalf("10 s after Redis turned read-only, calls failing: still SERVING\n%s", p.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// No call from here on. Twenty breaker periods: twenty background probes.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if serving, ready := health(); serving || ready {
			t.Fatalf("with Redis still read-only: SERVING %v, /readyz 200 %v; want neither\n%s", serving, ready, p.logs)
		}
	}

	redisDo("REPLICAOF", "NO", "ONE")
	back := time.Now()
	for serving, ready := health(); !serving || !ready; serving, ready = health() {
		if time.Since(back) > 10*time.Second {
			t.Fatalf("10 s after Redis took writes again, with no call: SERVING %v, /readyz 200 %v; want both\n%s", serving, ready, p.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp, err := rls.ShouldRateLimit(context.Background(), req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit once serving again = %v, %v; want OK", resp.GetOverallCode(), err)
	}
}

// TestHealthComesBackWithoutCalls: in error mode, a replica whose breaker
// opened reports SERVING and /readyz 200 again soon after Redis returns
// even if no rate-limit call reaches it (its health had taken it out of
// rotation): the breaker is probed in the background. It used to need a
// call, so it stayed out for good.
func TestHealthComesBackWithoutCalls(t *testing.T) {
	srv := redistest.Start(t)
	dir := writeConfig(t, map[string]string{"mesh.yaml": meshConfig})
	p := startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr, "--on-backend-failure", "error",
		"--backend-timeout", "50ms", "--breaker-open-for", "100ms", "--redis-dial-timeout", "50ms")
	conn := servertest.Dial(t, p.grpcAddr)
	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := servertest.Request("mesh", servertest.Desc("k", "probe"))

	srv.Stop()
	// Calls fail until the breaker opens.
	deadline := time.Now().Add(10 * time.Second)
	for {
		rls.ShouldRateLimit(context.Background(), req)
		if h, code, _ := p.readiness(t, conn); h == healthpb.HealthCheckResponse_NOT_SERVING && code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after Redis stopped, calls failing: not NOT_SERVING\n%s", p.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	// No call from here on: only health checks.
	for {
		h, code, _ := p.readiness(t, conn)
		if h == healthpb.HealthCheckResponse_SERVING && code == http.StatusOK {
			t.Logf("serving again %v after Redis came back, with no call", time.Since(back).Round(time.Millisecond))
			break
		}
		if time.Since(back) > 10*time.Second {
			t.Fatalf("10 s after Redis came back, with no call: health %v, /readyz %d; want SERVING, 200\n%s", h, code, p.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if resp, err := rls.ShouldRateLimit(context.Background(), req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit once serving again = %v, %v; want OK", resp.GetOverallCode(), err)
	}
}
