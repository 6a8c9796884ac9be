package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

// logUniform returns an integer in [lo, hi] whose logarithm is uniform.
func logUniform(rng *rand.Rand, lo, hi int64) int64 {
	v := int64(math.Exp(math.Log(float64(lo)) + rng.Float64()*(math.Log(float64(hi))-math.Log(float64(lo)))))
	return max(lo, min(v, hi))
}

// randLimit returns a valid Limit, often near the bounds, post-paid (with
// MaxDebt) a third of the time.
func randLimit(rng *rand.Rand) limiter.Limit {
	l := randPrepaid(rng)
	if rng.IntN(3) == 0 {
		if most := maxDebt(l); most > 0 {
			switch rng.IntN(4) {
			case 0:
				l.MaxDebt = most
			case 1:
				l.MaxDebt = 1
			case 2:
				l.MaxDebt = min(most, 5*l.Burst)
			default:
				l.MaxDebt = logUniform(rng, 1, most)
			}
		}
		if l.Validate() != nil {
			panic(fmt.Sprintf("randLimit: %+v is invalid: %v", l, l.Validate()))
		}
	}
	return l
}

// maxDebt is the largest MaxDebt that Limit.Validate accepts for l: at most
// MaxTokens, and Burst+MaxDebt tokens arriving within MaxFill,
// floor((Burst+MaxDebt)·Period/Count) ≤ MaxFill.
func maxDebt(l limiter.Limit) int64 {
	most := int64(limiter.MaxTokens)
	// n·p/count < MaxFill+1 ⟺ n ≤ ((MaxFill+1)·count − 1)/p, exactly.
	n := new(big.Int).Mul(big.NewInt(limiter.MaxFill.Microseconds()+1), big.NewInt(l.Count))
	n.Sub(n, big.NewInt(1))
	n.Quo(n, big.NewInt(l.Period.Microseconds()))
	if n.IsInt64() {
		most = min(most, n.Int64()-l.Burst)
	}
	return most
}

// randPrepaid returns a valid Limit without MaxDebt, often near the bounds.
func randPrepaid(rng *rand.Rand) limiter.Limit {
	maxFill := limiter.MaxFill.Microseconds()
	switch rng.IntN(7) {
	case 0: // everyday limits
		human := []limiter.Limit{
			{Count: 3, Period: time.Second, Burst: 3},
			{Count: 5, Period: time.Minute, Burst: 5},
			{Count: 10, Period: time.Second, Burst: 20},
			{Count: 1, Period: time.Hour, Burst: 1},
			{Count: 7, Period: 1001 * time.Microsecond, Burst: 3},
		}
		return human[rng.IntN(len(human))]
	case 1: // Count at the bound, Burst·Count up to 2^80, and periods up
		// to the longest Duration (more than 2^53 µs)
		l := limiter.Limit{Count: limiter.MaxTokens, Burst: 1 << 10}
		switch rng.IntN(3) {
		case 0:
			l.Burst = 1
		case 1:
			l.Burst = limiter.MaxTokens
		}
		l.Period = time.Duration(logUniform(rng, 1, math.MaxInt64/1000)) * time.Microsecond
		if rng.IntN(3) == 0 {
			l.Period = time.Duration(math.MaxInt64/1000-rng.Int64N(1000)) * time.Microsecond
		}
		if l.Validate() == nil {
			return l
		}
	case 2: // Burst at the bound, a 100-year fill
		l := limiter.Limit{Count: 1 << 10, Burst: limiter.MaxTokens}
		l.Period = time.Duration(maxFill*l.Count/l.Burst-rng.Int64N(3)) * time.Microsecond
		if l.Validate() == nil {
			return l
		}
	case 3: // the incumbent's largest: a uint32 requests_per_unit per
		// unit, with the default burst (the count) or another
		counts := []int64{1_000_000_000, 4_294_967_295, 1 + rng.Int64N(4_294_967_295)}
		units := []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour,
			30 * 24 * time.Hour, 365 * 24 * time.Hour}
		l := limiter.Limit{Count: counts[rng.IntN(len(counts))], Period: units[rng.IntN(len(units))]}
		l.Burst = l.Count
		if rng.IntN(3) == 0 {
			l.Burst = logUniform(rng, 1, l.Count)
		}
		return l
	}
	for {
		count := logUniform(rng, 1, limiter.MaxTokens)
		burst := logUniform(rng, 1, limiter.MaxTokens)
		// fill = burst·period/count ≤ MaxFill
		maxPeriod := int64(min(float64(maxFill)*float64(count)/float64(burst), float64(100*365*24*time.Hour/time.Microsecond)))
		if maxPeriod < 1 {
			continue
		}
		l := limiter.Limit{Count: count, Burst: burst, Period: time.Duration(logUniform(rng, 1, maxPeriod)) * time.Microsecond}
		if l.Validate() == nil {
			return l
		}
	}
}

