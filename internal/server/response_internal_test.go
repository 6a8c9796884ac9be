package server

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// answerConfig has a rule of each kind and shape the answer treats apart.
const answerConfig = kindsConfig + `
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10, name: shadowed}
  - key: slow
    rate_limit: {unit: hour, requests_per_unit: 2, unit_multiplier: 3, name: slow}
`

// plannedFor plans a request of one descriptor per key ("key=v"; "key!"
// for one with a limit override of 5 a second).
func plannedFor(t *testing.T, set *config.Set, keys ...string) plan {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "api"}
	for _, k := range keys {
		var o *ratelimitv3.RateLimitDescriptor_RateLimitOverride
		if key, ok := strings.CutSuffix(k, "!"); ok {
			k, o = key, &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_SECOND}
		}
		req.Descriptors = append(req.Descriptors, descriptor(k, "v", o))
	}
	p, err := planRequest(context.Background(), set, req, 0, 1024, false, QuotaModePerRule, InvalidOverrideDeny)
	if err != nil {
		t.Fatalf("planRequest(%v): %v", keys, err)
	}
	return p
}

// labels names rules for messages and comparisons.
func labels(rules []*config.Rule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.Label())
	}
	return out
}

func descStatus(code rlsv3.RateLimitResponse_Code, remaining uint32, reset int64, name string, perUnit uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, mult uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, LimitRemaining: remaining}
	if name != "" || perUnit > 0 {
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: perUnit, Unit: unit}
		if mult > 1 {
			st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(mult)
		}
		st.DurationUntilReset = &durationpb.Duration{Seconds: reset}
	}
	return st
}

