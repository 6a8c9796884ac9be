package limitertest

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

var (
	// tokensPerMinute is an LLM token budget: 1000 a minute, 5000 of debt.
	tokensPerMinute = limiter.Limit{Count: 1000, Period: time.Minute, Burst: 1000, MaxDebt: 5000}
	onePerSec       = limiter.Limit{Count: 1, Period: time.Second, Burst: 1}
)

func waitReq(key string, l limiter.Limit, hits int64, maxWait time.Duration) limiter.Request {
	return limiter.Request{Key: key, Limit: l, Hits: hits, MaxWait: maxWait}
}

func whereDenied(r limiter.Request) limiter.Request {
	r.Counting = limiter.CountWhereDenied
	return r
}

func waited(wait, reset time.Duration) limiter.Decision {
	return limiter.Decision{Allowed: true, Wait: wait, ResetAfter: reset}
}

// postpaidTimelines are the exact answers for post-paid charges and
// reservations.
var postpaidTimelines = []timeline{
	{"post-paid charges go into debt and deny until it is paid", []step{
		{at: 0, reqs: []limiter.Request{req("a", tokensPerMinute, 0)}, want: []limiter.Decision{Allowed(1000, 0)}},
		{at: 0, reqs: []limiter.Request{req("a", tokensPerMinute, 900)}, want: []limiter.Decision{Allowed(100, 54*time.Second)}},
		{at: 0, reqs: []limiter.Request{req("a", tokensPerMinute, 0)}, want: []limiter.Decision{Allowed(100, 54*time.Second)}},
		// Overdraws: recorded, and admitted since the bucket was not in debt.
		{at: 0, reqs: []limiter.Request{req("a", tokensPerMinute, 600)}, want: []limiter.Decision{Allowed(0, 90*time.Second)}},
		// 500 tokens of debt: 30 s to pay.
		{at: 0, reqs: []limiter.Request{req("a", tokensPerMinute, 0)}, want: []limiter.Decision{Denied(30*time.Second, 90*time.Second)}},
		// A charge in debt is denied and still recorded; it may retry when
		// the bucket is out of debt, its own 100 tokens included: 36 s.
		{at: 0, reqs: []limiter.Request{req("a", tokensPerMinute, 100)}, want: []limiter.Decision{Denied(36*time.Second, 96*time.Second)}},
		{at: 36*time.Second - time.Microsecond, reqs: []limiter.Request{req("a", tokensPerMinute, 0)}, want: []limiter.Decision{Denied(time.Microsecond, time.Minute+time.Microsecond)}},
		{at: 36 * time.Second, reqs: []limiter.Request{req("a", tokensPerMinute, 0)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		// The debt floor: 5000 below empty, 5 minutes of refill.
		{at: 36 * time.Second, reqs: []limiter.Request{req("a", tokensPerMinute, 100000)}, want: []limiter.Decision{Allowed(0, 6*time.Minute)}},
		{at: 36 * time.Second, reqs: []limiter.Request{req("a", tokensPerMinute, 1)}, want: []limiter.Decision{Denied(5*time.Minute, 6*time.Minute)}},
	}},
	{"a charge never makes a bucket deeper in debt than the floor fuller", []step{
		// A reservation of 10 s under a limit without overdraft...
		{at: 0, reqs: []limiter.Request{waitReq("c", limiter.Limit{Count: 1, Period: time.Second, Burst: 1}, 1, 0)}, want: []limiter.Decision{Allowed(0, time.Second)}},
		{at: 0, reqs: []limiter.Request{waitReq("c", limiter.Limit{Count: 1, Period: time.Second, Burst: 1}, 9, 0)}, want: []limiter.Decision{{ExceedsBurst: true, ResetAfter: time.Second}}},
		{at: 0, reqs: []limiter.Request{waitReq("c", limiter.Limit{Count: 1, Period: time.Second, Burst: 1}, 1, 20*time.Second)}, want: []limiter.Decision{waited(time.Second, 2*time.Second)}},
		{at: 0, reqs: []limiter.Request{waitReq("c", limiter.Limit{Count: 1, Period: time.Second, Burst: 1}, 1, 20*time.Second)}, want: []limiter.Decision{waited(2*time.Second, 3*time.Second)}},
		// ...then a post-paid limit with a floor of 2 s: the bucket owes 3 s,
		// deeper than the floor; the charge leaves it there, not at 2 s.
		{at: 0, reqs: []limiter.Request{req("c", limiter.Limit{Count: 1, Period: time.Second, Burst: 1, MaxDebt: 1}, 1)}, want: []limiter.Decision{Denied(2*time.Second, 3*time.Second)}},
		{at: 0, reqs: []limiter.Request{req("c", limiter.Limit{Count: 1, Period: time.Second, Burst: 1}, 0)}, want: []limiter.Decision{Denied(2*time.Second, 3*time.Second)}},
	}},
	{"a denied request still records its post-paid charges", []step{
		{at: 0, reqs: []limiter.Request{req("b", onePerMinute, 1)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", tokensPerMinute, 300), req("b", onePerMinute, 1)},
			want: []limiter.Decision{Allowed(700, 18*time.Second), Denied(time.Minute, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", tokensPerMinute, 0)}, want: []limiter.Decision{Allowed(700, 18*time.Second)}},
	}},
	{"with CountWhereDenied a denied Take records only the charges that were denied", []step{
		{at: 0, reqs: []limiter.Request{req("b", onePerMinute, 1)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		// a had room: its charge is not counted, as b denies the Take.
		{at: 0, reqs: []limiter.Request{whereDenied(req("a", tokensPerMinute, 300)), req("b", onePerMinute, 1)},
			want: []limiter.Decision{Allowed(1000, 0), Denied(time.Minute, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", tokensPerMinute, 0)}, want: []limiter.Decision{Allowed(1000, 0)}},
		// Alone, a charge that overdraws is counted (500 of debt)...
		{at: 0, reqs: []limiter.Request{whereDenied(req("a", tokensPerMinute, 1500))}, want: []limiter.Decision{Allowed(0, 90*time.Second)}},
		// ...and so is one its own bucket denies, whatever the others say.
		{at: 0, reqs: []limiter.Request{whereDenied(req("a", tokensPerMinute, 100)), req("b", onePerMinute, 1)},
			want: []limiter.Decision{Denied(36*time.Second, 96*time.Second), Denied(time.Minute, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", tokensPerMinute, 0)}, want: []limiter.Decision{Denied(36*time.Second, 96*time.Second)}},
	}},
	{"a shadow request's denial denies nothing", []step{
		{at: 0, reqs: []limiter.Request{{Key: "s", Limit: onePerMinute, Hits: 1, Shadow: true}}, want: []limiter.Decision{Allowed(0, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 1), {Key: "s", Limit: onePerMinute, Hits: 1, Shadow: true}},
			want: []limiter.Decision{Allowed(1, 30*time.Second), Denied(time.Minute, time.Minute)}},
		{at: 0, reqs: []limiter.Request{req("a", twoPerMinute, 1)}, want: []limiter.Decision{Allowed(0, time.Minute)}},
	}},
	{"reservations queue in arrival order", []step{
		{at: 0, reqs: []limiter.Request{waitReq("a", onePerSec, 1, 2*time.Second)}, want: []limiter.Decision{Allowed(0, time.Second)}},
		{at: 0, reqs: []limiter.Request{waitReq("a", onePerSec, 1, 2*time.Second)}, want: []limiter.Decision{waited(time.Second, 2*time.Second)}},
		{at: 0, reqs: []limiter.Request{waitReq("a", onePerSec, 1, 2*time.Second)}, want: []limiter.Decision{waited(2*time.Second, 3*time.Second)}},
		{at: 0, reqs: []limiter.Request{waitReq("a", onePerSec, 1, 2*time.Second)}, want: []limiter.Decision{Denied(3*time.Second, 3*time.Second)}},
		// Reserved tokens are debt: a check is denied until they are due.
		{at: 0, reqs: []limiter.Request{req("a", onePerSec, 0)}, want: []limiter.Decision{Denied(2*time.Second, 3*time.Second)}},
		{at: 1500 * time.Millisecond, reqs: []limiter.Request{waitReq("a", onePerSec, 1, 2*time.Second)},
			want: []limiter.Decision{waited(1500*time.Millisecond, 2500*time.Millisecond)}},
	}},
}

// RunPostpaidTests runs the conformance suite for post-paid charges
// (Limit.MaxDebt), reservations (Request.MaxWait) and refunds. The store
// must also implement limiter.Refunder.
func RunPostpaidTests(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	runTimelines(t, newStore, postpaidTimelines)
	t.Run("a refund moves the queue up and loses no token", func(t *testing.T) {
		store := newStore(t)
		refunder, ok := store.(limiter.Refunder)
		if !ok {
			t.Fatalf("%T does not implement limiter.Refunder", store)
		}
		key := t.Name()
		ctx := context.Background()
		take := func(at time.Duration, maxWait time.Duration) limiter.Decision {
			t.Helper()
			d, err := store.Take(ctx, T0.Add(at), []limiter.Request{waitReq(key, onePerSec, 1, maxWait)})
			if err != nil {
				t.Fatal(err)
			}
			return d[0]
		}
		take(0, 0)
		second := take(0, 2*time.Second)
		third := take(0, 2*time.Second)
		if second.Wait != time.Second || third.Wait != 2*time.Second {
			t.Fatalf("waits %v, %v; want 1s, 2s", second.Wait, third.Wait)
		}
		// The second waiter gives up: its token goes back.
		if err := refunder.Refund(ctx, T0, []limiter.Request{waitReq(key, onePerSec, 1, 0)}); err != nil {
			t.Fatal(err)
		}
		// The bucket now owes exactly the third's token (full again at 2s):
		// a new waiter is due at 2s, where it would have been due at 3s.
		if d := take(0, 2*time.Second); d.Wait != 2*time.Second {
			t.Errorf("after the refund a new waiter waits %v, want 2s", d.Wait)
		}
		// Refunds never make a bucket fuller than full.
		for range 5 {
			if err := refunder.Refund(ctx, T0.Add(10*time.Second), []limiter.Request{waitReq(key, onePerSec, 1, 0)}); err != nil {
				t.Fatal(err)
			}
		}
		if d := take(10*time.Second, 0); !d.Allowed || d.Remaining != 0 {
			t.Errorf("after refunds into a full bucket: %+v, want admitted with 0 left (burst 1)", d)
		}
		if d := take(10*time.Second, 0); d.Allowed {
			t.Errorf("a second take at once was admitted: refunds overfilled the bucket")
		}
	})
}

// A timeline is a named list of steps, played on a store of its own.
type timeline struct {
	name  string
	steps []step
}

// runTimelines plays each of tls on a new store, as subtests of
// "timelines".
func runTimelines(t *testing.T, newStore func(t *testing.T) limiter.Store, tls []timeline) {
	t.Run("timelines", func(t *testing.T) {
		for _, tl := range tls {
			t.Run(tl.name, func(t *testing.T) {
				runTimeline(t, newStore(t), tl.steps)
			})
		}
	})
}

// runTimeline plays steps against store, with keys prefixed by the test's
// name.
func runTimeline(t *testing.T, store limiter.Store, steps []step) {
	t.Helper()
	prefix := t.Name() + ":"
	for i, st := range steps {
		reqs := make([]limiter.Request, len(st.reqs))
		for j, r := range st.reqs {
			r.Key = prefix + r.Key
			reqs[j] = r
		}
		got, err := store.Take(context.Background(), T0.Add(st.at), reqs)
		if err != nil {
			t.Fatalf("step %d: Take(T0+%v, %v): %v", i, st.at, st.reqs, err)
		}
		if len(got) != len(st.want) {
			t.Fatalf("step %d: Take(T0+%v) gave %d decisions, want %d", i, st.at, len(got), len(st.want))
		}
		for j := range got {
			g, w := got[j], st.want[j]
			if st.allowedOnly {
				g, w = limiter.Decision{Allowed: g.Allowed}, limiter.Decision{Allowed: w.Allowed}
			}
			if g != w {
				t.Errorf("step %d: Take(T0+%v, %v)[%d] = %+v, want %+v", i, st.at, st.reqs[j], j, got[j], st.want[j])
			}
		}
	}
}
