package server_test

import (
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestOverdraftRecordsStreamDoneCharges plays the incumbent's
// check-then-charge pattern over gRPC on both backends, with a rule that
// declares no overdraft: a request-time check (hits_addend 0), then the
// stream-done charge of its cost (hits_addend 1500 with 999 left, Envoy's
// apply_on_stream_done). Under Options.Overdraft the charge is recorded
// and the next check is OVER_LIMIT until the debt is paid, with an exact
// Retry-After; without it, the charge is lost and the check passes.
func TestOverdraftRecordsStreamDoneCharges(t *testing.T) {
	const file = `domain: ai
descriptors:
  - key: model
    rate_limit: {unit: day, requests_per_unit: 1000}
`
	// A day, not a minute: Redis expires a bucket's key by its own clock
	// once the bucket would be full again (86.4 s for a token here), while
	// the store decides on this test's clock (CallerClock); at 60 ms a
	// token a busy machine let the key of the first request expire.
	for backend, newStore := range backends(t) {
		for _, on := range []bool{true, false} {
			name := backend + "/overdraft off"
			if on {
				name = backend + "/overdraft on"
			}
			t.Run(name, func(t *testing.T) {
				clock := clocktest.New()
				opts := server.Options{Now: clock.Now, Overdraft: server.Overdraft{On: on}}
				opts.Store = newStore(t)
				c, _ := startServer(t, opts, server.MustParse(t, file))
				check := func() *rlsv3.RateLimitResponse {
					return call(t, c, request("ai", withHits(desc("model", "m"), 0)))
				}
				charge := func(hits uint64) *rlsv3.RateLimitResponse {
					return call(t, c, request("ai", withHits(desc("model", "m"), hits)))
				}
				if r := charge(1); r.GetOverallCode() != ok {
					t.Fatalf("first request: %v", r.GetOverallCode())
				}
				charge(1500) // stream-done: Envoy ignores the answer
				r := check()
				if !on {
					if r.GetOverallCode() != ok || r.GetStatuses()[0].GetLimitRemaining() != 999 {
						t.Fatalf("check after a dropped charge: %v remaining %d, want OK remaining 999",
							r.GetOverallCode(), r.GetStatuses()[0].GetLimitRemaining())
					}
					return
				}
				// 501 tokens of debt at 86.4 s a token: 43286.4 s, 43287 in
				// whole seconds.
				if r.GetOverallCode() != over || header(r, "retry-after") != "43287" {
					t.Fatalf("check after the charge: %v Retry-After %q, want OVER_LIMIT 43287", r.GetOverallCode(), header(r, "retry-after"))
				}
				clock.Advance(43286400*time.Millisecond - time.Microsecond)
				if r := check(); r.GetOverallCode() != over || header(r, "retry-after") != "1" {
					t.Fatalf("a µs before paid: %v Retry-After %q, want OVER_LIMIT 1", r.GetOverallCode(), header(r, "retry-after"))
				}
				clock.Advance(time.Microsecond)
				if r := check(); r.GetOverallCode() != ok {
					t.Fatalf("once paid: %v, want OK", r.GetOverallCode())
				}
			})
		}
	}
}

// TestOverdraftCounting: a request that one descriptor denies still
// spends on the others under limiter.CountAlways (the incumbent's default
// counting), and not under limiter.CountWhereDenied (its
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true); on both backends.
func TestOverdraftCounting(t *testing.T) {
	const file = `domain: ai
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: global
    rate_limit: {unit: minute, requests_per_unit: 1000}
`
	for backend, newStore := range backends(t) {
		for _, tt := range []struct {
			counting limiter.Counting
			global   uint32 // remaining after the denied request
			// denied is how the observer sees the denied request: the
			// global charge counted as charged only where it is recorded.
			denied string
		}{
			{limiter.CountAlways, 998, "ai OK OVER_LIMIT: over_limit(charged 1) denied_by_other(charged 1)"},
			{limiter.CountWhereDenied, 999, "ai OK OVER_LIMIT: over_limit(charged 1) denied_by_other"},
		} {
			t.Run(backend+"/"+tt.counting.String(), func(t *testing.T) {
				rec := &recorder[string]{keep: outcomes}
				opts := server.Options{Now: clocktest.New().Now, Overdraft: server.Overdraft{On: true, Counting: tt.counting}, Observer: rec}
				opts.Store = newStore(t)
				c, _ := startServer(t, opts, server.MustParse(t, file))
				both := func() *rlsv3.RateLimitResponse {
					return call(t, c, request("ai", desc("user", "u"), desc("global", "g")))
				}
				if r := both(); r.GetOverallCode() != ok {
					t.Fatalf("first request: %v", r.GetOverallCode())
				}
				// The user's bucket is empty: the second request is denied
				// (admission is as without the overdraft), and its hits are
				// recorded where Counting says.
				r := both()
				if r.GetOverallCode() != over {
					t.Fatalf("second request: %v, want OVER_LIMIT", r.GetOverallCode())
				}
				// One token a minute, and the denied hit is owed: the next
				// token is there in two minutes.
				if got := r.GetStatuses()[0].GetDurationUntilReset().AsDuration(); got != 2*time.Minute {
					t.Errorf("user's duration_until_reset %v, want 2m (the denied hit recorded)", got)
				}
				rec.mu.Lock()
				if len(rec.calls) != 2 || rec.calls[1] != tt.denied {
					t.Errorf("observed %q, want the second %q", rec.calls, tt.denied)
				}
				rec.mu.Unlock()
				r = call(t, c, request("ai", withHits(desc("global", "g"), 0)))
				if got := r.GetStatuses()[0].GetLimitRemaining(); got != tt.global {
					t.Errorf("global remaining %d after the denied request, want %d", got, tt.global)
				}
			})
		}
	}
}

// TestOverdraftReachesLimitOverrides: a limit Envoy sends with the
// descriptor (the route's limit override, as Envoy Gateway's translator
// does) gets the default debt too: a charge above what is left is recorded.
func TestOverdraftReachesLimitOverrides(t *testing.T) {
	const file = `domain: ai
descriptors:
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 5}
`
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("overdraft %v", on), func(t *testing.T) {
			c, _ := startServer(t, server.Options{Now: clocktest.New().Now, Overdraft: server.Overdraft{On: on}}, server.MustParse(t, file))
			overridden := func(hits uint64) *rlsv3.RateLimitResponse {
				return call(t, c, request("ai", overridePerHour(withHits(desc("model", "m"), hits), 100)))
			}
			overridden(60)
			overridden(60) // 40 left: recorded only under the overdraft
			want := ok
			if on {
				want = over
			}
			if r := overridden(0); r.GetOverallCode() != want {
				t.Errorf("check after the charge: %v, want %v", r.GetOverallCode(), want)
			}
		})
	}
}
