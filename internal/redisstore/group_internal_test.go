package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestAlikeTakesMatchOneByOne is the property test of a group: m alike
// Takes of one request on one bucket, sent in one batch, travel as one
// group (take.lua's "*m") and are decided in one step; each caller's
// answer, and the state left, must be exactly what deciding them one
// after another gives (limiter.DecideAll, the reference model). Every kind
// of take is drawn: takes, checks, hits above burst, post-paid charges
// (counted always or where denied), reservations, Shadow requests, on
// buckets full, part spent (by whole tokens or not), in debt, and written
// under another rate.
func TestAlikeTakesMatchOneByOne(t *testing.T) {
	s, c := newCallerClockStore(t, "group:")
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(42, 7))
	t0 := time.Unix(1_800_000_000, 0)
	limits := []limiter.Limit{
		{Count: 10, Period: time.Second, Burst: 10},
		{Count: 3, Period: time.Second, Burst: 5},
		{Count: 7, Period: 1001 * time.Microsecond, Burst: 3},
		{Count: 1000, Period: time.Minute, Burst: 1000, MaxDebt: 500},
		{Count: 2, Period: time.Hour, Burst: 2, MaxDebt: 2},
		{Count: 999_983, Period: 7 * time.Second, Burst: 40, MaxDebt: 3},
		{Count: limiter.MaxTokens, Period: time.Second, Burst: limiter.MaxTokens},
	}
	kinds := map[string]int{}
	for trial := range 400 {
		key := fmt.Sprintf("k%d", trial)
		l := limits[rng.IntN(len(limits))]
		r := limiter.Request{Key: key, Limit: l, Hits: rng.Int64N(l.Burst + 2), Shadow: rng.IntN(5) == 0}
		if rng.IntN(3) == 0 {
			r.MaxWait = time.Duration(rng.Int64N(int64(l.FillTime()))) + time.Microsecond
		}
		if r.Charge() && rng.IntN(2) == 0 {
			r.Counting = limiter.CountWhereDenied
		}
		if r.Charge() {
			r.MaxWait = 0
		}
		now := t0.Add(time.Duration(trial) * time.Hour)
		// The bucket before: missing, or spent (or in debt) by up to its
		// depth, under its own rate or under another.
		var before limiter.State
		if rng.IntN(4) != 0 {
			under := l
			if rng.IntN(4) == 0 {
				under = limits[rng.IntN(len(limits))]
			}
			depth := under.FillTime() + under.TimeFor(under.MaxDebt)
			before = limiter.State{
				TAT: now.UnixMicro() + rng.Int64N(depth.Microseconds()+1), Frac: rng.Int64N(under.Count),
				Count: under.Count, PeriodUS: under.Period.Microseconds(),
			}
			if rng.IntN(3) == 0 {
				// spent by whole tokens: a take's "before + h ≤ bound"
				// then holds with equality at some count, the boundary
				// a closed form gets wrong first
				us, frac := under.Span(rng.Int64N(under.Burst + under.MaxDebt + 1))
				before.TAT, before.Frac = now.UnixMicro()+us, frac
			}
			v := fmt.Sprintf("%d:%d:%d:%d", before.TAT, before.Frac, before.Count, before.PeriodUS)
			if err := c.Set(ctx, s.Key(key), v, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		m := 2 + rng.IntN(30)
		reqs := []limiter.Request{r}
		calls := make([]*call, m)
		for j := range calls {
			sc := scriptCall{script: s.take, keys: []string{s.Key(key)}, args: s.takeArgs(now, reqs), merge: true, take: reqs, now: now, groupable: true}
			calls[j] = &call{ctx: ctx, done: make(chan struct{}), scriptCall: sc}
		}
		if es := envelopes(calls); len(es) != 1 || len(es[0].runs) != 1 || es[0].runs[0] != m {
			t.Fatalf("trial %d: %d alike Takes went as %d commands, runs %v; want one group", trial, m, len(es), es[0].runs)
		}
		s.server.batch.exec(calls)

		state := before
		for j, cl := range calls {
			<-cl.done
			want, next, _ := limiter.DecideAll(now, reqs, []limiter.State{state})
			got, err := decodeTakeCmd(cl.cmd, reqs, false)
			if err != nil || got.decisions[0] != want[0] {
				t.Fatalf("trial %d: %+v ×%d from %+v: Take %d = %+v, %v; one by one: %+v", trial, r, m, before, j+1, got.decisions, err, want[0])
			}
			state = next[0]
		}
		v, err := c.Get(ctx, s.Key(key)).Result()
		switch {
		case state == before && before == (limiter.State{}):
			if err == nil {
				t.Fatalf("trial %d: %+v ×%d left %q on a full bucket it did not spend", trial, r, m, v)
			}
		case state.Full(now):
			// written full, or deleted: both read as a full bucket
		case err == redis.Nil && state.TAT-now.UnixMicro() < 100_000:
			// full within 100 ms of now: with the caller's clock the key
			// expires that long after its write, by Redis's clock, which
			// a busy host's test may pass before it reads it
		default:
			if w := fmt.Sprintf("%d:%d:%d:%d", state.TAT, state.Frac, state.Count, state.PeriodUS); v != w {
				t.Fatalf("trial %d: %+v ×%d from %+v: bucket holds %q, %v; one by one leave %q", trial, r, m, before, v, err, w)
			}
		}
		kinds[takeSpec(r)[:1]]++
	}
	t.Logf("kinds of take drawn: %v", kinds)
	for _, k := range []string{"t", "k", "x", "c", "d", "T"} {
		if kinds[k] == 0 {
			t.Errorf("no take of kind %q drawn", k)
		}
	}
}
