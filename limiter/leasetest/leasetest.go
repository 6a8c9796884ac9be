// Package leasetest holds the conformance suite that every
// limiter.LeaseStore must pass, so that the in-memory and the Redis lease
// pools are held to one table of exact answers.
package leasetest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// T0 is the start of every timeline in the suite.
var T0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// op is what a step does.
type op int

const (
	acquire op = iota + 1
	release
	inFlight
)

// step is one call at T0+at on the timeline's pool (or on pool, when
// set). want is the LeaseDecision, LeaseRelease or PoolState it gives.
type step struct {
	at    time.Duration
	op    op
	pool  string
	id    string
	limit limiter.PoolLimit
	want  any
}

type timeline struct {
	name  string
	steps []step
}

var (
	eight = limiter.PoolLimit{MaxInFlight: 8, Lease: 10 * time.Second}
	two   = limiter.PoolLimit{MaxInFlight: 2, Lease: 10 * time.Second}
	one   = limiter.PoolLimit{MaxInFlight: 1, Lease: 10 * time.Second}
	four  = limiter.PoolLimit{MaxInFlight: 4, Lease: time.Minute}
	brief = limiter.PoolLimit{MaxInFlight: 8, Lease: time.Second}
)

func take(at time.Duration, id string, l limiter.PoolLimit, want limiter.LeaseDecision) step {
	return step{at: at, op: acquire, id: id, limit: l, want: want}
}

func give(at time.Duration, id string, want limiter.LeaseRelease) step {
	return step{at: at, op: release, id: id, want: want}
}

func read(at time.Duration, want limiter.PoolState) step {
	return step{at: at, op: inFlight, want: want}
}

func admitted(inFlight, remaining int64) limiter.LeaseDecision {
	return limiter.LeaseDecision{Allowed: true, InFlight: inFlight, Remaining: remaining}
}

func renewed(inFlight, remaining int64) limiter.LeaseDecision {
	return limiter.LeaseDecision{Allowed: true, Renewed: true, InFlight: inFlight, Remaining: remaining}
}

func full(inFlight int64, retry time.Duration) limiter.LeaseDecision {
	return limiter.LeaseDecision{InFlight: inFlight, RetryAfter: retry}
}

// eightThenFull takes r0…r7 one second apart, then finds the pool full.
func eightThenFull() []step {
	var steps []step
	for i := range 8 {
		steps = append(steps, take(time.Duration(i)*time.Second, fmt.Sprint("r", i), eight, admitted(int64(i+1), int64(7-i))))
	}
	return steps
}

