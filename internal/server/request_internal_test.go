package server

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/config"
)

// kindsConfig has a rule of every kind, for the internal tests.
const kindsConfig = `
domain: api
descriptors:
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 10, name: models}
  - key: free
    rate_limit: {unlimited: true, name: free}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0, name: blocked}
  - key: pair
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: rps}
      - {unit: minute, requests_per_unit: 60, name: rpm}
`

func descriptor(key, value string, override *ratelimitv3.RateLimitDescriptor_RateLimitOverride) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}, Limit: override}
}

// TestPlanKinds: what planRequest makes of each kind of rule, and the rule
// it builds for a limit override that no rule matched.
func TestPlanKinds(t *testing.T) {
	set := MustParse(t, kindsConfig)
	override := &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_SECOND}
	tests := []struct {
		name            string
		d               *ratelimitv3.RateLimitDescriptor
		kind            config.Kind // of it.rule; 0 for none
		path            string
		limited, denied bool
		limits          int // len(it.limits), each one take
		configured      bool
	}{
		{"no rule", descriptor("other", "x", nil), 0, "", false, false, 0, false},
		{"limited", descriptor("model", "m", nil), config.KindLimited, "api > model", true, false, 1, true},
		{"two limits", descriptor("pair", "p", nil), config.KindLimited, "api > pair", true, false, 2, true},
		{"unlimited", descriptor("free", "x", nil), config.KindUnlimited, "api > free", false, false, 0, true},
		{"deny-all", descriptor("blocked", "x", nil), config.KindDenyAll, "api > blocked", false, true, 0, true},
		{"override without a rule", descriptor("other", "x", override), config.KindLimited, "api > other=x (limit override)", true, false, 1, false},
		{"override of a limited rule", descriptor("model", "m", override), config.KindLimited, "api > model", true, false, 1, false},
		{"override of an unlimited rule", descriptor("free", "x", override), config.KindUnlimited, "api > free", true, false, 1, false},
		{"override of a deny-all rule", descriptor("blocked", "x", override), config.KindDenyAll, "api > blocked", true, false, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{tt.d}}
			p, err := planRequest(context.Background(), set, req, 0, 1024, false, QuotaModePerRule, InvalidOverrideDeny)
			if err != nil {
				t.Fatalf("planRequest: %v", err)
			}
			it := p.items[0]
			var kind config.Kind
			path := ""
			if it.rule != nil {
				kind, path = it.rule.Kind, it.rule.Path
			}
			if kind != tt.kind || path != tt.path {
				t.Errorf("rule = %v %q, want %v %q", kind, path, tt.kind, tt.path)
			}
			if it.limited != tt.limited || it.denyAll != tt.denied || len(it.limits) != tt.limits || it.configured != tt.configured {
				t.Errorf("item = limited %v, denyAll %v, %d limits, configured %v; want %v, %v, %d, %v",
					it.limited, it.denyAll, len(it.limits), it.configured, tt.limited, tt.denied, tt.limits, tt.configured)
			}
			if len(p.takes) != tt.limits {
				t.Errorf("%d takes, want %d", len(p.takes), tt.limits)
			}
		})
	}
}
