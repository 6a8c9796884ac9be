package limiter_test

import (
	"context"
	"maps"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// model is a naive bucket written from the specification of Decide, not
// from its arithmetic: no theoretical arrival time, no fractions of a
// microsecond, no rounding but the last one, and no bound on its numbers
// (math/big). It counts what the bucket holds in units of 1/P token, P being
// the Period in microseconds, so that exactly Count units arrive every
// microsecond and every quantity is an integer: a bucket of Burst tokens
// holds Burst·P units when full, and a request for n tokens needs n·P of
// them. Burst·P passes 2^64 for the largest limits (4294967295 per year is
// about 1.4·10^23 units): the model is exact there too.
type model struct {
	spent bool     // false: never spent from, so full
	at    int64    // when it last changed, µs since the epoch
	units *big.Int // what it held then (negative: in debt)
}

func bi(v int64) *big.Int { return big.NewInt(v) }

func mul(a, b *big.Int) *big.Int { return new(big.Int).Mul(a, b) }
func add(a, b *big.Int) *big.Int { return new(big.Int).Add(a, b) }
func sub(a, b *big.Int) *big.Int { return new(big.Int).Sub(a, b) }

func minB(a, b *big.Int) *big.Int {
	if a.Cmp(b) < 0 {
		return a
	}
	return b
}

func maxB(a, b *big.Int) *big.Int {
	if a.Cmp(b) > 0 {
		return a
	}
	return b
}

// int64Of is v, which must fit an int64 (a token count or a span in µs).
func int64Of(v *big.Int) int64 {
	if !v.IsInt64() {
		panic("model: " + v.String() + " does not fit an int64")
	}
	return v.Int64()
}

// full is what a full bucket of l holds, Burst·P units.
func full(l limiter.Limit) *big.Int { return mul(bi(l.Burst), bi(l.Period.Microseconds())) }

// held is what the bucket holds at now: what it held when it last changed
// plus Count a microsecond since (less, if the clock has gone back), at most
// full.
func (b model) held(l limiter.Limit, now int64) *big.Int {
	f := full(l)
	if !b.spent {
		return f
	}
	return minB(f, add(b.units, mul(bi(l.Count), bi(now-b.at))))
}

// ceilUS is units/count microseconds, rounded up, for units ≥ 0.
func ceilUS(units *big.Int, count int64) time.Duration {
	q := new(big.Int).Add(units, bi(count-1))
	q.Quo(q, bi(count))
	return time.Duration(int64Of(q)) * time.Microsecond
}

// tokens is units/p whole tokens, for units ≥ 0.
func tokens(units *big.Int, p int64) int64 { return int64Of(new(big.Int).Quo(units, bi(p))) }

// decide is Decide's specification, applied to the model at now.
func (b model) decide(r limiter.Request, at time.Time) (model, limiter.Decision) {
	l, now := r.Limit, at.UnixMicro()
	p := l.Period.Microseconds()
	f := full(l)
	have := b.held(l, now)
	need := mul(bi(r.Hits), bi(p))
	leaving := func(units *big.Int) model { return model{spent: true, at: now, units: units} }
	untilFull := func(units *big.Int) time.Duration { return ceilUS(sub(f, units), l.Count) }

	if l.MaxDebt > 0 && r.Hits > 0 {
		// A post-paid charge is recorded whatever the bucket holds, down
		// to MaxDebt tokens below empty, or where the bucket already is if
		// that is lower (a charge never makes it fuller). It is admitted
		// when the bucket was not in debt; denied, it says when the bucket
		// is out of debt again, this charge included.
		left := maxB(sub(have, need), minB(mul(bi(-l.MaxDebt), bi(p)), have))
		d := limiter.Decision{Allowed: have.Sign() >= 0, ResetAfter: untilFull(left)}
		switch {
		case !d.Allowed:
			d.RetryAfter = ceilUS(new(big.Int).Neg(left), l.Count)
		case left.Sign() >= 0:
			d.Remaining = tokens(left, p)
		}
		return leaving(left), d
	}
	if r.Hits > l.Burst {
		return b, limiter.Decision{ResetAfter: untilFull(have), ExceedsBurst: true}
	}
	if have.Cmp(need) >= 0 { // a check (need 0) passes unless the bucket is in debt
		left := sub(have, need)
		d := limiter.Decision{Allowed: true, Remaining: tokens(left, p), ResetAfter: untilFull(left)}
		if r.Hits == 0 {
			return b, d
		}
		return leaving(left), d
	}
	wait := ceilUS(sub(need, have), l.Count) // until the missing units have arrived
	if r.Hits > 0 && r.MaxWait > 0 && wait <= r.MaxWait {
		left := sub(have, need)
		return leaving(left), limiter.Decision{Allowed: true, ResetAfter: untilFull(left), Wait: wait}
	}
	return b, limiter.Decision{RetryAfter: wait, ResetAfter: untilFull(have)}
}

// state is the limiter.State a store keeps for the model: the instant it is
// full again, at plus the time the missing units take, as whole
// microseconds and Count-ths of one.
// bare is s without the rate it records, which the model does not keep
// (TestStateRecordsItsRate holds it).
func bare(s limiter.State) limiter.State {
	return limiter.State{TAT: s.TAT, Frac: s.Frac}
}

func (b model) state(l limiter.Limit) limiter.State {
	if !b.spent {
		return limiter.State{}
	}
	q, m := new(big.Int).QuoRem(sub(full(l), b.units), bi(l.Count), new(big.Int))
	return limiter.State{TAT: b.at + int64Of(q), Frac: int64Of(m)}
}

// takeModel is the specification of DecideAll (and Store.Take) on models
// by key: every request in order, each seeing the ones before it; if one
// that is not Shadow is denied, the Take starts again from buckets, records
// only the post-paid charges, and the others answer as a check would (those
// that passed the first time) or with their denial. It returns the
// decisions, each request's bucket after it, whether the Take was admitted,
// and the buckets after it.
func takeModel(now time.Time, reqs []limiter.Request, buckets map[string]model) ([]limiter.Decision, []model, bool, map[string]model) {
	tried := maps.Clone(buckets)
	first := make([]limiter.Decision, len(reqs))
	after := make([]model, len(reqs))
	admitted := true
	for i, r := range reqs {
		tried[r.Key], first[i] = tried[r.Key].decide(r, now)
		after[i] = tried[r.Key]
		admitted = admitted && (first[i].Allowed || r.Shadow)
	}
	if admitted {
		return first, after, true, tried
	}
	kept := maps.Clone(buckets)
	decisions := make([]limiter.Decision, len(reqs))
	for i, r := range reqs {
		switch {
		case r.Limit.MaxDebt > 0 && r.Hits > 0 && (r.Counting == limiter.CountAlways || !first[i].Allowed):
			kept[r.Key], decisions[i] = kept[r.Key].decide(r, now)
		case first[i].Allowed:
			check := r
			check.Hits = 0
			_, decisions[i] = kept[r.Key].decide(check, now)
		default:
			decisions[i] = first[i]
		}
		after[i] = kept[r.Key]
	}
	return decisions, after, false, kept
}

// randomLimit is a valid limit with a small burst, a period of a
// microsecond to a day (often not a whole number of microseconds per
// token), and sometimes an overdraft; or, one time in four, a huge limit
// (bigLimit).
func randomLimit(rng *rand.Rand) limiter.Limit {
	if rng.IntN(4) == 0 {
		return bigLimit(rng)
	}
	counts := []int64{1, 2, 3, 7, 10, 60, 1000, 1 + rng.Int64N(1_000_000)}
	periods := []time.Duration{time.Microsecond, time.Millisecond, time.Second, time.Minute, time.Hour, 24 * time.Hour,
		time.Duration(1+rng.Int64N(10_000_000)) * time.Microsecond}
	l := limiter.Limit{
		Count:  counts[rng.IntN(len(counts))],
		Period: periods[rng.IntN(len(periods))],
		Burst:  1 + rng.Int64N(20),
	}
	if rng.IntN(4) == 0 {
		l.MaxDebt = 1 + rng.Int64N(3*l.Burst)
	}
	return l
}

// The periods of the config's units (config.Unit), and a week.
var unitPeriods = []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour,
	30 * 24 * time.Hour, 365 * 24 * time.Hour}

