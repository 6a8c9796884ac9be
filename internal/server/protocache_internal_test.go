package server

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestLimitOverridesAreNotCached: the protobuf cache holds parts of the
// loaded config's rules only. A limit override on a descriptor no rule
// matches makes a rule per call; caching it grew the cache by one entry a
// call, without bound, until the next reload.
func TestLimitOverridesAreNotCached(t *testing.T) {
	set := MustParse(t, `
domain: api
descriptors:
  - key: model
    rate_limit: {unit: second, requests_per_unit: 10, name: model}
`)
	override := &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100000, Unit: typev3.RateLimitUnit_SECOND}
	for _, tc := range []struct {
		name  string
		entry *ratelimitv3.RateLimitDescriptor_Entry
		max   int // cache entries allowed: the config's rules
	}{
		{"no rule matches", &ratelimitv3.RateLimitDescriptor_Entry{Key: "route", Value: "/v1/chat"}, 0},
		{"a rule matches", &ratelimitv3.RateLimitDescriptor_Entry{Key: "model", Value: "m"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := New(Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), DynamicMetadata: DynamicMetadataAll})
			if err != nil {
				t.Fatal(err)
			}
			srv.SetConfig(set)
			req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{tc.entry}, Limit: override},
			}}
			for range 100 {
				resp, err := srv.ShouldRateLimit(context.Background(), req)
				if err != nil || len(resp.GetDynamicMetadata().GetFields()["ratelimitd.matched"].GetListValue().GetValues()) != 1 {
					t.Fatalf("override call: %v %v, want an answer naming one matched rule", resp, err)
				}
			}
			c := srv.current.Load().cache
			n := 0
			for _, m := range []interface{ Range(func(any, any) bool) }{&c.names, &c.alones[0], &c.alones[1], &c.limits} {
				m.Range(func(any, any) bool { n++; return true })
			}
			if n > tc.max {
				t.Errorf("%d cache entries after 100 override calls, want at most %d", n, tc.max)
			}
		})
	}
}
