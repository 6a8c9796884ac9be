package limiter_test

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// raceEnabled reports whether this test binary was built with -race, which
// makes every map write several times slower.
func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// heapInuse returns HeapInuse after a full collection.
func heapInuse() uint64 {
	runtime.GC()
	runtime.GC() // the second cycle frees what the first one's finalizers released
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// bytesPerMillion is the heap a million idle buckets may take (issue 4).
const bytesPerMillion = 200 << 20

// heavyTests names the environment variable that runs the tests too slow
// for a plain `go test ./limiter` (make test sets it to 1).
const heavyTests = "RATELIMITD_HEAVY_TESTS"

// TestMemoryStoreMillionBuckets fills a MemoryStore with a million distinct
// buckets that are not full, checks their heap against the budget of 200 MB
// per million, then lets the clock pass the time they are full again and
// checks that they are reclaimed: by the self-sweep of shards that grow, and
// by Sweep.
//
// Under -race or -short it uses 200,000 buckets and the proportional bound
// (40 MB): map writes under the race detector are several times slower, and
// the bound is linear in the number of buckets.
//
// It takes seconds (ten on a busy machine), so it runs only with
// RATELIMITD_HEAVY_TESTS=1, as make test runs it.
func TestMemoryStoreMillionBuckets(t *testing.T) {
	if os.Getenv(heavyTests) != "1" {
		t.Skipf("a million buckets take seconds: set %s=1 to run this test (make test does)", heavyTests)
	}
	n := 1_000_000
	if raceEnabled() || testing.Short() {
		n = 200_000
	}
	budget := uint64(bytesPerMillion) * uint64(n) / 1_000_000

	// One token of ten per minute: each bucket is full again 6 s after its
	// take, and not before.
	limit := limiter.Limit{Count: 10, Period: time.Minute, Burst: 10}
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	full := t0.Add(limit.Period / time.Duration(limit.Count)).Add(time.Microsecond)
	ctx := context.Background()

	// fill takes one token from each of n distinct buckets (keys first..first+n)
	// at now. The keys are not kept: the heap counted is the store's.
	fill := func(m *limiter.MemoryStore, first int, now time.Time) {
		t.Helper()
		reqs := []limiter.Request{{Limit: limit, Hits: 1}}
		var buf []byte
		for i := first; i < first+n; i++ {
			buf = benchKey(buf[:0], i)
			reqs[0].Key = string(buf)
			d, err := m.Take(ctx, now, reqs)
			if err != nil {
				t.Fatalf("Take(%q) = %v", reqs[0].Key, err)
			}
			if !d[0].Allowed {
				t.Fatalf("Take(%q) at %v denied a fresh bucket: %+v", reqs[0].Key, now, d[0])
			}
		}
	}

	base := heapInuse()
	m := limiter.NewMemoryStore(limiter.MemoryOptions{})
	fill(m, 0, t0)
	if got := m.Len(); got != n {
		t.Fatalf("after %d takes of distinct keys at one instant, Len() = %d, want %d", n, got, n)
	}
	peak := heapInuse()
	used := peak - min(peak, base)
	t.Logf("%d buckets: heap in use grew by %.1f MB (%d bytes a bucket; budget %.0f MB)",
		n, float64(used)/(1<<20), used/uint64(n), float64(budget)/(1<<20))
	if used > budget {
		t.Errorf("%d buckets take %.1f MB of heap, more than the %.0f MB budget", n, float64(used)/(1<<20), float64(budget)/(1<<20))
	}

	// The self-sweep: after the first buckets are full again, a second
	// generation of n other keys makes every shard outgrow its sweep mark
	// and drop the full ones, so the store holds about one generation, not
	// two.
	fill(m, n, full)
	if got := m.Len(); got > n+n/4 {
		t.Errorf("after a second generation of %d keys, with the first one full again, Len() = %d, want at most %d (shards sweep themselves as they grow)", n, got, n+n/4)
	}

	// Sweep, once the second generation is full again too.
	m.Sweep(full.Add(full.Sub(t0)))
	if got := m.Len(); got != 0 {
		t.Errorf("Len() after Sweep past every bucket's full time = %d, want 0", got)
	}
	after := heapInuse()
	left := after - min(after, base)
	t.Logf("after Sweep: heap in use %.1f MB above the start", float64(left)/(1<<20))
	if left > used/10 {
		t.Errorf("after Sweep the heap is still %.1f MB above the start (the buckets took %.1f MB), want at most a tenth of it",
			float64(left)/(1<<20), float64(used)/(1<<20))
	}
	runtime.KeepAlive(m)
}