// TestSetStatuses: each descriptor's status from its decision, and what
// the statuses sum up to for the headers and the metadata.
func TestSetStatuses(t *testing.T) {
	set := MustParse(t, answerConfig)
	const (
		ok      = rlsv3.RateLimitResponse_OK
		over    = rlsv3.RateLimitResponse_OVER_LIMIT
		perMin  = rlsv3.RateLimitResponse_RateLimit_MINUTE
		perSec  = rlsv3.RateLimitResponse_RateLimit_SECOND
		perHour = rlsv3.RateLimitResponse_RateLimit_HOUR
	)
	noStatus := &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok}
	// An unlimited rule answers as envoyproxy/ratelimit's does.
	unlimitedStatus := &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, LimitRemaining: math.MaxUint32}
	tests := []struct {
		name      string
		keys      []string
		decisions []limiter.Decision // one per take
		queueFull []bool
		overall   rlsv3.RateLimitResponse_Code
		statuses  []*rlsv3.RateLimitResponse_DescriptorStatus
		// the summary; its rule lists by label
		matched, denied, denier, least int
		retry                          time.Duration
		shadow, exceeds, waited, full  []string
	}{
		{name: "admitted", keys: []string{"model"},
			decisions: []limiter.Decision{{Allowed: true, Remaining: 7, ResetAfter: 1500 * time.Millisecond}},
			overall:   ok, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{descStatus(ok, 7, 2, "models", 10, perMin, 1)},
			matched: 1, denier: -1, least: 0},
		{name: "denied", keys: []string{"model"},
			decisions: []limiter.Decision{{RetryAfter: 2100 * time.Millisecond, ResetAfter: time.Minute}},
			overall:   over, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{descStatus(over, 0, 3, "models", 10, perMin, 1)},
			matched: 1, denied: 1, denier: 0, least: 0, retry: 2100 * time.Millisecond},
		{name: "more than the burst: a full bucket's time", keys: []string{"slow"},
			decisions: []limiter.Decision{{ExceedsBurst: true, RetryAfter: time.Second}},
			overall:   over, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{descStatus(over, 0, 3*3600, "slow", 2, perHour, 3)},
			matched: 1, denied: 1, denier: 0, least: 0, retry: 3 * time.Hour, exceeds: []string{"slow"}},
		{name: "waited", keys: []string{"model"},
			decisions: []limiter.Decision{{Allowed: true, Remaining: 0, Wait: time.Second, ResetAfter: 6 * time.Second}},
			overall:   ok, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{descStatus(ok, 0, 6, "models", 10, perMin, 1)},
			matched: 1, denier: -1, least: 0, waited: []string{"models"}},
		{name: "queue full", keys: []string{"model"},
			decisions: []limiter.Decision{{RetryAfter: time.Second}}, queueFull: []bool{true},
			overall: over, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{descStatus(over, 0, 1, "models", 10, perMin, 1)},
			matched: 1, denied: 1, denier: 0, least: 0, retry: time.Second, full: []string{"models"}},
		{name: "deny-all: no bucket, a unit's wait", keys: []string{"blocked"},
			overall: over, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{descStatus(over, 0, 60, "blocked", 0, perMin, 1)},
			matched: 1, denied: 1, denier: 0, least: 0, retry: time.Minute},
		{name: "unlimited: no limit", keys: []string{"free"},
			overall: ok, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{unlimitedStatus},
			matched: 1, denier: -1, least: -1},
		{name: "no rule", keys: []string{"other"},
			overall: ok, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{noStatus},
			denier: -1, least: -1},
		{name: "shadow denial: admitted, and no header's pick", keys: []string{"shadow"},
			decisions: []limiter.Decision{{RetryAfter: time.Second}},
			overall:   ok, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{descStatus(ok, 0, 1, "shadowed", 10, perMin, 1)},
			matched: 1, denier: -1, least: -1, shadow: []string{"shadowed"}},
		{name: "two limits: the denying one reports", keys: []string{"pair"},
			decisions: []limiter.Decision{{Allowed: true, Remaining: 1}, {RetryAfter: 30 * time.Second}},
			overall:   over, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{descStatus(over, 0, 30, "rpm", 60, perMin, 1)},
			matched: 1, denied: 1, denier: 0, least: 0, retry: 30 * time.Second},
		{name: "several: the longest denial, the least remaining", keys: []string{"model", "slow", "pair", "free"},
			decisions: []limiter.Decision{
				{Allowed: true, Remaining: 3, ResetAfter: time.Second},
				{RetryAfter: 5 * time.Second},
				{RetryAfter: 9 * time.Second}, {Allowed: true, Remaining: 50},
			},
			overall: over, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				descStatus(ok, 3, 1, "models", 10, perMin, 1),
				descStatus(over, 0, 5, "slow", 2, perHour, 3),
				descStatus(over, 0, 9, "rps", 2, perSec, 1),
				unlimitedStatus,
			},
			matched: 4, denied: 2, denier: 2, least: 1, retry: 9 * time.Second},
		{name: "an override's limit", keys: []string{"other!"},
			decisions: []limiter.Decision{{Allowed: true, Remaining: 4, ResetAfter: 200 * time.Millisecond}},
			overall:   ok, statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{descStatus(ok, 4, 1, "", 5, perSec, 1)},
			matched: 1, denier: -1, least: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := plannedFor(t, set, tt.keys...)
			if len(tt.decisions) != len(p.takes) {
				t.Fatalf("%d decisions for %d takes", len(tt.decisions), len(p.takes))
			}
			resp := newResponse(len(p.items))
			sum := setStatuses(resp, p, tt.decisions, tt.queueFull, &protoCache{})
			if resp.OverallCode != tt.overall {
				t.Errorf("overall_code = %v, want %v", resp.OverallCode, tt.overall)
			}
			for i, st := range resp.Statuses {
				if !proto.Equal(st, tt.statuses[i]) {
					t.Errorf("status %d = %v, want %v", i, st, tt.statuses[i])
				}
			}
			if sum.matched != tt.matched || sum.denied != tt.denied || sum.denier != tt.denier || sum.least != tt.least || sum.retry != tt.retry {
				t.Errorf("summary: matched %d, denied %d, denier %d, least %d, retry %v; want %d, %d, %d, %d, %v",
					sum.matched, sum.denied, sum.denier, sum.least, sum.retry, tt.matched, tt.denied, tt.denier, tt.least, tt.retry)
			}
			for _, l := range []struct {
				what      string
				got, want []string
			}{{"shadow", labels(sum.shadow), tt.shadow}, {"exceeds", labels(sum.exceeds), tt.exceeds},
				{"waited", labels(sum.waited), tt.waited}, {"full", labels(sum.full), tt.full}} {
				if !slices.Equal(l.got, l.want) {
					t.Errorf("summary %s = %q, want %q", l.what, l.got, l.want)
				}
			}
		})
	}
}

