package tokenlease_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/tokenlease"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// countingStore is a MemoryStore that counts the takes and refunds that
// reach it.
type countingStore struct {
	*limiter.MemoryStore
	takes, refunds atomic.Int64
}

func newCounting() *countingStore {
	return &countingStore{MemoryStore: limiter.NewMemoryStore(limiter.MemoryOptions{})}
}

func (s *countingStore) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	s.takes.Add(1)
	return s.MemoryStore.Take(ctx, now, reqs)
}

func (s *countingStore) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	s.refunds.Add(1)
	return s.MemoryStore.Refund(ctx, now, reqs)
}

// remaining is what a check on key under l answers in store at now.
func remaining(t *testing.T, store limiter.Store, key string, l limiter.Limit) int64 {
	t.Helper()
	d, err := store.Take(context.Background(), time.Now(), []limiter.Request{{Key: key, Limit: l}})
	if err != nil {
		t.Fatal(err)
	}
	return d[0].Remaining
}

func newLeaser(t *testing.T, store limiter.Store, opts tokenlease.Options) *tokenlease.Leaser {
	t.Helper()
	l, err := tokenlease.New(store, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

var hot = limiter.Limit{Count: 1000, Period: time.Second, Burst: 1000}

func take(t *testing.T, l limiter.Store, reqs ...limiter.Request) []limiter.Decision {
	t.Helper()
	d, err := l.Take(context.Background(), time.Now(), reqs)
	if err != nil {
		t.Fatalf("Take(%v): %v", reqs, err)
	}
	return d
}

// TestSliceSizedAndEnded: a bucket becomes busy once a window holds Busy ×
// Hold hits; its slice is that window's demand, at most Burst/16; while
// demand goes on, the slice is refilled before it runs out and the takes
// never reach the store; once demand stops, at the end of its Hold what is
// left goes back, and the store's bucket holds exactly what was admitted.
func TestSliceSizedAndEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newCounting()
		l := newLeaser(t, store, tokenlease.Options{})
		r := limiter.Request{Key: "model", Limit: hot, Hits: 1}
		for i := range 9 {
			if d := take(t, l, r); !d[0].Allowed {
				t.Fatalf("take %d denied", i)
			}
		}
		if got := store.takes.Load(); got != 9 {
			t.Fatalf("store saw %d takes before the bucket was busy, want 9", got)
		}
		// 500 hits a second over 20 ms is 10 hits: the 10th take makes
		// the bucket busy and takes a slice of the window's demand, 10,
		// which serves it.
		take(t, l, r)
		if st := l.Stats(); st.Slices != 1 || st.Taken != 10 || st.Local != 1 || st.Held != 9 || store.takes.Load() != 10 {
			t.Fatalf("after the 10th take: %+v, %d store takes; want one slice of 10, 9 held, 10 store takes", st, store.takes.Load())
		}
		// Demand goes on: each slice is refilled before it runs out (once
		// what is left would last under half a Hold), on a goroutine of its
		// own (synctest.Wait lets it land), so every take is served here
		// and only the slices reach the store.
		for i := range 40 {
			if d := take(t, l, r); !d[0].Allowed {
				t.Fatalf("take %d after the bucket was busy denied", 11+i)
			}
			synctest.Wait()
		}
		st := l.Stats()
		if st.Local != 41 || st.Slices < 2 || st.Held < 1 || store.takes.Load() != 9+st.Slices {
			t.Errorf("%+v, %d store takes; want all 41 served from refilled slices, never empty, and only the slices taken from the store (9 + slices)", st, store.takes.Load())
		}
		if st.Held > hot.Burst/16 {
			t.Errorf("%+v: held %d, more than the share cap %d", st, st.Held, hot.Burst/16)
		}
		// Time stands still: the store's bucket is spent by exactly what
		// was admitted (50) and what the slices hold.
		if got, want := remaining(t, store, "model", hot), 1000-50-st.Held; got != want {
			t.Errorf("store bucket has %d left, want %d: 50 admitted, %d held", got, want, st.Held)
		}

		// Demand stops and the last slice ends (a slice lives up to
		// MaxLives Holds while the store has plenty, as this bucket has):
		// what it holds goes back. 400 ms refill the 50 admitted at 1000/s.
		time.Sleep(tokenlease.DefaultMaxLives*tokenlease.DefaultHold + 80*time.Millisecond)
		synctest.Wait()
		if end := l.Stats(); end.Held != 0 || end.Returned != end.Taken-41 {
			t.Errorf("after the Hold: %+v, want every token not admitted given back", end)
		}
		if got := remaining(t, store, "model", hot); got != 1000 {
			t.Errorf("store bucket has %d left after the give-back and 400 ms, want 1000", got)
		}
	})
}

