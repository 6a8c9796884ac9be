package server_test

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// TestOverrideCannotPoisonTheRule is issue 21's three-call sequence, on
// both backends: spend user=poison on a 2/s burst-2 rule; a call for the
// same descriptor with a 1-a-year override is admitted from a bucket of its
// own; the next normal call finds the rule's bucket as the first two left
// it (refilled after a second), not owing a year.
func TestOverrideCannotPoisonTheRule(t *testing.T) {
	const conf = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2}
`
	year := &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR}
	for name, store := range backends(t) {
		t.Run(name, func(t *testing.T) {
			clock := clocktest.New()
			c, _ := startServer(t, server.Options{Store: store(t), Now: clock.Now}, server.MustParse(t, conf))
			call := func(override *ratelimitv3.RateLimitDescriptor_RateLimitOverride) *rlsv3.RateLimitResponse {
				t.Helper()
				d := desc("user", "poison")
				d.Limit = override
				resp, err := c.ShouldRateLimit(context.Background(), request("api", d))
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			for i := range 2 {
				if got := call(nil).GetOverallCode(); got != ok {
					t.Fatalf("normal call %d: %v, want OK (burst 2)", i+1, got)
				}
			}
			if got := call(nil).GetOverallCode(); got != over {
				t.Fatalf("third normal call: %v, want OVER_LIMIT (the rule's bucket is spent)", got)
			}
			if got := call(year).GetOverallCode(); got != ok {
				t.Fatalf("call with a 1/year override: %v, want OK (a bucket of its own)", got)
			}
			if got := call(year).GetOverallCode(); got != over {
				t.Fatalf("second call with a 1/year override: %v, want OVER_LIMIT (its own bucket, spent)", got)
			}
			clock.Advance(500 * time.Millisecond) // 0.5 s: one token of the rule back
			resp := call(nil)
			if got := resp.GetOverallCode(); got != ok {
				t.Fatalf("normal call after the override: %v (%v), want OK: the override changed the rule's bucket", got, resp.GetStatuses())
			}
			if s := resp.GetStatuses()[0]; s.GetCurrentLimit().GetRequestsPerUnit() != 2 || s.GetLimitRemaining() != 0 {
				t.Errorf("normal call: limit %v, remaining %d; want the rule's 2/s, 0 left", s.GetCurrentLimit(), s.GetLimitRemaining())
			}
		})
	}
}
