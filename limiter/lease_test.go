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
	// A pool in use: four other leases held throughout, so that the pool
	// itself stays (an emptied pool is dropped, and made again).
	for i := range 4 {
		m.Acquire(ctx, leasetest.T0, limiter.LeaseRequest{Pool: "p", ID: fmt.Sprint("held", i), Limit: l})
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
		for p := range 4 {
			for i := range 4 {
				m.Acquire(ctx, leasetest.T0, limiter.LeaseRequest{Pool: fmt.Sprint("pool", p), ID: fmt.Sprint("held", i), Limit: big})
			}
		}
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

// A pool of two: a third request is denied until a lease is released or
// expires; a retry of a held id keeps its one slot.
func ExampleMemoryLeases() {
	pools := limiter.NewMemoryLeases(limiter.MemoryOptions{})
	ctx := context.Background()
	vllm := limiter.PoolLimit{MaxInFlight: 2, Lease: 10 * time.Minute}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	acquire := func(at time.Duration, id string) {
		d, _ := pools.Acquire(ctx, t0.Add(at), limiter.LeaseRequest{Pool: "llama-3.1-70b", ID: id, Limit: vllm})
		fmt.Printf("%v %s: allowed %v renewed %v, %d in flight, %d free, retry after %v\n",
			at, id, d.Allowed, d.Renewed, d.InFlight, d.Remaining, d.RetryAfter)
	}
	acquire(0, "req-1")
	acquire(time.Second, "req-2")
	acquire(2*time.Second, "req-2") // an Envoy retry of req-2
	acquire(3*time.Second, "req-3")
	r, _ := pools.Release(ctx, t0.Add(4*time.Second), "llama-3.1-70b", "req-1")
	fmt.Printf("release req-1: released %v, %d in flight\n", r.Released, r.InFlight)
	r, _ = pools.Release(ctx, t0.Add(5*time.Second), "llama-3.1-70b", "req-1")
	fmt.Printf("release req-1 again: released %v, %d in flight\n", r.Released, r.InFlight)
	acquire(5*time.Second, "req-3")
	// Output:
	// 0s req-1: allowed true renewed false, 1 in flight, 1 free, retry after 0s
	// 1s req-2: allowed true renewed false, 2 in flight, 0 free, retry after 0s
	// 2s req-2: allowed true renewed true, 2 in flight, 0 free, retry after 0s
	// 3s req-3: allowed false renewed false, 2 in flight, 0 free, retry after 9m57s
	// release req-1: released true, 1 in flight
	// release req-1 again: released false, 1 in flight
	// 5s req-3: allowed true renewed false, 2 in flight, 0 free, retry after 0s
}
