package limiter

import (
	"math"
	"time"
)

// State is the stored state of one bucket: its theoretical arrival time
// (TAT), the instant at which it is full again, as TAT microseconds since the
// Unix epoch plus Frac/Count of a microsecond (0 ≤ Frac < Count). Keeping the
// fraction makes every rate exact: 3 per second adds exactly 333333⅓ µs per
// token, and 1 per hour exactly 3600 s.
//
// The zero State is a full bucket. A State written under one Limit is read
// under another (after a config change) with Frac clamped below the new Count,
// an error under a microsecond.
//
// The Redis script (internal/redisstore) mirrors this arithmetic step by step.
type State struct {
	TAT  int64
	Frac int64
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

// ceilDuration rounds a span up to a whole microsecond.
func (a instant) ceilDuration() time.Duration {
	us := a.us
	if a.frac > 0 {
		us++
	}
	return time.Duration(us) * time.Microsecond
}

// advance returns t plus the time n tokens take to arrive, n·Period/Count.
// The product n·Period is split as n·q + n·r/Count so that no intermediate
// value exceeds 2^53 for a valid Limit and n ≤ Burst.
func (l Limit) advance(t instant, n int64) instant {
	p := l.Period.Microseconds()
	q, r := p/l.Count, p%l.Count
	f := t.frac + n*r
	return instant{us: t.us + n*q + f/l.Count, frac: f % l.Count}
}

// fillTime is the time an empty bucket takes to fill: Burst·Period/Count.
func (l Limit) fillTime() instant {
	return l.advance(instant{}, l.Burst)
}

// tokensIn returns the whole number of tokens that arrive within span x,
// floor(x·Count/Period), for 0 ≤ x ≤ fillTime. The estimate in floating point
// is corrected with exact integer steps, so the result is exact.
func (l Limit) tokensIn(x instant) int64 {
	p := float64(l.Period.Microseconds())
	n := int64(math.Floor((float64(x.us) + float64(x.frac)/float64(l.Count)) * float64(l.Count) / p))
	n = max(0, min(n, l.Burst))
	for n < l.Burst && !x.less(l.advance(instant{}, n+1)) {
		n++
	}
	for n > 0 && x.less(l.advance(instant{}, n)) {
		n--
	}
	return n
}

// Decide applies a request for hits tokens at time now to a bucket in state
// s, and returns the bucket's next state and the decision. It is the
// specification every Store follows. hits must be in [0, MaxTokens] and l
// valid.
//
// A denied request leaves the state unchanged. The clock may go backwards
// between calls: the bucket then looks emptier than it is (never fuller), so
// nothing is admitted that should not be; stores that can keep the latest now
// they have seen (MemoryStore does) pass that instead.
func Decide(l Limit, s State, now time.Time, hits int64) (State, Decision) {
	nowI := instant{us: now.UnixMicro()}
	tat := instant{s.TAT, min(s.Frac, l.Count-1)}
	if tat.less(nowI) {
		tat = nowI
	}
	tau := l.fillTime()
	if hits > l.Burst {
		return s, Decision{
			ResetAfter:   tat.sub(nowI, l.Count).ceilDuration(),
			ExceedsBurst: true,
		}
	}
	next := l.advance(tat, hits)
	used := next.sub(nowI, l.Count) // time until the bucket is full again
	if tau.less(used) {
		return s, Decision{
			RetryAfter: used.sub(tau, l.Count).ceilDuration(),
			ResetAfter: tat.sub(nowI, l.Count).ceilDuration(),
		}
	}
	d := Decision{
		Allowed:    true,
		Remaining:  l.tokensIn(tau.sub(used, l.Count)),
		ResetAfter: used.ceilDuration(),
	}
	if hits == 0 {
		return s, d
	}
	return State{TAT: next.us, Frac: next.frac}, d
}

// Full reports whether a bucket in state s is full at time now, so that a
// store may forget it.
func (s State) Full(now time.Time) bool {
	return s.TAT < now.UnixMicro() || (s.TAT == now.UnixMicro() && s.Frac == 0)
}

// DecideAll applies reqs at time now all-or-nothing, given stored[i], the
// state stored under reqs[i].Key (the same for requests naming the same key).
// It returns the decisions, the states to store (next[i] for reqs[i].Key; for
// a key named several times, the last one counts) and whether every request
// was admitted. When one is denied nothing may be stored: next is then nil,
// and the requests that would have passed report their bucket as a check
// (Hits 0) would. It is the specification of Store.Take.
func DecideAll(now time.Time, reqs []Request, stored []State) (decisions []Decision, next []State, allowed bool) {
	decisions = make([]Decision, len(reqs))
	next = make([]State, len(reqs))
	allowed = true
	for i, r := range reqs {
		s := stored[i]
		for j := i - 1; j >= 0; j-- {
			if reqs[j].Key == r.Key {
				s = next[j]
				break
			}
		}
		next[i], decisions[i] = Decide(r.Limit, s, now, r.Hits)
		allowed = allowed && decisions[i].Allowed
	}
	if allowed {
		return decisions, next, true
	}
	for i, r := range reqs {
		if decisions[i].Allowed {
			_, decisions[i] = Decide(r.Limit, stored[i], now, 0)
		}
	}
	return decisions, nil, false
}
