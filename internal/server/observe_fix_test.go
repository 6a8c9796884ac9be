package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// asked summarizes a call: whether it was checked, and each descriptor's
// outcome with the tokens it asked for.
func asked(c server.Call) string {
	var b strings.Builder
	fmt.Fprintf(&b, "checked=%v %v %v:", c.Checked, c.Code, c.Overall)
	for _, d := range c.Descriptors {
		fmt.Fprintf(&b, " %v/%d", d.Outcome, d.Hits)
	}
	return b.String()
}

// TestObserverSeesTokensAsked: each descriptor reports the tokens it asked
// for, whether or not a bucket was asked for them (deny-all and unlimited
// rules have none, and a deny-all denial makes the other buckets only
// checked); a descriptor within its limit on a request another one denied
// is denied_by_other; a request that fails the checks is not Checked.
func TestObserverSeesTokensAsked(t *testing.T) {
	tests := []struct {
		name  string
		calls []*rlsv3.RateLimitRequest
		want  []string
	}{
		{
			name:  "deny-all",
			calls: []*rlsv3.RateLimitRequest{request("api", withHits(desc("ip", "10.0.0.66"), 5))},
			want:  []string{"checked=true OK OVER_LIMIT: over_limit/5"},
		},
		{
			name:  "unlimited",
			calls: []*rlsv3.RateLimitRequest{request("api", withHits(desc("internal", "x"), 5))},
			want:  []string{"checked=true OK OK: unlimited/5"},
		},
		{
			name:  "request hits_addend",
			calls: []*rlsv3.RateLimitRequest{{Domain: "api", Descriptors: request("api", desc("internal", "x"), desc("ip", "10.0.0.66")).Descriptors, HitsAddend: 3}},
			want:  []string{"checked=true OK OVER_LIMIT: unlimited/3 over_limit/3"},
		},
		{
			name: "deny-all beside a limited descriptor",
			calls: []*rlsv3.RateLimitRequest{
				request("api", withHits(desc("ip", "10.0.0.66"), 5), withHits(desc("model", "gpt-4o"), 2)),
			},
			want: []string{"checked=true OK OVER_LIMIT: over_limit/5 denied_by_other/2"},
		},
		{
			name: "denied by another descriptor",
			calls: []*rlsv3.RateLimitRequest{
				request("api", desc("model", "gpt-4o"), desc("client", "c")),
				request("api", desc("model", "gpt-4o"), desc("client", "c")),
				request("api", desc("model", "gpt-4o"), desc("client", "c")),
			},
			want: []string{
				"checked=true OK OK: within_limit/1 within_limit/1",
				"checked=true OK OK: within_limit/1 within_limit/1",
				"checked=true OK OVER_LIMIT: denied_by_other/1 over_limit/1",
			},
		},
		{
			name: "invalid",
			calls: []*rlsv3.RateLimitRequest{
				request(strings.Repeat("d", 1<<20), desc("model", "gpt-4o")),
				request("api"),
				request("api", withHits(desc("model", "gpt-4o"), 1<<40)),
			},
			want: []string{
				"checked=false InvalidArgument UNKNOWN:",
				"checked=false InvalidArgument UNKNOWN:",
				"checked=false InvalidArgument UNKNOWN:",
			},
		},
		{
			// The default policy for an invalid override denies.
			name: "checked, then denied for an invalid override",
			calls: []*rlsv3.RateLimitRequest{request("api", &ratelimitv3.RateLimitDescriptor{
				Entries: desc("model", "m").Entries, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1},
			})},
			want: []string{"checked=true OK OVER_LIMIT: over_limit/1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder[string]{keep: asked}
			_, srv := startServer(t, server.Options{Now: clocktest.New().Now, Observer: rec}, server.MustParse(t, testConfig))
			for _, req := range tt.calls {
				srv.ShouldRateLimit(context.Background(), req)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if got, want := strings.Join(rec.calls, "\n"), strings.Join(tt.want, "\n"); got != want {
				t.Errorf("observed:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestAppendEscaped(t *testing.T) {
	tests := []struct {
		s, reserved, want string
	}{
		{"gpt-4o", ",=", "gpt-4o"},
		{"", ",", ""},
		{"100%", "", "100%25"},
		{"b, c=d", ",=", "b%2C c%3Dd"},
		{"b, c=d", ",", "b%2C c=d"},
		{",=%", ",=", "%2C%3D%25"},
		{"%%", ",", "%25%25"},
		{"a\xffb", "\xff", "a%FFb"},
	}
	for _, tt := range tests {
		if got := string(server.AppendEscaped([]byte("x"), tt.s, tt.reserved)); got != "x"+tt.want {
			t.Errorf("AppendEscaped(x, %q, %q) = %q, want %q", tt.s, tt.reserved, got, "x"+tt.want)
		}
	}
}
