package server

import (
	"context"
	"errors"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestPlanStopsWhenTheCallerHasGone: a call whose context has ended buys
// no matching: planRequest returns the context's error before the next
// descriptor, and the call is answered with the context's status.
func TestPlanStopsWhenTheCallerHasGone(t *testing.T) {
	set := MustParse(t, kindsConfig)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("model", "m", nil), descriptor("model", "n", nil)}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := planRequest(ctx, set, req, 0, 1024, false, QuotaModePerRule, InvalidOverrideDeny); !errors.Is(err, context.Canceled) {
		t.Errorf("planRequest with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := planRequest(context.Background(), set, req, 0, 1024, false, QuotaModePerRule, InvalidOverrideDeny); err != nil {
		t.Errorf("planRequest: %v", err)
	}
	s, err := New(Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), Now: func() time.Time { return time.Unix(1e9, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	s.SetConfig(set)
	if _, err := s.ShouldRateLimit(ctx, req); status.Code(err) != codes.Canceled {
		t.Errorf("ShouldRateLimit with a cancelled context: %v, want code Canceled", err)
	}
}
