package servertest_test

import (
	"context"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// held answers OVER_LIMIT to everything; the first call waits in the
// handler until release is closed.
type held struct {
	rlsv3.UnimplementedRateLimitServiceServer
	entered, release chan struct{}
}

func (h held) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	select {
	case h.entered <- struct{}{}:
		<-h.release
	default:
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
}

// TestStart: both services answer on the client connection; GracefulStop
// returns only once the handler in progress has, and the server then
// refuses connections.
func TestStart(t *testing.T) {
	rls := held{entered: make(chan struct{}, 1), release: make(chan struct{})}
	s := servertest.Start(t, servertest.Options{
		RateLimit: rls,
		Register:  func(gs *grpc.Server) { healthpb.RegisterHealthServer(gs, health.NewServer()) },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if resp, err := healthpb.NewHealthClient(s.Conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health Check on %s = %v, %v; want SERVING", s.Addr, resp, err)
	}
	go s.Client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
	select {
	case <-rls.entered:
	case <-ctx.Done():
		t.Fatal("ShouldRateLimit never reached the handler")
	}
	stopped := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned while a handler was running")
	case <-time.After(100 * time.Millisecond):
	}
	close(rls.release)
	<-stopped
	s.GracefulStop() // again: nothing happens

	conn := servertest.Dial(t, s.Addr)
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(short, &rlsv3.RateLimitRequest{Domain: "d"}); err == nil {
		t.Errorf("ShouldRateLimit on %s after GracefulStop: no error", s.Addr)
	}
}
