package limiter_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestWithOverdraft: the debt is bursts × Burst, clamped to what Validate
// accepts (MaxTokens, and paid and filled within MaxFill), and a limit with
// its own overdraft keeps it.
func TestWithOverdraft(t *testing.T) {
	const year = 365 * 24 * time.Hour
	for _, tt := range []struct {
		name   string
		l      limiter.Limit
		bursts int64
		want   int64 // MaxDebt
	}{
		{"off", limiter.Limit{Count: 10, Period: time.Second, Burst: 10}, 0, 0},
		{"one burst", limiter.Limit{Count: 10, Period: time.Second, Burst: 10}, 1, 10},
		{"three bursts", limiter.Limit{Count: 10, Period: time.Second, Burst: 20}, 3, 60},
		{"declared debt kept", limiter.Limit{Count: 10, Period: time.Second, Burst: 10, MaxDebt: 7}, 4, 7},
		{"uint32 per second", limiter.Limit{Count: 4294967295, Period: time.Second, Burst: 4294967295}, 1, 4294967295},
		{"uint32 per year", limiter.Limit{Count: 4294967295, Period: year, Burst: 4294967295}, 2, 2 * 4294967295},
		// 99 years to fill: a debt of one more year's tokens at most.
		{"clamped to MaxFill", limiter.Limit{Count: 1, Period: year, Burst: 99}, 1, 1},
		{"100 years to fill: no debt fits", limiter.Limit{Count: 1, Period: year, Burst: 100}, 1, 0},
		{"clamped to MaxTokens", limiter.Limit{Count: limiter.MaxTokens, Period: time.Microsecond, Burst: limiter.MaxTokens}, 5, limiter.MaxTokens},
		{"bursts × Burst overflows", limiter.Limit{Count: limiter.MaxTokens, Period: time.Second, Burst: limiter.MaxTokens}, 1 << 40, limiter.MaxTokens},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.l.Validate(); err != nil {
				t.Fatalf("%+v: %v", tt.l, err)
			}
			got := tt.l.WithOverdraft(tt.bursts)
			if got.MaxDebt != tt.want {
				t.Errorf("%+v.WithOverdraft(%d).MaxDebt = %d, want %d", tt.l, tt.bursts, got.MaxDebt, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("%+v.WithOverdraft(%d) = %+v: %v", tt.l, tt.bursts, got, err)
			}
			// The clamp is tight: one more token of debt is invalid.
			if tt.l.MaxDebt == 0 && got.MaxDebt > 0 && got.MaxDebt < limiter.MaxTokens && got.MaxDebt < tt.bursts*tt.l.Burst {
				more := got
				more.MaxDebt++
				if more.Validate() == nil {
					t.Errorf("MaxDebt %d was clamped, yet %d is valid", got.MaxDebt, more.MaxDebt)
				}
			}
		})
	}
}