// bigLimit is a limit as large as the incumbent's files can write: a
// requests_per_unit of 10^9 or up to 2^32−1 (a uint32) per unit, with the
// default burst (the count) or another near it, sometimes an overdraft of
// up to two bursts. Count·Burst reaches 2^64.
func bigLimit(rng *rand.Rand) limiter.Limit {
	counts := []int64{1_000_000_000, 4_294_967_295, 1 << 31, 1 + rng.Int64N(4_294_967_295)}
	l := limiter.Limit{Count: counts[rng.IntN(len(counts))], Period: unitPeriods[rng.IntN(len(unitPeriods))]}
	l.Burst = l.Count
	switch rng.IntN(4) {
	case 0:
		l.Burst = 1 + rng.Int64N(l.Count)
	case 1:
		l.Burst = 1 + rng.Int64N(3)
	}
	if rng.IntN(3) == 0 {
		l.MaxDebt = 1 + rng.Int64N(2*l.Burst)
	}
	return l
}

// randomRequest asks for 0 to a few more tokens than l's burst (than its
// burst and overdraft, for a charge), sometimes for a huge number (Envoy's
// hits_addend is a uint32; a stream-done charge may be anything), and
// sometimes willing to wait up to the fill time.
func randomRequest(rng *rand.Rand, key string, l limiter.Limit) limiter.Request {
	r := limiter.Request{Key: key, Limit: l}
	switch n := rng.IntN(40); {
	case n < 6:
		r.Hits = 0
	case n < 34:
		r.Hits = 1 + rng.Int64N(l.Burst)
	case n < 36:
		r.Hits = l.Burst + 1 + rng.Int64N(3)
	case n < 38:
		r.Hits = 1 + rng.Int64N(l.Burst+l.MaxDebt+3)
	default:
		huge := []int64{4_294_967_295, limiter.MaxTokens, 1 + rng.Int64N(limiter.MaxTokens)}
		r.Hits = huge[rng.IntN(len(huge))]
	}
	if rng.IntN(4) == 0 {
		r.MaxWait = time.Duration(rng.Int64N(int64(l.FillTime()) + 1))
	}
	return r
}

