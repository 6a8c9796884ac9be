package server_test

import (
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

const refundConfig = `
domain: ai
descriptors:
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 100000, counts: tokens}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 10, counts: tokens}
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 10}
`

func negative(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
	d.IsNegativeHits = true
	return d
}

// TestRefundAndSpendLoopIsBounded: a caller that sends [refund 1e9, take
// 1] in one request, ten times a second for a minute, on a 10-a-minute
// token bucket, is admitted no more than rate·t + burst times (the refunds
// give back nothing: nobody reserved anything), on both backends; and is
// denied once the bucket is empty. With RefundsUnbounded (the incumbent's
// behaviour) the same loop is admitted every time.
func TestRefundAndSpendLoopIsBounded(t *testing.T) {
	for name, store := range backends(t) {
		for _, tt := range []struct {
			policy  server.RefundPolicy
			bounded bool
		}{{0, true}, {server.RefundsTaken, true}, {server.RefundsUnbounded, false}} {
			t.Run(fmt.Sprintf("%s/policy=%d", name, tt.policy), func(t *testing.T) {
				clock := clocktest.New()
				c, _ := startServer(t, server.Options{Store: store(t), Now: clock.Now, Refunds: tt.policy}, server.MustParse(t, refundConfig))
				const steps, every = 600, 100 * time.Millisecond
				admitted, firstDenied := 0, -1
				for i := range steps {
					resp := call(t, c, request("ai", negative(withHits(desc("small", "shared"), 1e9)), withHits(desc("small", "shared"), 1)))
					if resp.GetOverallCode() == ok {
						admitted++
					} else if firstDenied < 0 {
						firstDenied = i
					}
					clock.Advance(every)
				}
				// 10 a minute over 60 s, burst 10.
				bound := 10 + 10*int(time.Duration(steps)*every/time.Minute)
				switch {
				case tt.bounded && admitted > bound:
					t.Errorf("policy %d: %d admitted, more than rate·t + burst = %d", tt.policy, admitted, bound)
				case tt.bounded && firstDenied != 10:
					t.Errorf("policy %d: first denial at call %d, want call 10 (burst 10, then empty)", tt.policy, firstDenied)
				case !tt.bounded && admitted != steps:
					t.Errorf("RefundsUnbounded: %d admitted of %d, want all (the incumbent's refunds refill the bucket)", admitted, steps)
				}
			})
		}
	}
}

// TestNegativeHitsGiveBackOnlyWhatWasTaken: what a refund gives back is bounded
// by what calls without a refund took from the bucket, once; a refund on a
// limit that counts requests gives nothing back; the observer learns what
// was asked and given.
func TestNegativeHitsGiveBackOnlyWhatWasTaken(t *testing.T) {
	obs := &recorder[server.RefundOutcome]{keep: func(c server.Call) server.RefundOutcome { return c.Refunds }}
	clock := clocktest.New()
	c, _ := startServer(t, server.Options{Now: clock.Now, Observer: obs}, server.MustParse(t, refundConfig))
	remaining := func(key string) int64 {
		t.Helper()
		return int64(call(t, c, request("ai", withHits(desc(key, "x"), 0))).GetStatuses()[0].GetLimitRemaining())
	}
	steps := []struct {
		name    string
		req     *rlsv3.RateLimitRequest
		key     string
		left    int64
		outcome server.RefundOutcome
	}{
		{"take 20, denied", request("ai", withHits(desc("small", "x"), 20)), "small", 10, server.RefundOutcome{}},
		{"refund after a denied take", request("ai", negative(withHits(desc("small", "x"), 5))), "small", 10, server.RefundOutcome{Asked: 5, Given: 0}},
		{"reserve 4", request("ai", withHits(desc("small", "x"), 4)), "small", 6, server.RefundOutcome{}},
		{"refund 1e9 after 4 taken", request("ai", negative(withHits(desc("small", "x"), 1e9))), "small", 10, server.RefundOutcome{Asked: 1e9, Given: 4}},
		{"refund again", request("ai", negative(withHits(desc("small", "x"), 3))), "small", 10, server.RefundOutcome{Asked: 3, Given: 0}},
		{"take 5 in a call with a refund", request("ai", negative(withHits(desc("small", "x"), 1)), withHits(desc("small", "x"), 5)), "small", 5, server.RefundOutcome{Asked: 1, Given: 0}},
		{"refund of a settle's charge", request("ai", negative(withHits(desc("small", "x"), 5))), "small", 5, server.RefundOutcome{Asked: 5, Given: 0}},
		{"take 2 on a request limit", request("ai", withHits(desc("client", "x"), 2)), "client", 8, server.RefundOutcome{}},
		{"refund on a request limit", request("ai", negative(withHits(desc("client", "x"), 2))), "client", 8, server.RefundOutcome{Asked: 2, Given: 0}},
	}
	for _, st := range steps {
		obs.mu.Lock()
		obs.calls = nil
		obs.mu.Unlock()
		call(t, c, st.req)
		obs.mu.Lock()
		got := obs.calls[0]
		obs.mu.Unlock()
		if got != st.outcome {
			t.Errorf("%s: refund outcome %+v, want %+v", st.name, got, st.outcome)
		}
		if left := remaining(st.key); left != st.left {
			t.Errorf("%s: %d left, want %d", st.name, left, st.left)
		}
	}
}

// TestReserveThenSettle is the reserve-then-settle flow of issue 20 on
// both backends: reserve an estimate of 1000 tokens at request time; at
// stream done, in one call, give the estimate back and charge the actual
// 300. The bucket ends 300 lower than a bucket that saw only the same
// earlier traffic (the refund is made before the charge, so neither part
// is lost), whether it started full or half spent, and whether time passed
// during the stream.
func TestReserveThenSettle(t *testing.T) {
	for name, store := range backends(t) {
		for _, tt := range []struct {
			name   string
			before uint64 // tokens charged first, to both buckets
			stream time.Duration
		}{{"full", 0, 0}, {"half spent", 50000, 0}, {"half spent, 1s stream", 50000, time.Second}} {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				clock := clocktest.New()
				c, _ := startServer(t, server.Options{Store: store(t), Now: clock.Now}, server.MustParse(t, refundConfig))
				left := func(model string) int64 {
					t.Helper()
					return int64(call(t, c, request("ai", withHits(desc("model", model), 0))).GetStatuses()[0].GetLimitRemaining())
				}
				if tt.before > 0 {
					// Charged by settles of earlier streams: final, no credit.
					for _, m := range []string{"served", "control"} {
						call(t, c, request("ai", negative(withHits(desc("model", m), 0)), withHits(desc("model", m), tt.before)))
					}
				}
				start := left("served")
				if resp := call(t, c, request("ai", withHits(desc("model", "served"), 1000))); resp.GetOverallCode() != ok {
					t.Fatalf("reserve 1000: %v", resp.GetOverallCode())
				}
				if got := left("served"); got != start-1000 {
					t.Errorf("after the reservation: %d left, want %d", got, start-1000)
				}
				clock.Advance(tt.stream)
				resp := call(t, c, request("ai", negative(withHits(desc("model", "served"), 1000)), withHits(desc("model", "served"), 300)))
				if resp.GetOverallCode() != ok {
					t.Fatalf("settle: %v", resp.GetOverallCode())
				}
				// The ledger forgets 100,000 tokens in RefundLedgerWindow: a
				// stream that lasts loses that much of its estimate's refund.
				forgot := int64(100000*tt.stream/server.RefundLedgerWindow) + 1
				if got, want := left("served"), left("control")-300; got > want || got < want-forgot {
					t.Errorf("after the settle: %d left, want %d (300 below the bucket without the stream, less up to %d forgotten by the ledger; started at %d)", got, want, forgot, start)
				}
				if tt.stream == 0 && left("served") != start-300 {
					t.Errorf("after the settle: %d left, want %d (300 lower than it started)", left("served"), start-300)
				}
			})
		}
	}
}

