package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
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

// randLimit returns a valid Limit, often near the bounds.
func randLimit(rng *rand.Rand) limiter.Limit {
	maxFill := limiter.MaxFill.Microseconds()
	switch rng.IntN(6) {
	case 0: // everyday limits
		human := []limiter.Limit{
			{Count: 3, Period: time.Second, Burst: 3},
			{Count: 5, Period: time.Minute, Burst: 5},
			{Count: 10, Period: time.Second, Burst: 20},
			{Count: 1, Period: time.Hour, Burst: 1},
			{Count: 7, Period: 1001 * time.Microsecond, Burst: 3},
		}
		return human[rng.IntN(len(human))]
	case 1: // Count at the bound, Burst·Count = 2^50, and periods up to
		// the longest Duration (more than 2^53 µs)
		l := limiter.Limit{Count: limiter.MaxTokens, Burst: 1 << 10}
		if rng.IntN(2) == 0 {
			l.Burst = 1
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
	}
	for {
		count := logUniform(rng, 1, limiter.MaxTokens)
		burst := logUniform(rng, 1, min(limiter.MaxTokens, (1<<50)/count))
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

// randHits returns a number of tokens to ask from a bucket of burst b.
func randHits(rng *rand.Rand, b int64) int64 {
	switch rng.IntN(8) {
	case 0:
		return 0
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

// fillOf is a Limit's fill time, approximately.
func fillOf(l limiter.Limit) time.Duration {
	return time.Duration(float64(l.Period) * float64(l.Burst) / float64(l.Count))
}

// testMatchesDecideAll runs random Takes against the store and against
// limiter.DecideAll with a map of states, and requires exactly the same
// decisions and stored states.
//
// The store's keys expire on Redis's clock while decisions use the caller's
// now; so that a key never vanishes before the model's bucket is full, now
// advances by the real time elapsed plus random jumps. A key whose bucket
// is full within the step's own latency may still vanish while the Take
// is on its way (now is read before it is sent, and a coalesced call can
// wait longer than the previous one did): for those, the store may also
// answer as if the bucket were full.
func testMatchesDecideAll(t *testing.T, c redisstore.Client, rdb redis.Cmdable, steps int) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	store := newStore(t, c, redisstore.CallerClock)
	ctx := context.Background()

	buckets := []string{"a", "b{x}", "\x00", "é", "", "a:b", "v1\x01a"}
	limits := make([]limiter.Limit, len(buckets))
	for i := range limits {
		limits[i] = randLimit(rng)
	}
	model := map[string]limiter.State{}
	start := time.Now()
	var jumped time.Duration
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
			if f := fillOf(limits[rng.IntN(len(limits))]); jumped+f < 120*365*24*time.Hour {
				jumped += time.Duration(rng.Float64() * 1.2 * float64(f))
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
			reqs[i] = limiter.Request{Key: buckets[b], Limit: limits[b], Hits: randHits(rng, limits[b].Burst)}
			stored[i] = model[buckets[b]]
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
				want, next, allowed = w, n, a
			}
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("step %d: Take(%v, %v)[%d] = %+v, DecideAll gives %+v", step, now, reqs, i, got[i], want[i])
			}
		}
		if !allowed {
			continue
		}
		for i, r := range reqs {
			if r.Hits > 0 {
				model[r.Key] = next[i]
			}
		}
		for _, r := range reqs {
			if r.Hits == 0 {
				continue
			}
			s := model[r.Key]
			key := store.Key(r.Key)
			v, err := rdb.Get(ctx, key).Result()
			if err == redis.Nil && s.TAT-now.UnixMicro() < 100_000 {
				continue // expired already: it was full within the test's own latency
			}
			if err != nil {
				t.Fatalf("step %d: GET %s: %v", step, key, err)
			}
			if w := fmt.Sprintf("%d:%d", s.TAT, s.Frac); v != w {
				t.Fatalf("step %d: after Take(%v, %v), %s holds %q, want %q", step, now, reqs, key, v, w)
			}
			// PTTL counts down from the time until full, rounded up to
			// the millisecond (allow for the test's own slowness).
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
					t.Fatalf("step %d: PTTL %s = %dms, want %dms (the time until full)", step, key, ms, wantMS)
				}
			}
		}
	}
}

func TestMatchesDecideAllStandalone(t *testing.T) {
	c := standalone(t).Client()
	testMatchesDecideAll(t, c, c, 3000)
}

func TestMatchesDecideAllCluster(t *testing.T) {
	c := cluster(t).Client()
	testMatchesDecideAll(t, c, c, 1500)
}

// parseState reads a stored "TAT:Frac".
func parseState(t *testing.T, v string) limiter.State {
	t.Helper()
	a, b, ok := strings.Cut(v, ":")
	tat, err1 := strconv.ParseInt(a, 10, 64)
	frac, err2 := strconv.ParseInt(b, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("stored state %q is not TAT:Frac", v)
	}
	return limiter.State{TAT: tat, Frac: frac}
}