// randomStep moves a clock by about a token's time, sometimes by nothing,
// by up to two fill times, or back by up to one; with nanoseconds, which
// Decide ignores.
func randomStep(rng *rand.Rand, l limiter.Limit) time.Duration {
	token := max(l.TimeFor(1), time.Microsecond)
	fill := l.FillTime()
	var d time.Duration
	switch n := rng.IntN(20); {
	case n < 3:
		d = 0
	case n < 5:
		d = token // exactly when a token has arrived
	case n < 15:
		d = time.Duration(rng.Int64N(2 * int64(token)))
	case n < 18:
		d = time.Duration(rng.Int64N(2 * int64(fill)))
	default:
		d = -time.Duration(rng.Int64N(int64(fill)))
	}
	return d + time.Duration(rng.Int64N(1000))
}

// TestDecideMatchesModel: over random limits and timelines of random
// requests (checks, charges, reservations, more than the burst, a clock
// going back), Decide answers what the model answers, and leaves the state
// the model's bucket is stored as.
func TestDecideMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	// What the timelines reached: each kind of answer must come often, or
	// the comparison shows little.
	reached := map[string]int{}
	for trial := range 3000 {
		l := randomLimit(rng)
		if err := l.Validate(); err != nil {
			t.Fatalf("randomLimit gave %+v: %v", l, err)
		}
		var s limiter.State
		var m model
		now := t0
		for step := range 40 {
			r := randomRequest(rng, "k", l)
			if err := r.Validate(); err != nil {
				t.Fatalf("randomRequest gave %+v: %v", r, err)
			}
			next, d := limiter.Decide(r, s, now)
			wantM, want := m.decide(r, now)
			if d != want || bare(next) != wantM.state(l) {
				t.Fatalf("trial %d step %d: Decide(%+v hits %d max wait %v, %+v, t0+%v) = %+v, %+v; the model gives %+v, %+v (from %+v)",
					trial, step, l, r.Hits, r.MaxWait, s, now.Sub(t0), d, next, want, wantM.state(l), m)
			}
			if l.Count >= 1_000_000_000 {
				switch {
				case r.Charge():
					reached["big: charge"]++
				case d.Allowed && r.Hits > 0:
					reached["big: admitted"]++
				case !d.Allowed && !d.ExceedsBurst:
					reached["big: denied"]++
				}
			}
			switch {
			case r.Charge() && !d.Allowed:
				reached["charge in debt"]++
			case r.Charge():
				reached["charge"]++
			case d.ExceedsBurst:
				reached["more than the burst"]++
			case d.Wait > 0:
				reached["reservation"]++
			case d.Allowed && r.Hits == 0:
				reached["check"]++
			case d.Allowed:
				reached["admitted"]++
			default:
				reached["denied"]++
			}
			step := randomStep(rng, l)
			if step < 0 {
				reached["clock back"]++
			}
			s, m = next, wantM
			now = now.Add(step)
		}
	}
	t.Logf("reached: %v", reached)
	for _, kind := range []string{"admitted", "denied", "check", "reservation", "more than the burst", "charge", "charge in debt", "clock back",
		"big: admitted", "big: denied", "big: charge"} {
		if reached[kind] < 500 {
			t.Errorf("%d decisions of kind %q, want at least 500 (all: %v)", reached[kind], kind, reached)
		}
	}
}