// TestRefundsRejectsInvalidPolicy: an unknown RefundPolicy is refused.
func TestRefundsRejectsInvalidPolicy(t *testing.T) {
	if _, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), Refunds: server.RefundsUnbounded + 1}); err == nil {
		t.Error("server.New with Refunds out of range: no error")
	}
}

// TestRefundOfAChargeAtItsFloor: a reservation on a post-paid limit that
// overdraws it records only down to its floor (max_debt below empty); the
// refund of that reservation gives back no more than was recorded, so a
// settle never leaves the bucket fuller than an exact one would.
func TestRefundOfAChargeAtItsFloor(t *testing.T) {
	const file = `
domain: ai
descriptors:
  - key: budget
    rate_limit: {unit: minute, requests_per_unit: 20000, counts: tokens, overdraft: {max_debt: 16384}}
`
	for name, store := range backends(t) {
		t.Run(name, func(t *testing.T) {
			clock := clocktest.New()
			c, _ := startServer(t, server.Options{Store: store(t), Now: clock.Now}, server.MustParse(t, file))
			left := func() (int64, rlsv3.RateLimitResponse_Code) {
				t.Helper()
				r := call(t, c, request("ai", withHits(desc("budget", "b"), 0)))
				return int64(r.GetStatuses()[0].GetLimitRemaining()), r.GetOverallCode()
			}
			// Spent by an earlier settle: final, no credit. 10,000 left.
			call(t, c, request("ai", negative(withHits(desc("budget", "b"), 0)), withHits(desc("budget", "b"), 10000)))
			if got, _ := left(); got != 10000 {
				t.Fatalf("%d left after spending 10000, want 10000", got)
			}
			// A reservation of 1,000,000: admitted (not in debt), recorded down
			// to the floor only: 26,384 of it.
			if code := call(t, c, request("ai", withHits(desc("budget", "b"), 1000000))).GetOverallCode(); code != ok {
				t.Fatalf("reserve 1000000: %v", code)
			}
			// The settle: the reservation given back, 100 used.
			call(t, c, request("ai", negative(withHits(desc("budget", "b"), 1000000)), withHits(desc("budget", "b"), 100)))
			got, code := left()
			if code == ok && got > 9900 {
				t.Errorf("after the settle %d left, want at most 9900 (10000 less the 100 used): the refund gave back more than was recorded", got)
			}
		})
	}
}
