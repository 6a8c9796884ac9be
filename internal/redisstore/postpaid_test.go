package redisstore_test

import (
	"context"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestExtremesMatchDecide walks buckets at the bounds a Limit and a Request
// may reach (a 100-year fill of 2^40 tokens, the longest MaxWait, the
// deepest debt) through reservations, charges and refunds, where the
// script's doubles would lose exactness if it formed tat − now + a burst:
// every answer and state is the Go model's, held by a MemoryStore.
func TestExtremesMatchDecide(t *testing.T) {
	c := standalone(t).Client()
	s := newStore(t, c, redisstore.CallerClock)
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{})
	ctx := context.Background()
	maxFill := limiter.MaxFill.Microseconds()
	// Count 1021: a 100-year fill whose sums past 2^53 would round (with
	// Count 1024 they happen to be even, and exact).
	slow := limiter.Limit{Count: 1021, Burst: limiter.MaxTokens}
	slow.Period = time.Duration(maxFill*slow.Count/slow.Burst) * time.Microsecond
	// The deepest debt that still fills within MaxFill: the same burst
	// with Count·Period shortened to fit.
	deep := limiter.Limit{Count: 1 << 9, Burst: 1 << 40, MaxDebt: 1 << 40}
	deep.Period = time.Duration(maxFill*deep.Count/(deep.Burst+deep.MaxDebt)) * time.Microsecond
	for _, l := range []limiter.Limit{slow, deep} {
		if err := l.Validate(); err != nil {
			t.Fatalf("%+v: %v", l, err)
		}
	}
	wait := func(key string, l limiter.Limit, hits int64) limiter.Request {
		return limiter.Request{Key: key, Limit: l, Hits: hits, MaxWait: limiter.MaxFill}
	}
	steps := []struct {
		at     time.Duration
		refund bool
		reqs   []limiter.Request
	}{
		{0, false, []limiter.Request{wait("slow", slow, slow.Burst)}},
		{0, false, []limiter.Request{wait("slow", slow, slow.Burst)}},     // reserved 100 years ahead
		{0, false, []limiter.Request{wait("slow", slow, slow.Burst)}},     // 200 years: denied
		{time.Hour, false, []limiter.Request{wait("slow", slow, 1)}},      // denied, RetryAfter ~ 100 years
		{time.Hour, false, []limiter.Request{{Key: "slow", Limit: slow}}}, // a check in debt
		{time.Hour, true, []limiter.Request{{Key: "slow", Limit: slow, Hits: 12345}}},
		{time.Hour, false, []limiter.Request{{Key: "slow", Limit: deep, Hits: limiter.MaxTokens}}}, // a charge past the floor moves the TAT to it
		{2 * time.Hour, false, []limiter.Request{{Key: "deep", Limit: deep, Hits: limiter.MaxTokens}}},
		{2 * time.Hour, false, []limiter.Request{{Key: "deep", Limit: deep, Hits: 1}, wait("slow", slow, 1)}},
		{3 * time.Hour, true, []limiter.Request{{Key: "deep", Limit: deep, Hits: deep.Burst}, {Key: "deep", Limit: deep, Hits: 1}}},
		{3 * time.Hour, false, []limiter.Request{{Key: "deep", Limit: deep}}},
		{4 * time.Hour, true, []limiter.Request{{Key: "deep", Limit: deep, Hits: limiter.MaxTokens}, {Key: "slow", Limit: slow, Hits: limiter.MaxTokens}}},
		{4 * time.Hour, false, []limiter.Request{wait("slow", slow, slow.Burst), {Key: "deep", Limit: deep, Hits: 7}}},
	}
	// The limit each key was last named with: a check under it reads the
	// state as it stands (under another it would rescale it, a write).
	named := map[string]limiter.Limit{"slow": slow, "deep": deep}
	for i, st := range steps {
		now := t0.Add(st.at)
		for _, r := range st.reqs {
			named[r.Key] = r.Limit
		}
		if st.refund {
			if err := s.Refund(ctx, now, st.reqs); err != nil {
				t.Fatalf("step %d: Refund: %v", i, err)
			}
			mem.Refund(ctx, now, st.reqs)
		} else {
			got, err := s.Take(ctx, now, st.reqs)
			if err != nil {
				t.Fatalf("step %d: Take: %v", i, err)
			}
			want, _ := mem.Take(ctx, now, st.reqs)
			if !slices.Equal(got, want) {
				t.Errorf("step %d: Take(T0+%v, %v) = %+v, want %+v", i, st.at, st.reqs, got, want)
			}
		}
		// The states: a check on what Redis holds answers as one on the
		// model's.
		for _, key := range []string{"slow", "deep"} {
			var st limiter.State
			if v, err := c.Get(ctx, s.Key(key)).Result(); err == nil {
				st = parseState(t, v)
			}
			probe := []limiter.Request{{Key: key, Limit: named[key]}}
			d, _, _ := limiter.DecideAll(now, probe, []limiter.State{st})
			got, _ := mem.Take(ctx, now, probe)
			if d[0] != got[0] {
				t.Errorf("step %d: %s holds %+v, which a check answers %+v; the model answers %+v", i, key, st, d[0], got[0])
			}
		}
	}
}

