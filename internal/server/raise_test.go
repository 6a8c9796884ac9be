package server_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// TestRaisedLimitFreesAThrottledClient plays issue 42's case over gRPC on
// both backends, in the incumbent's environment (denied calls charged, a
// debt of up to one burst): a tenant throttled on 2 an hour, one denied
// call charged, is relieved by a reload that raises the rule to 4 an
// hour. envoyproxy/ratelimit's counter holds 3 hits of 4 then, and admits
// one more at once; so does ratelimitd, which keeps the 3 tokens spent
// (2 and the debt of 1) and spends them at the new rate. A later reload
// back to 2 an hour keeps what was spent: denied.
func TestRaisedLimitFreesAThrottledClient(t *testing.T) {
	const perHour = `domain: tenants
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: %d}
`
	for backend, newStore := range backends(t) {
		t.Run(backend, func(t *testing.T) {
			clock := clocktest.New()
			opts := server.Options{Now: clock.Now, Overdraft: server.Overdraft{On: true}}
			opts.Store = newStore(t)
			c, srv := startServer(t, opts, server.MustParse(t, fmt.Sprintf(perHour, 2)))
			codes := func() []string {
				var got []string
				for range 3 {
					got = append(got, call(t, c, request("tenants", desc("tenant", "acme"))).GetOverallCode().String())
				}
				return got
			}
			if got := codes(); got[0] != "OK" || got[1] != "OK" || got[2] != "OVER_LIMIT" {
				t.Fatalf("at 2 an hour: %v, want OK OK OVER_LIMIT", got)
			}
			clock.Advance(time.Second)
			srv.SetConfig(server.MustParse(t, fmt.Sprintf(perHour, 4)))
			r := call(t, c, request("tenants", desc("tenant", "acme")))
			if r.GetOverallCode() != ok {
				t.Fatalf("after the raise to 4 an hour: %v, want OK (3 of 4 spent)", r.GetOverallCode())
			}
			if r := call(t, c, request("tenants", desc("tenant", "acme"))); r.GetOverallCode() != over {
				t.Fatalf("the call after: %v, want OVER_LIMIT (4 of 4 spent)", r.GetOverallCode())
			}
			srv.SetConfig(server.MustParse(t, fmt.Sprintf(perHour, 2)))
			if r := call(t, c, request("tenants", desc("tenant", "acme"))); r.GetOverallCode() != over {
				t.Fatalf("lowered back to 2 an hour: %v, want OVER_LIMIT", r.GetOverallCode())
			}
		})
	}
}
