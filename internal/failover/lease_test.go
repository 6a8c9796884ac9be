package failover_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// leaseBackend is backend's lease pools: in memory while "up", failing as
// its Take does otherwise.
type leaseBackend struct {
	*backend
	mem *limiter.MemoryLeases
}

func (b leaseBackend) state() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.backend.state
}

func (b leaseBackend) Acquire(ctx context.Context, now time.Time, r limiter.LeaseRequest) (limiter.LeaseDecision, error) {
	if err := b.wait(ctx, b.state(), 0); err != nil {
		return limiter.LeaseDecision{}, err
	}
	return b.mem.Acquire(ctx, now, r)
}

func (b leaseBackend) Release(ctx context.Context, now time.Time, pool, id string) (limiter.LeaseRelease, error) {
	if err := b.wait(ctx, b.state(), 0); err != nil {
		return limiter.LeaseRelease{}, err
	}
	return b.mem.Release(ctx, now, pool, id)
}

func (b leaseBackend) InFlight(ctx context.Context, now time.Time, pool string) (limiter.PoolState, error) {
	if err := b.wait(ctx, b.state(), 0); err != nil {
		return limiter.PoolState{}, err
	}
	return b.mem.InFlight(ctx, now, pool)
}

// TestLeasesFailAsBucketsDo: lease calls to a backend that is down are
// answered per the failure mode, count in the breaker that buckets share
// (which then answers them without asking the backend), and a lease taken
// locally is released locally.
func TestLeasesFailAsBucketsDo(t *testing.T) {
	four := limiter.PoolLimit{MaxInFlight: 4, Lease: time.Minute}
	req := func(id string) limiter.LeaseRequest { return limiter.LeaseRequest{Pool: "p", ID: id, Limit: four} }
	for _, tt := range []struct {
		mode failover.Mode
		// admitted is how many of five new leases are admitted while the
		// backend is down; 0 with err for error mode.
		admitted int
		err      error
	}{
		{failover.Error, 0, limiter.ErrUnavailable},
		{failover.Allow, 5, nil},
		{failover.Deny, 0, nil},
		{failover.Local, 2, nil}, // MaxInFlight 4 over ReplicasHint 2
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			b := newBackend()
			lb := leaseBackend{backend: b, mem: limiter.NewMemoryLeases(limiter.MemoryOptions{})}
			var fallbacks []limiter.Fallback
			s, clk := newStore(t, b, failover.Options{Mode: tt.mode, FailureThreshold: 2, FailingFor: time.Millisecond, OpenFor: time.Minute, ReplicasHint: 2,
				OnFallback: func(c limiter.Fallback) { fallbacks = append(fallbacks, c) }})
			leases := s.Leases(lb)
			ctx := context.Background()
			if d, err := leases.Acquire(ctx, t0, req("up")); err != nil || !d.Allowed || d.Remaining != 3 {
				t.Fatalf("backend up: Acquire = %+v, %v; want admitted, 3 left", d, err)
			}

			b.set("down")
			admitted := 0
			for _, id := range []string{"a", "b", "c", "d", "e"} {
				clk.Advance(time.Millisecond)
				d, err := leases.Acquire(ctx, t0, req(id))
				if tt.err != nil {
					if !errors.Is(err, tt.err) {
						t.Fatalf("backend down: Acquire(%s) = %v, want %v", id, err, tt.err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("backend down: Acquire(%s) = %v, want an answer per the failure mode", id, err)
				}
				if d.Allowed {
					admitted++
				} else if d.RetryAfter <= 0 {
					t.Errorf("backend down: a denial of %s without a Retry-After", id)
				}
			}
			if admitted != tt.admitted {
				t.Errorf("backend down: %d of 5 new leases admitted, want %d", admitted, tt.admitted)
			}
			if len(fallbacks) != 5 || fallbacks[0] != limiter.FallbackBackendFailed || fallbacks[4] != limiter.FallbackBreakerOpen {
				t.Errorf("fallbacks %v, want 5: backend failed, then breaker open once it tripped", fallbacks)
			}
			if s.Healthy() {
				t.Error("the breaker is closed after lease calls failed; want it open (shared with buckets)")
			}
			if tt.mode == failover.Local {
				if r, err := leases.Release(ctx, t0, "p", "a"); err != nil || !r.Released {
					t.Errorf("Local: Release(a) = %+v, %v; want the local lease released", r, err)
				}
				if d, err := leases.Acquire(ctx, t0, req("f")); err != nil || !d.Allowed {
					t.Errorf("Local: Acquire(f) after a release = %+v, %v; want admitted in the freed slot", d, err)
				}
			}
		})
	}
}
