package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

func TestMemoryStoreConformance(t *testing.T) {
	limitertest.RunStoreTests(t, func(t *testing.T) limiter.Store {
		return limiter.NewMemoryStore(limiter.MemoryOptions{})
	})
}

func TestMemoryStorePostpaid(t *testing.T) {
	limitertest.RunPostpaidTests(t, func(t *testing.T) limiter.Store {
		return limiter.NewMemoryStore(limiter.MemoryOptions{})
	})
}

// TestMemoryStoreTakeAllocates: a Take of up to 8 requests allocates only
// the decisions it returns (the states it reads and writes stay on the
// stack), admitted or denied.
func TestMemoryStoreTakeAllocates(t *testing.T) {
	m := limiter.NewMemoryStore(limiter.MemoryOptions{})
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
	for _, reqs := range [][]limiter.Request{
		{{Key: "a", Limit: l, Hits: 1}},
		{{Key: "a", Limit: l, Hits: 1}, {Key: "b", Limit: l, Hits: 1}, {Key: "c", Limit: l, Hits: 0}},
	} {
		if n := testing.AllocsPerRun(100, func() { m.Take(ctx, now, reqs) }); n != 1 {
			t.Errorf("Take of %d requests: %v allocations, want 1", len(reqs), n)
		}
	}
}
