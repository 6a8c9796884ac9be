//go:build linux

package daemon

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/faultproxy"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The tests of this file hold two lines of openRedis that the packages
// below it cannot see: failover.Options.ProbeInBackground (the daemon's
// probe loop is the open breaker's only probe) and TimerLateness fed by a
// timerlag.Monitor (the margin before a deadline grows on a host that
// wakes this process late). Each runs a daemon on a real redis-server
// behind a faultproxy and watches what a call gets.

// wiringLimit is the calls' bucket: never empty within a test.
var wiringLimit = limiter.Limit{Count: 1_000_000, Period: time.Second, Burst: 1_000_000}

// TestDaemonBreakerProbedInBackground: while Redis is in a black hole and
// the breaker is open, every call, for several OpenFor, is answered at
// once per the failure mode (breaker_open) and none reaches the Redis
// store; once the black hole ends, with no call coming, the daemon's
// background probe closes the breaker. A call that probed the half-open
// breaker (ProbeInBackground unset) would go to Redis within an OpenFor
// and wait there for its whole budget.
func TestDaemonBreakerProbedInBackground(t *testing.T) {
	d, proxy := wiringDaemon(t, failover.Options{Mode: failover.Deny, OpenFor: 40 * time.Millisecond})
	b := d.backend.(*redisBackend)
	store := b.Store()
	try := func() ([]limiter.Decision, time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		start := time.Now()
		ds, err := store.Take(ctx, start, []limiter.Request{{Key: "wiring-probe", Limit: wiringLimit, Hits: 1}})
		return ds, time.Since(start), err
	}
	take := func() (limiter.Decision, time.Duration) {
		t.Helper()
		ds, took, err := try()
		if err != nil {
			t.Fatalf("Take = %v after %v, want the failure mode's answer or Redis's", err, took)
		}
		return ds[0], took
	}

	proxy.Blackhole()
	end := time.Now().Add(3 * time.Second)
	for b.Healthy() {
		if time.Now().After(end) {
			t.Fatal("breaker not open 3s into a black hole with calls every 20ms")
		}
		// Calls the black hole holds: one answered after its caller's
		// deadline (this process starved of CPU) is an error, and no
		// matter here.
		try()
	}
	// Open: calls about a millisecond apart, for a quarter-second (five
	// OpenFor and more) and 100 calls at least, each of which would probe
	// a breaker that calls probe, and wait for its budget on the black
	// hole to be answered backend_failed.
	takes := b.store.Stats().Takes
	var slowest time.Duration
	calls := 0
	for open := time.Now(); time.Since(open) < 250*time.Millisecond || calls < 100 && time.Since(open) < 3*time.Second; calls++ {
		dec, took := take()
		if dec.Fallback != limiter.FallbackBreakerOpen || dec.Allowed {
			t.Fatalf("call %d with the breaker open: %+v after %v; want denied per the mode, Fallback breaker_open", calls+1, dec, took)
		}
		slowest = max(slowest, took)
		time.Sleep(time.Millisecond)
	}
	if got := b.store.Stats().Takes - takes; got != 0 {
		t.Errorf("%d of %d calls with the breaker open reached the Redis store, want 0: a call probed the open breaker", got, calls)
	}
	t.Logf("%d calls with the breaker open, answered per the mode within %v", calls, slowest)

	proxy.Pass()
	passed := time.Now()
	for !b.Healthy() {
		if time.Since(passed) > 2*time.Second {
			t.Fatal("breaker still open 2s after the black hole ended, no call coming: no background probe closed it")
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("background probe closed the breaker %v after the black hole ended", time.Since(passed).Round(time.Millisecond))
	// A second to answer: on a busy host a 20ms call may be late, and
	// this one is to show who decides.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ds, err := store.Take(ctx, time.Now(), []limiter.Request{{Key: "wiring-probe", Limit: wiringLimit, Hits: 1}})
	if err != nil || ds[0].Fallback != limiter.FallbackNone || !ds[0].Allowed {
		t.Errorf("call after the probe closed the breaker: %+v, %v; want admitted by Redis", ds, err)
	}
}

// TestDaemonMarginFollowsTimerLateness: just after the whole process
// was stopped for 150ms (SIGSTOP, SIGCONT: what a host that deschedules
// it does), a call whose Redis holds it is answered a quarter of the time
// left (150ms) before its 600ms deadline, not 5ms: no call was in flight
// to show that lateness, so only the daemon's timer-lateness monitor can
// have seen it. (On a busy host the monitor widens the margin before the
// stop too, which is why no call before it is timed.)
func TestDaemonMarginFollowsTimerLateness(t *testing.T) {
	d, proxy := wiringDaemon(t, failover.Options{Mode: failover.Deny, FailureThreshold: 10})
	store := d.backend.Store()
	const deadline = 600 * time.Millisecond
	take := func() time.Duration {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		ds, err := store.Take(ctx, start, []limiter.Request{{Key: "wiring-margin", Limit: wiringLimit, Hits: 1}})
		took := time.Since(start)
		if err != nil || ds[0].Fallback != limiter.FallbackBackendFailed {
			t.Fatalf("Take on a black-holed Redis = %+v, %v after %v; want answered per the mode, backend_failed", ds, err, took)
		}
		return took
	}

	// A held call is one failure: the breaker (threshold 10) stays
	// closed. Without the monitor the margin is a fifth of the time left,
	// at most 5ms, or twice how late calls came back past their budget,
	// and none has.
	proxy.Blackhole()
	stopSelf(t, 150*time.Millisecond)
	// The monitor notes the lateness as its timer's goroutine runs
	// after SIGCONT, which may be just after this goroutine: a second
	// call finds it noted.
	var tooks []time.Duration
	for range 2 {
		took := take()
		tooks = append(tooks, took)
		if took < deadline-100*time.Millisecond {
			t.Logf("after a 150ms stop: answered %v into its %v deadline", took.Round(time.Millisecond), deadline)
			return
		}
	}
	t.Errorf("after a 150ms stop: calls answered %v into their %v deadline, want a margin of 100ms or more: the timers' lateness did not widen it",
		tooks, deadline)
}

// TestDaemonMarginFollowsReadWaits holds the two lines that make room
// for requests that waited in the gRPC sockets (internal/readlag): the
// gRPC listener notes each read's wait (a health check's reads are noted,
// once the kernel stamps them), and a noted wait widens the margin of a
// call's budget as timer lateness does. A wait of 150ms noted, a call
// whose Redis holds it is answered 100ms or more before its 600ms
// deadline.
func TestDaemonMarginFollowsReadWaits(t *testing.T) {
	d, proxy := wiringDaemon(t, failover.Options{Mode: failover.Deny, FailureThreshold: 10})
	hc := healthpb.NewHealthClient(servertest.Dial(t, d.GRPCAddr().String()))
	// The kernel turns stamping on lazily: the first reads may carry none.
	for i := 0; d.reads.Lateness(time.Now()) == 0; i++ {
		if i == 50 {
			t.Fatal("50 health checks and no read of the gRPC listener noted its wait")
		}
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("health check: %v", err)
		}
	}

	const deadline = 600 * time.Millisecond
	proxy.Blackhole()
	d.reads.Note(150*time.Millisecond, time.Now())
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	ds, err := d.backend.Store().Take(ctx, start, []limiter.Request{{Key: "wiring-reads", Limit: wiringLimit, Hits: 1}})
	took := time.Since(start)
	if err != nil || ds[0].Fallback != limiter.FallbackBackendFailed {
		t.Fatalf("Take on a black-holed Redis = %+v, %v after %v; want answered per the mode, backend_failed", ds, err, took)
	}
	if took > deadline-100*time.Millisecond {
		t.Errorf("with a 150ms read wait noted: answered %v into its %v deadline, want a margin of 100ms or more", took.Round(time.Millisecond), deadline)
	}
}

// wiringDaemon runs a daemon of failure on a fresh redis-server behind a
// fault proxy (passing), until the test ends, and returns once a call is
// decided by Redis. Redis's read timeout is long, so that a round trip in
// a black hole is held for a call's whole budget.
func wiringDaemon(t *testing.T, failure failover.Options) (*Daemon, *faultproxy.Proxy) {
	t.Helper()
	srv := redistest.Start(t)
	proxy, err := faultproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	w := watchLines(t, Config{Redis: Redis{URL: "redis://" + proxy.Addr(), ReadTimeout: 5 * time.Second}, Failure: failure}, "domain: api\n")
	// Before the daemon stops (cleanups run last first): its round trips
	// held in the black hole fail then, not at the read timeout.
	t.Cleanup(func() { proxy.Close() })
	end := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ds, err := w.d.backend.Store().Take(ctx, time.Now(), []limiter.Request{{Key: "wiring-ready", Limit: wiringLimit, Hits: 1}})
		cancel()
		if err == nil && ds[0].Fallback == limiter.FallbackNone {
			return w.d, proxy
		}
		if time.Now().After(end) {
			t.Fatalf("no call decided by Redis within 10s: %+v, %v", ds, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stopSelf stops this whole process for d: a child process sends it
// SIGSTOP, then SIGCONT d later, and is waited for.
func stopSelf(t *testing.T, d time.Duration) {
	t.Helper()
	pid := os.Getpid()
	script := fmt.Sprintf("kill -STOP %d; sleep %.3f; kill -CONT %d", pid, d.Seconds(), pid)
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("stopping the process for %v: %v: %s", d, err, out)
	}
}
