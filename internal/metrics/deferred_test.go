package metrics_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// recorder is an Observer that keeps the domains of the calls it saw, in
// order.
type recorder struct {
	mu      sync.Mutex
	domains []string
}

func (r *recorder) ObserveCall(c server.Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.domains = append(r.domains, c.Domain)
}

func (r *recorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.domains...)
}

func TestDeferredHandsCallsOverAfterItsDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		d := metrics.NewDeferred(rec, 5*time.Millisecond, 0)
		defer d.Close()
		d.ObserveCall(server.Call{Domain: "a"})
		time.Sleep(2 * time.Millisecond)
		d.ObserveCall(server.Call{Domain: "b"})
		synctest.Wait()
		if got := rec.seen(); len(got) != 0 {
			t.Fatalf("before the delay: handed over %q, want nothing yet", got)
		}
		time.Sleep(3 * time.Millisecond) // 5ms after the first call
		synctest.Wait()
		if got := rec.seen(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
			t.Fatalf("at the delay after the first call: handed over %q, want [a b]", got)
		}
		// The next call starts a new delay.
		d.ObserveCall(server.Call{Domain: "c"})
		time.Sleep(4 * time.Millisecond)
		synctest.Wait()
		if got := rec.seen(); len(got) != 2 {
			t.Fatalf("4ms after a later call: handed over %q, want it still queued", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := rec.seen(); len(got) != 3 || got[2] != "c" {
			t.Fatalf("5ms after a later call: handed over %q, want [a b c]", got)
		}
	})
}

func TestDeferredFlushAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		d := metrics.NewDeferred(rec, time.Hour, 0)
		d.ObserveCall(server.Call{Domain: "a"})
		d.ObserveCall(server.Call{Domain: "b"})
		d.Flush()
		if got := rec.seen(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
			t.Fatalf("after Flush: handed over %q, want [a b]", got)
		}
		d.ObserveCall(server.Call{Domain: "c"})
		d.Close()
		if got := rec.seen(); len(got) != 3 || got[2] != "c" {
			t.Fatalf("after Close: handed over %q, want [a b c]", got)
		}
		// After Close, calls are handed over by their callers.
		d.ObserveCall(server.Call{Domain: "d"})
		if got := rec.seen(); len(got) != 4 || got[3] != "d" {
			t.Fatalf("a call after Close: handed over %q, want [a b c d] at once", got)
		}
		d.Close()
	})
}

func TestDeferredFullQueueHandsOverInline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		d := metrics.NewDeferred(rec, time.Hour, 2)
		defer d.Close()
		for _, dom := range []string{"a", "b", "c"} {
			d.ObserveCall(server.Call{Domain: dom})
		}
		if got := rec.seen(); len(got) != 1 || got[0] != "c" {
			t.Fatalf("a third call with two queued: handed over %q, want [c] at once", got)
		}
		d.Flush()
		if got := rec.seen(); len(got) != 3 {
			t.Fatalf("after Flush: handed over %q, want all three", got)
		}
	})
}

// TestDeferredLosesNothing: calls from many goroutines while batches go
// out on the timer and on Flush all reach the observer, once each.
func TestDeferredLosesNothing(t *testing.T) {
	rec := &recorder{}
	d := metrics.NewDeferred(rec, 50*time.Microsecond, 64)
	const goroutines, each = 16, 500
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for i := range each {
				d.ObserveCall(server.Call{Domain: "x"})
				if i%100 == 0 {
					d.Flush()
				}
			}
		})
	}
	wg.Wait()
	d.Flush()
	if got := len(rec.seen()); got != goroutines*each {
		t.Errorf("handed over %d calls, want %d", got, goroutines*each)
	}
	d.Close()
}
