package limiter

import (
	"math"
	"math/bits"
	"time"
)

// State is the stored state of one bucket: its theoretical arrival time
// (TAT), the instant at which it is full again, as TAT microseconds since the
// Unix epoch plus Frac/Count of a microsecond (0 ≤ Frac < Count). Keeping the
// fraction makes every rate exact: 3 per second adds exactly 333333⅓ µs per
// token, and 1 per hour exactly 3600 s.
//
// Count and PeriodUS record the rate of the Limit the state was written
// under (Count tokens every PeriodUS µs); Decide, DecideAll and Refund
// return states that record their Limit's. Zero means unknown, as in the
// zero State (a full bucket) and a state of ratelimitd's first format: it
// is read as written under the Limit reading it.
//
// A State written under one rate and read under another (after a config
// change) keeps the whole tokens it had spent, now spent at the new rate
// (see under): raising a limit frees at once what the raise adds, as a
// counter of hits would, and lowering it never empties a bucket deeper
// than the new Limit allows.
//
// The Redis script (internal/redisstore) mirrors this arithmetic step by step.
type State struct {
	TAT      int64
	Frac     int64
	Count    int64
	PeriodUS int64
}

// under returns s as Limit l reads it at now (Unix µs): s itself when it
// was written under l's rate (or an unknown one) or is full; otherwise the
// state, marked with l's rate, in which the tokens s had spent at its own
// rate, n = (TAT − now)·Count_s/Period_s, are spent at l's, at most Burst
// + MaxDebt of them (an empty bucket at its deepest debt): TAT = now +
// n·Period/Count, rounded down to 1/Count µs (the client's favour).
//
// It computes in float64, step for step as the Redis script computes in
// Lua's doubles (common.lua's rescale), so that both stores agree to the
// bit: exact while (TAT − now)·Count_s and n·Period stay below 2^53 (10^6
// a second with a burst of 10^6 is 2^40; a day's budget of 10^5 tokens,
// 2^53), and otherwise off by the rounding of a double, once, at a change
// of the limit.
func (s State) under(l Limit, now int64) State {
	p := l.Period.Microseconds()
	if s.Count < 1 || s.PeriodUS < 1 || (s.Count == l.Count && s.PeriodUS == p) || s.TAT < now {
		return s
	}
	used, f0 := float64(s.TAT-now), float64(min(s.Frac, s.Count-1))
	n := (float64(used*float64(s.Count)) + f0) / float64(s.PeriodUS)
	if cap := float64(l.Burst + l.MaxDebt); n > cap {
		n = cap
	}
	span := float64(n*float64(p)) / float64(l.Count)
	us := math.Floor(span)
	fr := math.Floor(float64((span - us) * float64(l.Count)))
	fr = max(0, min(fr, float64(l.Count-1)))
	return State{TAT: int64(float64(now) + us), Frac: int64(fr), Count: l.Count, PeriodUS: p}
}

// state is the State at instant t written under l.
func (l Limit) state(t instant) State {
	return State{TAT: t.us, Frac: t.frac, Count: l.Count, PeriodUS: l.Period.Microseconds()}
}

// instant is a point in time or a span: us microseconds plus frac/Count of one.
type instant struct {
	us, frac int64
}

func (a instant) less(b instant) bool {
	return a.us < b.us || (a.us == b.us && a.frac < b.frac)
}

// sub returns a−b for a ≥ b, both with fractions of the same Count.
func (a instant) sub(b instant, count int64) instant {
	d := instant{a.us - b.us, a.frac - b.frac}
	if d.frac < 0 {
		d.frac += count
		d.us--
	}
	return d
}

// add returns a+b, both with fractions of the same Count.
func (a instant) add(b instant, count int64) instant {
	d := instant{a.us + b.us, a.frac + b.frac}
	if d.frac >= count {
		d.frac -= count
		d.us++
	}
	return d
}

// ceilDuration rounds a span up to a whole microsecond.
func (a instant) ceilDuration() time.Duration {
	us := a.us
	if a.frac > 0 {
		us++
	}
	return time.Duration(us) * time.Microsecond
}

// span returns the time n tokens take to arrive, n·Period/Count, exactly,
// for n ≥ 0. The product n·Period is split as n·q + n·r/Count (q, r =
// Period/Count, Period%Count); n·r passes 2^63 when Count and n are both
// near 2^32 (4294967295 a second with that burst), so it is formed and
// divided in 128 bits (the quotient fits: n·r < n·Count). Every Limit that
// Validate accepts is thus exact, whatever Count·Burst is. The results are
// spans under 2^53 µs with a fraction below Count ≤ MaxTokens: the Redis
// script adds and compares them exactly in doubles.
func (l Limit) span(n int64) instant {
	p := l.Period.Microseconds()
	q, r := p/l.Count, p%l.Count
	hi, lo := bits.Mul64(uint64(n), uint64(r))
	quo, rem := bits.Div64(hi, lo, uint64(l.Count))
	return instant{us: n*q + int64(quo), frac: int64(rem)}
}