// timelines are the exact answers every LeaseStore gives.
var timelines = []timeline{
	{"eight taken, the ninth full; release one, the ninth admitted", append(eightThenFull(),
		// r0, taken at 0, expires at 10s: the earliest.
		take(8*time.Second, "r8", eight, full(8, 2*time.Second)),
		give(8*time.Second, "r3", limiter.LeaseRelease{Released: true, InFlight: 7}),
		take(8*time.Second, "r8", eight, admitted(8, 0)),
		take(9*time.Second, "r9", eight, full(8, time.Second)),
		read(9*time.Second, limiter.PoolState{InFlight: 8, NextExpiry: time.Second}),
	)},
	{"release unknown or twice changes nothing", []step{
		give(0, "a", limiter.LeaseRelease{}), // a pool never seen
		take(0, "a", two, admitted(1, 1)),
		take(0, "b", two, admitted(2, 0)),
		give(time.Second, "unknown", limiter.LeaseRelease{InFlight: 2}),
		take(time.Second, "c", two, full(2, 9*time.Second)),
		give(time.Second, "a", limiter.LeaseRelease{Released: true, InFlight: 1}),
		give(time.Second, "a", limiter.LeaseRelease{InFlight: 1}),
		take(time.Second, "c", two, admitted(2, 0)),
		take(time.Second, "d", two, full(2, 9*time.Second)),
		give(2*time.Second, "b", limiter.LeaseRelease{Released: true, InFlight: 1}),
		give(2*time.Second, "c", limiter.LeaseRelease{Released: true, InFlight: 0}),
		give(2*time.Second, "c", limiter.LeaseRelease{}),
		read(2*time.Second, limiter.PoolState{}),
	}},
	{"the same id twice holds one slot and renews it", []step{
		take(0, "a", two, admitted(1, 1)),
		take(time.Second, "a", two, renewed(1, 1)), // a now expires at 11s
		take(2*time.Second, "b", two, admitted(2, 0)),
		take(3*time.Second, "c", two, full(2, 8*time.Second)),
		// A renewal is admitted in a full pool: it takes no new slot.
		take(4*time.Second, "a", two, renewed(2, 0)), // a now expires at 14s
		take(5*time.Second, "c", two, full(2, 7*time.Second)),
		// b expires at 12s; a, renewed, does not.
		take(12*time.Second, "c", two, limiter.LeaseDecision{Allowed: true, InFlight: 2, Expired: 1}),
		read(13*time.Second, limiter.PoolState{InFlight: 2, NextExpiry: time.Second}),
	}},
	{"a lease expires exactly at its duration", []step{
		take(0, "a", one, admitted(1, 0)),
		take(10*time.Second-time.Microsecond, "b", one, full(1, time.Microsecond)),
		read(10*time.Second-time.Microsecond, limiter.PoolState{InFlight: 1, NextExpiry: time.Microsecond}),
		take(10*time.Second, "b", one, limiter.LeaseDecision{Allowed: true, InFlight: 1, Expired: 1}),
		// A late release of the expired lease frees nothing: b keeps its slot.
		give(11*time.Second, "a", limiter.LeaseRelease{InFlight: 1}),
		take(11*time.Second, "c", one, full(1, 9*time.Second)),
	}},
	{"a release after expiry is counted as expired, not released", []step{
		take(0, "a", one, admitted(1, 0)),
		give(10*time.Second, "a", limiter.LeaseRelease{Expired: 1}),
		take(10*time.Second, "a", one, admitted(1, 0)),
	}},
	{"expired leases are counted once", []step{
		take(0, "a", brief, admitted(1, 7)),
		take(0, "b", brief, admitted(2, 6)),
		take(500*time.Millisecond, "c", brief, admitted(3, 5)),
		read(time.Second, limiter.PoolState{InFlight: 1, NextExpiry: 500 * time.Millisecond, Expired: 2}),
		read(2*time.Second, limiter.PoolState{Expired: 1}),
		read(3*time.Second, limiter.PoolState{}),
		take(3*time.Second, "a", brief, admitted(1, 7)),
	}},
	{"a smaller max_in_flight applies to the leases held", []step{
		take(0, "a", four, admitted(1, 3)),
		take(0, "b", four, admitted(2, 2)),
		take(0, "c", four, admitted(3, 1)),
		take(time.Second, "d", two, full(3, 59*time.Second)),
		take(time.Second, "a", two, renewed(3, 0)),
		give(time.Second, "a", limiter.LeaseRelease{Released: true, InFlight: 2}),
		take(time.Second, "d", two, full(2, 59*time.Second)),
		give(time.Second, "b", limiter.LeaseRelease{Released: true, InFlight: 1}),
		take(time.Second, "d", two, admitted(2, 0)),
	}},
	{"pools are separate", []step{
		take(0, "a", one, admitted(1, 0)),
		{at: 0, op: acquire, pool: "other", id: "a", limit: one, want: admitted(1, 0)},
		take(0, "b", one, full(1, 10*time.Second)),
		{at: 0, op: release, pool: "other", id: "a", want: limiter.LeaseRelease{Released: true}},
		take(0, "b", one, full(1, 10*time.Second)),
		give(0, "a", limiter.LeaseRelease{Released: true}),
		take(0, "b", one, admitted(1, 0)),
	}},
}