// randHits returns a number of tokens to ask from (or give back to) a
// bucket of limit l.
func randHits(rng *rand.Rand, l limiter.Limit) int64 {
	b := l.Burst
	if l.MaxDebt > 0 && rng.IntN(3) == 0 {
		// Charges up to and past the debt floor.
		most := min(b+l.MaxDebt, limiter.MaxTokens)
		switch rng.IntN(4) {
		case 0:
			return most
		case 1:
			return min(most+1+rng.Int64N(3), limiter.MaxTokens)
		case 2:
			return limiter.MaxTokens
		default:
			return 1 + rng.Int64N(most)
		}
	}
	switch rng.IntN(9) {
	case 0:
		return 0
	case 8: // Envoy's largest hits_addend (a uint32), or more
		return []int64{4_294_967_295, limiter.MaxTokens}[rng.IntN(2)]
	case 1, 2:
		return 1
	case 3:
		return b
	case 4:
		return min(b+1+rng.Int64N(3), limiter.MaxTokens)
	case 5:
		return 1 + rng.Int64N(min(b, 4))
	default:
		return 1 + rng.Int64N(b)
	}
}

// randMaxWait returns a Request.MaxWait for limit l at now: none half the
// time, else anything up to limiter.MaxFill, within what keeps a written TAT
// (at most now + FillTime + MaxWait) below 2^53 µs, where the Redis
// script's doubles are exact (see take.lua).
func randMaxWait(rng *rand.Rand, l limiter.Limit, now time.Time) time.Duration {
	var w time.Duration
	switch rng.IntN(8) {
	case 0, 1, 2, 3:
		return 0
	case 4:
		w = limiter.MaxFill
	case 5: // not a whole microsecond: compared as Decide does
		w = time.Duration(1+rng.Int64N(3))*time.Microsecond + time.Duration(rng.Int64N(1000))
	case 6:
		w = time.Duration(rng.Float64() * 2 * float64(fillOf(l)))
	default:
		w = time.Duration(logUniform(rng, 1, limiter.MaxFill.Microseconds())) * time.Microsecond
	}
	exact := (1<<53 - now.UnixMicro() - l.FillTime().Microseconds()) - 10e6
	return max(0, min(w, limiter.MaxFill, time.Duration(exact)*time.Microsecond))
}

// fillOf is a Limit's fill time, approximately.
func fillOf(l limiter.Limit) time.Duration {
	return time.Duration(float64(l.Period) * float64(l.Burst) / float64(l.Count))
}

