package xdstest

import (
	"context"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// TestServer drives the server with a bare ADS stream: the snapshot of the
// node is pushed, ACKs and NACKs are recorded as such, and WaitForNACK
// returns each NACK once, in order.
func TestServer(t *testing.T) {
	s := Start(t, Options{})
	s.SetSnapshot("node-a", "1", EGConfig("d", "r", false))
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "node-a"}
	send := func(version, nonce, nack string) {
		t.Helper()
		req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resource.RateLimitConfigType, VersionInfo: version, ResponseNonce: nonce}
		if nack != "" {
			req.ErrorDetail = &status.Status{Message: nack}
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(wantVersion string) *discoveryv3.DiscoveryResponse {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetVersionInfo() != wantVersion || len(resp.GetResources()) != 1 {
			t.Fatalf("push version %q with %d resources, want %s with 1", resp.GetVersionInfo(), len(resp.GetResources()), wantVersion)
		}
		return resp
	}
	send("", "", "")
	resp := recv("1")
	var rc rlsconfv3.RateLimitConfig
	if err := resp.GetResources()[0].UnmarshalTo(&rc); err != nil || !proto.Equal(&rc, EGConfig("d", "r", false)) {
		t.Fatalf("pushed resource %v (%v), want the EG fixture", &rc, err)
	}
	send("1", resp.GetNonce(), "")
	if ack := s.WaitForACK(t, "1"); ack.NodeID != "node-a" || ack.Nonce != resp.GetNonce() {
		t.Errorf("ACK %+v", ack)
	}
	s.SetSnapshot("node-a", "2", EGConfig("d", "r2", false))
	resp = recv("2")
	send("1", resp.GetNonce(), "first refusal")
	if got := s.WaitForNACK(t); got != "first refusal" {
		t.Errorf("WaitForNACK = %q, want the first refusal", got)
	}
	// The snapshot cache pushes a refused version again at once
	// (envoyproxy/go-control-plane#962); clients must not spin on it.
	resp = recv("2")
	s.SetSnapshot("node-a", "3", EGConfig("d", "r3", false))
	send("1", resp.GetNonce(), "second refusal")
	if got := s.WaitForNACK(t); got != "second refusal" {
		t.Errorf("WaitForNACK = %q, want the second refusal", got)
	}
	recv("3")
	if n := s.Streams(); n != 1 {
		t.Errorf("Streams = %d, want 1", n)
	}
	for _, r := range s.Requests() {
		if r.IsACK() && r.Version != "1" {
			t.Errorf("a NACK counted as an ACK: %+v", r)
		}
	}
}