// Run runs the conformance suite against stores made by newStore. Each
// store must decide at the now it is given (a Redis store in its
// CallerClock mode), and may be shared by subtests: pools are named after
// the test.
func Run(t *testing.T, newStore func(t *testing.T) limiter.LeaseStore) {
	for _, tl := range timelines {
		t.Run(tl.name, func(t *testing.T) {
			store := newStore(t)
			for i, s := range tl.steps {
				pool := t.Name() + "/" + s.pool
				now := T0.Add(s.at)
				var got any
				var err error
				var call string
				switch s.op {
				case acquire:
					r := limiter.LeaseRequest{Pool: pool, ID: s.id, Limit: s.limit}
					call = fmt.Sprintf("Acquire(T0+%v, %q, %v)", s.at, s.id, s.limit)
					got, err = store.Acquire(context.Background(), now, r)
				case release:
					call = fmt.Sprintf("Release(T0+%v, %q)", s.at, s.id)
					got, err = store.Release(context.Background(), now, pool, s.id)
				case inFlight:
					call = fmt.Sprintf("InFlight(T0+%v)", s.at)
					got, err = store.InFlight(context.Background(), now, pool)
				}
				if err != nil {
					t.Fatalf("step %d: %s: %v", i, call, err)
				}
				if got != s.want {
					t.Errorf("step %d: %s = %+v, want %+v", i, call, got, s.want)
				}
			}
		})
	}

	t.Run("invalid arguments", func(t *testing.T) {
		store := newStore(t)
		pool := t.Name()
		bad := []limiter.LeaseRequest{
			{Pool: pool, ID: "", Limit: eight},
			{Pool: pool, ID: string(make([]byte, limiter.MaxLeaseID+1)), Limit: eight},
			{Pool: pool, ID: "a", Limit: limiter.PoolLimit{}},
			{Pool: pool, ID: "a", Limit: limiter.PoolLimit{MaxInFlight: 0, Lease: time.Second}},
			{Pool: pool, ID: "a", Limit: limiter.PoolLimit{MaxInFlight: -1, Lease: time.Second}},
			{Pool: pool, ID: "a", Limit: limiter.PoolLimit{MaxInFlight: limiter.MaxPoolSize + 1, Lease: time.Second}},
			{Pool: pool, ID: "a", Limit: limiter.PoolLimit{MaxInFlight: 1, Lease: limiter.MinLease - 1}},
			{Pool: pool, ID: "a", Limit: limiter.PoolLimit{MaxInFlight: 1, Lease: limiter.MaxLease + 1}},
			{Pool: pool, ID: "a", Limit: eight, MaxWait: -1},
		}
		for _, r := range bad {
			if _, err := store.Acquire(context.Background(), T0, r); !errors.Is(err, limiter.ErrInvalidRequest) {
				t.Errorf("Acquire(%+v) error = %v, want ErrInvalidRequest", r.Limit, err)
			}
		}
		if _, err := store.Release(context.Background(), T0, pool, ""); !errors.Is(err, limiter.ErrInvalidRequest) {
			t.Errorf("Release(empty id) error = %v, want ErrInvalidRequest", err)
		}
		if st, err := store.InFlight(context.Background(), T0, pool); err != nil || st != (limiter.PoolState{}) {
			t.Errorf("InFlight after refused Acquires = %+v, %v; want an empty pool", st, err)
		}
	})

	t.Run("a long lease id and any bytes", func(t *testing.T) {
		store := newStore(t)
		pool := t.Name() + "\x00{}:\xff"
		ids := []string{string(make([]byte, limiter.MaxLeaseID)), "\x00", "a b{c}", "é"}
		for i, id := range ids {
			d, err := store.Acquire(context.Background(), T0, limiter.LeaseRequest{Pool: pool, ID: id, Limit: eight})
			if want := admitted(int64(i+1), int64(7-i)); err != nil || d != want {
				t.Errorf("Acquire(%q) = %+v, %v; want %+v", id, d, err, want)
			}
		}
		for i, id := range ids {
			r, err := store.Release(context.Background(), T0, pool, id)
			if want := (limiter.LeaseRelease{Released: true, InFlight: int64(len(ids) - 1 - i)}); err != nil || r != want {
				t.Errorf("Release(%q) = %+v, %v; want %+v", id, r, err, want)
			}
		}
	})
}

