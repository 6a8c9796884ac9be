package limiter_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestSpan: the time of n tokens, exact to the fraction of a microsecond.
func TestSpan(t *testing.T) {
	tests := []struct {
		limit    limiter.Limit
		n        int64
		us, frac int64
	}{
		{limiter.Limit{Count: 3, Period: time.Second, Burst: 3}, 1, 333333, 1},
		{limiter.Limit{Count: 3, Period: time.Second, Burst: 3}, 3, 1_000_000, 0},
		{limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}, 1, 3_600_000_000, 0},
		{limiter.Limit{Count: 7, Period: time.Microsecond, Burst: 7}, 5, 0, 5},
		{limiter.Limit{Count: 10, Period: time.Second, Burst: 10}, 0, 0, 0},
	}
	for _, tt := range tests {
		if us, frac := tt.limit.Span(tt.n); us != tt.us || frac != tt.frac {
			t.Errorf("%+v.Span(%d) = %d µs + %d/%d, want %d µs + %d/%d",
				tt.limit, tt.n, us, frac, tt.limit.Count, tt.us, tt.frac, tt.limit.Count)
		}
	}
}

// TestDecideDenied: what DecideAll answers for a denied Take is
// DecideDenied's, given the first pass's decisions; and for an admitted
// Take, DecideDenied says what a denial would have answered and left: the
// charge kept, the others reporting a check, the denied one its denial.
func TestDecideDenied(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	perHour := limiter.Limit{Count: 1, Period: time.Hour, Burst: 2}
	debt := limiter.Limit{Count: 1, Period: time.Hour, Burst: 2, MaxDebt: 5}
	reqs := []limiter.Request{
		{Key: "a", Limit: perHour, Hits: 1},
		{Key: "c", Limit: debt, Hits: 3}, // a post-paid charge
		{Key: "a", Limit: perHour, Hits: 1},
	}
	stored := make([]limiter.State, len(reqs))
	decisions, next, allowed := limiter.DecideAll(now, reqs, stored)
	if !allowed {
		t.Fatalf("DecideAll = %+v, want admitted", decisions)
	}
	denied, deniedNext := limiter.DecideDenied(now, reqs, stored, decisions)
	check := func(r limiter.Request, s limiter.State) limiter.Decision {
		r.Hits = 0
		_, d := limiter.Decide(r, s, now)
		return d
	}
	charged, chargeDecision := limiter.Decide(reqs[1], stored[1], now)
	wantDecisions := []limiter.Decision{check(reqs[0], stored[0]), chargeDecision, check(reqs[2], stored[2])}
	wantNext := []limiter.State{stored[0], charged, stored[2]}
	for i := range reqs {
		if denied[i] != wantDecisions[i] || deniedNext[i] != wantNext[i] {
			t.Errorf("DecideDenied[%d] = %+v, %+v; want %+v, %+v", i, denied[i], deniedNext[i], wantDecisions[i], wantNext[i])
		}
	}
	if next[2] == deniedNext[2] {
		t.Errorf("admitted and denied states of a agree (%+v): the test shows nothing", next[2])
	}

	// A third token on a: DecideAll denies, and answers as DecideDenied does.
	reqs = append(reqs, limiter.Request{Key: "a", Limit: perHour, Hits: 1})
	stored = append(stored, limiter.State{})
	decisions, next, allowed = limiter.DecideAll(now, reqs, stored)
	if allowed {
		t.Fatalf("DecideAll = %+v, want denied", decisions)
	}
	// The first pass, request by request on the chained states.
	first := make([]limiter.Decision, len(reqs))
	states := map[string]limiter.State{}
	for i, r := range reqs {
		states[r.Key], first[i] = limiter.Decide(r, states[r.Key], now)
	}
	wantD, wantN := limiter.DecideDenied(now, reqs, stored, first)
	for i := range reqs {
		if decisions[i] != wantD[i] || next[i] != wantN[i] {
			t.Errorf("denied DecideAll[%d] = %+v, %+v; DecideDenied gives %+v, %+v", i, decisions[i], next[i], wantD[i], wantN[i])
		}
	}
	if decisions[3].Allowed || decisions[3].RetryAfter == 0 {
		t.Errorf("the denied request answers %+v, want its denial", decisions[3])
	}
}

// TestStateRecordsItsRate: limiter.Decide and limiter.Refund mark the states they write with
// their Limit's rate; a state written under another rate keeps the tokens
// it had spent, at most Burst + MaxDebt of them, at the new rate; a
// state of unknown rate (the zero limiter.State, ratelimitd's first Redis format)
// or a full one is read as it stands.
func TestStateRecordsItsRate(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	us := t0.UnixMicro()
	perMin := func(n int64) limiter.Limit { return limiter.Limit{Count: n, Period: time.Minute, Burst: n} }
	rate := func(l limiter.Limit) limiter.State {
		return limiter.State{Count: l.Count, PeriodUS: l.Period.Microseconds()}
	}
	at := func(l limiter.Limit, tat int64) limiter.State { s := rate(l); s.TAT = tat; return s }
	for _, tc := range []struct {
		name string
		l    limiter.Limit
		s    limiter.State
		hits int64
		want limiter.State
		d    limiter.Decision
	}{
		{"a take writes its rate", perMin(2), limiter.State{}, 1, at(perMin(2), us+30e6), limiter.Decision{Allowed: true, Remaining: 1, ResetAfter: 30 * time.Second}},
		{"first format: read as it stands", perMin(2), limiter.State{TAT: us + 30e6}, 1, at(perMin(2), us+60e6), limiter.Decision{Allowed: true, ResetAfter: time.Minute}},
		{"raised: 1 of 2 spent is 1 of 4", perMin(4), at(perMin(2), us+30e6), 1, at(perMin(4), us+30e6), limiter.Decision{Allowed: true, Remaining: 2, ResetAfter: 30 * time.Second}},
		{"raised: part-tokens kept", perMin(4), at(perMin(2), us+59e6), 1, at(perMin(4), us+44_500_000), limiter.Decision{Allowed: true, Remaining: 1, ResetAfter: 44500 * time.Millisecond}},
		{"lowered: never deeper than the new burst", perMin(2), at(perMin(10), us+60e6), 1, at(perMin(2), us+60e6), limiter.Decision{RetryAfter: 30 * time.Second, ResetAfter: time.Minute}},
		{"lowered and denied: the rescale is the state", perMin(1), at(perMin(4), us+15e6), 2, at(perMin(1), us+60e6), limiter.Decision{ExceedsBurst: true, ResetAfter: time.Minute}},
		{"full: read as it stands", perMin(4), at(perMin(2), us-1), 0, at(perMin(2), us-1), limiter.Decision{Allowed: true, Remaining: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, d := limiter.Decide(limiter.Request{Key: "k", Limit: tc.l, Hits: tc.hits}, tc.s, t0)
			if next != tc.want || d != tc.d {
				t.Errorf("limiter.Decide(%v, hits %d, %+v) = %+v, %+v; want %+v, %+v", tc.l, tc.hits, tc.s, next, d, tc.want, tc.d)
			}
		})
	}
	// limiter.Refund rescales first, then gives back.
	if got, want := limiter.Refund(perMin(4), at(perMin(2), us+60e6), t0, 1), at(perMin(4), us+15e6); got != want {
		t.Errorf("limiter.Refund after a raise = %+v, want %+v", got, want)
	}
}
