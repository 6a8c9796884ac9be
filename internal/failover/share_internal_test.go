package failover

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestShare: this replica's share of a limit in Local mode, exactly: each
// of count, burst and max debt divided and rounded down to at least one,
// then cut to fit limiter.MaxFill where the rounding made it fill slower.
func TestShare(t *testing.T) {
	const maxFill = limiter.MaxFill
	tests := []struct {
		name     string
		limit    limiter.Limit
		replicas int64
		want     limiter.Limit
	}{
		{"divided", limiter.Limit{Count: 10, Period: time.Minute, Burst: 20}, 2,
			limiter.Limit{Count: 5, Period: time.Minute, Burst: 10}},
		{"below the hint: one token", limiter.Limit{Count: 1, Period: time.Second, Burst: 2}, 3,
			limiter.Limit{Count: 1, Period: time.Second, Burst: 1}},
		{"post-paid", limiter.Limit{Count: 1000, Period: time.Minute, Burst: 1000, MaxDebt: 5000}, 10,
			limiter.Limit{Count: 100, Period: time.Minute, Burst: 100, MaxDebt: 500}},
		{"post-paid, debt below the hint", limiter.Limit{Count: 1000, Period: time.Minute, Burst: 1000, MaxDebt: 5}, 10,
			limiter.Limit{Count: 100, Period: time.Minute, Burst: 100, MaxDebt: 1}},
		{"count 2n−1: burst cut to fit", limiter.Limit{Count: 3, Period: maxFill / 2, Burst: 6}, 2,
			limiter.Limit{Count: 1, Period: maxFill / 2, Burst: 2}},
		{"count 2n−1, post-paid: burst then debt cut", limiter.Limit{Count: 3, Period: maxFill / 4, Burst: 6, MaxDebt: 6}, 2,
			limiter.Limit{Count: 1, Period: maxFill / 4, Burst: 3, MaxDebt: 1}},
		{"one token too slow: count raised", limiter.Limit{Count: 4, Period: 2 * maxFill, Burst: 1}, 8,
			limiter.Limit{Count: 2, Period: 2 * maxFill, Burst: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(nil, Options{Mode: Local, ReplicasHint: tt.replicas})
			if err != nil {
				t.Fatal(err)
			}
			if got := s.share(tt.limit); got != tt.want {
				t.Errorf("share(%+v) over %d = %+v, want %+v", tt.limit, tt.replicas, got, tt.want)
			}
		})
	}
}

// TestShareOfAValidLimitIsValid walks limits at and near the bounds of
// limiter.Limit.Validate: every valid one has a valid share, never more
// count, burst or debt than the limit itself.
func TestShareOfAValidLimitIsValid(t *testing.T) {
	counts := []int64{1, 2, 3, 5, 7, 19, 1000, limiter.MaxTokens}
	bursts := []int64{1, 2, 3, 6, 19, 1000, limiter.MaxTokens}
	debts := []int64{0, 1, 3, 5000, limiter.MaxTokens}
	periods := []time.Duration{time.Microsecond, time.Second, limiter.MaxFill / 7, limiter.MaxFill / 2, limiter.MaxFill, 2 * limiter.MaxFill}
	checked := 0
	for _, n := range []int64{1, 2, 3, 7, 10, 1000} {
		s, err := New(nil, Options{Mode: Local, ReplicasHint: n})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range counts {
			for _, b := range bursts {
				for _, d := range debts {
					for _, p := range periods {
						for _, burst := range []int64{b, b * min(c, limiter.MaxTokens/b)} { // also near the fill-time bound
							l := limiter.Limit{Count: c, Period: p, Burst: burst, MaxDebt: d}
							if l.Validate() != nil {
								continue
							}
							checked++
							sh := s.share(l)
							if err := sh.Validate(); err != nil {
								t.Errorf("share(%+v) over %d = %+v: %v", l, n, sh, err)
							}
							if sh.Count > l.Count || sh.Burst > l.Burst || sh.MaxDebt > l.MaxDebt || (sh.MaxDebt > 0) != (l.MaxDebt > 0) || sh.Period != l.Period {
								t.Errorf("share(%+v) over %d = %+v: larger than the limit, or not post-paid alike", l, n, sh)
							}
						}
					}
				}
			}
		}
	}
	if checked < 1000 {
		t.Errorf("only %d valid limits checked", checked)
	}
}