// HammerOptions configures Hammer.
type HammerOptions struct {
	// Stores are the stores the goroutines share out, round robin: for a
	// Redis store, several clients with their own connections, as several
	// replicas. At least one.
	Stores []limiter.LeaseStore
	// Now is the time each call passes (the stores may ignore it).
	Now func() time.Time
	// Held, when set, reads the number of leases the pool holds from the
	// backend itself (Redis ZCARD), as often as it can while the
	// goroutines run; every reading must be at most MaxInFlight.
	Held func(pool string) (int64, error)
	// Goroutines and Rounds bound the load: each goroutine acquires and
	// releases Rounds times. Defaults 32 and 50.
	Goroutines, Rounds int
}

// Hammer has many goroutines acquire and release leases in one pool of 8,
// each holding its lease for a moment (one Gosched) before releasing it.
// It checks that no Acquire admits a ninth holder (a count of holders kept
// beside the store), that the backend's own count (opts.Held) never
// exceeds 8, that every admitted lease is released, and that the pool ends
// empty. It returns the number of admissions.
func Hammer(t *testing.T, pool string, opts HammerOptions) int64 {
	t.Helper()
	if opts.Goroutines == 0 {
		opts.Goroutines = 32
	}
	if opts.Rounds == 0 {
		opts.Rounds = 50
	}
	limit := limiter.PoolLimit{MaxInFlight: 8, Lease: time.Minute}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var holders, most, admissions atomic.Int64
	var samples, sampleMax atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	errs := make(chan error, opts.Goroutines+1)
	if opts.Held != nil {
		sampler.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, err := opts.Held(pool)
				if err != nil {
					errs <- fmt.Errorf("held: %w", err)
					return
				}
				samples.Add(1)
				if n > sampleMax.Load() {
					sampleMax.Store(n)
				}
			}
		})
	}
	var wg sync.WaitGroup
	for g := range opts.Goroutines {
		store := opts.Stores[g%len(opts.Stores)]
		wg.Go(func() {
			for i := range opts.Rounds {
				id := fmt.Sprintf("g%d-%d", g, i)
				d, err := store.Acquire(ctx, opts.Now(), limiter.LeaseRequest{Pool: pool, ID: id, Limit: limit})
				if err != nil {
					errs <- fmt.Errorf("Acquire(%q): %w", id, err)
					return
				}
				if !d.Allowed {
					continue
				}
				admissions.Add(1)
				if n := holders.Add(1); n > most.Load() {
					most.Store(n) // racy max, but n > 8 is kept by some goroutine
					if n > limit.MaxInFlight {
						errs <- fmt.Errorf("Acquire(%q) admitted holder %d of at most %d", id, n, limit.MaxInFlight)
					}
				}
				runtime.Gosched()
				holders.Add(-1)
				r, err := store.Release(ctx, opts.Now(), pool, id)
				if err != nil {
					errs <- fmt.Errorf("Release(%q): %w", id, err)
					return
				}
				if !r.Released {
					errs <- fmt.Errorf("Release(%q) = %+v: an admitted lease was not held", id, r)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m := sampleMax.Load(); m > limit.MaxInFlight {
		t.Errorf("the backend held %d leases at once, more than %d", m, limit.MaxInFlight)
	}
	if opts.Held != nil && samples.Load() == 0 {
		t.Error("the backend's count was never read")
	}
	st, err := opts.Stores[0].InFlight(context.Background(), opts.Now(), pool)
	if err != nil || st.InFlight != 0 {
		t.Errorf("InFlight after the hammer = %+v, %v; want an empty pool", st, err)
	}
	if admissions.Load() < int64(limit.MaxInFlight) {
		t.Errorf("%d admissions of %d attempts: want at least %d", admissions.Load(), opts.Goroutines*opts.Rounds, limit.MaxInFlight)
	}
	t.Logf("%d of %d acquisitions admitted; most holders at once %d; backend read %d times, at most %d held",
		admissions.Load(), opts.Goroutines*opts.Rounds, most.Load(), samples.Load(), sampleMax.Load())
	return admissions.Load()
}
