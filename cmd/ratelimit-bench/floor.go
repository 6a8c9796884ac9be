package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// floorStartedMsg is logged (as JSON, with grpc_addr) once the floor
// listens; run waits for it.
const floorStartedMsg = "ratelimit-bench floor started"

// floorServer is the least a RateLimitService can do: answer OK, with one
// OK status per descriptor, without looking at anything else. Its
// throughput and latency are what gRPC itself costs on this machine.
//
// With a Redis client it is the Redis floor: the same, after one PING round
// trip per call (go-redis, as ratelimitd uses it). It is what any service
// that asks Redis once per call costs here at least, and shows what "one
// Redis round trip" adds to a call on this machine, measured side by side.
type floorServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	redis *redis.Client // nil: no Redis
}

var _ rlsv3.RateLimitServiceServer = floorServer{}

// ShouldRateLimit answers OK (after a PING, for the Redis floor).
func (f floorServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if f.redis != nil {
		if err := f.redis.Ping(ctx).Err(); err != nil {
			return nil, status.Errorf(codes.Unavailable, "redis: %v", err)
		}
	}
	st := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))
	for i := range st {
		st[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: st}, nil
}

// runFloor is the floor command: serve until ctx is done.
func runFloor(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelimit-bench floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "gRPC listen address (loopback only; port 0 picks a free one)")
	redisAddr := fs.String("redis-addr", "", "the Redis floor: one PING to this Redis (loopback only) per call")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if err := checkLoopback(*addr); err != nil {
		return usageError{fmt.Errorf("--addr: %w", err)}
	}
	var f floorServer
	if *redisAddr != "" {
		if err := checkLoopback(*redisAddr); err != nil {
			return usageError{fmt.Errorf("--redis-addr: %w", err)}
		}
		f.redis = redis.NewClient(&redis.Options{Addr: *redisAddr})
		defer f.redis.Close()
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("floor: listen: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	log.Info(floorStartedMsg, "grpc_addr", lis.Addr().String())
	return serveFloor(ctx, lis, f)
}

// serveFloor serves f on lis until ctx is done, then stops gracefully (at
// most 5 s).
func serveFloor(ctx context.Context, lis net.Listener, f floorServer) error {
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, f)
	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("floor: serve: %w", err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		gs.Stop()
		<-stopped
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("floor: serve: %w", err)
	}
	return nil
}
