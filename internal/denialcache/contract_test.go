package denialcache_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

// TestAnswersAreTheStores: whatever the cache answers is the Decision the
// store would give for that request at that instant, computed from what
// the cache learned; when it cannot be, the store answers.
func TestAnswersAreTheStores(t *testing.T) {
	// 1 token a second, 10 at most.
	slow := limiter.Limit{Count: 1, Period: time.Second, Burst: 10}
	// 3 tokens a second, 5 at most: 333333⅓ µs a token, full in 1666666⅔.
	thirds := limiter.Limit{Count: 3, Period: time.Second, Burst: 5}
	us := time.Microsecond
	exceeds := func(reset time.Duration) limiter.Decision {
		return limiter.Decision{ExceedsBurst: true, ResetAfter: reset}
	}
	one := func(key string, l limiter.Limit, hits int64) []limiter.Request {
		return []limiter.Request{req(key, l, hits)}
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"larger requests get their own RetryAfter", []step{
			{0, one("k", slow, 10), []limiter.Decision{limitertest.Allowed(0, 10*time.Second)}, true},
			{0, one("k", slow, 1), []limiter.Decision{limitertest.Denied(time.Second, 10*time.Second)}, true},
			// 5 tokens take 5 s to arrive, not 1 s.
			{0, one("k", slow, 5), []limiter.Decision{limitertest.Denied(5*time.Second, 10*time.Second)}, false},
			{0, one("k", slow, 10), []limiter.Decision{limitertest.Denied(10*time.Second, 10*time.Second)}, false},
			{0, one("k", slow, 11), []limiter.Decision{exceeds(10 * time.Second)}, false},
			{500 * ms, one("k", slow, 5), []limiter.Decision{limitertest.Denied(4500*ms, 9500*ms)}, false},
			{500 * ms, one("k", slow, 1), []limiter.Decision{limitertest.Denied(500*ms, 9500*ms)}, false},
			// The first token is back: the store decides.
			{time.Second, one("k", slow, 1), []limiter.Decision{limitertest.Allowed(0, 10*time.Second)}, true},
		}},
		{"fractions the answers do not tell go to the store", []step{
			{0, one("k", thirds, 5), []limiter.Decision{limitertest.Allowed(0, 1666667*us)}, true},
			// The TAT is t0+1666666⅔ µs; this answer says it is
			// 1666667 µs less 0 or ⅓ µs, not which.
			{0, one("k", thirds, 1), []limiter.Decision{limitertest.Denied(333334*us, 1666667*us)}, true},
			// 2 tokens arrive 1 s before the TAT either way.
			{0, one("k", thirds, 2), []limiter.Decision{limitertest.Denied(666667*us, 1666667*us)}, false},
			{0, one("k", thirds, 6), []limiter.Decision{exceeds(1666667 * us)}, false},
			// 3 arrive at 1000000 or 1000001 µs: the store knows.
			{0, one("k", thirds, 3), []limiter.Decision{limitertest.Denied(time.Second, 1666667*us)}, true},
			{0, one("k", thirds, 3), []limiter.Decision{limitertest.Denied(time.Second, 1666667*us)}, false},
			// That answer told ⅓ or ⅔; 4 needs to know which.
			{0, one("k", thirds, 4), []limiter.Decision{limitertest.Denied(1333334*us, 1666667*us)}, true},
			{0, one("k", thirds, 5), []limiter.Decision{limitertest.Denied(1666667*us, 1666667*us)}, false},
			{200 * ms, one("k", thirds, 5), []limiter.Decision{limitertest.Denied(1466667*us, 1466667*us)}, false},
		}},
		{"this replica's admission makes the store's answers longer", []step{
			{0, one("k", slow, 8), []limiter.Decision{limitertest.Allowed(2, 8*time.Second)}, true},
			{0, one("k", slow, 5), []limiter.Decision{limitertest.Denied(3*time.Second, 8*time.Second)}, true},
			{0, one("k", slow, 2), []limiter.Decision{limitertest.Allowed(0, 10*time.Second)}, true},
			// 5 now wait 5 s, not 3: the store is asked.
			{0, one("k", slow, 5), []limiter.Decision{limitertest.Denied(5*time.Second, 10*time.Second)}, true},
			{0, one("k", slow, 5), []limiter.Decision{limitertest.Denied(5*time.Second, 10*time.Second)}, false},
		}},
		{"an admission in a multi-request Take too", []step{
			{0, one("k", slow, 8), []limiter.Decision{limitertest.Allowed(2, 8*time.Second)}, true},
			{0, one("k", slow, 5), []limiter.Decision{limitertest.Denied(3*time.Second, 8*time.Second)}, true},
			{0, []limiter.Request{req("k", slow, 1), req("j", onePerSec, 1)}, []limiter.Decision{limitertest.Allowed(1, 9*time.Second), limitertest.Allowed(0, time.Second)}, true},
			{0, one("k", slow, 5), []limiter.Decision{limitertest.Denied(4*time.Second, 9*time.Second)}, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { runSteps(t, tc.steps) })
	}
}

// liveHeap returns the bytes of the heap live after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestMemoryIsBoundedByBytes: however long the keys, and however many
// distinct ones are denied, the entries' heap stays within the bytes
// budget (the entries' own, with the room of their maps), and keys too
// long for it are not remembered.
func TestMemoryIsBoundedByBytes(t *testing.T) {
	const maxEntries = 4096
	const maxBytes = maxEntries * denialcache.BytesPerEntry // the default
	for _, tc := range []struct {
		name      string
		first     int // keys of 20 bytes denied first
		keyLen    int // then keys of keyLen bytes
		n         int
		wantLen   int // about; at most maxEntries
		noneFits  bool
		heapBound uint64
	}{
		{name: "short keys", keyLen: 20, n: 3 * maxEntries, wantLen: maxBytes / (20 + denialcache.EntryOverhead)},
		{name: "100-byte keys", keyLen: 100, n: 3 * maxEntries, wantLen: maxBytes / (100 + denialcache.EntryOverhead)},
		{name: "4 KiB values", keyLen: 4200, n: 3 * maxEntries, wantLen: maxBytes / (4200 + denialcache.EntryOverhead)},
		{name: "4 KiB values after short keys", first: 3 * maxEntries, keyLen: 4200, n: 3 * maxEntries, wantLen: maxBytes / (4200 + denialcache.EntryOverhead)},
		{name: "keys longer than a shard's budget", keyLen: maxBytes/64 + 1, n: 64, noneFits: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clockAt(t0)
			before := liveHeap()
			c := newCache(t, denialcache.Options{Now: clk.Now, MaxEntries: maxEntries})
			s := c.Wrap(denyAll{})
			ctx := context.Background()
			take := func(key string) {
				if _, err := s.Take(ctx, t0, []limiter.Request{req(key, onePerSec, 1)}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range tc.first {
				take(fmt.Sprintf("short:%014d", i))
			}
			pad := strings.Repeat("v", tc.keyLen-16)
			for i := range tc.n {
				take(fmt.Sprintf("%016d", i) + pad)
			}
			heap := liveHeap() - min(before, liveHeap())
			n := c.Len()
			if tc.noneFits {
				if n != 0 {
					t.Errorf("Len = %d after %d keys of %d bytes, want 0: none fits", n, tc.n, tc.keyLen)
				}
			} else if n > maxEntries || n > tc.wantLen || n < tc.wantLen*3/4 {
				t.Errorf("Len = %d after %d keys of %d bytes, want about %d (at most %d)", n, tc.n, tc.keyLen, tc.wantLen, min(tc.wantLen, maxEntries))
			}
			// The entries cost about what they count, but for the
			// allocator's rounding: allow half again.
			if bound := uint64(maxBytes) * 3 / 2; heap > bound {
				t.Errorf("%d entries of %d-byte keys take %d bytes of heap, want at most %d", n, tc.keyLen, heap, bound)
			}
			t.Logf("Len %d, heap %d bytes (%d per entry)", n, heap, heap/uint64(max(n, 1)))
			runtime.KeepAlive(c)
		})
	}
}

// TestDenialTrustedForMaxAge: tokens can come back without this replica
// seeing it (a Cluster give-back, a refund elsewhere). A denial is
// answered from the cache for at most MaxAge after the call that learned
// it was sent, however long its RetryAfter.
func TestDenialTrustedForMaxAge(t *testing.T) {
	perHour := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
	for _, tc := range []struct {
		name    string
		maxAge  time.Duration
		trusted time.Duration // denied from the cache until then
	}{
		{"default", 0, denialcache.DefaultMaxAge},
		{"10ms", 10 * ms, 10 * ms},
		{"longer than RetryAfter", 2 * time.Hour, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clockAt(t0)
			be := newBackend(clk)
			c := newCache(t, denialcache.Options{Now: clk.Now, MaxAge: tc.maxAge})
			s := c.Wrap(be)
			ctx := context.Background()
			r := []limiter.Request{req("k", perHour, 1)}
			// Another replica's Take spanning slots takes the token...
			if d, _ := be.mem.Take(ctx, t0, r); !d[0].Allowed {
				t.Fatalf("the other replica's Take = %+v, want admitted", d[0])
			}
			// ...this replica's Take is denied meanwhile...
			if d, _ := s.Take(ctx, t0, r); d[0].Allowed || c.Stats().Learned != 1 {
				t.Fatalf("Take in the window = %+v, cache %+v: want denied and learned", d[0], c.Stats())
			}
			// ...and the other slot's denial gives the token back.
			clk.Advance(time.Millisecond)
			if err := be.mem.Refund(ctx, clk.Now(), r); err != nil {
				t.Fatal(err)
			}
			clk.Set(t0.Add(tc.trusted - time.Microsecond))
			calls := be.Calls()
			if d, _ := s.Take(ctx, clk.Now(), r); d[0].Allowed || be.Calls() != calls {
				t.Errorf("Take at t0+%v = %+v, asked the store %v: want denied from the cache", tc.trusted-time.Microsecond, d[0], be.Calls() != calls)
			}
			clk.Set(t0.Add(tc.trusted))
			if d, _ := s.Take(ctx, clk.Now(), r); !d[0].Allowed || be.Calls() != calls+1 {
				t.Errorf("Take at t0+%v = %+v, asked the store %v: want the store's admission", tc.trusted, d[0], be.Calls() != calls)
			}
		})
	}
}

// pausing is a backend whose Take, when pause is set, decides at once but
// answers only when release is closed, having closed decided.
type pausing struct {
	*backend
	pause            atomic.Bool
	decided, release chan struct{}
}

func (p *pausing) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	d, err := p.backend.Take(ctx, now, reqs)
	if p.pause.CompareAndSwap(true, false) {
		close(p.decided)
		<-p.release
	}
	return d, err
}

