package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/faultproxy"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// coalescingBehindProxy returns a Store with opts on a redis-server of
// the test's own, reached through a fault proxy, whose batcher coalesces
// every call (it counts one round trip in flight for the whole test, so
// none is sent directly), and the proxy.
func coalescingBehindProxy(t *testing.T, opts Options) (*Store, *faultproxy.Proxy) {
	t.Helper()
	srv := redistest.Start(t)
	proxy, err := faultproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	s := dialedStore(t, proxy.Addr(), opts)
	b := s.server.batch
	b.inflight.Add(1)
	t.Cleanup(func() { b.inflight.Add(-1) })
	return s, proxy
}

// TestADetachedRoundTripHoldsNoCallBack: a round trip Redis does not
// answer (a black hole) is reported after SlowAfter and its sender goes
// on without it; from then on it holds no queued call back, so it is no
// longer in stalled (a call whose budget runs out in the queue for
// another reason, once the fault has ended, is not Redis's failure),
// though its answer is still awaited.
func TestADetachedRoundTripHoldsNoCallBack(t *testing.T) {
	reported := make(chan time.Duration, 16)
	s, proxy := coalescingBehindProxy(t, Options{Prefix: "detached:", SlowAfter: 10 * time.Millisecond,
		OnBackend: func(_ string, held time.Duration, err error) {
			if err != nil {
				reported <- held
			}
		}})
	b := s.server.batch

	proxy.Blackhole()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.Take(ctx, time.Now(), []limiter.Request{{Key: "k", Limit: limiter.Limit{Count: 10, Period: time.Second, Burst: 10}, Hits: 1}}); err == nil {
		t.Fatal("Take through a black hole succeeded")
	}
	select {
	case held := <-reported:
		if held < 10*time.Millisecond {
			t.Errorf("the round trip was reported after %v, want SlowAfter (10ms) or more", held)
		}
	case <-time.After(time.Second):
		t.Fatal("the round trip Redis held was not reported within a second")
	}
	proxy.Pass()
	// The report comes just before the detach: give the sender a moment.
	deadline := time.Now().Add(time.Second)
	for b.stalled(mono()) != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if d := b.stalled(mono()); d != 0 {
		t.Errorf("stalled = %v after the round trip's sender went on without it, want 0 (no call waits behind it)", d)
	}
	if n := b.detached.Load(); n != 1 {
		t.Errorf("%d round trips detached, want 1 (its answer still awaited)", n)
	}
}

// TestAProbeFreesTheSendersAfterAFault: a black hole under load holds
// more round trips than maxDetached, so both senders wait for theirs,
// which the read timeout (500 ms) ends. Once the fault is over, a probe
// is not queued behind them (it goes directly), and its success lets
// the senders go on: a call sent just after is decided by Redis at once,
// not after the read timeout.
func TestAProbeFreesTheSendersAfterAFault(t *testing.T) {
	s, proxy := coalescingBehindProxy(t, Options{Prefix: "freed:", SlowAfter: 5 * time.Millisecond})
	b := s.server.batch
	take := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := s.Take(ctx, time.Now(), []limiter.Request{{Key: "k", Limit: limiter.Limit{Count: 10, Period: time.Second, Burst: 10}, Hits: 1}})
		return err
	}

	proxy.Blackhole()
	// Each call's round trip is detached 5 ms after it was written; the
	// ones past maxDetached hold their sender.
	for i := 0; b.detached.Load() < maxDetached+senders; i++ {
		if i == 100 {
			t.Fatalf("%d round trips detached after 100 calls, want %d", b.detached.Load(), maxDetached+senders)
		}
		take(8 * time.Millisecond)
	}
	if err := take(20 * time.Millisecond); err == nil {
		t.Fatal("Take with both senders held succeeded")
	}
	proxy.Pass()
	passed := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Probe(ctx); err != nil {
		t.Fatalf("Probe after the fault: %v, want nil: it is sent directly, not behind the held round trips", err)
	}
	if err := take(100 * time.Millisecond); err != nil {
		t.Fatalf("Take after the probe: %v, want Redis's answer: the senders go on", err)
	}
	if took := time.Since(passed); took > 250*time.Millisecond {
		t.Errorf("decided by Redis %v after the fault ended, want well within the read timeout (500ms)", took)
	}
}
