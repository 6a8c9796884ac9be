package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

const quotaConfig = `
domain: ai
descriptors:
  - key: q1
    quota_mode: true
    metadata: {route: {backend: a}}
    rate_limit: {unit: minute, requests_per_unit: 2, name: q1}
  - key: q2
    quota_mode: true
    metadata: {route: {backend: b, zone: west}, extra: 1}
    rate_limit: {unit: minute, requests_per_unit: 2, name: q2}
  - key: q3
    quota_mode: true
    rate_limits:
      - {name: q3-minute, unit: minute, requests_per_unit: 1}
      - {name: q3-hour, unit: hour, requests_per_unit: 100}
  - key: n
    metadata: {normal: true}
    rate_limit: {unit: minute, requests_per_unit: 2, name: n}
  - key: free
    quota_mode: true
    rate_limit: {unlimited: true}
`

// left reads what a bucket of the rule for entries holds, by a check
// (hits 0) taken at now: limit is the index into the rule's limits.
func left(t *testing.T, store limiter.Store, set *config.Set, now time.Time, limit int, kv ...string) int64 {
	t.Helper()
	entries := servertest.Entries(kv...)
	r := set.Lookup("ai", entries)
	if r == nil {
		t.Fatalf("no rule for %v", kv)
	}
	ds, err := store.Take(context.Background(), now, []limiter.Request{{Key: string(r.AppendKey(nil, limit, entries)), Limit: r.Limits[limit].Limit}})
	if err != nil {
		t.Fatal(err)
	}
	return ds[0].Remaining
}

// TestQuotaMode follows envoyproxy/ratelimit's rule on both backends: a
// request is denied when a normal descriptor is over, or when all its
// quota-mode descriptors are; a quota-mode descriptor over its limit in an
// admitted request says OVER_LIMIT and spends nothing, the others spend;
// a denied request spends nothing.
func TestQuotaMode(t *testing.T) {
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for name, newStore := range backends(t) {
		t.Run(name, func(t *testing.T) {
			clk := clocktest.New()
			store := newStore(t)
			set := server.MustParse(t, quotaConfig)
			c, _ := startServer(t, server.Options{Now: clk.Now, Store: store}, set)
			now := clk.Now()
			type spent struct {
				kv    []string
				limit int
				want  int64
			}
			steps := []struct {
				name     string
				req      *rlsv3.RateLimitRequest
				overall  rlsv3.RateLimitResponse_Code
				statuses []rlsv3.RateLimitResponse_Code
				after    []spent
			}{
				{"one quota-mode descriptor alone is a normal one", request("ai", withHits(desc("q1", "x"), 2)),
					ok, []rlsv3.RateLimitResponse_Code{ok}, []spent{{[]string{"q1", "x"}, 0, 0}}},
				{"one of two quota-mode descriptors over: OK", request("ai", desc("q1", "x"), desc("q2", "x"), desc("n", "x")),
					ok, []rlsv3.RateLimitResponse_Code{over, ok, ok},
					[]spent{{[]string{"q1", "x"}, 0, 0}, {[]string{"q2", "x"}, 0, 1}, {[]string{"n", "x"}, 0, 1}}},
				{"the last token of q2", request("ai", desc("q2", "x")), ok, []rlsv3.RateLimitResponse_Code{ok},
					[]spent{{[]string{"q2", "x"}, 0, 0}}},
				{"both quota-mode descriptors over: OVER_LIMIT, nothing spent", request("ai", desc("q1", "x"), desc("q2", "x"), desc("n", "x")),
					over, []rlsv3.RateLimitResponse_Code{over, over, ok},
					[]spent{{[]string{"n", "x"}, 0, 1}}},
				{"the last token of n", request("ai", desc("n", "x")), ok, []rlsv3.RateLimitResponse_Code{ok},
					[]spent{{[]string{"n", "x"}, 0, 0}}},
				{"a normal descriptor over: OVER_LIMIT, quota-mode ones spend nothing", request("ai", desc("q1", "y"), desc("q2", "y"), desc("n", "x")),
					over, []rlsv3.RateLimitResponse_Code{ok, ok, over},
					[]spent{{[]string{"q1", "y"}, 0, 2}, {[]string{"q2", "y"}, 0, 2}}},
				{"q3's minute limit spent", request("ai", desc("q3", "z")), ok, []rlsv3.RateLimitResponse_Code{ok},
					[]spent{{[]string{"q3", "z"}, 0, 0}, {[]string{"q3", "z"}, 1, 99}}},
				{"an over quota-mode descriptor spends none of its other limits", request("ai", desc("q3", "z"), desc("q2", "z")),
					ok, []rlsv3.RateLimitResponse_Code{over, ok},
					[]spent{{[]string{"q3", "z"}, 1, 99}, {[]string{"q2", "z"}, 0, 1}}},
				{"an unlimited quota-mode rule is no quota-mode descriptor", request("ai", desc("free", "f"), desc("q3", "z")),
					over, []rlsv3.RateLimitResponse_Code{ok, over},
					[]spent{{[]string{"q3", "z"}, 1, 99}}},
			}
			for _, s := range steps {
				resp := call(t, c, s.req)
				if resp.GetOverallCode() != s.overall {
					t.Errorf("%s: overall %v, want %v", s.name, resp.GetOverallCode(), s.overall)
				}
				for i, st := range resp.GetStatuses() {
					if st.GetCode() != s.statuses[i] {
						t.Errorf("%s: status %d = %v, want %v", s.name, i, st.GetCode(), s.statuses[i])
					}
				}
				if s.overall == ok && header(resp, "retry-after") != "" {
					t.Errorf("%s: an admitted answer carries retry-after", s.name)
				}
				for _, sp := range s.after {
					if got := left(t, store, set, now, sp.limit, sp.kv...); got != sp.want {
						t.Errorf("%s: then %v limit %d holds %d, want %d", s.name, sp.kv, sp.limit, got, sp.want)
					}
				}
			}
		})
	}
}