// TestSliceCappedAtAShareOfTheBurst: however busy, a slice holds at most
// Burst/ShareDivisor tokens.
func TestSliceCappedAtAShareOfTheBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newCounting()
		l := newLeaser(t, store, tokenlease.Options{})
		small := limiter.Limit{Count: 1000, Period: time.Second, Burst: 160}
		r := limiter.Request{Key: "k", Limit: small, Hits: 1}
		for range 100 {
			take(t, l, r)
		}
		if st := l.Stats(); st.Slices == 0 || st.Taken > st.Slices*10 {
			t.Errorf("%+v: want slices of at most 160/16 = 10", st)
		}
		l.Close()
	})
}

// TestGiveBackOnLimitChangeAndClose: a slice ends when its rule's limit
// changes and at Close, giving back what it holds.
func TestGiveBackOnLimitChangeAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newCounting()
		l := newLeaser(t, store, tokenlease.Options{}) // time stands still: no slice ends by time
		r := limiter.Request{Key: "k", Limit: hot, Hits: 1}
		for range 20 {
			take(t, l, r)
			synctest.Wait() // a refill lands
		}
		held := l.Stats().Held
		if held == 0 {
			t.Fatalf("%+v: want a slice held", l.Stats())
		}
		raised := hot
		raised.Count, raised.Burst = 2000, 2000
		take(t, l, limiter.Request{Key: "k", Limit: raised, Hits: 1})
		if st := l.Stats(); st.Returned != held {
			t.Errorf("after the limit changed: %+v, want the %d held under the old limit given back", st, held)
		}
		for range 30 {
			take(t, l, limiter.Request{Key: "k", Limit: raised, Hits: 1})
			synctest.Wait()
		}
		st := l.Stats()
		if st.Held == 0 {
			t.Fatalf("%+v: want a slice held under the new limit", st)
		}
		admitted := st.Local + store.takes.Load() - st.Slices // every take admitted here
		l.Close()
		if st := l.Stats(); st.Held != 0 {
			t.Errorf("after Close: %+v, want nothing held", st)
		}
		// Time stands still: the store's bucket holds exactly what was
		// admitted under both limits (20 + 1 + 30), spent at 2000/s.
		if got, want := remaining(t, store, "k", raised), int64(2000-51); got != want {
			t.Errorf("store bucket has %d left after Close, want %d (admitted %d)", got, want, admitted)
		}
	})
}

// TestAllOrNothingGivesBackToTheSlice: a Take of a leased bucket and a
// denied one is denied whole; the slice gets its token back.
func TestAllOrNothingGivesBackToTheSlice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newCounting()
		l := newLeaser(t, store, tokenlease.Options{})
		model := limiter.Request{Key: "model", Limit: hot, Hits: 1}
		for range 20 {
			take(t, l, model)
			synctest.Wait() // a refill lands
		}
		held := l.Stats().Held
		tiny := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
		client := limiter.Request{Key: "client", Limit: tiny, Hits: 1}
		if d := take(t, l, model, client); !d[0].Allowed || !d[1].Allowed {
			t.Fatalf("first pair: %+v, want both admitted", d)
		}
		if got := l.Stats().Held; got != held-1 {
			t.Fatalf("held %d after an admitted pair, want %d", got, held-1)
		}
		d := take(t, l, model, client)
		if d[1].Allowed {
			t.Fatalf("second pair: %+v, want the client denied", d)
		}
		if got := l.Stats().Held; got != held-1 {
			t.Errorf("held %d after a denied pair, want %d: the model's token back in its slice", got, held-1)
		}
		l.Close()
	})
}

