package denialcache_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// backend is a fake shared store: in-memory buckets deciding at the fake
// clock's time, counting calls.
type backend struct {
	clock *clocktest.Clock
	mem   *limiter.MemoryStore
	err   error // returned instead, when set

	mu    sync.Mutex
	calls int
}

func newBackend(c *clocktest.Clock) *backend {
	return &backend{clock: c, mem: limiter.NewMemoryStore(limiter.MemoryOptions{})}
}

func (b *backend) Take(ctx context.Context, _ time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	b.mu.Lock()
	b.calls++
	err := b.err
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return b.mem.Take(ctx, b.clock.Now(), reqs)
}

func (b *backend) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	return b.mem.Refund(ctx, b.clock.Now(), reqs)
}

func (b *backend) Calls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls
}

func newCache(t testing.TB, opts denialcache.Options) *denialcache.Cache {
	t.Helper()
	c, err := denialcache.New(opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts, err)
	}
	return c
}

// wrapped is a backend on a clock at t0 behind a cache with the
// defaults, and the cache's store in front of it.
func wrapped(t *testing.T) (*clocktest.Clock, *backend, *denialcache.Cache, limiter.Store) {
	t.Helper()
	clk := clockAt(t0)
	be := newBackend(clk)
	c := newCache(t, denialcache.Options{Now: clk.Now})
	return clk, be, c, c.Wrap(be)
}

func req(key string, l limiter.Limit, hits int64) limiter.Request {
	return limiter.Request{Key: key, Limit: l, Hits: hits}
}

// step is one Take at at (since t0): want is its decision, and backend
// whether the store was asked.
type step struct {
	at      time.Duration
	reqs    []limiter.Request
	want    []limiter.Decision
	backend bool
}

func runSteps(t *testing.T, steps []step) {
	t.Helper()
	clk, be, _, s := wrapped(t)
	for i, st := range steps {
		clk.Set(t0.Add(st.at))
		before := be.Calls()
		got, err := s.Take(context.Background(), clk.Now(), st.reqs)
		if err != nil {
			t.Fatalf("step %d: Take(t0+%v, %v): %v", i, st.at, st.reqs, err)
		}
		if asked := be.Calls() > before; asked != st.backend {
			t.Errorf("step %d: Take(t0+%v, %v) asked the store: %v, want %v", i, st.at, st.reqs, asked, st.backend)
		}
		for j := range st.want {
			if got[j] != st.want[j] {
				t.Errorf("step %d: Take(t0+%v, %v)[%d] = %+v, want %+v", i, st.at, st.reqs, j, got[j], st.want[j])
			}
		}
	}
}

var (
	onePerSec = limiter.Limit{Count: 1, Period: time.Second, Burst: 1}
	tenPerSec = limiter.Limit{Count: 10, Period: time.Second, Burst: 10}
	ms        = time.Millisecond
)

func TestHotDeniedKey(t *testing.T) {
	runSteps(t, []step{
		{0, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Allowed(0, time.Second)}, true},
		{0, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Second, time.Second)}, true},
		// Denied locally until t0+1s, counting down.
		{0, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Second, time.Second)}, false},
		{500 * ms, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(500*ms, 500*ms)}, false},
		{time.Second - time.Nanosecond, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Microsecond, time.Microsecond)}, false},
		// At the deadline, the store is asked again, and admits.
		{time.Second, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Allowed(0, time.Second)}, true},
		{time.Second, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Second, time.Second)}, true},
		{1500 * ms, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(500*ms, 500*ms)}, false},
		// Another key is not affected.
		{1500 * ms, []limiter.Request{req("other", onePerSec, 1)}, []limiter.Decision{limitertest.Allowed(0, time.Second)}, true},
	})
}

