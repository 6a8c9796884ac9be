package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/server"
)

// shadowAllConfig has a one-token rule, a block rule (requests_per_unit 0)
// and a rule that is a shadow rule of its own.
const shadowAllConfig = `domain: api
descriptors:
  - {key: client, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: blocked, rate_limit: {unit: hour, requests_per_unit: 0}}
  - {key: own, shadow_mode: true, rate_limit: {unit: hour, requests_per_unit: 1}}
`

// descriptorOutcomes is the outcome of each descriptor in c.
func descriptorOutcomes(c server.Call) []server.Outcome {
	var outcomes []server.Outcome
	for _, d := range c.Descriptors {
		outcomes = append(outcomes, d.Outcome)
	}
	return outcomes
}

// lastOutcome is the outcome of the last descriptor observed, 0 if none.
func lastOutcome(obs *recorder[[]server.Outcome]) server.Outcome {
	obs.mu.Lock()
	defer obs.mu.Unlock()
	all := slices.Concat(obs.calls...)
	if len(all) == 0 {
		return 0
	}
	return all[len(all)-1]
}

// TestShadowModeEverywhere: with Options.ShadowMode every rule, a block
// rule and a limit override included, is a shadow rule: the calls its
// bucket would deny are admitted (descriptor status OK) and observed as
// ShadowOverLimit; without it they are denied.
func TestShadowModeEverywhere(t *testing.T) {
	override := func(key string) *ratelimitv3.RateLimitDescriptor { return overridePerHour(desc(key, "x"), 1) }
	entry := func(key string) *ratelimitv3.RateLimitDescriptor { return desc(key, "x") }
	tests := []struct {
		name  string
		desc  func() *ratelimitv3.RateLimitDescriptor
		calls int // the last one is over the limit
	}{
		{"limited rule", func() *ratelimitv3.RateLimitDescriptor { return entry("client") }, 2},
		{"block rule", func() *ratelimitv3.RateLimitDescriptor { return entry("blocked") }, 1},
		{"own shadow rule", func() *ratelimitv3.RateLimitDescriptor { return entry("own") }, 2},
		{"limit override", func() *ratelimitv3.RateLimitDescriptor { return override("unmatched") }, 2},
	}
	for _, shadowAll := range []bool{false, true} {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				obs := &recorder[[]server.Outcome]{keep: descriptorOutcomes}
				rls, _ := startServer(t, server.Options{Observer: obs, ShadowMode: shadowAll}, server.MustParse(t, shadowAllConfig))
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				var resp *rlsv3.RateLimitResponse
				for range tt.calls {
					var err error
					if resp, err = rls.ShouldRateLimit(ctx, request("api", tt.desc())); err != nil {
						t.Fatalf("ShouldRateLimit: %v", err)
					}
				}
				shadow := shadowAll || tt.name == "own shadow rule"
				wantCode, wantOutcome := rlsv3.RateLimitResponse_OVER_LIMIT, server.OverLimit
				if shadow {
					wantCode, wantOutcome = rlsv3.RateLimitResponse_OK, server.ShadowOverLimit
				}
				if got := resp.GetOverallCode(); got != wantCode {
					t.Errorf("ShadowMode %v: call %d overall_code = %v, want %v", shadowAll, tt.calls, got, wantCode)
				}
				if got := resp.GetStatuses()[0].GetCode(); got != wantCode {
					t.Errorf("ShadowMode %v: call %d status code = %v, want %v", shadowAll, tt.calls, got, wantCode)
				}
				if got := lastOutcome(obs); got != wantOutcome {
					t.Errorf("ShadowMode %v: call %d observed %v, want %v", shadowAll, tt.calls, got, wantOutcome)
				}
			})
		}
	}
}
