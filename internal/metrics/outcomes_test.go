package metrics_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestDescriptorCountersCountTokensAsked: every descriptor whose rule
// applies counts the tokens it asked for in hits, deny-all and unlimited
// rules included; within_limit and near_limit count only descriptors of
// admitted requests, and a descriptor within its limit on a request that
// another denied counts as denied_by_other (in hits, not within_limit).
func TestDescriptorCountersCountTokensAsked(t *testing.T) {
	type counts struct{ hits, within, near, over, shadow float64 }
	tests := []struct {
		name  string
		calls [][]*ratelimitv3.RateLimitDescriptor // each one request
		want  map[string]counts                    // by rule
		// outcomes are descriptor counts by rule and outcome.
		outcomes map[[2]string]float64
	}{
		{
			name:     "deny-all",
			calls:    [][]*ratelimitv3.RateLimitDescriptor{{servertest.WithHits("blocked", "x", 5)}},
			want:     map[string]counts{"blocked": {hits: 5, over: 5}},
			outcomes: map[[2]string]float64{{"blocked", "over_limit"}: 1},
		},
		{
			name:     "unlimited",
			calls:    [][]*ratelimitv3.RateLimitDescriptor{{servertest.WithHits("free", "x", 5)}},
			want:     map[string]counts{"free": {hits: 5, within: 5}},
			outcomes: map[[2]string]float64{{"free", "unlimited"}: 1},
		},
		{
			name:     "shadow deny-all",
			calls:    [][]*ratelimitv3.RateLimitDescriptor{{servertest.WithHits("trial", "x", 5)}},
			want:     map[string]counts{"trial": {hits: 5, shadow: 5}},
			outcomes: map[[2]string]float64{{"trial", "shadow_over_limit"}: 1},
		},
		{
			name: "deny-all beside others",
			calls: [][]*ratelimitv3.RateLimitDescriptor{
				{servertest.WithHits("blocked", "x", 5), servertest.WithHits("a", "x", 3), servertest.WithHits("free", "x", 2)},
			},
			want: map[string]counts{"blocked": {hits: 5, over: 5}, "a": {hits: 3}, "free": {hits: 2}},
			outcomes: map[[2]string]float64{
				{"blocked", "over_limit"}: 1, {"a", "denied_by_other"}: 1, {"a", "within_limit"}: 0, {"free", "unlimited"}: 1,
			},
		},
		{
			name: "denied by another descriptor",
			calls: [][]*ratelimitv3.RateLimitDescriptor{
				{servertest.WithHits("a", "x", 1), servertest.WithHits("b", "x", 1)},
				{servertest.WithHits("a", "x", 1), servertest.WithHits("b", "x", 1)},
			},
			want: map[string]counts{"a": {hits: 2, within: 1}, "b": {hits: 2, within: 1, near: 1, over: 1}},
			outcomes: map[[2]string]float64{
				{"a", "within_limit"}: 1, {"a", "denied_by_other"}: 1, {"b", "within_limit"}: 1, {"b", "over_limit"}: 1,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMetrics(t, metrics.Options{})
			srv := newServerWithoutConfig(t, m)
			srv.SetConfig(mustParse(t, servertest.OutcomesConfig))
			for _, descs := range tt.calls {
				if _, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: descs}); err != nil {
					t.Fatal(err)
				}
			}
			reg := m.Registry()
			for rule, want := range tt.want {
				var got counts
				for _, c := range []struct {
					family string
					v      *float64
				}{{"hits", &got.hits}, {"within_limit", &got.within}, {"near_limit", &got.near}, {"over_limit", &got.over}, {"shadow_mode", &got.shadow}} {
					*c.v, _ = value(t, reg, "ratelimitd_descriptor_"+c.family+"_total", map[string]string{"domain": "api", "rule": rule})
				}
				if got != want {
					t.Errorf("rule %s: tokens %+v, want %+v", rule, got, want)
				}
			}
			for k, want := range tt.outcomes {
				got, _ := value(t, reg, "ratelimitd_descriptor_requests_total", map[string]string{"domain": "api", "rule": k[0], "outcome": k[1]})
				if got != want {
					t.Errorf("requests_total{rule=%q, outcome=%q} = %v, want %v", k[0], k[1], got, want)
				}
			}
		})
	}
}