func TestSmallerAsksAndChecksPassThrough(t *testing.T) {
	runSteps(t, []step{
		{0, []limiter.Request{req("k", tenPerSec, 8)}, []limiter.Decision{limitertest.Allowed(2, 800*ms)}, true},
		// 5 are missing 3 tokens, 300ms away.
		{0, []limiter.Request{req("k", tenPerSec, 5)}, []limiter.Decision{limitertest.Denied(300*ms, 800*ms)}, true},
		// 6 are missing 4: the store's answer for 6, from the cache.
		{0, []limiter.Request{req("k", tenPerSec, 6)}, []limiter.Decision{limitertest.Denied(400*ms, 800*ms)}, false},
		// Fewer than 5 may pass: the store decides.
		{0, []limiter.Request{req("k", tenPerSec, 2)}, []limiter.Decision{limitertest.Allowed(0, time.Second)}, true},
		// A check always goes to the store.
		{100 * ms, []limiter.Request{req("k", tenPerSec, 0)}, []limiter.Decision{limitertest.Allowed(1, 900*ms)}, true},
		// More than a burst exceeds it: that is the store's answer.
		{100 * ms, []limiter.Request{req("k", tenPerSec, 11)}, []limiter.Decision{{ExceedsBurst: true, ResetAfter: 900 * ms}}, true},
	})
}

func TestChangedLimitPassesThrough(t *testing.T) {
	twoPerSec := limiter.Limit{Count: 2, Period: time.Second, Burst: 2}
	runSteps(t, []step{
		{0, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Allowed(0, time.Second)}, true},
		{0, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Second, time.Second)}, true},
		{0, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Second, time.Second)}, false},
		// A new limit applies to the stored state: the store decides, and
		// keeps the token spent, half a second at 2 a second.
		{0, []limiter.Request{req("k", twoPerSec, 1)}, []limiter.Decision{limitertest.Allowed(0, time.Second)}, true},
		{500 * ms, []limiter.Request{req("k", twoPerSec, 1)}, []limiter.Decision{limitertest.Allowed(0, time.Second)}, true},
		{500 * ms, []limiter.Request{req("k", twoPerSec, 1)}, []limiter.Decision{limitertest.Denied(500*ms, time.Second)}, true},
		// Learned under 2 a second; back under 1 a second, the store decides.
		{500 * ms, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Second, time.Second)}, true},
	})
}

func TestMultiRequestTakesPassThrough(t *testing.T) {
	runSteps(t, []step{
		{0, []limiter.Request{req("k", onePerSec, 1), req("j", onePerSec, 1)}, []limiter.Decision{limitertest.Allowed(0, time.Second), limitertest.Allowed(0, time.Second)}, true},
		{0, []limiter.Request{req("k", onePerSec, 1), req("j", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Second, time.Second), limitertest.Denied(time.Second, time.Second)}, true},
		// Not learned from a multi-request Take...
		{0, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Second, time.Second)}, true},
		// ...nor answered from the cache.
		{0, []limiter.Request{req("k", onePerSec, 1), req("x", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Second, time.Second), limitertest.Allowed(1, 0)}, true},
	})
}

func TestReservationsAndPostPaidPassThrough(t *testing.T) {
	postPaid := limiter.Limit{Count: 1, Period: time.Second, Burst: 1, MaxDebt: 5}
	wait := func(r limiter.Request, w time.Duration) limiter.Request { r.MaxWait = w; return r }
	runSteps(t, []step{
		{0, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Allowed(0, time.Second)}, true},
		{0, []limiter.Request{req("k", onePerSec, 1)}, []limiter.Decision{limitertest.Denied(time.Second, time.Second)}, true},
		// A reservation within its MaxWait is the store's to admit.
		{0, []limiter.Request{wait(req("k", onePerSec, 1), 2*time.Second)}, []limiter.Decision{{Allowed: true, ResetAfter: 2 * time.Second, Wait: time.Second}}, true},
		// Post-paid charges are always recorded.
		{0, []limiter.Request{req("p", postPaid, 1)}, []limiter.Decision{limitertest.Allowed(0, time.Second)}, true},
		{0, []limiter.Request{req("p", postPaid, 1)}, []limiter.Decision{limitertest.Allowed(0, 2*time.Second)}, true},
		// Denied in debt, and recorded: retry once paid, its own token included.
		{0, []limiter.Request{req("p", postPaid, 1)}, []limiter.Decision{limitertest.Denied(2*time.Second, 3*time.Second)}, true},
		{0, []limiter.Request{req("p", postPaid, 1)}, []limiter.Decision{limitertest.Denied(3*time.Second, 4*time.Second)}, true},
	})
}