// Span returns the time n tokens take to arrive, n·Period/Count, exactly:
// us whole microseconds plus frac/Count of one. It is Decide's arithmetic,
// for a store that decides elsewhere (the Redis script) and needs its
// spans: the fill time Span(Burst), a request's Span(Hits). n must be at
// most Burst+MaxDebt, as in Decide (beyond, n·Period may overflow).
func (l Limit) Span(n int64) (us, frac int64) {
	t := l.span(n)
	return t.us, t.frac
}

// fillTime is the time an empty bucket takes to fill: Burst·Period/Count.
func (l Limit) fillTime() instant {
	return l.span(l.Burst)
}

// tokensIn returns the whole number of tokens that arrive within span x,
// floor(x·Count/Period), for 0 ≤ x ≤ fillTime. The estimate in floating point
// is corrected with exact integer steps, so the result is exact.
func (l Limit) tokensIn(x instant) int64 {
	p := float64(l.Period.Microseconds())
	n := int64(math.Floor((float64(x.us) + float64(x.frac)/float64(l.Count)) * float64(l.Count) / p))
	n = max(0, min(n, l.Burst))
	for n < l.Burst && !x.less(l.span(n+1)) {
		n++
	}
	for n > 0 && x.less(l.span(n)) {
		n--
	}
	return n
}

// Decide applies request r at time now to a bucket in state s, and returns
// the bucket's next state and the decision. It is the specification every
// Store follows; r must be valid (Request.Validate).
//
//   - A request for Hits tokens is admitted when the bucket holds at least
//     Hits, and then spends them. Hits 0 checks without spending: admitted
//     unless the bucket is in debt.
//   - Hits above Burst can never be admitted (ExceedsBurst).
//   - With MaxWait, a request that would be denied but whose tokens arrive
//     within MaxWait reserves them: admitted with Wait, the bucket in debt
//     until they arrive.
//   - With Limit.MaxDebt, a charge (Hits > 0) is always recorded, down to
//     MaxDebt tokens below empty, and is admitted when the bucket was not in
//     debt before it.
//
// A denied request leaves the state unchanged (except a charge). The clock
// may go backwards between calls: the bucket then looks emptier than it is
// (never fuller), so nothing is admitted that should not be; stores that
// can keep the latest now they have seen (MemoryStore does) pass that.
func Decide(r Request, s State, now time.Time) (State, Decision) {
	l, hits := r.Limit, r.Hits
	nowI := instant{us: now.UnixMicro()}
	s = s.under(l, nowI.us)
	tat := instant{s.TAT, min(s.Frac, l.Count-1)}
	if tat.less(nowI) {
		tat = nowI
	}
	tau := l.fillTime()
	before := tat.sub(nowI, l.Count) // time until full before this request
	if r.Charge() {
		return l.charge(tat, nowI, tau, before, hits)
	}
	if hits > l.Burst {
		return s, Decision{ResetAfter: before.ceilDuration(), ExceedsBurst: true}
	}
	next := tat.add(l.span(hits), l.Count)
	used := next.sub(nowI, l.Count) // time until the bucket is full again
	if !tau.less(used) {
		d := Decision{
			Allowed:    true,
			Remaining:  l.tokensIn(tau.sub(used, l.Count)),
			ResetAfter: used.ceilDuration(),
		}
		if hits == 0 {
			return s, d
		}
		return l.state(next), d
	}
	wait := used.sub(tau, l.Count) // until this request's tokens have arrived
	if hits > 0 && r.MaxWait > 0 && wait.ceilDuration() <= r.MaxWait {
		return l.state(next), Decision{
			Allowed:    true,
			ResetAfter: used.ceilDuration(),
			Wait:       wait.ceilDuration(),
		}
	}
	return s, Decision{RetryAfter: wait.ceilDuration(), ResetAfter: before.ceilDuration()}
}

// charge records a post-paid charge of hits tokens on a bucket whose TAT is
// tat (at least now), down to MaxDebt tokens below empty.
func (l Limit) charge(tat, now, tau, before instant, hits int64) (State, Decision) {
	// The deepest debt a charge may reach: MaxDebt below empty, or where the
	// bucket already is (after a reservation or a lowered rate), since a
	// charge never makes a bucket fuller.
	floor := tau.add(l.span(l.MaxDebt), l.Count)
	if floor.less(before) {
		floor = before
	}
	next := tat.add(l.span(min(hits, l.Burst+l.MaxDebt)), l.Count)
	used := next.sub(now, l.Count)
	if floor.less(used) {
		used = floor
		next = instant{us: now.us + floor.us, frac: floor.frac}
	}
	d := Decision{Allowed: !tau.less(before), ResetAfter: used.ceilDuration()}
	switch {
	case !d.Allowed:
		// Until the bucket is out of debt again, this charge included:
		// the same charge is admitted then.
		d.RetryAfter = used.sub(tau, l.Count).ceilDuration()
	case !tau.less(used):
		d.Remaining = l.tokensIn(tau.sub(used, l.Count))
	}
	return l.state(next), d
}