// TestResponseHeaders: Retry-After on denials, and the draft-03 headers of
// the denial with the longest wait, else of the least remaining.
func TestResponseHeaders(t *testing.T) {
	const perMin = rlsv3.RateLimitResponse_RateLimit_MINUTE
	statuses := []*rlsv3.RateLimitResponse_DescriptorStatus{
		descStatus(rlsv3.RateLimitResponse_OK, 3, 20, "models", 10, perMin, 1),
		descStatus(rlsv3.RateLimitResponse_OVER_LIMIT, 0, 9, "rps", 2, rlsv3.RateLimitResponse_RateLimit_SECOND, 1),
		descStatus(rlsv3.RateLimitResponse_OK, 8, 5, "", 60, perMin, 5),
	}
	admitted := summary{matched: 3, denier: -1, least: 0}
	denied := summary{matched: 3, denied: 1, denier: 1, least: 0, retry: 8100 * time.Millisecond}
	send, omit := RetryAfterSend, RetryAfterOmit
	draft, off, inc := RateLimitHeadersDraft03, RateLimitHeadersOff, RateLimitHeadersIncumbent
	h := func(kv ...string) []*corev3.HeaderValue {
		var out []*corev3.HeaderValue
		for i := 0; i < len(kv); i += 2 {
			out = append(out, &corev3.HeaderValue{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	tests := []struct {
		name       string
		sum        summary
		retryAfter RetryAfter
		headers    RateLimitHeaders
		want       []*corev3.HeaderValue
	}{
		{"admitted, no headers asked", admitted, send, off, nil},
		{"admitted: the least remaining", admitted, send, draft,
			h("x-ratelimit-limit", `10, 10;w=60;name="models"`, "x-ratelimit-remaining", "3", "x-ratelimit-reset", "20")},
		{"admitted: the least remaining, unnamed, 5 minutes", summary{matched: 3, denier: -1, least: 2}, omit, draft,
			h("x-ratelimit-limit", "60, 60;w=300", "x-ratelimit-remaining", "8", "x-ratelimit-reset", "5")},
		{"denied: Retry-After rounded up", denied, send, off,
			h("retry-after", "9", "cache-control", "no-store")},
		{"denied: Retry-After omitted", denied, omit, off, nil},
		{"denied: at least a second", summary{matched: 1, denied: 1, denier: 1, least: 0}, send, off,
			h("retry-after", "1", "cache-control", "no-store")},
		{"denied: Retry-After and the denial's headers", denied, send, draft,
			h("retry-after", "9", "cache-control", "no-store",
				"x-ratelimit-limit", `2, 2;w=1;name="rps"`, "x-ratelimit-remaining", "0", "x-ratelimit-reset", "9")},
		{"nothing enforced (shadow, unlimited): no draft-03 headers", summary{matched: 1, denier: -1, least: -1}, send, draft, nil},
		{"incumbent, admitted: the least remaining", admitted, send, inc,
			h("RateLimit-Limit", "10", "RateLimit-Remaining", "3", "RateLimit-Reset", "20")},
		{"incumbent, denied: Retry-After and the denial's", denied, send, inc,
			h("retry-after", "9", "cache-control", "no-store",
				"RateLimit-Limit", "2", "RateLimit-Remaining", "0", "RateLimit-Reset", "9")},
		{"incumbent, nothing enforced: none", summary{matched: 1, denier: -1, least: -1}, omit, inc, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := responseHeaders(statuses, tt.sum, answerOptions{retryAfter: tt.retryAfter, headers: tt.headers, headerNames: DefaultRateLimitHeaderNames()})
			if !slices.EqualFunc(got, tt.want, func(a, b *corev3.HeaderValue) bool { return proto.Equal(a, b) }) {
				t.Errorf("responseHeaders = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSetMetadata: which rules the metadata names under each mode, and
// that a one-rule answer of the loaded config carries it pre-encoded.
func TestSetMetadata(t *testing.T) {
	set := MustParse(t, answerConfig)
	tests := []struct {
		name      string
		keys      []string
		decisions []limiter.Decision
		mode      DynamicMetadata
		encoded   bool           // pre-encoded in the unknown fields
		want      map[string]any // nil: no metadata
	}{
		{"no rule matched", []string{"other"}, nil, DynamicMetadataAll, false, nil},
		{"off", []string{"model"}, []limiter.Decision{{RetryAfter: time.Second}}, DynamicMetadataOff, false, nil},
		{"notable, nothing of note", []string{"model"}, []limiter.Decision{{Allowed: true}}, DynamicMetadataNotable, false, nil},
		{"one rule admits", []string{"model"}, []limiter.Decision{{Allowed: true}}, DynamicMetadataAll, true,
			map[string]any{metaMatched: []any{"models"}}},
		{"one rule denies, notable", []string{"blocked"}, nil, DynamicMetadataNotable, true,
			map[string]any{metaMatched: []any{"blocked"}, metaDeniedBy: []any{"blocked"}}},
		{"one rule waited", []string{"model"}, []limiter.Decision{{Allowed: true, Wait: time.Second}}, DynamicMetadataNotable, false,
			map[string]any{metaMatched: []any{"models"}, metaWaited: []any{"models"}}},
		{"a shadow denial", []string{"shadow"}, []limiter.Decision{{RetryAfter: time.Second}}, DynamicMetadataAll, false,
			map[string]any{metaMatched: []any{"shadowed"}, metaShadowDenied: []any{"shadowed"}}},
		{"two rules, one denies", []string{"model", "free", "other", "slow"},
			[]limiter.Decision{{Allowed: true}, {ExceedsBurst: true}}, DynamicMetadataAll, false,
			map[string]any{metaMatched: []any{"models", "free", "slow"}, metaDeniedBy: []any{"slow"}, metaExceedsBurst: []any{"slow"}}},
		{"an override's rule, made per call", []string{"other!"}, []limiter.Decision{{Allowed: true}}, DynamicMetadataAll, false,
			map[string]any{metaMatched: []any{"api > other=v (limit override)"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := plannedFor(t, set, tt.keys...)
			resp := newResponse(len(p.items))
			cache := &protoCache{}
			sum := setStatuses(resp, p, tt.decisions, nil, cache)
			setMetadata(resp, p, sum, tt.mode, cache, nil)
			encoded := resp.DynamicMetadata == nil && len(resp.ProtoReflect().GetUnknown()) > 0
			if encoded != tt.encoded {
				t.Errorf("pre-encoded: %v, want %v", encoded, tt.encoded)
			}
			b, err := proto.Marshal(resp)
			if err != nil {
				t.Fatalf("proto.Marshal: %v", err)
			}
			var got rlsv3.RateLimitResponse
			if err := proto.Unmarshal(b, &got); err != nil {
				t.Fatalf("proto.Unmarshal: %v", err)
			}
			var want *structpb.Struct
			if tt.want != nil {
				if want, err = structpb.NewStruct(tt.want); err != nil {
					t.Fatalf("structpb.NewStruct(%v): %v", tt.want, err)
				}
			}
			if !proto.Equal(got.GetDynamicMetadata(), want) {
				t.Errorf("dynamic_metadata = %v, want %v", got.GetDynamicMetadata(), want)
			}
		})
	}
}