// TestDecideAllMatchesModel: over random Takes of one to five requests on
// three buckets with random limits (a key named more than once, Shadow
// requests, charges, reservations), DecideAll answers what takeModel
// answers and leaves each request's bucket in the model's state; a store
// that writes what DecideAll leaves carries the model's buckets from one
// Take to the next. A MemoryStore (one shard, so one latest time) answers
// what the model answers at the latest time it has seen.
func TestDecideAllMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	keys := []string{"a", "b", "c"}
	reached := map[string]int{}
	for trial := range 500 {
		limits := map[string]limiter.Limit{}
		for _, k := range keys {
			limits[k] = randomLimit(rng)
		}
		stored := map[string]limiter.State{}
		models := map[string]model{}
		mem := limiter.NewMemoryStore(limiter.MemoryOptions{Shards: 1})
		memModels := map[string]model{}
		now, latest := t0, t0
		for take := range 30 {
			reqs := make([]limiter.Request, 1+rng.IntN(5))
			states := make([]limiter.State, len(reqs))
			for i := range reqs {
				k := keys[rng.IntN(len(keys))]
				reqs[i] = randomRequest(rng, k, limits[k])
				reqs[i].Shadow = rng.IntN(6) == 0
				if rng.IntN(3) == 0 {
					reqs[i].Counting = limiter.CountWhereDenied
				}
				states[i] = stored[k]
			}
			decisions, next, ok := limiter.DecideAll(now, reqs, states)
			want, wantAfter, wantOK, wantModels := takeModel(now, reqs, models)
			for i, r := range reqs {
				if decisions[i] != want[i] || bare(next[i]) != wantAfter[i].state(r.Limit) || ok != wantOK {
					t.Fatalf("trial %d take %d at t0+%v: DecideAll(%+v) from %+v: request %d = %+v, %+v (admitted %v); the model gives %+v, %+v (admitted %v)",
						trial, take, now.Sub(t0), reqs, states, i, decisions[i], next[i], ok, want[i], wantAfter[i].state(r.Limit), wantOK)
				}
			}
			// What a store writes: for each key, the state after the last
			// request naming it.
			for i, r := range reqs {
				stored[r.Key] = next[i]
			}
			models = wantModels
			for _, k := range keys {
				if bare(stored[k]) != models[k].state(limits[k]) {
					t.Fatalf("trial %d take %d: after DecideAll(%+v), %s is stored as %+v; the model's bucket is %+v",
						trial, take, reqs, k, stored[k], models[k].state(limits[k]))
				}
			}

			got, err := mem.Take(context.Background(), now, reqs)
			if err != nil {
				t.Fatalf("MemoryStore.Take(%+v) = %v", reqs, err)
			}
			if now.After(latest) {
				latest = now
			}
			want, _, _, memModels = takeModel(latest, reqs, memModels)
			for i := range reqs {
				if got[i] != want[i] {
					t.Fatalf("trial %d take %d at t0+%v (latest t0+%v): MemoryStore.Take(%+v): request %d = %+v; the model gives %+v",
						trial, take, now.Sub(t0), latest.Sub(t0), reqs, i, got[i], want[i])
				}
			}

			reached[takeKind(reqs, decisions, ok)]++
			step := time.Duration(0)
			for _, r := range reqs {
				step = max(step, randomStep(rng, r.Limit))
			}
			if rng.IntN(10) == 0 {
				step = -step
			}
			now = now.Add(step)
		}
	}
	t.Logf("reached: %v", reached)
	for _, kind := range []string{"admitted", "admitted over a shadow denial", "denied", "denied, with a charge", "denied, one key twice", "denied, a charge with room not counted"} {
		if reached[kind] < 200 {
			t.Errorf("%d Takes of kind %q, want at least 200 (all: %v)", reached[kind], kind, reached)
		}
	}
}

// takeKind names what a Take exercised, for TestDecideAllMatchesModel's
// tally.
func takeKind(reqs []limiter.Request, decisions []limiter.Decision, admitted bool) string {
	seen := map[string]bool{}
	twice, charge, shadowDenied, dropped := false, false, false, false
	for i, r := range reqs {
		twice = twice || seen[r.Key]
		seen[r.Key] = true
		charge = charge || r.Charge()
		dropped = dropped || !admitted && r.Charge() && r.Counting == limiter.CountWhereDenied && decisions[i].Allowed
		shadowDenied = shadowDenied || r.Shadow && !decisions[i].Allowed
	}
	switch {
	case admitted && shadowDenied:
		return "admitted over a shadow denial"
	case admitted:
		return "admitted"
	case dropped:
		return "denied, a charge with room not counted"
	case charge:
		return "denied, with a charge"
	case twice:
		return "denied, one key twice"
	}
	return "denied"
}
