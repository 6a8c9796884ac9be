package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/leasetest"
)

// TestLeaseConformance runs limiter's lease table on both servers, at the
// caller's clock (exact values).
func TestLeaseConformance(t *testing.T) {
	onBothServers(t, func(t *testing.T, newClient func() redis.UniversalClient) {
		c := newClient()
		leasetest.Run(t, func(t *testing.T) limiter.LeaseStore { return newStore(t, c, redisstore.CallerClock) })
	})
}

// TestLeaseKeys pins the keys of a pool: apart from buckets' and the
// probe's, and the waiting mark in the pool's Cluster slot.
func TestLeaseKeys(t *testing.T) {
	s, err := redisstore.New(standaloneClientless{}, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.LeaseKey("pool"), "ratelimitd:lease{cG9vbA}"; got != want {
		t.Errorf("LeaseKey(pool) = %q, want %q", got, want)
	}
	if got, want := s.LeaseChannel("pool"), "ratelimitd:lease{cG9vbA}"; got != want {
		t.Errorf("LeaseChannel(pool) = %q, want %q", got, want)
	}
	if got, want := s.LeaseChannelPattern(), "ratelimitd:lease{*"; got != want {
		t.Errorf("LeaseChannelPattern() = %q, want %q", got, want)
	}
	if s.LeaseKey("pool") == s.Key("pool") {
		t.Errorf("a pool and a bucket of one name share the key %q", s.Key("pool"))
	}
	if got := redisstore.Slot(s.LeaseKey("pool")); got != redisstore.Slot(s.Key("pool")) {
		t.Errorf("Slot(LeaseKey) = %d, want the slot of the identity's hash tag, %d", got, redisstore.Slot(s.Key("pool")))
	}
	glob, err := redisstore.New(standaloneClientless{}, redisstore.Options{Prefix: `a*b?[c]\:`})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := glob.LeaseChannelPattern(), `a\*b\?\[c\]\\:lease{*`; got != want {
		t.Errorf("LeaseChannelPattern() with a glob prefix = %q, want %q", got, want)
	}
}

// TestLeaseServerClock: on Redis's own clock, a short lease frees its slot
// once it has expired, every expired lease is counted once, and the pool's
// key disappears one lease after its last lease, with no call to remove it.
func TestLeaseServerClock(t *testing.T) {
	c := standalone(t).Client()
	s := newStore(t, c, redisstore.ServerClock)
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	l := limiter.PoolLimit{MaxInFlight: 8, Lease: lease}
	pool := t.Name()
	start := time.Now()
	for i := range 8 {
		d, err := s.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: pool, ID: fmt.Sprint(i), Limit: l})
		if err != nil || !d.Allowed || d.InFlight != int64(i+1) {
			t.Fatalf("Acquire(%d) = %+v, %v; want admitted, %d in flight", i, d, err, i+1)
		}
	}
	d, err := s.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: pool, ID: "ninth", Limit: l})
	if err != nil || d.Allowed || d.InFlight != 8 || d.RetryAfter <= 0 || d.RetryAfter > lease {
		t.Fatalf("Acquire(ninth) = %+v, %v; want full, 8 in flight, retry after (0, %v]", d, err, lease)
	}
	if elapsed := time.Since(start); elapsed < lease-d.RetryAfter-5*time.Millisecond {
		// RetryAfter counts from Redis's clock: at most the lease less the
		// time since the first acquire (by this clock, a few ms apart).
		t.Errorf("RetryAfter %v after %v: more than the first lease has left", d.RetryAfter, elapsed)
	}
	// Retry (bounded) until the slots free: never before the lease is over.
	var expired int64
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, err = s.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: pool, ID: "ninth", Limit: l})
		if err != nil {
			t.Fatal(err)
		}
		expired += d.Expired
		if d.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ninth lease is still denied %v after the first 8, of %v, were taken: %+v", time.Since(start), lease, d)
		}
		time.Sleep(min(d.RetryAfter, 20*time.Millisecond))
	}
	if elapsed := time.Since(start); elapsed < lease {
		t.Errorf("a slot freed %v after the leases were taken, before their %v", elapsed, lease)
	}
	st, err := s.InFlight(ctx, time.Time{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if expired += st.Expired; expired+st.InFlight != 9 || st.InFlight < 1 {
		t.Errorf("expired %d, then %d in flight: want the 8 first leases counted expired once each (the ninth held)", expired, st.InFlight)
	}
	// The key lives one lease past its latest lease: then it is gone,
	// unread.
	ninth := time.Now()
	for key := s.LeaseKey(pool); ; time.Sleep(20 * time.Millisecond) {
		n, err := c.Exists(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			if held := time.Since(ninth); held < lease {
				t.Errorf("the pool's key was gone %v after its last lease was taken, before the lease (%v) was over", held, lease)
			}
			break
		}
		if time.Since(start) > 10*time.Second {
			pttl, _ := c.PTTL(ctx, key).Result()
			t.Fatalf("the pool's key %s is still there %v after its last lease (ttl %v)", key, time.Since(start), pttl)
		}
	}
}

// TestLeaseReleasePublishes subscribes for real: a release from one
// replica that frees a slot of a pool someone waits on (a denied acquire
// with MaxWait, from another replica) is published on the pool's channel;
// releases of a pool no one waits on, and releases that free nothing,
// publish nothing.
func TestLeaseReleasePublishes(t *testing.T) {
	onBothServers(t, func(t *testing.T, newClient func() redis.UniversalClient) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		replicas := replicasOf(t, 2, newClient)
		a, b := replicas[0], replicas[1]
		sub := newClient().PSubscribe(ctx, a.LeaseChannelPattern())
		defer sub.Close()
		if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
			t.Fatal(err)
		}
		msgs := sub.Channel()
		l := limiter.PoolLimit{MaxInFlight: 1, Lease: time.Minute}
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		// next returns the next message, failing after a bound.
		next := func() *redis.Message {
			t.Helper()
			select {
			case m := <-msgs:
				return m
			case <-time.After(3 * time.Second):
				t.Fatal("no message within 3s")
			}
			return nil
		}
		// A pool no one waits on: its releases publish nothing. The
		// test's own PUBLISH then comes first.
		quiet := "quiet"
		_, err := a.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: quiet, ID: "x", Limit: l})
		must(err)
		d, err := b.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: quiet, ID: "y", Limit: l}) // full, no wait
		must(err)
		if d.Allowed {
			t.Fatalf("Acquire(y) in a full pool = %+v", d)
		}
		r, err := a.Release(ctx, time.Time{}, quiet, "x")
		must(err)
		if !r.Released {
			t.Fatalf("Release(x) = %+v, want released", r)
		}
		pub := newClient()
		must(pub.Publish(ctx, a.LeaseChannel(quiet), "marker-1").Err())
		if m := next(); m.Payload != "marker-1" {
			t.Fatalf("after a release no one waited for, got %q on %s, want the test's marker first", m.Payload, m.Channel)
		}

		// A pool someone waits on.
		busy := "busy"
		_, err = a.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: busy, ID: "x", Limit: l})
		must(err)
		d, err = b.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: busy, ID: "y", Limit: l, MaxWait: 2 * time.Second})
		must(err)
		if d.Allowed {
			t.Fatalf("Acquire(y) in a full pool = %+v", d)
		}
		// A release that frees nothing publishes nothing.
		_, err = a.Release(ctx, time.Time{}, busy, "unknown")
		must(err)
		released := time.Now()
		_, err = a.Release(ctx, time.Time{}, busy, "x")
		must(err)
		m := next()
		if m.Channel != b.LeaseChannel(busy) || m.Payload != "0" {
			t.Fatalf("after the release, got %q on %s; want \"0\" on %s", m.Payload, m.Channel, b.LeaseChannel(busy))
		}
		t.Logf("the release reached the subscriber %v after it was sent", time.Since(released))
		d, err = b.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: busy, ID: "y", Limit: l, MaxWait: 2 * time.Second})
		if err != nil || !d.Allowed {
			t.Fatalf("the woken Acquire(y) = %+v, %v; want admitted", d, err)
		}
		// The second release of x frees nothing: no message; the marker
		// comes first.
		_, err = a.Release(ctx, time.Time{}, busy, "x")
		must(err)
		must(pub.Publish(ctx, a.LeaseChannel(busy), "marker-2").Err())
		if m := next(); m.Payload != "marker-2" {
			t.Fatalf("after a release that freed nothing, got %q on %s, want the test's marker", m.Payload, m.Channel)
		}
	})
}