// TestRefundForgets: a refund makes the bucket fuller, so the cache forgets
// it and the store decides again.
func TestRefundForgets(t *testing.T) {
	_, _, c, s := wrapped(t)
	ctx := context.Background()
	r := []limiter.Request{req("k", onePerSec, 1)}
	s.Take(ctx, t0, r)
	s.Take(ctx, t0, r)
	if c.Len() != 1 {
		t.Fatalf("Len = %d after a denial, want 1", c.Len())
	}
	if err := s.(limiter.Refunder).Refund(ctx, t0, r); err != nil {
		t.Fatalf("Refund: %v", err)
	}
	if d, _ := s.Take(ctx, t0, r); !d[0].Allowed {
		t.Errorf("Take after Refund = %+v, want the refunded token", d[0])
	}
	if err := c.Wrap(denyAll{}).(limiter.Refunder).Refund(ctx, t0, r); !errors.Is(err, limiter.ErrInvalidRequest) {
		t.Errorf("Refund through a store that cannot = %v, want ErrInvalidRequest", err)
	}
}

func TestExceedsBurstIsCachedPerLimit(t *testing.T) {
	threePerSec := limiter.Limit{Count: 3, Period: time.Second, Burst: 3}
	exceeds := limiter.Decision{ExceedsBurst: true}
	runSteps(t, []step{
		{0, []limiter.Request{req("k", threePerSec, 4)}, []limiter.Decision{exceeds}, true},
		{0, []limiter.Request{req("k", threePerSec, 4)}, []limiter.Decision{exceeds}, false},
		{500 * ms, []limiter.Request{req("k", threePerSec, 100)}, []limiter.Decision{exceeds}, false},
		// Within the burst: the store decides.
		{500 * ms, []limiter.Request{req("k", threePerSec, 3)}, []limiter.Decision{limitertest.Allowed(0, time.Second)}, true},
		// A larger burst: the store decides.
		{500 * ms, []limiter.Request{req("k2", threePerSec, 4)}, []limiter.Decision{exceeds}, true},
		{500 * ms, []limiter.Request{req("k2", limiter.Limit{Count: 3, Period: time.Second, Burst: 5}, 4)}, []limiter.Decision{limitertest.Allowed(1, 1333334*time.Microsecond)}, true},
	})
}

func TestErrorsAndInvalidRequestsPassThrough(t *testing.T) {
	_, be, c, s := wrapped(t)
	ctx := context.Background()
	be.err = fmt.Errorf("take: %w", limiter.ErrUnavailable)
	if _, err := s.Take(ctx, t0, []limiter.Request{req("k", onePerSec, 1)}); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Take with a failing store = %v, want its error", err)
	}
	be.err = nil
	s.Take(ctx, t0, []limiter.Request{req("k", onePerSec, 1)})
	s.Take(ctx, t0, []limiter.Request{req("k", onePerSec, 1)}) // denied, learned
	if _, err := s.Take(ctx, t0, []limiter.Request{req("k", onePerSec, limiter.MaxTokens+1)}); !errors.Is(err, limiter.ErrInvalidRequest) {
		t.Errorf("Take(hits > MaxTokens) = %v, want ErrInvalidRequest from the store", err)
	}
	if st := c.Stats(); st.Learned != 1 {
		t.Errorf("Stats = %+v, want one denial learned", st)
	}
}

