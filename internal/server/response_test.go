package server_test

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestDynamicMetadataOnTheWire: the metadata a client decodes from an
// answer's bytes, whether the server sent it pre-encoded (one rule,
// admitted or denied) or as a Struct (anything else).
func TestDynamicMetadataOnTheWire(t *testing.T) {
	set := server.MustParse(t, testConfig)
	tests := []struct {
		name    string
		req     *rlsv3.RateLimitRequest
		calls   int            // the last call's answer is checked
		encoded bool           // sent pre-encoded: DynamicMetadata nil, the bytes in the unknown fields
		want    map[string]any // the metadata, as structpb.NewStruct takes it
	}{
		{"one rule admits", request("api", desc("model", "gpt-4o")), 1, true,
			map[string]any{"ratelimitd.matched": []any{"gpt-4o"}}},
		{"one rule denies", request("api", desc("client", "a")), 3, true,
			map[string]any{"ratelimitd.matched": []any{"per-client"}, "ratelimitd.denied_by": []any{"per-client"}}},
		{"a deny-all rule denies", request("api", desc("ip", "10.0.0.66")), 1, true,
			map[string]any{"ratelimitd.matched": []any{"blocked"}, "ratelimitd.denied_by": []any{"blocked"}}},
		{"two rules admit", request("api", desc("model", "gpt-4o"), desc("client", "a")), 1, false,
			map[string]any{"ratelimitd.matched": []any{"gpt-4o", "per-client"}}},
		{"a shadow rule would deny", request("api", desc("shadow", "x")), 2, false,
			map[string]any{"ratelimitd.matched": []any{"shadowed"}, "ratelimitd.shadow_denied": []any{"shadowed"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := structpb.NewStruct(tt.want)
			if err != nil {
				t.Fatalf("structpb.NewStruct(%v): %v", tt.want, err)
			}
			srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), DynamicMetadata: server.DynamicMetadataAll})
			if err != nil {
				t.Fatalf("server.New: %v", err)
			}
			srv.SetConfig(set)
			var resp *rlsv3.RateLimitResponse
			for range tt.calls {
				if resp, err = srv.ShouldRateLimit(context.Background(), tt.req); err != nil {
					t.Fatalf("ShouldRateLimit(%v): %v", tt.req, err)
				}
			}
			if encoded := resp.DynamicMetadata == nil && len(resp.ProtoReflect().GetUnknown()) > 0; encoded != tt.encoded {
				t.Errorf("answer sent pre-encoded: %v, want %v", encoded, tt.encoded)
			}
			b, err := proto.Marshal(resp)
			if err != nil {
				t.Fatalf("proto.Marshal(%v): %v", resp, err)
			}
			var got rlsv3.RateLimitResponse
			if err := proto.Unmarshal(b, &got); err != nil {
				t.Fatalf("proto.Unmarshal: %v", err)
			}
			if !proto.Equal(got.GetDynamicMetadata(), want) {
				t.Errorf("dynamic_metadata on the wire = %v, want %v", got.GetDynamicMetadata(), want)
			}
			if len(got.ProtoReflect().GetUnknown()) > 0 {
				t.Errorf("decoded answer has unknown fields %x, want none", got.ProtoReflect().GetUnknown())
			}
		})
	}
}