// TestSpendingDuringTake: a Take the store denied before a refund, an
// admission or a post-paid charge through this replica, whose answer comes
// back after that returned, is not learned: the refund made it wrong, and
// the spending makes its retry-after short.
func TestSpendingDuringTake(t *testing.T) {
	perMinute := limiter.Limit{Count: 1, Period: time.Minute, Burst: 10}
	postPaid := limiter.Limit{Count: 1, Period: time.Minute, Burst: 10, MaxDebt: 10}
	for _, tc := range []struct {
		name string
		// during runs while the denial is on its way back.
		during func(c *denialcache.Cache, front, learn limiter.Store) error
		// wantAfter is whether a Take of 5 is admitted at the end.
		wantAfter bool
	}{
		{"refund through the front", func(_ *denialcache.Cache, front, _ limiter.Store) error {
			return front.(limiter.Refunder).Refund(context.Background(), t0, []limiter.Request{req("k", perMinute, 8)})
		}, true},
		{"refund through the learner", func(_ *denialcache.Cache, _, learn limiter.Store) error {
			return learn.(limiter.Refunder).Refund(context.Background(), t0, []limiter.Request{req("k", perMinute, 8)})
		}, true},
		{"admission of 2, alone", func(_ *denialcache.Cache, front, _ limiter.Store) error {
			_, err := front.Take(context.Background(), t0, []limiter.Request{req("k", perMinute, 2)})
			return err
		}, false},
		{"admission of 2 beside another bucket", func(_ *denialcache.Cache, front, _ limiter.Store) error {
			_, err := front.Take(context.Background(), t0, []limiter.Request{req("k", perMinute, 2), req("j", perMinute, 1)})
			return err
		}, false},
		{"post-paid charge of 2", func(_ *denialcache.Cache, front, _ limiter.Store) error {
			_, err := front.Take(context.Background(), t0, []limiter.Request{req("k", postPaid, 2)})
			return err
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clockAt(t0)
			be := &pausing{backend: newBackend(clk), decided: make(chan struct{}), release: make(chan struct{})}
			c := newCache(t, denialcache.Options{Now: clk.Now})
			learn := c.Learn(be)
			front := c.Front(learn)
			ctx := context.Background()
			r := []limiter.Request{req("k", perMinute, 5)}
			if d, _ := front.Take(ctx, t0, []limiter.Request{req("k", perMinute, 8)}); !d[0].Allowed {
				t.Fatalf("first Take = %+v, want admitted (2 left)", d[0])
			}
			be.pause.Store(true)
			answered := make(chan limiter.Decision)
			go func() {
				d, _ := front.Take(ctx, t0, r)
				answered <- d[0]
			}()
			<-be.decided // denied, on its way back
			if err := tc.during(c, front, learn); err != nil {
				t.Fatalf("during: %v", err)
			}
			close(be.release)
			if d := <-answered; d.Allowed {
				t.Fatalf("Take decided before = %+v, want denied", d)
			}
			if c.Len() != 0 {
				t.Errorf("Len = %d: the denial decided before was learned", c.Len())
			}
			if d, _ := front.Take(ctx, t0, r); d[0].Allowed != tc.wantAfter {
				t.Errorf("Take of 5 at the end = %+v, want admitted %v", d[0], tc.wantAfter)
			}
		})
	}
}