// TestQuotaModeRetryAfter: when every quota-mode descriptor is over, the
// client may retry when the first of them has room again.
func TestQuotaModeRetryAfter(t *testing.T) {
	set := server.MustParse(t, `
domain: ai
descriptors:
  - {key: fast, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 6}}
  - {key: slow, quota_mode: true, rate_limit: {unit: hour, requests_per_unit: 1}}
`)
	clk := clocktest.New()
	c, _ := startServer(t, server.Options{Now: clk.Now}, set)
	call(t, c, request("ai", withHits(desc("fast", "x"), 6)))
	call(t, c, request("ai", desc("slow", "x")))
	resp := call(t, c, request("ai", desc("fast", "x"), desc("slow", "x")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || header(resp, "retry-after") != "10" {
		t.Errorf("both over: %v, retry-after %q; want OVER_LIMIT, 10 (fast's next token)", resp.GetOverallCode(), header(resp, "retry-after"))
	}
}

// TestGlobalQuotaMode: with QuotaModeAll (the incumbent's QUOTA_MODE)
// every descriptor is a quota-mode one, even one no rule matched.
func TestGlobalQuotaMode(t *testing.T) {
	set := server.MustParse(t, `
domain: api
descriptors:
  - {key: a, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: b, rate_limit: {unit: minute, requests_per_unit: 1}}
`)
	tests := []struct {
		mode server.QuotaMode
		want rlsv3.RateLimitResponse_Code
	}{
		{server.QuotaModePerRule, rlsv3.RateLimitResponse_OVER_LIMIT},
		{server.QuotaModeAll, rlsv3.RateLimitResponse_OK},
	}
	for _, tt := range tests {
		clk := clocktest.New()
		c, _ := startServer(t, server.Options{Now: clk.Now, QuotaMode: tt.mode}, set)
		call(t, c, request("api", desc("a", "x")))
		if got := call(t, c, request("api", desc("a", "x"), desc("b", "x"))).GetOverallCode(); got != tt.want {
			t.Errorf("mode %v: a over, b within: %v, want %v", tt.mode, got, tt.want)
		}
		if got := call(t, c, request("api", desc("a", "x"), desc("none", "x"))).GetOverallCode(); got != tt.want {
			t.Errorf("mode %v: a over, a descriptor with no rule: %v, want %v", tt.mode, got, tt.want)
		}
	}
	if _, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), QuotaMode: 7}); err == nil {
		t.Error("server.New(QuotaMode 7) = nil error")
	}
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// withoutOurs is the dynamic metadata of resp without the ratelimitd.* keys.
func withoutOurs(resp *rlsv3.RateLimitResponse) *structpb.Struct {
	out := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range resp.GetDynamicMetadata().GetFields() {
		if !strings.HasPrefix(k, "ratelimitd.") {
			out.Fields[k] = v
		}
	}
	return out
}