// TestAdmissionForgets: should the store admit what an entry denies (it
// lost its state), the entry goes.
func TestAdmissionForgets(t *testing.T) {
	clk := clockAt(t0)
	be := newBackend(clk)
	c := newCache(t, denialcache.Options{Now: clk.Now})
	learn := c.Learn(be)
	ctx := context.Background()
	learn.Take(ctx, t0, []limiter.Request{req("k", onePerSec, 1)})
	learn.Take(ctx, t0, []limiter.Request{req("k", onePerSec, 1)})
	if c.Len() != 1 {
		t.Fatalf("Len = %d after a denial, want 1", c.Len())
	}
	be.mem = limiter.NewMemoryStore(limiter.MemoryOptions{}) // state lost
	if d, _ := learn.Take(ctx, t0, []limiter.Request{req("k", onePerSec, 1)}); !d[0].Allowed {
		t.Fatalf("Take on a fresh store = %+v, want allowed", d[0])
	}
	if c.Len() != 0 {
		t.Errorf("Len = %d after the store admitted, want 0", c.Len())
	}
}

// TestSameAsStore: over a random timeline, the store behind the cache and
// the same store without it give exactly the same Decisions: the cache
// denies nothing the store would admit, admits nothing itself, and
// answers what the store would (requests it answers are denials, which
// leave the bucket as it was, so both stores hold the same buckets).
func TestSameAsStore(t *testing.T) {
	limits := []limiter.Limit{
		onePerSec, tenPerSec,
		{Count: 3, Period: time.Second, Burst: 5},             // 333333⅓ µs a token
		{Count: 7, Period: 1001 * time.Microsecond, Burst: 3}, // 143 µs
		{Count: 7, Period: time.Millisecond, Burst: 6},        // 142 6/7 µs
		{Count: 1000, Period: 999 * time.Microsecond, Burst: 40},
	}
	for _, tc := range []struct {
		name   string
		maxAge time.Duration
		steps  time.Duration // largest step of the clock
	}{
		{"default", 0, 50 * ms},
		{"short steps", 0, 2 * ms},
		{"max age 3ms", 3 * ms, 10 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			clk := clockAt(t0)
			cached := newBackend(clk)
			plain := newBackend(clk)
			c := newCache(t, denialcache.Options{Now: clk.Now, MaxEntries: 64, MaxAge: tc.maxAge})
			s := c.Wrap(cached)
			ctx := context.Background()
			for i := range 20000 {
				// Whole microseconds: the store reads its clock to the
				// microsecond, and decides at the instant the call is sent.
				if rng.IntN(10) == 0 {
					clk.Advance(time.Duration(rng.Int64N(10)) * time.Microsecond)
				} else {
					clk.Advance(time.Duration(rng.Int64N(tc.steps.Microseconds())) * time.Microsecond)
				}
				n := 1
				if rng.IntN(10) == 0 {
					n = 2
				}
				reqs := make([]limiter.Request, n)
				for j := range reqs {
					l := limits[rng.IntN(len(limits))]
					reqs[j] = req(fmt.Sprintf("k%d", rng.IntN(8)), l, 1+rng.Int64N(l.Burst+1))
				}
				got, err := s.Take(ctx, clk.Now(), reqs)
				if err != nil {
					t.Fatal(err)
				}
				want, _ := plain.Take(ctx, clk.Now(), reqs)
				for j := range reqs {
					if got[j] != want[j] {
						t.Fatalf("step %d: Take(%v)[%d] = %+v through the cache, %+v without", i, reqs, j, got[j], want[j])
					}
				}
			}
			st := c.Stats()
			if st.LocalDenials == 0 {
				t.Errorf("Stats = %+v: the cache never answered", st)
			}
			t.Logf("%+v; store calls %d with the cache, %d without", st, cached.Calls(), plain.Calls())
		})
	}
}