// TestInvalidRequestsTakeNoDomain: the domain of a request that fails the
// server's checks (empty, or longer than allowed) is neither a label nor
// one of the bounded domains; such calls count as domain="_invalid", and
// a later valid domain still gets its own label.
func TestInvalidRequestsTakeNoDomain(t *testing.T) {
	m := newMetrics(t, metrics.Options{MaxDomains: 2})
	srv := newServer(t, m)
	ctx := context.Background()
	invalid := []*rlsv3.RateLimitRequest{
		request(strings.Repeat("d", 1<<20), []string{"model", "gpt-4o"}),
		request(strings.Repeat("e", server.DefaultRequestLimits().MaxDomainBytes+1), []string{"model", "gpt-4o"}),
		request(""),
		request("nodescriptors"),
	}
	for _, req := range invalid {
		if _, err := srv.ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("invalid request: %v, want InvalidArgument", err)
		}
	}
	for _, d := range []string{"api", "elsewhere"} {
		if _, err := srv.ShouldRateLimit(ctx, request(d, []string{"model", "gpt-4o"})); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]float64{"_invalid": 4, "api": 1, "elsewhere": 1}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimitd_requests_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "domain" {
					if len(l.GetValue()) > 64 {
						t.Errorf("requests_total has a domain label of %d bytes", len(l.GetValue()))
					}
					got[l.GetValue()] += s.GetCounter().GetValue()
				}
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("requests_total by domain = %v, want %v", got, want)
	}
}

// ruleLimitInfoHead is the exposition's head of ratelimitd_rule_limit_info,
// before its series.
const ruleLimitInfoHead = `
# HELP ratelimitd_rule_limit_info 1 for each limit of each rule that has seen traffic: what its tokens count (requests or tokens), its quota group, and its rate.
# TYPE ratelimitd_rule_limit_info gauge
`

// TestRuleLimitInfoSaysWhatIsCounted: each limit of a rule with a bucket
// is described, once it has seen traffic, until a reload drops its rule.
func TestRuleLimitInfoSaysWhatIsCounted(t *testing.T) {
	set := servertest.ParseConfig(t, "ai.yaml", `domain: ai
descriptors:
  - key: model
    value: claude
    rate_limits:
      - {unit: minute, requests_per_unit: 50, name: rpm}
      - {unit: minute, requests_per_unit: 8000, counts: tokens, overdraft: {max_debt: 64000}, name: tpm}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0, name: blocked}
  - key: free
    rate_limit: {unlimited: true, name: free}
`)
	m := newMetrics(t, metrics.Options{})
	srv := newServerClocked(t, m, time.Now)
	srv.SetConfig(set)
	m.ConfigLoaded(set)
	// Rules without a bucket (deny-all, unlimited) describe no limit.
	for _, d := range [][]string{{"model", "claude"}, {"blocked", "x"}, {"free", "x"}} {
		if _, err := srv.ShouldRateLimit(context.Background(), request("ai", d)); err != nil {
			t.Fatal(err)
		}
	}
	want := ruleLimitInfoHead + `ratelimitd_rule_limit_info{counts="requests",domain="ai",group="",limit="rpm",rate="50 per minute",rule="rpm"} 1
ratelimitd_rule_limit_info{counts="tokens",domain="ai",group="",limit="tpm",rate="8000 per minute",rule="rpm"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "ratelimitd_rule_limit_info"); err != nil {
		t.Error(err)
	}
	m.ConfigLoaded(mustParse(t, "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if n := testutil.CollectAndCount(m.Registry(), "ratelimitd_rule_limit_info"); n != 0 {
		t.Errorf("after a reload, %d rule_limit_info series remain from the old config", n)
	}
}

// TestRuleLimitInfoIgnoresReplacedRules: a call decided under the old
// config and observed after a reload that keeps the rule's label but
// changes its rate must not bring back the old rate beside the new one.
func TestRuleLimitInfoIgnoresReplacedRules(t *testing.T) {
	cfg := func(n int) string {
		return fmt.Sprintf("domain: api\ndescriptors:\n  - key: model\n    rate_limit: {unit: minute, requests_per_unit: %d, name: models}\n", n)
	}
	m := newMetrics(t, metrics.Options{})
	srv := newServerWithoutConfig(t, m)
	old, next := mustParse(t, cfg(100)), mustParse(t, cfg(200))
	srv.SetConfig(old)
	m.ConfigLoaded(old)
	call := func() {
		t.Helper()
		if _, err := srv.ShouldRateLimit(context.Background(), request("api", []string{"model", "m"})); err != nil {
			t.Fatal(err)
		}
	}
	call()
	// As cmd/ratelimitd reloads: metrics first, then the server; a call
	// decided before the server's swap is observed after the metrics'.
	m.ConfigLoaded(next)
	call()
	srv.SetConfig(next)
	call()
	want := ruleLimitInfoHead + `ratelimitd_rule_limit_info{counts="requests",domain="api",group="",limit="models",rate="200 per minute",rule="models"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "ratelimitd_rule_limit_info"); err != nil {
		t.Error(err)
	}
	if got, _ := value(t, m.Registry(), "ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "models"}); got != 3 {
		t.Errorf("hits across the reload = %v, want 3 (the late call counts on the kept rule)", got)
	}
}