// TestLeaseHammer: three replicas, each its own client and connections,
// hammer one pool of 8 on Redis's clock while another client reads ZCARD
// of the pool's key as fast as it can: never more than 8.
func TestLeaseHammer(t *testing.T) {
	onBothServers(t, func(t *testing.T, newClient func() redis.UniversalClient) {
		replicas := replicasOf(t, 3, newClient)
		var stores []limiter.LeaseStore
		for _, s := range replicas {
			stores = append(stores, s)
		}
		first := replicas[len(replicas)-1]
		reader := newClient()
		leasetest.Hammer(t, "hammer", leasetest.HammerOptions{
			Stores: stores,
			Now:    time.Now,
			Held: func(pool string) (int64, error) {
				return reader.ZCard(context.Background(), first.LeaseKey(pool)).Result()
			},
			Goroutines: 24, Rounds: 40,
		})
	})
}

// TestLeaseErrors: a pool's key that holds something else is an error, not
// a panic nor an admission; a stopped server is limiter.ErrUnavailable.
func TestLeaseErrors(t *testing.T) {
	c := standalone(t).Client()
	s := newStore(t, c, redisstore.ServerClock)
	ctx := context.Background()
	if err := c.Set(ctx, s.LeaseKey("wrong"), "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	l := limiter.PoolLimit{MaxInFlight: 1, Lease: time.Second}
	if d, err := s.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: "wrong", ID: "a", Limit: l}); err == nil {
		t.Errorf("Acquire on a string key = %+v, want an error", d)
	}
	srv := redistest.Start(t)
	gone := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1})
	defer gone.Close()
	ds := newStore(t, gone, redisstore.ServerClock)
	srv.Stop()
	if _, err := ds.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: "p", ID: "a", Limit: l}); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Acquire on a dead server: %v, want ErrUnavailable", err)
	}
	if _, err := ds.Release(ctx, time.Time{}, "p", "a"); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Release on a dead server: %v, want ErrUnavailable", err)
	}
	if _, err := ds.InFlight(ctx, time.Time{}, "p"); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("InFlight on a dead server: %v, want ErrUnavailable", err)
	}
}

