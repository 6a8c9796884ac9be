package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/ratelimitd/ratelimitd/internal/runtimetune"
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
//
// With a script as well it is the script floor: instead of the PING, one
// EVALSHA per call of gcraScript on a key named after the call's first
// descriptor. It is what a limiter that decides every call alone in a
// Redis script, on Redis's clock, costs here at least.
type floorServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	redis  *redis.Client // nil: no Redis
	script *redis.Script // nil: PING
}

var _ rlsv3.RateLimitServiceServer = floorServer{}

// gcraScript is the least a token bucket on Redis's clock does per call:
// read the clock and the bucket's theoretical arrival time (GCRA), decide,
// and write the new one with an expiry. KEYS[1] is the bucket; ARGV[1] and
// ARGV[2] are the emission interval and the burst tolerance in µs. It
// returns 1 if the hit is admitted (and written), else 0.
const gcraScript = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local nxt = tat + interval
if nxt - now > tolerance + interval then return 0 end
redis.call('SET', KEYS[1], nxt, 'PX', math.floor((nxt - now) / 1000) + 1)
return 1
`

// The script floor's limit: a million hits a second with a second's burst,
// which the load never reaches, so every call writes its bucket as an
// admission does. The floor answers OK whatever the script says.
const (
	floorIntervalUS  = "1"
	floorToleranceUS = "1000000"
)

// ShouldRateLimit answers OK, after a PING for the Redis floor, or after
// the script for the script floor.
func (f floorServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	switch {
	case f.script != nil:
		if err := f.script.Run(ctx, f.redis, []string{floorKey(req)}, floorIntervalUS, floorToleranceUS).Err(); err != nil {
			return nil, status.Errorf(codes.Unavailable, "redis: %v", err)
		}
	case f.redis != nil:
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

// floorKey names the script floor's bucket for req: its domain and its
// first descriptor's entries.
func floorKey(req *rlsv3.RateLimitRequest) string {
	var b strings.Builder
	b.WriteString("floor:")
	b.WriteString(req.GetDomain())
	if ds := req.GetDescriptors(); len(ds) > 0 {
		for _, e := range ds[0].GetEntries() {
			b.WriteByte('|')
			b.WriteString(e.GetKey())
			b.WriteByte('=')
			b.WriteString(e.GetValue())
		}
	}
	return b.String()
}

// runFloor is the floor command: serve until ctx is done.
func runFloor(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelimit-bench floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "gRPC listen address (loopback only; port 0 picks a free one)")
	redisAddr := fs.String("redis-addr", "", "the Redis floor: one PING to this Redis (loopback only) per call")
	script := fs.Bool("script", false, "with --redis-addr, the script floor: one minimal token-bucket script call per call instead of the PING")
	tuned := fs.Bool("runtime-tuning", false, "run with ratelimitd's default runtime tuning (--adaptive-procs, --gc-heap-floor-mib): the tuned floor, what gRPC costs with the tuning ratelimitd has")
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
		if *script {
			f.script = redis.NewScript(gcraScript)
		}
	} else if *script {
		return usageError{errors.New("--script needs --redis-addr")}
	}
	if *tuned {
		// As ratelimitd serve does by default: one P while lightly loaded
		// (a lone call then costs some 40 µs less here), and fewer
		// collections while the heap is small (some 20% more calls at 64
		// callers here). An operator's GOMAXPROCS or GOGC wins, as there.
		defer runtimetune.StartProcs(runtimetune.ProcsOptions{}).Stop()
		if os.Getenv("GOGC") == "" {
			defer runtimetune.StartGC(runtimetune.DefaultHeapFloor, 100).Stop()
		}
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