// TestNearLimitIsExact: near_limit is "fewer than (1 − ratio) × burst
// tokens left", compared without float error.
func TestNearLimitIsExact(t *testing.T) {
	tests := []struct {
		ratio            float64
		burst, remaining int64
		near             bool
	}{
		{0.7, 10, 3, false}, // (1 − 0.7) × 10 is 3.0000000000000004 in floats
		{0.7, 10, 2, true},
		{0.9, 10, 1, false}, // 0.09999999999999998 × 10
		{0.9, 10, 0, true},
		{0.8, 5, 1, false},
		{0.8, 5, 0, true},
		{0.3, 10, 6, true},
		{0.3, 10, 7, false},
		{0.5, 3, 1, true}, // 1 < 1.5
		{0.5, 3, 2, false},
		{1, 5, 0, false}, // ratio 1: never near
		{0.8, limiter.MaxTokens, limiter.MaxTokens/5 + 1, false}, // 0.2 × 2⁴⁰ = …555.2
		{0.8, limiter.MaxTokens, limiter.MaxTokens / 5, true},
	}
	set := mustParse(t, testConfig)
	gpt := set.Lookup("api", []config.Entry{{Key: "model", Value: "gpt-4o"}})
	req := request("api", []string{"model", "gpt-4o"})
	for _, tt := range tests {
		m := newMetrics(t, metrics.Options{NearLimitRatio: tt.ratio})
		l := limiter.Limit{Count: tt.burst, Period: time.Minute, Burst: tt.burst}
		m.ObserveCall(server.Call{Domain: "api", Checked: true, Code: codes.OK, Overall: rlsv3.RateLimitResponse_OK,
			Descriptors: []server.DescriptorOutcome{{Descriptor: req.Descriptors[0], Rule: gpt, Outcome: server.WithinLimit,
				Hits: 1, Limit: l, Decision: limiter.Decision{Allowed: true, Remaining: tt.remaining}}}})
		got, _ := value(t, m.Registry(), "ratelimitd_descriptor_near_limit_total", map[string]string{"domain": "api", "rule": "gpt-4o"})
		if (got == 1) != tt.near {
			t.Errorf("ratio %v, burst %d, %d left: near_limit %v, want near %v", tt.ratio, tt.burst, tt.remaining, got, tt.near)
		}
	}
}