// answering is a store that gives one fixed Decision to every request.
type answering limiter.Decision

func (a answering) Take(_ context.Context, _ time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	d := make([]limiter.Decision, len(reqs))
	for i := range d {
		d[i] = limiter.Decision(a)
	}
	return d, nil
}

// TestAnswersThatDoNotFitTheModelAreNotLearned: the cache computes its
// answers with the limiter arithmetic, so it learns only denials that fit
// it.
func TestAnswersThatDoNotFitTheModelAreNotLearned(t *testing.T) {
	for _, tc := range []struct {
		name  string
		d     limiter.Decision
		hits  int64
		learn bool
	}{
		{"fits", limiter.Decision{RetryAfter: 100 * ms, ResetAfter: time.Second}, 1, true},
		{"fits, from a full bucket", limiter.Decision{ExceedsBurst: true}, 11, true},
		{"ResetAfter too short for RetryAfter", limiter.Decision{RetryAfter: 100 * ms, ResetAfter: 100 * ms}, 1, false},
		{"ResetAfter too long", limiter.Decision{RetryAfter: 100 * ms, ResetAfter: time.Hour}, 1, false},
		{"not whole microseconds", limiter.Decision{RetryAfter: 100*ms + 1, ResetAfter: time.Second + 1}, 1, false},
		{"denied without a RetryAfter", limiter.Decision{ResetAfter: time.Second}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCache(t, denialcache.Options{Now: clockAt(t0).Now})
			s := c.Wrap(answering(tc.d))
			s.Take(context.Background(), t0, []limiter.Request{req("k", tenPerSec, tc.hits)})
			if learned := c.Len() == 1; learned != tc.learn {
				t.Errorf("Take answered %+v: learned %v, want %v", tc.d, learned, tc.learn)
			}
		})
	}
}

func TestNewRejectsNegativeOptions(t *testing.T) {
	for _, opts := range []denialcache.Options{
		{MaxEntries: -1}, {MaxBytes: -1}, {MaxAge: -time.Nanosecond},
		// Too large: the byte budget or an expiry would overflow.
		{MaxEntries: 1 << 56}, {MaxEntries: denialcache.MaxEntriesLimit + 1}, {MaxBytes: 1 << 62}, {MaxAge: 1 << 62},
	} {
		if _, err := denialcache.New(opts); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", opts)
		}
	}
}
