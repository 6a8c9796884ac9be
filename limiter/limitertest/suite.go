// Package limitertest holds the conformance suite that every limiter.Store
// must pass, so that the in-memory and the Redis stores are held to the same
// table of exact answers.
package limitertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// T0 is the start of every timeline in the suite.
var T0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// step is one call in a timeline: Take(T0+at, reqs) should give want.
type step struct {
	at   time.Duration
	reqs []limiter.Request
	want []limiter.Decision
	// allowedOnly compares only Decision.Allowed (for answers that depend on
	// how a store treats a clock going backwards).
	allowedOnly bool
}

func req(key string, l limiter.Limit, hits int64) limiter.Request {
	return limiter.Request{Key: key, Limit: l, Hits: hits}
}

// Allowed is the Decision of an admitted request that left remaining
// tokens and a bucket full again after reset.
func Allowed(remaining int64, reset time.Duration) limiter.Decision {
	return limiter.Decision{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

// Denied is the Decision of a denied request that would be admitted after
// retry, its bucket full again after reset.
func Denied(retry, reset time.Duration) limiter.Decision {
	return limiter.Decision{RetryAfter: retry, ResetAfter: reset}
}

var (
	fivePerMinute = limiter.Limit{Count: 5, Period: time.Minute, Burst: 5}
	threePerSec   = limiter.Limit{Count: 3, Period: time.Second, Burst: 3}
	onePerHour    = limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
	twoPerHour    = limiter.Limit{Count: 2, Period: time.Hour, Burst: 2}
	fourPerHour   = limiter.Limit{Count: 4, Period: time.Hour, Burst: 4}
	tenPerSecB20  = limiter.Limit{Count: 10, Period: time.Second, Burst: 20}
	twoPerMinute  = limiter.Limit{Count: 2, Period: time.Minute, Burst: 2}
	onePerMinute  = limiter.Limit{Count: 1, Period: time.Minute, Burst: 1}
	tenPerMinute  = limiter.Limit{Count: 10, Period: time.Minute, Burst: 10}
	onePerSecB2   = limiter.Limit{Count: 1, Period: time.Second, Burst: 2}
)

const third = 333334 * time.Microsecond // 1/3 s rounded up

// timelines are the exact answers every store gives. Keys are "a", "b":
// RunStoreTests prefixes them with the test's name.
var timelines = []timeline{
	{"five per minute counts down then denies", []step{
		{at: 0, reqs: []limiter.Request{req("a", fivePerMinute, 1)}, want: []limiter.Decision{Allowed(4, 12*time.Second)}},
		{at: 0, reqs: []limiter.Request{req("a", fivePerMinute, 1)}, want: []limiter.Decision{Allowed(3, 24*time.Second)}},
		{at: 0, reqs: []limiter.Request{req("a", fivePerMinute, 1)}, want: []limiter.Decision{Allowed(2, 36*time.Second)}},
		{at: 0, reqs: []limiter.Request{req("a", fivePerMinute, 1)}, want: []limiter.Decision{Allowed(1, 48*time.Second)}},
		{at: 0, reqs: []limiter.Request{req("a", fivePerMinute, 1)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", fivePerMinute, 1)}, want: []limiter.Decision{Denied(12*time.Second, time.Minute)}},
		{at: 11 * time.Second, reqs: []limiter.Request{req("a", fivePerMinute, 1)}, want: []limiter.Decision{Denied(time.Second, 49*time.Second)}},
		{at: 12 * time.Second, reqs: []limiter.Request{req("a", fivePerMinute, 1)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		{at: 72 * time.Second, reqs: []limiter.Request{req("a", fivePerMinute, 0)}, want: []limiter.Decision{Allowed(5, 0)}},
	}},
	{"three per second is exact", []step{
		{at: 0, reqs: []limiter.Request{req("a", threePerSec, 1)}, want: []limiter.Decision{Allowed(2, third)}},
		{at: 0, reqs: []limiter.Request{req("a", threePerSec, 1)}, want: []limiter.Decision{Allowed(1, 666667*time.Microsecond)}},
		{at: 0, reqs: []limiter.Request{req("a", threePerSec, 1)}, want: []limiter.Decision{Allowed(0, time.Second)}},
		{at: 0, reqs: []limiter.Request{req("a", threePerSec, 1)}, want: []limiter.Decision{Denied(third, time.Second)}},
		{at: 333333 * time.Microsecond, reqs: []limiter.Request{req("a", threePerSec, 1)}, want: []limiter.Decision{Denied(time.Microsecond, 666667*time.Microsecond)}},
		{at: third, reqs: []limiter.Request{req("a", threePerSec, 1)}, want: []limiter.Decision{Allowed(0, time.Second)}},
		// Three seconds of refill after that are exactly three tokens.
		{at: third + 3*time.Second, reqs: []limiter.Request{req("a", threePerSec, 3)}, want: []limiter.Decision{Allowed(0, time.Second)}},
	}},
	{"one per hour refills one token per hour", []step{
		{at: 0, reqs: []limiter.Request{req("a", onePerHour, 1)}, want: []limiter.Decision{Allowed(0, time.Hour)}},
		{at: 59*time.Minute + 59*time.Second, reqs: []limiter.Request{req("a", onePerHour, 1)}, want: []limiter.Decision{Denied(time.Second, time.Second)}},
		{at: time.Hour, reqs: []limiter.Request{req("a", onePerHour, 1)}, want: []limiter.Decision{Allowed(0, time.Hour)}},
	}},
	{"burst above the rate, refill capped at burst", []step{
		{at: 0, reqs: []limiter.Request{req("a", tenPerSecB20, 20)}, want: []limiter.Decision{Allowed(0, 2*time.Second)}},
		{at: 0, reqs: []limiter.Request{req("a", tenPerSecB20, 1)}, want: []limiter.Decision{Denied(100*time.Millisecond, 2*time.Second)}},
		{at: 500 * time.Millisecond, reqs: []limiter.Request{req("a", tenPerSecB20, 5)}, want: []limiter.Decision{Allowed(0, 2*time.Second)}},
		{at: time.Minute, reqs: []limiter.Request{req("b", onePerSecB2, 2)}, want: []limiter.Decision{Allowed(0, 2*time.Second)}},
		{at: time.Minute + 10*time.Second, reqs: []limiter.Request{req("b", onePerSecB2, 2)}, want: []limiter.Decision{Allowed(0, 2*time.Second)}},
		{at: time.Minute + 10*time.Second, reqs: []limiter.Request{req("b", onePerSecB2, 1)}, want: []limiter.Decision{Denied(time.Second, 2*time.Second)}},
	}},
	{"hits above burst can never pass", []step{
		{at: 0, reqs: []limiter.Request{req("a", fivePerMinute, 6)}, want: []limiter.Decision{{ExceedsBurst: true}}},
		{at: 0, reqs: []limiter.Request{req("a", fivePerMinute, 5)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", fivePerMinute, 6)}, want: []limiter.Decision{{ExceedsBurst: true, ResetAfter: time.Minute}}},
	}},
	{"a check spends nothing", []step{
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 0)}, want: []limiter.Decision{Allowed(2, 0)}},
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 0)}, want: []limiter.Decision{Allowed(2, 0)}},
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 2)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 0)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
	}},
	{"a denied request spends from no bucket", []step{
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 1), req("b", onePerMinute, 1)},
			want: []limiter.Decision{Allowed(1, 30*time.Second), Allowed(0, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 1), req("b", onePerMinute, 1)},
			want: []limiter.Decision{Allowed(1, 30*time.Second), Denied(time.Minute, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 1)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
	}},
	{"one key twice in a request", []step{
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 1), req("a", twoPerMinute, 1)},
			want: []limiter.Decision{Allowed(1, 30*time.Second), Allowed(0, time.Minute)}},
		{at: 30 * time.Second, reqs: []limiter.Request{req("a", twoPerMinute, 1), req("a", twoPerMinute, 1)},
			want: []limiter.Decision{Allowed(1, 30*time.Second), Denied(30*time.Second, time.Minute)}},
		{at: 30 * time.Second, reqs: []limiter.Request{req("a", twoPerMinute, 1)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
	}},
	// A bucket keeps the tokens it has spent across a change of its
	// limit, now spent at the new rate: raising a limit frees at once what
	// the raise adds, as a counter of hits would (envoyproxy/ratelimit's),
	// and lowering it keeps what was spent.
	{"a changed limit applies to the existing bucket", []step{
		{at: 0, reqs: []limiter.Request{req("a", fivePerMinute, 5)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		// 5 spent of 10: 5 left, after this one 4 (each 6 s at 10/min).
		{at: 0, reqs: []limiter.Request{req("a", tenPerMinute, 1)}, want: []limiter.Decision{Allowed(4, 36*time.Second)}},
		{at: 6 * time.Second, reqs: []limiter.Request{req("a", tenPerMinute, 1)}, want: []limiter.Decision{Allowed(4, 36*time.Second)}},
		// 30 s of 10/min left to refill: 5 tokens, all of 5/min's burst.
		{at: 12 * time.Second, reqs: []limiter.Request{req("a", fivePerMinute, 1)}, want: []limiter.Decision{Denied(12*time.Second, time.Minute)}},
	}},
	{"a raised limit frees a throttled client at once", []step{
		{at: 0, reqs: []limiter.Request{req("a", twoPerHour, 2)}, want: []limiter.Decision{Allowed(0, time.Hour)}},
		{at: time.Minute, reqs: []limiter.Request{req("a", twoPerHour, 1)}, want: []limiter.Decision{Denied(29*time.Minute, 59*time.Minute)}},
		// 2 per hour → 4 per hour: the 59 min owed at 2 an hour are 1.97
		// tokens, 29.5 min at 4 an hour: 2 of the 4 are free.
		{at: time.Minute, reqs: []limiter.Request{req("a", fourPerHour, 2)}, want: []limiter.Decision{Allowed(0, 59*time.Minute+30*time.Second)}},
		{at: time.Minute, reqs: []limiter.Request{req("a", fourPerHour, 1)}, want: []limiter.Decision{Denied(14*time.Minute+30*time.Second, 59*time.Minute+30*time.Second)}},
	}},
	{"a lowered limit never empties a bucket below its floor", []step{
		{at: 0, reqs: []limiter.Request{req("a", tenPerMinute, 10)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		// 10 spent, at most 2 of them at 2/min: empty, full in a minute.
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 1)}, want: []limiter.Decision{Denied(30*time.Second, time.Minute)}},
		{at: 30 * time.Second, reqs: []limiter.Request{req("a", twoPerMinute, 1)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
	}},
	{"a clock that steps back never unlocks a bucket", []step{
		{at: time.Minute, reqs: []limiter.Request{req("a", onePerMinute, 1)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		{at: 30 * time.Second, reqs: []limiter.Request{req("a", onePerMinute, 1)}, want: []limiter.Decision{{}}, allowedOnly: true},
		{at: 2 * time.Minute, reqs: []limiter.Request{req("a", onePerMinute, 1)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
	}},
}

// RunStoreTests runs the conformance suite against stores made by newStore.
// Each store must decide with the now passed to Take (a Redis store in its
// test mode), and may be shared by subtests: keys are prefixed with the
// test's name.
func RunStoreTests(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	runTimelines(t, newStore, timelines)

	t.Run("invalid requests", func(t *testing.T) {
		store := newStore(t)
		bad := []limiter.Request{
			{Key: t.Name(), Limit: fivePerMinute, Hits: -1},
			{Key: t.Name(), Limit: fivePerMinute, Hits: limiter.MaxTokens + 1},
			{Key: t.Name(), Limit: limiter.Limit{}, Hits: 1},
			{Key: t.Name(), Limit: limiter.Limit{Count: 1, Period: time.Second, Burst: 0}, Hits: 1},
			{Key: t.Name(), Limit: limiter.Limit{Count: 1, Period: time.Second, Burst: 1, MaxDebt: -1}, Hits: 1},
			// A debt of 2^20 tokens at one an hour takes longer than MaxFill to repay.
			{Key: t.Name(), Limit: limiter.Limit{Count: 1, Period: time.Hour, Burst: 1, MaxDebt: 1 << 20}, Hits: 1},
			// Burst·Period (and (Burst+MaxDebt)·Period) wrap int64 to a
			// span under MaxFill: a store must refuse them, not admit
			// from a wrapped fill time.
			{Key: t.Name(), Limit: limiter.Limit{Count: 1, Period: 24 * time.Hour, Burst: 1_000_000_000_000}, Hits: 110_000_000},
			{Key: t.Name(), Limit: limiter.Limit{Count: 1, Period: 24 * time.Hour, Burst: 1, MaxDebt: 1_000_000_000_000}, Hits: 1},
			{Key: t.Name(), Limit: fivePerMinute, Hits: 1, MaxWait: -1},
			{Key: t.Name(), Limit: fivePerMinute, Hits: 1, MaxWait: limiter.MaxFill + time.Microsecond},
		}
		for _, r := range bad {
			_, err := store.Take(context.Background(), T0, []limiter.Request{r})
			if !errors.Is(err, limiter.ErrInvalidRequest) {
				t.Errorf("Take(%+v) error = %v, want ErrInvalidRequest", r, err)
			}
		}
		// One invalid request fails the whole Take before anything is taken.
		good := limiter.Request{Key: t.Name() + "/good", Limit: fivePerMinute, Hits: 1}
		if _, err := store.Take(context.Background(), T0, []limiter.Request{good, bad[0]}); !errors.Is(err, limiter.ErrInvalidRequest) {
			t.Errorf("Take(valid, invalid) error = %v, want ErrInvalidRequest", err)
		}
		d, err := store.Take(context.Background(), T0, []limiter.Request{{Key: good.Key, Limit: fivePerMinute}})
		if err != nil || d[0].Remaining != 5 {
			t.Errorf("after a refused Take, its valid bucket = %+v, %v; want untouched (5 left)", d, err)
		}
	})

	t.Run("many goroutines on one key admit exactly the burst", func(t *testing.T) {
		store := newStore(t)
		// So slow a refill that a real clock adds nothing during the test.
		l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 50}
		key := t.Name()
		var admitted atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					reqs := []limiter.Request{{Key: key, Limit: l, Hits: 1}}
					if i%2 == 1 { // also race multi-key, all-or-nothing requests
						reqs = append(reqs, limiter.Request{Key: fmt.Sprintf("%s:other%d", key, g), Limit: fivePerMinute, Hits: 0})
					}
					d, err := store.Take(context.Background(), T0, reqs)
					if err != nil {
						errs <- err
						return
					}
					if d[0].Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("Take: %v", err)
		}
		if got := admitted.Load(); got != l.Burst {
			t.Errorf("16×25 concurrent takes admitted %d, want exactly %d", got, l.Burst)
		}
	})
}