// TestFleetNeverOverAdmits: replicas, each with a Leaser of its own, share
// one store's hot bucket, offered twice its rate by concurrent callers for
// ten (fake) seconds: admitted never exceeds rate·t + burst, and is most of
// it.
func TestFleetNeverOverAdmits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newCounting()
		lim := limiter.Limit{Count: 10000, Period: time.Second, Burst: 1000}
		const replicas, callers = 8, 4
		leasers := make([]*tokenlease.Leaser, replicas)
		for i := range leasers {
			leasers[i] = newLeaser(t, store, tokenlease.Options{})
		}
		start := time.Now()
		const run = 10 * time.Second
		var admitted atomic.Int64
		var wg sync.WaitGroup
		// 8 × 4 callers, each a call every 1.6 ms: 20,000 a second, twice
		// the rate.
		for _, l := range leasers {
			for range callers {
				wg.Go(func() {
					for time.Since(start) < run {
						d, err := l.Take(context.Background(), time.Now(), []limiter.Request{{Key: "model", Limit: lim, Hits: 1}})
						if err != nil {
							panic(err)
						}
						if d[0].Allowed {
							admitted.Add(1)
							// the bound, at every admission
							if bound := lim.Burst + int64(time.Since(start)/time.Millisecond)*lim.Count/1000 + lim.Count/1000; admitted.Load() > bound {
								panic(fmt.Sprintf("admitted %d at %v, above rate·t + burst = %d", admitted.Load(), time.Since(start), bound))
							}
						}
						time.Sleep(1600 * time.Microsecond)
					}
				})
			}
		}
		wg.Wait()
		bound := lim.Burst + int64(run.Seconds()*float64(lim.Count))
		got := admitted.Load()
		var local int64
		for _, l := range leasers {
			local += l.Stats().Local
			l.Close()
		}
		t.Logf("admitted %d of bound %d (%.2f%%); %d from slices; %d takes reached the store", got, bound, 100*float64(got)/float64(bound), local, store.takes.Load())
		if got > bound {
			t.Errorf("admitted %d > rate·t + burst = %d", got, bound)
		}
		if float64(got) < 0.97*float64(bound) {
			t.Errorf("admitted %d < 97%% of %d", got, bound)
		}
	})
}

// TestSlicesLengthenWhileTheStoreHasPlenty: on a bucket with tokens to
// spare, each slice granted at once lives, and is sized for, twice the
// Holds of the one before, up to MaxLives: steady demand then costs the
// store a few slices a second instead of one a Hold. With MaxLives 1 every
// slice is one Hold's.
func TestSlicesLengthenWhileTheStoreHasPlenty(t *testing.T) {
	plenty := limiter.Limit{Count: 100_000, Period: time.Second, Burst: 100_000}
	slices := func(maxLives int64) (int64, tokenlease.Stats) {
		var n int64
		var st tokenlease.Stats
		synctest.Test(t, func(t *testing.T) {
			store := newCounting()
			l := newLeaser(t, store, tokenlease.Options{MaxLives: maxLives})
			r := limiter.Request{Key: "model", Limit: plenty, Hits: 1}
			// 1,000 takes a second for 2 s: 20 a Hold, busy.
			for i := range 2000 {
				if d := take(t, l, r); !d[0].Allowed {
					t.Fatalf("take %d denied", i)
				}
				time.Sleep(time.Millisecond)
				synctest.Wait()
			}
			st = l.Stats()
			n = store.takes.Load()
			if want := 9 + st.Slices; n != want {
				t.Errorf("MaxLives %d: %d store takes, want %d: the 9 before the bucket was busy and the slices", maxLives, n, want)
			}
		})
		return n, st
	}
	long, st := slices(tokenlease.DefaultMaxLives)
	short, stShort := slices(1)
	t.Logf("store takes in 2 s: %d with MaxLives %d (%+v), %d with 1 (%+v)", long, tokenlease.DefaultMaxLives, st, short, stShort)
	if long > 20 {
		t.Errorf("MaxLives %d: %d store takes in 2 s, want at most 20 (slices of up to 16 Holds)", tokenlease.DefaultMaxLives, long)
	}
	if short < 80 {
		t.Errorf("MaxLives 1: %d store takes in 2 s, want about one a Hold (100)", short)
	}
}