// TestDescriptorMetadata checks the metadata of the descriptors that
// passed in the answer's dynamic metadata, shaped as envoyproxy/ratelimit
// shapes it, beside the ratelimitd.* keys.
func TestDescriptorMetadata(t *testing.T) {
	set := server.MustParse(t, quotaConfig)
	type step struct {
		req  *rlsv3.RateLimitRequest
		want map[string]any
	}
	tests := []struct {
		name  string
		mode  server.DescriptorMetadata
		steps []step
	}{
		{"passed", 0, []step{
			{request("ai", desc("q1", "x"), desc("q2", "x")),
				map[string]any{"metadata": map[string]any{"route": map[string]any{"backend": "a", "zone": "west"}, "extra": 1.0}}},
			{request("ai", withHits(desc("q1", "x"), 1)), map[string]any{"metadata": map[string]any{"route": map[string]any{"backend": "a"}}}},
			// q1 is over now: only q2's and n's metadata.
			{request("ai", desc("q1", "x"), desc("q2", "x"), desc("n", "x")),
				map[string]any{"metadata": map[string]any{"route": map[string]any{"backend": "b", "zone": "west"}, "extra": 1.0, "normal": true}}},
			{request("ai", desc("free", "x")), map[string]any{}},
		}},
		{"incumbent", server.DescriptorMetadataIncumbent, []step{
			{&rlsv3.RateLimitRequest{Domain: "ai", HitsAddend: 1, Descriptors: append(request("ai", desc("q1", "x", "sub", "y")).Descriptors, withHits(desc("q2", "x"), 1))},
				map[string]any{
					"domain": "ai",
					"descriptors": []any{
						map[string]any{"entries": []any{"q1=x", "sub=y"}},
						map[string]any{"entries": []any{"q2=x"}, "hitsAddend": 1.0},
					},
					"hitsAddend": 1.0,
					"metadata":   map[string]any{"route": map[string]any{"backend": "b", "zone": "west"}, "extra": 1.0},
				}},
			{request("ai", desc("nothing", "x")), map[string]any{
				"domain": "ai", "descriptors": []any{map[string]any{"entries": []any{"nothing=x"}}},
			}},
		}},
		{"off", server.DescriptorMetadataOff, []step{
			{request("ai", desc("q1", "x")), map[string]any{}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktest.New()
			c, _ := startServer(t, server.Options{Now: clk.Now, DescriptorMetadata: tt.mode, DynamicMetadata: server.DynamicMetadataAll}, set)
			for i, s := range tt.steps {
				resp := call(t, c, s.req)
				if got, want := withoutOurs(resp), mustStruct(t, s.want); !proto.Equal(got, want) {
					t.Errorf("step %d: dynamic metadata %v, want %v", i, got, want)
				}
				if len(s.req.GetDescriptors()) > 0 && set.Lookup("ai", []config.Entry{{Key: s.req.Descriptors[0].Entries[0].Key, Value: "x"}}) != nil {
					if _, has := resp.GetDynamicMetadata().GetFields()["ratelimitd.matched"]; !has {
						t.Errorf("step %d: no ratelimitd.matched beside them: %v", i, resp.GetDynamicMetadata())
					}
				}
			}
		})
	}
}

// TestDescriptorMetadataByDefault: in the default dynamic-metadata mode
// (notable) a plain admission still carries the passed descriptors'
// metadata, without the ratelimitd.* keys, and an admission in which a
// quota-mode rule is over its limit names it.
func TestDescriptorMetadataByDefault(t *testing.T) {
	set := server.MustParse(t, quotaConfig)
	steps := []struct {
		req  *rlsv3.RateLimitRequest
		want map[string]any // the descriptors' metadata
		ours []string       // the ratelimitd.* keys, sorted
	}{
		{request("ai", desc("q1", "x"), desc("q2", "x")),
			map[string]any{"metadata": map[string]any{"route": map[string]any{"backend": "a", "zone": "west"}, "extra": 1.0}}, nil},
		{request("ai", withHits(desc("q1", "x"), 1)), map[string]any{"metadata": map[string]any{"route": map[string]any{"backend": "a"}}}, nil},
		// q1 is over now, in an admitted answer.
		{request("ai", desc("q1", "x"), desc("q2", "x"), desc("n", "x")),
			map[string]any{"metadata": map[string]any{"route": map[string]any{"backend": "b", "zone": "west"}, "extra": 1.0, "normal": true}},
			[]string{"ratelimitd.matched", "ratelimitd.quota_over"}},
	}
	clk := clocktest.New()
	c, _ := startServer(t, server.Options{Now: clk.Now}, set)
	for i, s := range steps {
		resp := call(t, c, s.req)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("step %d: %v, want OK", i, resp.GetOverallCode())
		}
		if got, want := withoutOurs(resp), mustStruct(t, s.want); !proto.Equal(got, want) {
			t.Errorf("step %d: descriptors' metadata %v, want %v", i, got, want)
		}
		var ours []string
		for k := range resp.GetDynamicMetadata().GetFields() {
			if strings.HasPrefix(k, "ratelimitd.") {
				ours = append(ours, k)
			}
		}
		slices.Sort(ours)
		if !slices.Equal(ours, s.ours) {
			t.Errorf("step %d: ratelimitd keys %v, want %v", i, ours, s.ours)
		}
	}
}

