package limitspage_test

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/limitspage"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// TestTrackerCountsTokensAsked: a rule's Tokens are those its descriptors
// asked for, also where no bucket was asked (requests_per_unit: 0,
// unlimited) and where another descriptor denied the request.
func TestTrackerCountsTokensAsked(t *testing.T) {
	d := func(key string, hits uint64) *ratelimitv3.RateLimitDescriptor {
		return servertest.WithHits(key, "x", hits)
	}
	tests := []struct {
		name  string
		descs []*ratelimitv3.RateLimitDescriptor
		want  map[string]limitspage.Counts // by rule path
	}{
		{"deny-all", []*ratelimitv3.RateLimitDescriptor{d("blocked", 5)},
			map[string]limitspage.Counts{"api > blocked": {Requests: 1, Shed: 1, Tokens: 5}}},
		{"shadow deny-all", []*ratelimitv3.RateLimitDescriptor{d("trial", 5)},
			map[string]limitspage.Counts{"api > trial": {Requests: 1, ShadowShed: 1, Tokens: 5}}},
		{"unlimited", []*ratelimitv3.RateLimitDescriptor{d("free", 5)},
			map[string]limitspage.Counts{"api > free": {Requests: 1, Tokens: 5}}},
		{"denied by another", []*ratelimitv3.RateLimitDescriptor{d("blocked", 5), d("a", 3)},
			map[string]limitspage.Counts{"api > blocked": {Requests: 1, Shed: 1, Tokens: 5}, "api > a": {Requests: 1, Tokens: 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixtureWith(t, servertest.OutcomesConfig)
			if _, err := f.srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: tt.descs}); err != nil {
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