// gatedStore is a countingStore whose Takes naming the key gated wait
// until gate is closed.
type gatedStore struct {
	*countingStore
	gated string
	gate  chan struct{}
}

func (s *gatedStore) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	for _, r := range reqs {
		if r.Key == s.gated {
			<-s.gate
		}
	}
	return s.countingStore.Take(ctx, now, reqs)
}

// TestGiveBackOfATakeInFlightAtClose: a Take of a leased bucket and a
// denied one, still at the store when Close ends the slices, gives the
// leased token back to the store once it is denied: nothing is lost at
// shutdown.
func TestGiveBackOfATakeInFlightAtClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &gatedStore{countingStore: newCounting(), gated: "client", gate: make(chan struct{})}
		l := newLeaser(t, store, tokenlease.Options{}) // time stands still: no slice ends by time
		model := limiter.Request{Key: "model", Limit: hot, Hits: 1}
		for range 20 {
			take(t, l, model)
			synctest.Wait() // a refill lands
		}
		if l.Stats().Held == 0 {
			t.Fatalf("%+v: want a slice held", l.Stats())
		}
		tiny := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
		client := limiter.Request{Key: "client", Limit: tiny, Hits: 1}
		if d, err := store.countingStore.Take(context.Background(), time.Now(), []limiter.Request{client}); err != nil || !d[0].Allowed {
			t.Fatalf("emptying the client's bucket: %+v, %v", d, err)
		}
		var d []limiter.Decision
		var err error
		done := make(chan struct{})
		go func() {
			defer close(done)
			d, err = l.Take(context.Background(), time.Now(), []limiter.Request{model, client})
		}()
		synctest.Wait() // the model's token served from the slice, the client's at the store
		l.Close()
		close(store.gate)
		<-done
		if err != nil || d[1].Allowed {
			t.Fatalf("%+v, %v: want the client denied", d, err)
		}
		synctest.Wait()
		// Time stands still: the store's bucket is spent by exactly the 20
		// admitted.
		if got, want := remaining(t, store, "model", hot), int64(1000-20); got != want {
			t.Errorf("store bucket has %d left, want %d: the token of the denied Take lost at Close (%+v)", got, want, l.Stats())
		}
	})
}

// TestNoSliceAfterClose: Takes that come after Close go to the store
// alone: no slice is taken that nothing would give back.
func TestNoSliceAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newCounting()
		l := newLeaser(t, store, tokenlease.Options{})
		l.Close()
		r := limiter.Request{Key: "model", Limit: hot, Hits: 1}
		for i := range 20 {
			if d := take(t, l, r); !d[0].Allowed {
				t.Fatalf("take %d denied", i)
			}
			synctest.Wait()
		}
		if got, want := remaining(t, store, "model", hot), int64(1000-20); got != want {
			t.Errorf("store bucket has %d left, want %d: only the 20 admitted spent (%+v)", got, want, l.Stats())
		}
	})
}