// denyAll is a store whose every bucket is an hour short of empty at any
// time: it denies every request, with limiter.Decide's answer.
type denyAll struct{}

func (denyAll) Take(_ context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	d := make([]limiter.Decision, len(reqs))
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return nil, err
		}
		tat := now.Add(time.Hour + r.Limit.FillTime()).UnixMicro()
		_, d[i] = limiter.Decide(r, limiter.State{TAT: tat}, now)
	}
	return d, nil
}

// TestMemoryIsBounded: a million distinct denied keys fill the cache to
// its bound and no further; entries past their deadline make room first.
func TestMemoryIsBounded(t *testing.T) {
	clk := clockAt(t0)
	const maxEntries = 1024
	c := newCache(t, denialcache.Options{Now: clk.Now, MaxEntries: maxEntries})
	s := c.Wrap(denyAll{})
	ctx := context.Background()
	l := onePerSec
	for i := range 1_000_000 {
		if _, err := s.Take(ctx, t0, []limiter.Request{req(fmt.Sprint(i), l, 1)}); err != nil {
			t.Fatal(err)
		}
		if i%100_000 == 0 && c.Len() > maxEntries {
			t.Fatalf("after %d keys, Len = %d, want at most %d", i+1, c.Len(), maxEntries)
		}
	}
	if n := c.Len(); n > maxEntries || n < maxEntries/2 {
		t.Errorf("after a million keys, Len = %d, want at most %d (and near it)", n, maxEntries)
	}
	// The most recent keys are still denied locally.
	if st := c.Stats(); st.Learned != 1_000_000 {
		t.Errorf("Stats = %+v, want a million learned", st)
	}
	// An hour later every entry has expired: new ones replace them.
	clk.Advance(time.Hour)
	for i := range 2 * maxEntries {
		s.Take(ctx, t0, []limiter.Request{req(fmt.Sprint("new", i), l, 1)})
	}
	if n := c.Len(); n > maxEntries {
		t.Errorf("Len = %d, want at most %d", n, maxEntries)
	}
}

// TestConcurrentHotKey: many goroutines on one denied key, with the clock
// moving, admit what the bucket holds, no more and no less, and the store
// is asked far less often than it is called; run with -race.
func TestConcurrentHotKey(t *testing.T) {
	clk, be, c, s := wrapped(t)
	const goroutines, takes = 16, 500
	var answered, admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range takes {
				if g == 0 && i%50 == 0 {
					clk.Advance(100 * ms)
				}
				d, err := s.Take(context.Background(), clk.Now(), []limiter.Request{req("hot", tenPerSec, 1)})
				if err != nil || len(d) != 1 {
					t.Errorf("Take = %v, %v", d, err)
					return
				}
				answered.Add(1)
				if d[0].Allowed {
					admitted.Add(1)
				}
				if g == 0 && i%50 == 49 && !d[0].Allowed {
					// The last of goroutine 0's Takes before its next step
					// was denied, by the store or with its proof, so the
					// bucket holds no token until that step: a denial that
					// outlived its token would leave one here.
					check, err := be.mem.Take(context.Background(), clk.Now(), []limiter.Request{req("hot", tenPerSec, 0)})
					if err != nil || check[0].Remaining != 0 {
						t.Errorf("at t0+%v, after a Take denied %+v, the bucket holds %+v, %v; want no token left",
							clk.Now().Sub(t0), d[0], check, err)
					}
				}
			}
		})
	}
	wg.Wait()
	if n := answered.Load(); n != goroutines*takes {
		t.Fatalf("%d Takes answered, want %d", n, goroutines*takes)
	}
	// The clock moved 1 s in all, in ten steps of 100 ms, each bringing one
	// token of ten a second: at most 10 + 10 admitted. And at least 19:
	// goroutine 0 takes 50 times after each step, and the cache denies only
	// while it has the store's proof that no token can have arrived, so
	// every token that arrives is taken before the next step; only the
	// first step, if it came before any Take, adds to a full bucket.
	if n := admitted.Load(); n < 19 || n > 20 {
		t.Errorf("%d of %d Takes admitted, want 19 or 20 (burst 10, and 10 a second for 1 s)", n, goroutines*takes)
	}
	// Each admission is a store call, and each Take either one or a local
	// denial; there is a store call per deadline that passed and per
	// goroutine racing to it, not per Take.
	calls, st := be.Calls(), c.Stats()
	if int64(calls)+st.LocalDenials != goroutines*takes || int64(calls) < admitted.Load() {
		t.Errorf("%d store calls and %d local denials (%+v) for %d Takes, %d admitted; want a call or a local denial for each, a call for each admission",
			calls, st.LocalDenials, st, goroutines*takes, admitted.Load())
	}
	if calls > 500 {
		t.Errorf("%d store calls for %d Takes on one hot key, want far fewer", calls, goroutines*takes)
	}
}