// testMatchesDecideAll runs random Takes (with post-paid charges,
// reservations and shadow requests) and Refunds against the store and
// against limiter.DecideAll and limiter.Refund with a map of states, and
// requires exactly the same decisions and stored states, and a TTL of the
// time until full on what was written.
//
// The store's keys expire on Redis's clock while decisions use the caller's
// now; so that a key never vanishes before the model's bucket is full, now
// advances by the real time elapsed plus random jumps. A key whose bucket
// is full within the step's own latency may still vanish while the Take
// is on its way (now is read before it is sent, and a coalesced call can
// wait longer than the previous one did): for those, the store may also
// answer as if the bucket were full.
func testMatchesDecideAll(t *testing.T, c redisstore.Client, rdb redis.Cmdable, steps int, options ...func(*redisstore.Store)) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	store := newStore(t, c, redisstore.CallerClock)
	for _, o := range options {
		o(store)
	}
	ctx := context.Background()

	buckets := []string{"a", "b{x}", "\x00", "é", "", "a:b", "v1\x01a"}
	limits := make([]limiter.Limit, len(buckets))
	for i := range limits {
		limits[i] = randLimit(rng)
	}
	model := map[string]limiter.State{}
	start := time.Now()
	var jumped time.Duration
	var takes, refunds, denied, charges, waits, shadows int
	for step := range steps {
		switch rng.IntN(6) {
		case 0:
		case 1:
			jumped += time.Duration(rng.Int64N(1000)) * time.Microsecond
		case 2:
			jumped += time.Duration(rng.Int64N(10_000_000)) * time.Microsecond
		default:
			// a fraction of some bucket's fill time, capped so that times
			// stay within 120 years of T0 (before 2155, see take.lua)
			f := fillOf(limits[rng.IntN(len(limits))])
			if jump := time.Duration(rng.Float64() * 1.2 * float64(f)); jumped+jump < 120*365*24*time.Hour {
				jumped += jump
			}
		}
		if rng.IntN(20) == 0 { // a rule's rate changed
			limits[rng.IntN(len(limits))] = randLimit(rng)
		}
		sent := time.Now()
		now := limitertest.T0.Add(sent.Sub(start) + jumped)

		reqs := make([]limiter.Request, 1+rng.IntN(4))
		stored := make([]limiter.State, len(reqs))
		for i := range reqs {
			b := rng.IntN(len(buckets))
			l := limits[b]
			reqs[i] = limiter.Request{Key: buckets[b], Limit: l, Hits: randHits(rng, l)}
			stored[i] = model[buckets[b]]
		}

		if rng.IntN(8) == 0 {
			// A Refund, request after request, as limiter.Refund.
			refunds++
			if err := store.Refund(ctx, now, reqs); err != nil {
				t.Fatalf("step %d: Refund(%v, %v): %v", step, now, reqs, err)
			}
			for _, r := range reqs {
				switch s := limiter.Refund(r.Limit, model[r.Key], now, r.Hits); {
				case s.Full(now):
					model[r.Key] = limiter.State{}
				case s != model[r.Key]:
					model[r.Key] = s
				}
			}
			checkStored(t, rdb, store, model, stored, reqs, now, fmt.Sprintf("step %d: after Refund(%v, %v)", step, now, reqs))
			continue
		}

		takes++
		for i := range reqs {
			reqs[i].MaxWait = randMaxWait(rng, reqs[i].Limit, now)
			reqs[i].Shadow = rng.IntN(5) == 0
			if rng.IntN(3) == 0 {
				reqs[i].Counting = limiter.CountWhereDenied
			}
			if reqs[i].Charge() {
				charges++
			}
		}
		want, next, allowed := limiter.DecideAll(now, reqs, stored)
		got, err := store.Take(ctx, now, reqs)
		if err != nil {
			t.Fatalf("step %d: Take(%v, %v): %v", step, now, reqs, err)
		}
		if !slices.Equal(got, want) {
			// Buckets full within the step's latency (plus a millisecond
			// for Redis's cached clock) may have expired meanwhile.
			latency := time.Since(sent).Microseconds() + 1000
			expired := slices.Clone(stored)
			for i, st := range stored {
				if st != (limiter.State{}) && st.TAT-now.UnixMicro() < latency {
					expired[i] = limiter.State{}
				}
			}
			if w, n, a := limiter.DecideAll(now, reqs, expired); slices.Equal(got, w) {
				want, next, allowed, stored = w, n, a, expired
			}
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("step %d: Take(%v, %v)[%d] = %+v, DecideAll gives %+v", step, now, reqs, i, got[i], want[i])
			}
			if got[i].Wait > 0 {
				waits++
			}
			if reqs[i].Shadow && !got[i].Allowed {
				shadows++
			}
		}
		if !allowed {
			denied++
		}
		// DecideAll's write rule: for each key, the state the last request
		// on it left, where it differs from the stored one.
		last := map[string]int{}
		for i, r := range reqs {
			last[r.Key] = i
		}
		for key, i := range last {
			if next[i] != stored[i] {
				model[key] = next[i]
			}
		}
		checkStored(t, rdb, store, model, stored, reqs, now, fmt.Sprintf("step %d: after Take(%v, %v)", step, now, reqs))
	}
	t.Logf("%d Takes (%d denied; %d charges, %d reservations, %d shadow denials), %d Refunds",
		takes, denied, charges, waits, shadows, refunds)
}

