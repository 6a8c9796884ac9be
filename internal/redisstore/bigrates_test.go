package redisstore_test

import (
	"context"
	"math/big"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

// backends are the two stores a rule must limit alike on: memory, and
// Redis deciding at the caller's now (exact values).
func backends() []struct {
	name  string
	store func(t *testing.T) limiter.Store
} {
	return []struct {
		name  string
		store func(t *testing.T) limiter.Store
	}{
		{"memory", func(t *testing.T) limiter.Store { return limiter.NewMemoryStore(limiter.MemoryOptions{}) }},
		{"redis", func(t *testing.T) limiter.Store { return callerClockStore(t) }},
	}
}

// parseRule parses one incumbent-style file and returns the limit of the
// rule that domain d, key k, value v matches.
func parseRule(t *testing.T, file, value string) limiter.Limit {
	t.Helper()
	set, err := config.Parse([]config.File{{Name: "big.yaml", Data: []byte(file)}})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	r := set.Lookup("d", []config.Entry{{Key: "k", Value: value}})
	if r == nil || len(r.Limits) != 1 {
		t.Fatalf("Lookup(d, k=%s) = %+v, want a rule with one limit", value, r)
	}
	return r.Limits[0].Limit
}

// tokenTime is the time n tokens of l take to arrive, n·Period/Count µs,
// rounded up, computed apart from limiter's arithmetic.
func tokenTime(l limiter.Limit, n int64) time.Duration {
	num := new(big.Int).Mul(big.NewInt(n), big.NewInt(l.Period.Microseconds()))
	num.Add(num, big.NewInt(l.Count-1))
	num.Quo(num, big.NewInt(l.Count))
	return time.Duration(num.Int64()) * time.Microsecond
}

// tokensIn is the whole number of tokens of l that arrive in d,
// floor(d·Count/Period), computed apart from limiter's arithmetic.
func tokensIn(l limiter.Limit, d time.Duration) int64 {
	num := new(big.Int).Mul(big.NewInt(d.Microseconds()), big.NewInt(l.Count))
	return num.Quo(num, big.NewInt(l.Period.Microseconds())).Int64()
}

// TestIncumbentSizedRulesLoadAndLimit: rules with the largest rates the
// incumbent's files can write (requests_per_unit is a uint32), with the
// default burst, load through config.Parse and limit exactly on both
// backends: the whole burst is admitted at once, one more token is denied
// until its time has come, exactly, and Envoy's largest hits_addend is more
// than the burst of a 10^9 rule.
func TestIncumbentSizedRulesLoadAndLimit(t *testing.T) {
	const file = `domain: d
descriptors:
  - {key: k, value: billion-second, rate_limit: {unit: second, requests_per_unit: 1000000000}}
  - {key: k, value: uint32-second, rate_limit: {unit: second, requests_per_unit: 4294967295}}
  - {key: k, value: uint32-minute, rate_limit: {unit: minute, requests_per_unit: 4294967295}}
  - {key: k, value: uint32-hour, rate_limit: {unit: hour, requests_per_unit: 4294967295}}
  - {key: k, value: uint32-day, rate_limit: {unit: day, requests_per_unit: 4294967295}}
  - {key: k, value: uint32-week, rate_limit: {unit: week, requests_per_unit: 4294967295}}
  - {key: k, value: uint32-month, rate_limit: {unit: month, requests_per_unit: 4294967295}}
  - {key: k, value: uint32-year, rate_limit: {unit: year, requests_per_unit: 4294967295}}
`
	ctx := context.Background()
	for _, b := range backends() {
		for _, value := range []string{"billion-second", "uint32-second", "uint32-minute", "uint32-hour", "uint32-day", "uint32-week", "uint32-month", "uint32-year"} {
			t.Run(b.name+"/"+value, func(t *testing.T) {
				l := parseRule(t, file, value)
				if l.Burst != l.Count {
					t.Fatalf("burst %d, want the default, requests_per_unit %d", l.Burst, l.Count)
				}
				store := b.store(t)
				key := t.Name()
				take := func(at time.Duration, hits int64) limiter.Decision {
					t.Helper()
					d, err := store.Take(ctx, limitertest.T0.Add(at), []limiter.Request{{Key: key, Limit: l, Hits: hits}})
					if err != nil {
						t.Fatalf("Take(t0+%v, %d): %v", at, hits, err)
					}
					return d[0]
				}
				one := tokenTime(l, 1)
				steps := []chargeStep{
					{0, 0, limiter.Decision{Allowed: true, Remaining: l.Count}},
					{0, 4294967296, limiter.Decision{ExceedsBurst: true}}, // more than any burst here
					{0, l.Count - 1, limiter.Decision{Allowed: true, Remaining: 1, ResetAfter: tokenTime(l, l.Count-1)}},
					{0, 2, limiter.Decision{RetryAfter: one, ResetAfter: tokenTime(l, l.Count-1)}},
					{0, 1, limiter.Decision{Allowed: true, ResetAfter: l.Period}},
					{0, 1, limiter.Decision{RetryAfter: one, ResetAfter: l.Period}},
					{one - time.Microsecond, 1, limiter.Decision{RetryAfter: time.Microsecond, ResetAfter: l.Period - one + time.Microsecond}},
					// In one (rounded up) at least one token has come, more
					// for a per-second rule (1000 in a µs at 10^9/s).
					{one, 1, limiter.Decision{Allowed: true, Remaining: tokensIn(l, one) - 1, ResetAfter: l.Period}},
					{l.Period + one, l.Count, limiter.Decision{Allowed: true, ResetAfter: l.Period}},
				}
				for i, s := range steps {
					if got := take(s.at, s.hits); got != s.want {
						t.Errorf("step %d: Take(t0+%v, %d) = %+v, want %+v", i, s.at, s.hits, got, s.want)
					}
				}
			})
		}
	}
}

// chargeStep is a step of the tests here: at t0 + at, hits taken (or
// charged) on one bucket, and the decision wanted.
type chargeStep struct {
	at   time.Duration
	hits int64
	want limiter.Decision
}

// TestStreamDoneChargeUnderDefaultOverdraft: an incumbent-style rule (no
// overdraft in the file) under the server's default overdraft (one burst,
// limiter.Limit.WithOverdraft): a stream-done charge larger than what is
// left is recorded, and the request-time checks after it (hits_addend 0,
// and hits 1) are denied until the debt is paid, with an exact Retry-After;
// without the default overdraft the same charge is dropped.
func TestStreamDoneChargeUnderDefaultOverdraft(t *testing.T) {
	const file = `domain: d
descriptors:
  - {key: k, value: tokens, rate_limit: {unit: minute, requests_per_unit: 1000}}
`
	ctx := context.Background()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			rule := parseRule(t, file, "tokens")
			l := rule.WithOverdraft(1)
			if l.MaxDebt != 1000 {
				t.Fatalf("WithOverdraft(1).MaxDebt = %d, want 1000", l.MaxDebt)
			}
			tok := func(n int64) time.Duration { return time.Duration(n) * 60 * time.Millisecond } // 60 ms a token
			for _, tt := range []struct {
				name  string
				limit limiter.Limit
				steps []chargeStep
			}{
				{"default overdraft", l, []chargeStep{
					{0, 1, limiter.Decision{Allowed: true, Remaining: 999, ResetAfter: tok(1)}},
					// The stream-done charge: 1500 tokens, 999 left. Recorded
					// (501 in debt); admitted, as the bucket was not in debt
					// (Envoy ignores the answer).
					{0, 1500, limiter.Decision{Allowed: true, ResetAfter: tok(1501)}},
					// The request-time check of the next request.
					{0, 0, limiter.Decision{RetryAfter: tok(501), ResetAfter: tok(1501)}},
					// A request-time hit in debt is denied, and counted: it
					// may retry once the debt, its own token included, is paid.
					{0, 1, limiter.Decision{RetryAfter: tok(502), ResetAfter: tok(1502)}},
					{tok(502) - time.Microsecond, 0, limiter.Decision{RetryAfter: time.Microsecond, ResetAfter: tok(1000) + time.Microsecond}},
					{tok(502), 1, limiter.Decision{Allowed: true, ResetAfter: tok(1001)}},
					// Another charge, from a bucket in debt: denied, recorded
					// down to the floor, one burst below empty.
					{tok(502), 1500, limiter.Decision{RetryAfter: tok(1000), ResetAfter: tok(2000)}},
					{tok(1502) - time.Microsecond, 0, limiter.Decision{RetryAfter: time.Microsecond, ResetAfter: tok(1000) + time.Microsecond}},
					{tok(1502), 1, limiter.Decision{Allowed: true, ResetAfter: tok(1001)}},
				}},
				{"no overdraft: the charge is dropped", rule, []chargeStep{
					{0, 1, limiter.Decision{Allowed: true, Remaining: 999, ResetAfter: tok(1)}},
					{0, 1500, limiter.Decision{ExceedsBurst: true, ResetAfter: tok(1)}},
					{0, 0, limiter.Decision{Allowed: true, Remaining: 999, ResetAfter: tok(1)}},
				}},
			} {
				t.Run(tt.name, func(t *testing.T) {
					store := b.store(t)
					key := t.Name()
					for i, s := range tt.steps {
						d, err := store.Take(ctx, limitertest.T0.Add(s.at), []limiter.Request{{Key: key, Limit: tt.limit, Hits: s.hits}})
						if err != nil {
							t.Fatalf("step %d: Take: %v", i, err)
						}
						if d[0] != s.want {
							t.Errorf("step %d: Take(t0+%v, hits %d) = %+v, want %+v", i, s.at, s.hits, d[0], s.want)
						}
					}
				})
			}
		})
	}
}
