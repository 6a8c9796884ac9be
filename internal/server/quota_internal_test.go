package server

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/limiter"
)

const quotaPlanConfig = `
domain: ai
quota_groups:
  pool: {unit: minute, requests_per_unit: 10, max_wait: 1s}
descriptors:
  - {key: q1, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 2, max_wait: 1s}}
  - {key: q2, quota_mode: true, quota_group: pool}
  - {key: qb, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 0}}
  - {key: qs, quota_mode: true, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: n, rate_limit: {unit: minute, requests_per_unit: 2, max_wait: 1s}}
  - {key: nb, rate_limit: {unit: minute, requests_per_unit: 0}}
`

// TestPlanQuotaMode: how planRequest prepares quota-mode descriptors for
// the store (see quota.go): with two or more, their takes are Shadow and
// nothing waits; one alone is a normal descriptor; the request is only
// checked when it is sure to be denied.
func TestPlanQuotaMode(t *testing.T) {
	set := MustParse(t, quotaPlanConfig)
	tests := []struct {
		name      string
		keys      []string
		quotas    int
		shadow    []bool // per take
		waits     bool   // some take may wait
		checkOnly bool   // every take has Hits 0
	}{
		{"one quota-mode descriptor: normal", []string{"q1", "n"}, 1, []bool{false, false}, true, false},
		{"two: tolerant, no waits", []string{"q1", "q2", "n"}, 2, []bool{true, true, false}, false, false},
		{"a quota group in quota mode", []string{"q2", "q1"}, 2, []bool{true, true}, false, false},
		{"one deny-all of two quota-mode: not denied outright", []string{"qb", "q1"}, 2, []bool{true}, false, false},
		{"every quota-mode one denies outright: only checked", []string{"qb", "qb", "n"}, 2, []bool{false}, false, true},
		{"a normal deny-all: only checked", []string{"nb", "q1", "q2"}, 2, []bool{true, true}, false, true},
		{"shadow quota-mode rule counts, stays shadow", []string{"qs", "q1"}, 2, []bool{true, true}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &rlsv3.RateLimitRequest{Domain: "ai"}
			for _, k := range tt.keys {
				req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: "x"}}})
			}
			p, err := planRequest(context.Background(), set, req, 5*time.Second, 1024, false, QuotaModePerRule, InvalidOverrideDeny)
			if err != nil {
				t.Fatal(err)
			}
			if p.quotas != tt.quotas {
				t.Errorf("quotas = %d, want %d", p.quotas, tt.quotas)
			}
			if len(p.takes) != len(tt.shadow) {
				t.Fatalf("%d takes, want %d", len(p.takes), len(tt.shadow))
			}
			waits, checkOnly := false, true
			for k, r := range p.takes {
				if r.Shadow != tt.shadow[k] {
					t.Errorf("take %d Shadow = %v, want %v", k, r.Shadow, tt.shadow[k])
				}
				waits = waits || r.MaxWait > 0
				checkOnly = checkOnly && r.Hits == 0
			}
			if waits != tt.waits || checkOnly != tt.checkOnly {
				t.Errorf("waits %v, check only %v; want %v, %v", waits, checkOnly, tt.waits, tt.checkOnly)
			}
		})
	}
}

// TestQuotaVerdict is the incumbent's decision rule over decisions.
func TestQuotaVerdict(t *testing.T) {
	set := MustParse(t, quotaPlanConfig)
	yes, no := limiter.Decision{Allowed: true}, limiter.Decision{}
	tests := []struct {
		keys      []string
		decisions []limiter.Decision
		over      bool
	}{
		{[]string{"q1", "q2"}, []limiter.Decision{no, yes}, false},
		{[]string{"q1", "q2"}, []limiter.Decision{no, no}, true},
		{[]string{"q1", "q2", "n"}, []limiter.Decision{yes, yes, no}, true},
		{[]string{"qb", "q1"}, []limiter.Decision{yes}, false},
		{[]string{"qb", "q1"}, []limiter.Decision{no}, true},
		{[]string{"qs", "q1"}, []limiter.Decision{no, no}, false}, // a shadow rule is never over
		{[]string{"q1"}, []limiter.Decision{no}, true},
	}
	for _, tt := range tests {
		req := &rlsv3.RateLimitRequest{Domain: "ai"}
		for _, k := range tt.keys {
			req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: "x"}}})
		}
		p, err := planRequest(context.Background(), set, req, 0, 1024, false, QuotaModePerRule, InvalidOverrideDeny)
		if err != nil {
			t.Fatal(err)
		}
		if got := quotaVerdict(p, tt.decisions); got != tt.over {
			t.Errorf("quotaVerdict(%v, %v) = %v, want %v", tt.keys, tt.decisions, got, tt.over)
		}
	}
}
