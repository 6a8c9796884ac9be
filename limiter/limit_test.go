package limiter_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestLimitValidate: the bounds of a Limit, and that limits whose spans
// would overflow int64 are refused with the true numbers in the message,
// not wrapped ones.
func TestLimitValidate(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		name  string
		limit limiter.Limit
		want  string // a part of the error; "" for a valid limit
	}{
		{"ten a minute", limiter.Limit{Count: 10, Period: time.Minute, Burst: 20}, ""},
		{"fills in exactly MaxFill", limiter.Limit{Count: 1, Period: limiter.MaxFill, Burst: 1}, ""},
		{"MaxTokens at the smallest rate", limiter.Limit{Count: limiter.MaxTokens, Period: time.Microsecond, Burst: 1}, ""},
		{"debt paid in exactly MaxFill", limiter.Limit{Count: 1, Period: day, Burst: 1, MaxDebt: 100*365 - 1}, ""},
		{"no count", limiter.Limit{Period: time.Second, Burst: 1}, "count 0: must be at least 1"},
		{"sub-microsecond period", limiter.Limit{Count: 1, Period: time.Nanosecond, Burst: 1}, "period 1ns: must be at least 1µs"},
		{"burst above MaxTokens", limiter.Limit{Count: 1, Period: time.Second, Burst: limiter.MaxTokens + 1}, "must be at most 1099511627776"},
		{"fills in MaxFill and a microsecond", limiter.Limit{Count: 1, Period: limiter.MaxFill + time.Microsecond, Burst: 1},
			"the bucket would take 876000h0m0.000001s to fill, more than 876000h0m0s"},
		// Burst·Period is 8.64e22 µs: computed, it wraps int64 to a fill
		// time under MaxFill, and the bucket admitted 110,000,000 tokens
		// every time.
		{"fill time wraps int64", limiter.Limit{Count: 1, Period: day, Burst: 1_000_000_000_000},
			"burst 1000000000000 at 1 per 24h0m0s: the bucket would take about 2.74e+09 years to fill, more than 876000h0m0s"},
		{"fill time beyond a Duration", limiter.Limit{Count: 1, Period: 200 * 365 * day, Burst: 2},
			"the bucket would take about 400 years to fill"},
		{"debt one day beyond MaxFill", limiter.Limit{Count: 1, Period: day, Burst: 1, MaxDebt: 100 * 365},
			"burst 1 and max debt 36500 at 1 per 24h0m0s: paying the debt and filling would take 876024h0m0s, more than 876000h0m0s"},
		// (Burst+MaxDebt)·Period wraps int64 the same way.
		{"debt span wraps int64", limiter.Limit{Count: 1, Period: day, Burst: 1, MaxDebt: 1_000_000_000_000},
			"paying the debt and filling would take about 2.74e+09 years"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.limit.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("%+v.Validate() = %v, want nil", tt.limit, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("%+v.Validate() = %v, want an error containing %q", tt.limit, err, tt.want)
			case err == nil && tt.limit.FillTime() <= 0:
				t.Errorf("%+v.FillTime() = %v for a valid limit", tt.limit, tt.limit.FillTime())
			}
		})
	}
}

// TestDecideAtTheBounds: for limits at the edge of what Validate accepts,
// and hits from 0 to MaxTokens, no span overflows: every duration Decide
// answers lies between 0 and the time Burst+MaxDebt tokens take (at most
// MaxFill), and Remaining between 0 and Burst.
func TestDecideAtTheBounds(t *testing.T) {
	const day = 24 * time.Hour
	limits := []limiter.Limit{
		{Count: 1, Period: day, Burst: 100 * 365},
		{Count: 1, Period: limiter.MaxFill, Burst: 1},
		{Count: limiter.MaxTokens, Period: time.Microsecond, Burst: 1},
		{Count: limiter.MaxTokens, Period: limiter.MaxFill, Burst: 1 << 10},
		{Count: 1, Period: day, Burst: 1, MaxDebt: 100*365 - 1},
		{Count: 7, Period: day, Burst: 7, MaxDebt: 7*100*365 - 7},
	}
	now := time.Unix(1_800_000_000, 0)
	for _, l := range limits {
		if err := l.Validate(); err != nil {
			t.Fatalf("%+v.Validate() = %v, want nil", l, err)
		}
		longest := l.TimeFor(l.Burst+l.MaxDebt) + time.Microsecond
		for _, hits := range []int64{0, 1, l.Burst, l.Burst + 1, l.Burst + l.MaxDebt, limiter.MaxTokens} {
			r := limiter.Request{Key: "k", Limit: l, Hits: hits}
			var s limiter.State
			for i := range 2 { // from full, then from what the first left
				var d limiter.Decision
				s, d = limiter.Decide(r, s, now)
				if d.ResetAfter < 0 || d.ResetAfter > longest || d.RetryAfter < 0 || d.RetryAfter > longest ||
					d.Remaining < 0 || d.Remaining > l.Burst || s.TAT < 0 {
					t.Errorf("Decide(%+v hits %d) #%d = %+v, state %+v: out of bounds (longest %v)", l, hits, i+1, d, s, longest)
				}
			}
		}
	}
}

// TestNames: the names metrics and docs use for the enums, and the
// fallback for a value out of range.
func TestNames(t *testing.T) {
	tests := []struct {
		v    fmt.Stringer
		want string
	}{
		{limiter.FallbackNone, "none"},
		{limiter.FallbackBackendFailed, "backend_failed"},
		{limiter.FallbackBreakerOpen, "breaker_open"},
		{limiter.FallbackOverloaded, "overloaded"},
		{limiter.FallbackTryAgain, "try_again"},
		{limiter.FallbackTryAgain + 1, "Fallback(5)"},
		{limiter.CountAlways, "always"},
		{limiter.CountWhereDenied, "where-denied"},
		{limiter.CountWhereDenied + 1, "Counting(2)"},
	}
	for _, tt := range tests {
		if got := tt.v.String(); got != tt.want {
			t.Errorf("%T(%d).String() = %q, want %q", tt.v, tt.v, got, tt.want)
		}
	}
}