// TestClusterGiveBackKeepsCharges: a Take spanning two slots, denied in
// one, keeps the post-paid charge and gives back the take and the
// reservation made in the other, as DecideAll says.
func TestClusterGiveBackKeepsCharges(t *testing.T) {
	c, s, a, b := acrossSlots(t)
	tokens := limiter.Limit{Count: 1000, Period: time.Minute, Burst: 1000, MaxDebt: 5000}
	perSec := limiter.Limit{Count: 1, Period: time.Second, Burst: 1}
	onePerMin := limiter.Limit{Count: 1, Period: time.Minute, Burst: 1}
	us := t0.UnixMicro()

	take(t, s, t0, limiter.Request{Key: b, Limit: onePerMin, Hits: 1})        // b is empty
	take(t, s, t0, limiter.Request{Key: a + ":wait", Limit: perSec, Hits: 1}) // the next one waits
	reqs := []limiter.Request{
		{Key: a, Limit: tokens, Hits: 300},                                   // a charge: kept
		{Key: a, Limit: tokens, Hits: 0},                                     // a check after it
		{Key: a + ":wait", Limit: perSec, Hits: 1, MaxWait: 2 * time.Second}, // a reservation: given back
		{Key: b, Limit: onePerMin, Hits: 1},                                  // denied
	}
	stored := make([]limiter.State, len(reqs))
	for i, r := range reqs {
		stored[i], _ = getState(t, c, s.Key(r.Key))
	}
	if redisstore.Slot(s.Key(a)) == redisstore.Slot(s.Key(a+":wait")) {
		t.Logf("the charge and the reservation share a slot")
	}
	want, next, allowed := limiter.DecideAll(t0, reqs, stored)
	if allowed {
		t.Fatal("DecideAll admits the Take; the test wants it denied")
	}
	if got := take(t, s, t0, reqs...); !slices.Equal(got, want) {
		t.Errorf("Take = %+v, want %+v", got, want)
	}
	if st, _ := getState(t, c, s.Key(a)); st != next[0] || st != (limiter.State{TAT: us + 18e6, Count: tokens.Count, PeriodUS: tokens.Period.Microseconds()}) {
		t.Errorf("%s = %+v after the denied Take, want the charge kept: %+v", a, st, next[0])
	}
	if st, _ := getState(t, c, s.Key(a+":wait")); st != (limiter.State{TAT: us + 1e6, Count: perSec.Count, PeriodUS: perSec.Period.Microseconds()}) {
		t.Errorf("%s = %+v after the denied Take, want the reservation given back: TAT T0+1s", a+":wait", st)
	}
}

// TestWaitAcrossReplicas: two replicas (the server's clock) share a bucket
// of one token per 100ms in wait mode (max wait 300ms), hammered from
// goroutines for a second. The admitted timeline, each request counted at
// the time it was admitted plus its Wait, never exceeds rate·elapsed +
// burst over any stretch of it; and the bucket is kept busy.
func TestWaitAcrossReplicas(t *testing.T) {
	stores := replicas(t)
	l := limiter.Limit{Count: 1, Period: 100 * time.Millisecond, Burst: 1}
	const maxWait, run = 300 * time.Millisecond, time.Second
	// lo and hi bound when a request's tokens were due: the server decided
	// between the call and its answer.
	type admit struct{ lo, hi time.Time }
	var mu sync.Mutex
	var admitted []admit
	var takes int
	var wg sync.WaitGroup
	start := time.Now()
	for g := range 8 {
		wg.Go(func() {
			s := stores[g%2]
			for time.Since(start) < run {
				sent := time.Now()
				d, err := s.Take(context.Background(), time.Time{}, []limiter.Request{{Key: "shared", Limit: l, Hits: 1, MaxWait: maxWait}})
				got := time.Now()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				takes++
				if d[0].Allowed {
					if d[0].Wait > maxWait {
						t.Errorf("Wait %v, more than MaxWait %v", d[0].Wait, maxWait)
					}
					admitted = append(admitted, admit{sent.Add(d[0].Wait), got.Add(d[0].Wait)})
				}
				mu.Unlock()
				if !d[0].Allowed {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].lo.Before(admitted[j].lo) })
	rate := float64(l.Count) / l.Period.Seconds()
	// Any k admissions due within a stretch of length x: k ≤ burst + rate·x.
	// The stretch holding admissions i..j (in order of lo) is at most
	// max(hi) − lo_i.
	for i := range admitted {
		latest := admitted[i].hi
		for j := i; j < len(admitted); j++ {
			if admitted[j].hi.After(latest) {
				latest = admitted[j].hi
			}
			span := latest.Sub(admitted[i].lo)
			if k := j - i + 1; float64(k) > float64(l.Burst)+rate*span.Seconds() {
				t.Fatalf("admissions %d..%d (%d) are due within %v: more than burst %d + rate·elapsed", i, j, k, span, l.Burst)
			}
		}
	}
	// Over the run plus the longest wait, a busy bucket admits about
	// burst + rate·(run + maxWait); ask for most of it.
	if n, least := len(admitted), int(0.7*rate*(run+maxWait).Seconds()); n < least {
		t.Errorf("admitted %d in %v, want at least %d", n, run, least)
	}
	t.Logf("%d Takes from 2 replicas admitted %d in %v", takes, len(admitted), time.Since(start))
}
