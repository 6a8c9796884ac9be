package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

// newMemoryStore is a MemoryStore with the defaults, for the suites.
func newMemoryStore(*testing.T) limiter.Store { return limiter.NewMemoryStore(limiter.MemoryOptions{}) }

func TestMemoryStoreConformance(t *testing.T) { limitertest.RunStoreTests(t, newMemoryStore) }

func TestMemoryStorePostpaid(t *testing.T) { limitertest.RunPostpaidTests(t, newMemoryStore) }

// TestMemoryStoreTakeAllocates: a Take of up to 8 requests allocates only
// the decisions it returns (the states it reads and writes stay on the
// stack), admitted or denied.
func TestMemoryStoreTakeAllocates(t *testing.T) {
	m := limiter.NewMemoryStore(limiter.MemoryOptions{})
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	plenty := limiter.Limit{Count: 1 << 20, Period: time.Second, Burst: 1 << 20} // admits every run
	none := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}                 // denies after the first
	for _, tt := range []struct {
		reqs    []limiter.Request
		allowed bool
	}{
		{[]limiter.Request{{Key: "a", Limit: plenty, Hits: 1}}, true},
		{[]limiter.Request{{Key: "b", Limit: plenty, Hits: 1}, {Key: "c", Limit: plenty, Hits: 1}, {Key: "d", Limit: plenty, Hits: 0}}, true},
		{[]limiter.Request{{Key: "e", Limit: none, Hits: 1}}, false},
		{[]limiter.Request{{Key: "f", Limit: plenty, Hits: 1}, {Key: "g", Limit: none, Hits: 1}}, false},
	} {
		m.Take(ctx, now, tt.reqs) // the first Take of none admits
		n := testing.AllocsPerRun(100, func() {
			d, err := m.Take(ctx, now, tt.reqs)
			if err != nil || d[len(d)-1].Allowed != tt.allowed {
				t.Fatalf("Take(%v) = %+v, %v; want the last allowed %v", tt.reqs, d, err, tt.allowed)
			}
		})
		if n != 1 {
			t.Errorf("Take of %d requests (allowed %v): %v allocations, want 1", len(tt.reqs), tt.allowed, n)
		}
	}
}
