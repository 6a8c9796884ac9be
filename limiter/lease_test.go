package limiter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/leasetest"
)

func TestMemoryLeasesConformance(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) limiter.LeaseStore {
		return limiter.NewMemoryLeases(limiter.MemoryOptions{})
	})
}

func TestMemoryLeasesHammer(t *testing.T) {
	m := limiter.NewMemoryLeases(limiter.MemoryOptions{})
	leasetest.Hammer(t, "pool", leasetest.HammerOptions{
		Stores: []limiter.LeaseStore{m},
		Now:    func() time.Time { return leasetest.T0 },
		Held: func(pool string) (int64, error) {
			st, err := m.InFlight(context.Background(), leasetest.T0, pool)
			return st.InFlight, err
		},
		Goroutines: 32, Rounds: 200,
	})
}

// TestMemoryLeasesClockStepsBack: a shard reads a clock that steps back as
// standing still, so a lease never comes back to life.
func TestMemoryLeasesClockStepsBack(t *testing.T) {
	m := limiter.NewMemoryLeases(limiter.MemoryOptions{Shards: 1})
	ctx := context.Background()
	l := limiter.PoolLimit{MaxInFlight: 1, Lease: 10 * time.Second}
	t0 := leasetest.T0
	steps := []struct {
		at   time.Duration
		id   string
		want limiter.LeaseDecision
	}{
		{0, "a", limiter.LeaseDecision{Allowed: true, InFlight: 1}},
		{20 * time.Second, "b", limiter.LeaseDecision{Allowed: true, InFlight: 1, Expired: 1}},
		// Back to 5s: read as 20s, so b (until 30s) is held for 10s more.
		{5 * time.Second, "c", limiter.LeaseDecision{InFlight: 1, RetryAfter: 10 * time.Second}},
		{29 * time.Second, "c", limiter.LeaseDecision{InFlight: 1, RetryAfter: time.Second}},
		{30 * time.Second, "c", limiter.LeaseDecision{Allowed: true, InFlight: 1, Expired: 1}},
	}
	for _, s := range steps {
		d, err := m.Acquire(ctx, t0.Add(s.at), limiter.LeaseRequest{Pool: "p", ID: s.id, Limit: l})
		if err != nil || d != s.want {
			t.Errorf("Acquire(T0+%v, %q) = %+v, %v; want %+v", s.at, s.id, d, err, s.want)
		}
	}
}

// TestMemoryLeasesBounded: however many ids and pools pass, memory follows
// the leases held. A pool left empty by a call is dropped at once; pools
// whose leases expired unseen are dropped by the shards' own sweeps as they
// grow, and Sweep reports every lease purged without a call.
func TestMemoryLeasesBounded(t *testing.T) {
	m := limiter.NewMemoryLeases(limiter.MemoryOptions{Shards: 4})
	ctx := context.Background()
	l := limiter.PoolLimit{MaxInFlight: 4, Lease: time.Second}
	t0 := leasetest.T0
	// One pool, many ids: each acquired then released, or left to expire.
	for i := range 10_000 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		id := fmt.Sprint("id", i)
		if _, err := m.Acquire(ctx, now, limiter.LeaseRequest{Pool: "one", ID: id, Limit: l}); err != nil {
			t.Fatal(err)
		}
		if i%3 != 0 {
			if _, err := m.Release(ctx, now, "one", id); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st, _ := m.InFlight(ctx, t0.Add(9999*time.Millisecond), "one"); st.InFlight > 4 || st.InFlight < 1 {
		t.Errorf("one pool after 10000 ids holds %d leases, want 1 to 4", st.InFlight)
	}
	if st, _ := m.InFlight(ctx, t0.Add(11*time.Second), "one"); st.InFlight != 0 || m.Pools() != 0 {
		t.Errorf("after its leases expire, the pool holds %d and %d pools are kept; want none", st.InFlight, m.Pools())
	}
	// Many pools, each left with one lease that expires unseen.
	const pools = 50_000
	var reported int64
	for i := range pools {
		now := t0.Add(time.Hour + time.Duration(i)*time.Millisecond)
		d, err := m.Acquire(ctx, now, limiter.LeaseRequest{Pool: fmt.Sprint("p", i), ID: "x", Limit: l})
		if err != nil || !d.Allowed {
			t.Fatalf("Acquire(p%d) = %+v, %v", i, d, err)
		}
		reported += d.Expired
	}
	// A pool's lease lives 1s, 1000 acquires: the self-sweeps keep the
	// pools within a small multiple of those live, far below 50000.
	if n := m.Pools(); n > 8*1024 {
		t.Errorf("after %d pools with short leases, %d are held; want the shards to sweep", pools, n)
	}
	end := t0.Add(2 * time.Hour)
	swept := m.Sweep(end)
	if got := reported + swept; got != pools {
		t.Errorf("expired leases reported by Acquire (%d) and Sweep (%d) = %d, want %d (each once)", reported, swept, got, pools)
	}
	if n := m.Pools(); n != 0 {
		t.Errorf("after Sweep, %d pools held, want 0", n)
	}
	if n := m.Sweep(end); n != 0 {
		t.Errorf("a second Sweep reports %d expired, want 0", n)
	}
}

func BenchmarkMemoryLeases(b *testing.B) {
	m := limiter.NewMemoryLeases(limiter.MemoryOptions{})
	ctx := context.Background()
	l := limiter.PoolLimit{MaxInFlight: 8, Lease: time.Minute}
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("%08x-4f0e-4b5e-9c1d-%012x", i, i) // x-request-id sized
	}
	b.Run("acquire+release", func(b *testing.B) {
		b.ReportAllocs()
		now := leasetest.T0
		for i := 0; b.Loop(); i++ {
			id := ids[i%len(ids)]
			if d, _ := m.Acquire(ctx, now, limiter.LeaseRequest{Pool: "p", ID: id, Limit: l}); !d.Allowed {
				b.Fatal("denied")
			}
			if r, _ := m.Release(ctx, now, "p", id); !r.Released {
				b.Fatal("not released")
			}
		}
	})
	b.Run("acquire+release/parallel", func(b *testing.B) {
		b.ReportAllocs()
		big := limiter.PoolLimit{MaxInFlight: 1 << 20, Lease: time.Minute}
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			pool := fmt.Sprint("pool", n.Add(1)%4)
			i := 0
			for pb.Next() {
				id := ids[i%len(ids)]
				i++
				m.Acquire(ctx, leasetest.T0, limiter.LeaseRequest{Pool: pool, ID: id, Limit: big})
				m.Release(ctx, leasetest.T0, pool, id)
			}
		})
	})
}