// BenchmarkLease measures an Acquire and its Release on a standalone
// server, one caller (two round trips) and parallel callers (coalesced).
func BenchmarkLease(b *testing.B) {
	s := newStore(b, standalone(b).Client(), redisstore.ServerClock)
	ctx := context.Background()
	l := limiter.PoolLimit{MaxInFlight: 1 << 20, Lease: time.Minute}
	b.Run("acquire+release", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			id := fmt.Sprintf("%08x-4f0e-4b5e-9c1d-%012x", i, i)
			if d, err := s.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: "p", ID: id, Limit: l}); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
			if r, err := s.Release(ctx, time.Time{}, "p", id); err != nil || !r.Released {
				b.Fatal(r, err)
			}
		}
	})
	b.Run("acquire+release/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				id := fmt.Sprint("id-", n.Add(1))
				if _, err := s.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: "p", ID: id, Limit: l}); err != nil {
					b.Error(err)
					return
				}
				if _, err := s.Release(ctx, time.Time{}, "p", id); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// TestLeasePrepareLoadsScript: after Prepare, on a server that never ran
// it, the lease script costs no NOSCRIPT retry: one round trip a call.
func TestLeasePrepareLoadsScript(t *testing.T) {
	s := newStoreOpts(t, redistest.Start(t).Client(), redisstore.Options{BatchMax: 1})
	ctx := context.Background()
	if err := s.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	before := s.Stats().RoundTrips
	l := limiter.PoolLimit{MaxInFlight: 1, Lease: time.Second}
	if d, err := s.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: "p", ID: "a", Limit: l}); err != nil || !d.Allowed {
		t.Fatalf("Acquire = %+v, %v", d, err)
	}
	if n := s.Stats().RoundTrips - before; n != 1 {
		t.Errorf("Acquire after Prepare took %d round trips, want 1 (the script loaded)", n)
	}
}

