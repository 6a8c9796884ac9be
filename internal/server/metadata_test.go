package server_test

import (
	"slices"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/server"
)

// TestDynamicMetadataModes: which answers name their rules in
// dynamic_metadata under each mode, over one sequence of calls: plain
// admissions, a shadow-mode denial (still admitted) and a denial.
func TestDynamicMetadataModes(t *testing.T) {
	set := server.MustParse(t, testConfig)
	reqs := []*rlsv3.RateLimitRequest{
		request("api", desc("model", "gpt-4o")), // admitted
		request("api", desc("shadow", "x")),     // admitted: the shadowed rule's one token
		request("api", desc("shadow", "x")),     // shadow denial
		request("api", desc("client", "a")),     // admitted (2 a minute)
		request("api", desc("client", "a")),     // admitted
		request("api", desc("client", "a")),     // denied
	}
	matched := []string{"ratelimitd.matched"}
	shadowDenied := []string{"ratelimitd.matched", "ratelimitd.shadow_denied"}
	deniedBy := []string{"ratelimitd.denied_by", "ratelimitd.matched"}
	tests := []struct {
		name string
		mode server.DynamicMetadata
		want [][]string // the metadata keys of each answer, sorted; nil for none
	}{
		{"all", server.DynamicMetadataAll, [][]string{matched, matched, shadowDenied, matched, matched, deniedBy}},
		{"notable", server.DynamicMetadataNotable, [][]string{nil, nil, shadowDenied, nil, nil, deniedBy}},
		{"default is notable", 0, [][]string{nil, nil, shadowDenied, nil, nil, deniedBy}},
		{"off", server.DynamicMetadataOff, [][]string{nil, nil, nil, nil, nil, nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := startServer(t, server.Options{DynamicMetadata: tt.mode}, set)
			for i, req := range reqs {
				resp := call(t, c, req)
				var keys []string
				for k := range resp.GetDynamicMetadata().GetFields() {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				if !slices.Equal(keys, tt.want[i]) {
					t.Errorf("call %d (%v): metadata keys %v, want %v", i+1, resp.GetOverallCode(), keys, tt.want[i])
				}
			}
		})
	}
}
