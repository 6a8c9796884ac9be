package limiter_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestLongRunAdmitsTheRate sends one bucket random requests (0 to 3 tokens,
// 50 ms apart on average, where a token arrives every 333333⅓ µs) over an
// hour of fake time that moves in random steps and, halfway, steps back ten
// seconds. After every request, the tokens admitted so far are at most
// burst + rate·t, t being the furthest the clock has been; and since the
// requests come faster than the tokens and keep the bucket drained, at the
// end they are at least 99.9% of it. It runs on Decide with the state kept
// by the test, which reads the step back as an emptier bucket, and on a
// MemoryStore, which reads it as a clock standing still.
func TestLongRunAdmitsTheRate(t *testing.T) {
	limit := limiter.Limit{Count: 3, Period: time.Second, Burst: 10}
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const (
		run      = time.Hour
		stepBack = 10 * time.Second
		maxStep  = 100 * time.Millisecond
	)
	for _, tc := range []struct {
		name string
		take func(t *testing.T) func(now time.Time, hits int64) limiter.Decision
	}{
		{"Decide", func(t *testing.T) func(time.Time, int64) limiter.Decision {
			var s limiter.State
			return func(now time.Time, hits int64) limiter.Decision {
				var d limiter.Decision
				s, d = limiter.Decide(limiter.Request{Key: "k", Limit: limit, Hits: hits}, s, now)
				return d
			}
		}},
		{"MemoryStore", func(t *testing.T) func(time.Time, int64) limiter.Decision {
			m := limiter.NewMemoryStore(limiter.MemoryOptions{})
			return func(now time.Time, hits int64) limiter.Decision {
				d, err := m.Take(context.Background(), now, []limiter.Request{{Key: "k", Limit: limit, Hits: hits}})
				if err != nil {
					t.Fatalf("Take(%v, %d) = %v", now, hits, err)
				}
				return d[0]
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			take := tc.take(t)
			rng := rand.New(rand.NewPCG(1, 2))
			// bound is burst + rate·t in whole tokens, t the furthest
			// the clock has been (whole microseconds count).
			bound := func(furthest time.Time) int64 {
				us := furthest.UnixMicro() - t0.UnixMicro()
				return limit.Burst + us*limit.Count/limit.Period.Microseconds()
			}
			now, furthest := t0, t0
			var admitted, requests, steppedBack int64
			for furthest.Sub(t0) < run {
				hits := rng.Int64N(4)
				d := take(now, hits)
				requests++
				if d.Allowed {
					admitted += hits
				}
				if b := bound(furthest); admitted > b {
					t.Fatalf("request %d at t0+%v (for %d): %d tokens admitted, more than burst + rate·t = %d (t = %v)",
						requests, now.Sub(t0), hits, admitted, b, furthest.Sub(t0))
				}
				if steppedBack == 0 && furthest.Sub(t0) >= run/2 {
					now = now.Add(-stepBack)
					steppedBack = requests
				} else {
					now = now.Add(time.Duration(rng.Int64N(int64(maxStep))))
				}
				if now.After(furthest) {
					furthest = now
				}
			}
			b := bound(furthest)
			t.Logf("%d requests over %v: %d tokens admitted of burst + rate·t = %d (%.4f%%)",
				requests, furthest.Sub(t0), admitted, b, 100*float64(admitted)/float64(b))
			if steppedBack == 0 {
				t.Fatalf("the clock never stepped back")
			}
			if admitted*1000 < b*999 {
				t.Errorf("%d tokens admitted over %v of a bucket kept drained, less than 99.9%% of burst + rate·t = %d",
					admitted, furthest.Sub(t0), b)
			}
		})
	}
}
