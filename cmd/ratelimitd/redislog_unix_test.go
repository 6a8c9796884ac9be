//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// refusingAddr is a loopback address that refuses every connection until
// the test ends: a TCP socket bound to it that never listens. Holding the
// port bound (without SO_REUSEADDR) keeps the kernel from handing it to
// another listener, as it may a port merely closed: a process of a test
// running beside this one once got it, and the dials meant to fail
// succeeded.
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		t.Fatalf("getsockname: %T, want an IPv4 address", sa)
	}
	return fmt.Sprintf("127.0.0.1:%d", in4.Port)
}

// TestGoRedisLogsAreJSON: with --log-format json and Redis unreachable, the
// lines go-redis writes about failed dials are JSON records of the
// process's logger, at debug level: there at --log-level debug, absent at
// info, and never plain text.
func TestGoRedisLogsAreJSON(t *testing.T) {
	closed := refusingAddr(t)
	dir := writeConfig(t, map[string]string{"api.yaml": fivePerMinute})
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "model", Value: "gpt-4o"}},
	}}}
	tests := []struct {
		level       string
		wantGoRedis bool
	}{
		{"debug", true},
		{"info", false},
	}
	for _, tt := range tests {
		t.Run(tt.level, func(t *testing.T) {
			p := startProc(t, "--config", dir, "--redis-url", "redis://"+closed, "--log-level", tt.level,
				"--on-backend-failure", "allow", "--redis-dial-timeout", "50ms", "--backend-timeout", "100ms")
			rls := rlsv3.NewRateLimitServiceClient(dial(t, p.grpcAddr))
			// Calls until failover has logged the outage: by then go-redis
			// has failed to dial, and logged it, several times.
			deadline := time.Now().Add(10 * time.Second)
			for !strings.Contains(p.logs.String(), "backend failing") {
				if time.Now().After(deadline) {
					t.Fatalf("no outage logged in 10 s:\n%s", p.logs)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				rls.ShouldRateLimit(ctx, req)
				cancel()
				time.Sleep(10 * time.Millisecond)
			}
			goRedis := 0
			for _, line := range strings.Split(strings.TrimSpace(p.logs.String()), "\n") {
				var rec struct{ Level, Msg, Logger string }
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Errorf("log line not JSON: %q", line)
					continue
				}
				if rec.Logger == "go-redis" {
					goRedis++
					if rec.Level != "DEBUG" || !strings.Contains(rec.Msg, "failed to dial") {
						t.Errorf("go-redis record %+v, want level DEBUG and a failed dial", rec)
					}
				}
			}
			if got := goRedis > 0; got != tt.wantGoRedis {
				t.Errorf("--log-level %s: %d go-redis records, want some: %v\n%s", tt.level, goRedis, tt.wantGoRedis, p.logs)
			}
		})
	}
}