// TestIncumbentSmallDifferences pins three answers the incumbent gives: an
// override on a domain with no config is ignored, an unlimited rule
// answers limit_remaining 4294967295, a descriptor without entries is OK.
func TestIncumbentSmallDifferences(t *testing.T) {
	clk := clocktest.New()
	c, _ := startServer(t, server.Options{Now: clk.Now}, server.MustParse(t, testConfig))
	withOverride := desc("key1", "value1")
	withOverride.Limit = overrideLimit(10)
	resp := call(t, c, request("foo_domain", withOverride))
	if st := resp.GetStatuses()[0]; resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil || st.GetLimitRemaining() != 0 {
		t.Errorf("override on an unknown domain: %v, want OK with no limit", resp)
	}
	resp = call(t, c, request("api", withOverride))
	if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 10 || st.GetLimitRemaining() != 9 {
		t.Errorf("override on a known domain, no rule: %v, want 10 remaining 9 (as the incumbent)", resp)
	}
	resp = call(t, c, request("api", desc("internal", "x")))
	if st := resp.GetStatuses()[0]; st.GetLimitRemaining() != 4294967295 || st.GetCurrentLimit() != nil {
		t.Errorf("unlimited: %v, want remaining 4294967295 and no current_limit", st)
	}
	resp = call(t, c, request("api", desc(), desc("model", "gpt-4o")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("descriptor without entries: %v, want OK", resp)
	}
}

func overrideLimit(perDay uint32) *ratelimitv3.RateLimitDescriptor_RateLimitOverride {
	return &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: perDay, Unit: typev3.RateLimitUnit_DAY}
}
