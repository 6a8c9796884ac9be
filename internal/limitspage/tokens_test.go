package limitspage_test

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/limitspage"
)

// TestTrackerCountsTokensAsked: a rule's Tokens are those its descriptors
// asked for, also where no bucket was asked (requests_per_unit: 0,
// unlimited) and where another descriptor denied the request.
func TestTrackerCountsTokensAsked(t *testing.T) {
	const cfg = `
domain: d
descriptors:
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0, name: blocked}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0, name: trial}
  - key: free
    rate_limit: {unlimited: true, name: free}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 100, name: a}
`
	d := func(key string, hits uint64) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{
			Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: "x"}},
			HitsAddend: wrapperspb.UInt64(hits),
		}
	}
	tests := []struct {
		name  string
		descs []*ratelimitv3.RateLimitDescriptor
		want  map[string]limitspage.Counts // by rule path
	}{
		{"deny-all", []*ratelimitv3.RateLimitDescriptor{d("blocked", 5)},
			map[string]limitspage.Counts{"d > blocked": {Requests: 1, Shed: 1, Tokens: 5}}},
		{"shadow deny-all", []*ratelimitv3.RateLimitDescriptor{d("trial", 5)},
			map[string]limitspage.Counts{"d > trial": {Requests: 1, ShadowShed: 1, Tokens: 5}}},
		{"unlimited", []*ratelimitv3.RateLimitDescriptor{d("free", 5)},
			map[string]limitspage.Counts{"d > free": {Requests: 1, Tokens: 5}}},
		{"denied by another", []*ratelimitv3.RateLimitDescriptor{d("blocked", 5), d("a", 3)},
			map[string]limitspage.Counts{"d > blocked": {Requests: 1, Shed: 1, Tokens: 5}, "d > a": {Requests: 1, Tokens: 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixtureWith(t, cfg)
			if _, err := f.srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: tt.descs}); err != nil {
				t.Fatal(err)
			}
			for path, want := range tt.want {
				if got := f.tracker.LastMinute(path, f.clock.Now()); got != want {
					t.Errorf("LastMinute(%q) = %+v, want %+v", path, got, want)
				}
			}
		})
	}
}
