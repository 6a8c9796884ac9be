package server_test

import (
	"bytes"
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// rawCodec sends requests as the bytes given, as Envoy's C++ protobuf
// does, without checking that their strings are UTF-8.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }

// wireWithBytes is req on the wire with every "@@" in a string replaced by
// the two bytes b (same length, so every length prefix stays right).
func wireWithBytes(t *testing.T, req *rlsv3.RateLimitRequest, b string) []byte {
	t.Helper()
	wire, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.ReplaceAll(wire, []byte("@@"), []byte(b))
}

// TestRequestsThatAreNotUTF8AreLimited: Envoy can send descriptor values
// holding bytes that are not UTF-8 (from a header value). Protobuf-go
// refuses such a request and gRPC answers INTERNAL, which Envoy by default
// lets through unlimited; with server.Codec they are limited like any
// other, each distinct value in its own bucket.
func TestRequestsThatAreNotUTF8AreLimited(t *testing.T) {
	for _, tc := range []struct {
		name  string
		codec bool
	}{{"gRPC's codec", false}, {"server.Codec", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), Now: clocktest.New().Now})
			if err != nil {
				t.Fatal(err)
			}
			srv.SetConfig(server.MustParse(t, testConfig))
			var opts []grpc.ServerOption
			if tc.codec {
				opts = append(opts, server.Codec())
			}
			conn := servertest.Start(t, servertest.Options{
				RateLimit:     srv,
				ServerOptions: opts,
				DialOptions:   []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}))},
			}).Conn
			send := func(wire []byte) (*rlsv3.RateLimitResponse, error) {
				resp := &rlsv3.RateLimitResponse{}
				err := conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", wire, resp)
				return resp, err
			}
			req := request("api", desc("client", "c@@"))

			resp, err := send(wireWithBytes(t, req, "\xff\xfe"))
			if !tc.codec {
				if status.Code(err) != codes.Internal {
					t.Errorf("without server.Codec: %v, want INTERNAL (what this codec exists for)", err)
				}
				return
			}
			// per-client is 2 a minute, one bucket per value.
			for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
				if i > 0 {
					resp, err = send(wireWithBytes(t, req, "\xff\xfe"))
				}
				if err != nil || resp.GetOverallCode() != want {
					t.Errorf("call %d with value c\\xff\\xfe: %v %v, want %v", i+1, resp.GetOverallCode(), err, want)
				}
			}
			if resp, err := send(wireWithBytes(t, req, "\xfe\xff")); err != nil || resp.GetOverallCode() != ok {
				t.Errorf("value c\\xfe\\xff: %v %v, want OK (a bucket of its own)", resp.GetOverallCode(), err)
			}
			// A valid request goes through as before.
			if resp, err := send(wireWithBytes(t, req, "ok")); err != nil || resp.GetOverallCode() != ok {
				t.Errorf("valid value: %v %v, want OK", resp.GetOverallCode(), err)
			}
			// Bytes that break the message, not only its strings, are still refused.
			if _, err := send([]byte{0x12, 0x05, 0x0a}); status.Code(err) != codes.Internal {
				t.Errorf("truncated message: %v, want INTERNAL", err)
			}
		})
	}
}