// BenchmarkHotDeniedKey measures a Take on a bucket the cache denies: for
// as many tokens as the denial it learned, and for more (its answer then
// computed from the limit's arithmetic).
func BenchmarkHotDeniedKey(b *testing.B) {
	thirds := limiter.Limit{Count: 3, Period: time.Second, Burst: 5}
	for _, bc := range []struct {
		name        string
		l           limiter.Limit
		learn, take int64
	}{
		{"same hits", tenPerSec, 1, 1},
		{"more hits", tenPerSec, 1, 5},
		// The denial of 1 tells that 4 arrive 1333333 µs, not
		// 1333334, before the TAT.
		{"more hits, fractional", thirds, 1, 4},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := newCache(b, denialcache.Options{})
			s := c.Wrap(denyAll{})
			key := "v1\x0aai-gateway\x05model\x06gpt-4o"
			ctx := context.Background()
			s.Take(ctx, time.Time{}, []limiter.Request{req(key, bc.l, bc.learn)})
			reqs := []limiter.Request{req(key, bc.l, bc.take)}
			start := time.Now()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if d, err := s.Take(ctx, time.Time{}, reqs); err != nil || d[0].Allowed {
						b.Fatal(d, err)
					}
				}
			})
			// The store is asked again once every DefaultMaxAge.
			most := 2 + int64(time.Since(start)/denialcache.DefaultMaxAge)
			if st := c.Stats(); st.Learned > most || st.LocalDenials < int64(b.N)-most {
				b.Errorf("Stats = %+v after %d Takes, want the store asked at most %d times", st, b.N, most)
			}
		})
	}
}

// BenchmarkLearnChurn measures what the cache adds to a Take the store
// denies when every key is new and the cache is full: a lookup that
// misses, and a denial learned in place of an older one. (The benchmark
// makes each key: one allocation of keyLen bytes.)
func BenchmarkLearnChurn(b *testing.B) {
	for _, keyLen := range []int{100, 4096} {
		b.Run(fmt.Sprintf("%d-byte keys", keyLen), func(b *testing.B) {
			c := newCache(b, denialcache.Options{})
			s := c.Wrap(denyAll{})
			ctx := context.Background()
			buf := []byte(strings.Repeat("v", keyLen))
			reqs := []limiter.Request{req("", tenPerSec, 1)}
			take := func(i int) {
				copy(buf, fmt.Appendf(buf[:0:0], "%016d", i))
				reqs[0].Key = string(buf)
				s.Take(ctx, time.Time{}, reqs)
			}
			for i := range 1 << 17 {
				take(-i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				take(i)
			}
		})
	}
}

// clockAt is a hand-set clock reading t.
func clockAt(t time.Time) *clocktest.Clock {
	c := clocktest.New()
	c.Set(t)
	return c
}