// checkStored compares what Redis holds for the buckets of reqs with model,
// and, for those whose state changed from stored (the states before the
// call, one per request), the TTL with the time until full.
func checkStored(t *testing.T, rdb redis.Cmdable, store *redisstore.Store, model map[string]limiter.State, stored []limiter.State, reqs []limiter.Request, now time.Time, call string) {
	t.Helper()
	ctx := context.Background()
	for i, r := range reqs {
		s := model[r.Key]
		key := store.Key(r.Key)
		v, err := rdb.Get(ctx, key).Result()
		if err == redis.Nil && s.TAT-now.UnixMicro() < 100_000 {
			continue // full, or expired already: it was full within the test's own latency
		}
		if err != nil {
			t.Fatalf("%s: GET %s: %v", call, key, err)
		}
		if w := fmt.Sprintf("%d:%d:%d:%d", s.TAT, s.Frac, s.Count, s.PeriodUS); v != w {
			t.Fatalf("%s: %s holds %q, want %q", call, key, v, w)
		}
		if s == stored[i] {
			continue // not written: its TTL counts from an earlier now
		}
		// PTTL counts down from the time until full, rounded up to the
		// millisecond (allow for the test's own slowness).
		untilFull := s.TAT - now.UnixMicro()
		if s.Frac > 0 {
			untilFull++
		}
		wantMS := (untilFull + 999) / 1000
		if wantMS > 1000 {
			pttl, err := rdb.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatalf("PTTL %s: %v", key, err)
			}
			if ms := pttl.Milliseconds(); ms > wantMS || ms < wantMS-500 {
				t.Fatalf("%s: PTTL %s = %dms, want %dms (the time until full)", call, key, ms, wantMS)
			}
		}
	}
}

func TestMatchesDecideAllStandalone(t *testing.T) {
	c := standalone(t).Client()
	testMatchesDecideAll(t, c, c, 3000)
}

// TestMatchesDecideAllTakeLua: one-request Takes sent alone go through
// take_one.lua above; here through take.lua, whose path for them (as when
// merged with others) must decide the same.
func TestMatchesDecideAllTakeLua(t *testing.T) {
	c := standalone(t).Client()
	testMatchesDecideAll(t, c, c, 1000, redisstore.OnlyTakeLua)
}

func TestMatchesDecideAllCluster(t *testing.T) {
	c := cluster(t).Client()
	testMatchesDecideAll(t, c, c, 1500)
}

// parseState reads a stored "TAT:Frac:Count:Period" (or the first
// format's "TAT:Frac").
func parseState(t *testing.T, v string) limiter.State {
	t.Helper()
	var st limiter.State
	if _, err := redisstore.FmtSscan(v, &st); err != nil {
		t.Fatalf("stored state %q: %v", v, err)
	}
	return st
}