// TestLeaseWaitingMark: a denied Acquire with a MaxWait marks the pool for
// that long (rounded up to the millisecond), a longer wait extends the
// mark and a shorter one does not shorten it, a denial without a wait or
// an admission sets none, and once the mark is gone a release publishes
// nothing.
func TestLeaseWaitingMark(t *testing.T) {
	c := standalone(t).Client()
	s := newStore(t, c, redisstore.ServerClock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := limiter.PoolLimit{MaxInFlight: 1, Lease: time.Minute}
	pool, mark := "p", s.LeaseWaitingKey("p")
	acquire := func(id string, wait time.Duration) limiter.LeaseDecision {
		t.Helper()
		d, err := s.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: pool, ID: id, Limit: l, MaxWait: wait})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	pttl := func() time.Duration {
		t.Helper()
		d, err := c.PTTL(ctx, mark).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := acquire("a", time.Second); !d.Allowed {
		t.Fatalf("Acquire(a) = %+v", d)
	}
	if ttl := pttl(); ttl != -2*time.Nanosecond && ttl != -2*time.Millisecond {
		t.Errorf("after an admission, the mark's PTTL = %v, want none (-2)", ttl)
	}
	acquire("b", 0)
	if n, _ := c.Exists(ctx, mark).Result(); n != 0 {
		t.Errorf("a denial without a wait set the mark")
	}
	sent := time.Now()
	acquire("b", 1500*time.Microsecond) // 2 ms
	switch ttl := pttl(); {
	case ttl == -2*time.Nanosecond || ttl == -2*time.Millisecond:
		// gone already: only once its 1.5 ms (2 ms, rounded up) can have
		// passed, which a busy machine takes between two round trips
		if waited := time.Since(sent); waited < 1500*time.Microsecond {
			t.Errorf("after a denial with a 1.5ms wait, the mark was gone %v later, want it for (0, 2ms]", waited)
		}
	case ttl <= 0 || ttl > 2*time.Millisecond:
		t.Errorf("after a denial with a 1.5ms wait, the mark's PTTL = %v, want (0, 2ms]", ttl)
	}
	acquire("b", 10*time.Second)
	acquire("c", 300*time.Millisecond)
	if ttl := pttl(); ttl <= 5*time.Second || ttl > 10*time.Second {
		t.Errorf("after waits of 10s then 300ms, the mark's PTTL = %v, want about 10s", ttl)
	}
	// A short mark, then gone: the release publishes nothing.
	if err := c.Del(ctx, mark).Err(); err != nil {
		t.Fatal(err)
	}
	acquire("b", 50*time.Millisecond)
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if n, err := c.Exists(ctx, mark).Result(); err != nil || n == 0 {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the mark of a 50ms wait is still there after %v", time.Since(start))
		}
	}
	sub := standalone(t).Client().Subscribe(ctx, s.LeaseChannel(pool))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Release(ctx, time.Time{}, pool, "a"); err != nil || !r.Released {
		t.Fatalf("Release(a) = %+v, %v", r, err)
	}
	if err := c.Publish(ctx, s.LeaseChannel(pool), "marker").Err(); err != nil {
		t.Fatal(err)
	}
	m, err := sub.ReceiveMessage(ctx)
	if err != nil || m.Payload != "marker" {
		t.Errorf("after the mark expired, the first message = %+v, %v; want the test's marker", m, err)
	}
}
