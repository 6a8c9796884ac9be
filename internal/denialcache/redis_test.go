package denialcache_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/denialcache"
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