// Refund returns the state of a bucket in state s after giving back hits
// tokens at time now: its TAT moves back by their time, but not before now.
func Refund(l Limit, s State, now time.Time, hits int64) State {
	nowI := instant{us: now.UnixMicro()}
	s = s.under(l, nowI.us)
	tat := instant{s.TAT, min(s.Frac, l.Count-1)}
	if !nowI.less(tat) {
		return s
	}
	back := l.span(min(hits, l.Burst+l.MaxDebt))
	if !back.less(tat.sub(nowI, l.Count)) {
		return l.state(nowI)
	}
	return l.state(tat.sub(back, l.Count))
}

// Full reports whether a bucket in state s is full at time now, so that a
// store may forget it.
func (s State) Full(now time.Time) bool {
	return s.TAT < now.UnixMicro() || (s.TAT == now.UnixMicro() && s.Frac == 0)
}

// DecideAll applies reqs at time now all-or-nothing, given stored[i], the
// state stored under reqs[i].Key (the same for requests naming the same key).
// It returns the decisions, the state of each request's bucket after it, and
// whether every request was admitted. A store writes next[i] under
// reqs[i].Key for each request whose next[i] differs from what it stored
// (for a key named several times, the last one counts): a request with
// Hits > 0 that spent or charged, or any request on a bucket written under
// another rate, which it leaves rescaled (see State).
//
// When one request is denied (a Shadow one does not count), none is charged
// except post-paid charges (Request.Charge; with CountWhereDenied, only
// those that were themselves denied), and the requests that would have
// passed report their bucket as a check (Hits 0) would. It is the
// specification of Store.Take.
func DecideAll(now time.Time, reqs []Request, stored []State) (decisions []Decision, next []State, allowed bool) {
	decisions = make([]Decision, len(reqs))
	next = make([]State, len(reqs))
	allowed = decideAll(now, reqs, stored, decisions, next)
	return decisions, next, allowed
}

// decideAll is DecideAll writing into decisions and next (as long as reqs),
// for a store that provides them.
func decideAll(now time.Time, reqs []Request, stored []State, decisions []Decision, next []State) (allowed bool) {
	allowed = true
	for i, r := range reqs {
		next[i], decisions[i] = Decide(r, current(reqs, stored, next, i), now)
		allowed = allowed && (decisions[i].Allowed || r.Shadow)
	}
	if allowed {
		return true
	}
	// In place: decideDenied reads each first-pass decision before
	// replacing it.
	decideDenied(now, reqs, stored, decisions, decisions, next)
	return false
}

// DecideDenied returns the decisions and next states of a Take of reqs
// that is denied: what DecideAll answers and leaves when it denies, given
// stored as DecideAll takes it and decided, DecideAll's decision for each
// request before the Take was known to be denied (a request that was denied
// answers that same decision). Post-paid charges are decided and kept
// (with CountWhereDenied, those that were denied); the other requests that
// were admitted report a check (Hits 0) and leave their bucket as it was. A store that must know both outcomes (one Take split
// over several Redis Cluster slots, which decide apart) calls it when
// DecideAll admits, to give back what an admitted slot took.
func DecideDenied(now time.Time, reqs []Request, stored []State, decided []Decision) (decisions []Decision, next []State) {
	decisions = make([]Decision, len(reqs))
	next = make([]State, len(reqs))
	decideDenied(now, reqs, stored, decided, decisions, next)
	return decisions, next
}

// decideDenied is DecideDenied writing into decisions and next, which may
// be decided itself: decided[i] is read before decisions[i] is written.
func decideDenied(now time.Time, reqs []Request, stored []State, decided, decisions []Decision, next []State) {
	nowUS := now.UnixMicro()
	for i, r := range reqs {
		// rescaled, so that a denied Take also writes what a change of the
		// limit made of the bucket (see the write rule in DecideAll)
		s := current(reqs, stored, next, i).under(r.Limit, nowUS)
		switch {
		case r.Charge() && (r.Counting == CountAlways || !decided[i].Allowed):
			next[i], decisions[i] = Decide(r, s, now)
		case decided[i].Allowed:
			check := r
			check.Hits = 0
			next[i] = s
			_, decisions[i] = Decide(check, s, now)
		default:
			next[i], decisions[i] = s, decided[i]
		}
	}
}

// current is the state of reqs[i]'s bucket before it: next of the last
// earlier request for the same key, else stored[i].
func current(reqs []Request, stored, next []State, i int) State {
	for j := i - 1; j >= 0; j-- {
		if reqs[j].Key == reqs[i].Key {
			return next[j]
		}
	}
	return stored[i]
}
