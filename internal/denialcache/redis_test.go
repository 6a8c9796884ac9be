package denialcache_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestTwoReplicasOnRedis: two replicas share a bucket in one real Redis,
// one of them behind the cache. Together they never admit more than the
// bucket allows over the time they ran (rate·elapsed + burst, by the
// server's clock), and no fewer than it would to a steady demand, while the
// caching replica answers most of its denials itself.
func TestTwoReplicasOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	var replicas [2]*redisstore.Store
	for i := range replicas {
		s, err := redisstore.New(srv.Client(), redisstore.Options{Prefix: "e2e:"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		replicas[i] = s
	}
	cache := newCache(t, denialcache.Options{})
	stores := [2]limiter.Store{cache.Wrap(replicas[0]), replicas[1]}

	l := limiter.Limit{Count: 100, Period: time.Second, Burst: 10}
	const run = 400 * time.Millisecond
	var admitted, takes [2]atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for g := range 16 {
		r := g % 2
		wg.Go(func() {
			for time.Since(start) < run {
				d, err := stores[r].Take(context.Background(), time.Time{}, []limiter.Request{{Key: "shared", Limit: l, Hits: 1}})
				if err != nil {
					t.Error(err)
					return
				}
				takes[r].Add(1)
				if d[0].Allowed {
					admitted[r].Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	total := admitted[0].Load() + admitted[1].Load()
	most := l.Burst + int64(elapsed.Seconds()*float64(l.Count))
	least := l.Burst + int64(run.Seconds()*float64(l.Count)/2)
	if total > most || total < least {
		t.Errorf("two replicas admitted %d in %v, want between %d and %d (rate·elapsed + burst)", total, elapsed, least, most)
	}
	st := cache.Stats()
	if redisTakes := replicas[0].Stats().Takes; st.LocalDenials == 0 || redisTakes >= takes[0].Load() {
		t.Errorf("the caching replica sent %d of its %d Takes to Redis (cache %+v), want fewer", redisTakes, takes[0].Load(), st)
	}
	t.Logf("admitted %d+%d of %d+%d in %v; cache %+v; Redis Takes %d and %d",
		admitted[0].Load(), admitted[1].Load(), takes[0].Load(), takes[1].Load(), elapsed, st, replicas[0].Stats().Takes, replicas[1].Stats().Takes)
}

// TestRefundThroughTheChainOnRedis: the chain the server builds, denial
// cache (front) → failover → denial cache (learning) → Redis store, is a
// limiter.Refunder end to end. A refund reaches Redis and makes both layers
// forget the denial they held, and a reservation's Wait comes back through
// every layer.
func TestRefundThroughTheChainOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	store, err := redisstore.New(srv.Client(), redisstore.Options{Prefix: "chain:", Clock: redisstore.CallerClock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cache := newCache(t, denialcache.Options{})
	fs, err := failover.New(cache.Learn(store), failover.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var chain limiter.Store = cache.Front(fs)
	refunder, ok := chain.(limiter.Refunder)
	if !ok {
		t.Fatalf("%T does not implement limiter.Refunder", chain)
	}
	ctx := context.Background()
	l := limiter.Limit{Count: 1, Period: time.Minute, Burst: 1}
	one := []limiter.Request{{Key: "k", Limit: l, Hits: 1}}
	takeOne := func(step string, reqs []limiter.Request) limiter.Decision {
		t.Helper()
		d, err := chain.Take(ctx, t0, reqs)
		if err != nil {
			t.Fatalf("%s: Take: %v", step, err)
		}
		return d[0]
	}
	if d := takeOne("first", one); !d.Allowed {
		t.Fatalf("first Take = %+v, want admitted", d)
	}
	if d := takeOne("second", one); d.Allowed {
		t.Fatalf("second Take = %+v, want denied", d)
	}
	if d := takeOne("third", one); d.Allowed || cache.Stats().LocalDenials != 1 {
		t.Fatalf("third Take = %+v, cache %+v: want denied from the cache", d, cache.Stats())
	}
	if err := refunder.Refund(ctx, t0, one); err != nil {
		t.Fatalf("Refund: %v", err)
	}
	if d := takeOne("after the refund", one); !d.Allowed {
		t.Errorf("Take after the refund = %+v, want the refunded token", d)
	}
	wait := []limiter.Request{{Key: "k", Limit: l, Hits: 1, MaxWait: 2 * time.Minute}}
	if d := takeOne("reservation", wait); !d.Allowed || d.Wait != time.Minute {
		t.Errorf("reservation = %+v, want admitted with Wait 1m", d)
	}
	// The caller gives up: its token goes back, and the next reservation
	// waits only for the first one's.
	if err := refunder.Refund(ctx, t0, wait); err != nil {
		t.Fatalf("Refund: %v", err)
	}
	if d := takeOne("reservation after the refund", wait); !d.Allowed || d.Wait != time.Minute {
		t.Errorf("reservation after the refund = %+v, want admitted with Wait 1m", d)
	}
}
