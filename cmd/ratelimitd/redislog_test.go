package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// TestRedisLoggerWritesThroughSlog: a go-redis line comes out as one record
// of the logger in use, at debug level, in its format; below debug it is
// not written.
func TestRedisLoggerWritesThroughSlog(t *testing.T) {
	dialErr := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	tests := []struct {
		name    string
		format  string
		level   slog.Level
		want    string // the whole output; "" for none
		wantRec map[string]any
	}{
		{name: "json at debug", format: "json", level: slog.LevelDebug, wantRec: map[string]any{
			"level": "DEBUG", "logger": "go-redis",
			"msg": "redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:1: connect: connection refused",
		}},
		{name: "text at debug", format: "text", level: slog.LevelDebug,
			want: `level=DEBUG msg="redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:1: connect: connection refused" logger=go-redis` + "\n"},
		{name: "json at info", format: "json", level: slog.LevelInfo},
		{name: "text at error", format: "text", level: slog.LevelError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			// As newLogger builds it, without the time, so that records
			// can be compared whole.
			opts := &slog.HandlerOptions{Level: tt.level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}}
			log := slog.New(slog.NewTextHandler(&buf, opts))
			if tt.format == "json" {
				log = slog.New(slog.NewJSONHandler(&buf, opts))
			}
			var r redisstore.Logger
			r.Use(log)
			r.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v\n", 1, dialErr)
			got := buf.String()
			if tt.wantRec != nil {
				var rec map[string]any
				if err := json.Unmarshal([]byte(got), &rec); err != nil {
					t.Fatalf("output %q: not one JSON record: %v", got, err)
				}
				if len(rec) != len(tt.wantRec) {
					t.Errorf("record %v, want %v", rec, tt.wantRec)
				}
				for k, v := range tt.wantRec {
					if rec[k] != v {
						t.Errorf("record %v: %s = %v, want %v", rec, k, rec[k], v)
					}
				}
				return
			}
			if got != tt.want {
				t.Errorf("output %q, want %q", got, tt.want)
			}
		})
	}
}

// refusingAddr is a loopback address that refuses every connection until
// the test ends: a TCP socket bound to it that never listens. Holding the
// port bound (without SO_REUSEADDR) keeps the kernel from handing it to
// another listener, as it may a port merely closed: a process of a test
// running beside this one once got it, and the dials meant to fail
// succeeded. (This package's tests already need a Unix system.)
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
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in4.Port))
}

// TestRefusingAddr: a connection to refusingAddr's address is refused, and
// no listener can take its port while the test runs.
func TestRefusingAddr(t *testing.T) {
	addr := refusingAddr(t)
	if c, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Errorf("dial %s: %v, want connection refused", addr, err)
	}
	if l, err := net.Listen("tcp", addr); !errors.Is(err, syscall.EADDRINUSE) {
		if l != nil {
			l.Close()
		}
		t.Errorf("listen on %s: %v, want address in use", addr, err)
	}
}

// TestGoRedisLogsAreJSON: with --log-format json and Redis unreachable, the
// lines go-redis writes about failed dials are JSON records of the
// process's logger, at debug level: there at --log-level debug, absent at
// info, and never plain text.
func TestGoRedisLogsAreJSON(t *testing.T) {
	refusing := refusingAddr(t)
	dir := writeConfig(t, map[string]string{"api.yaml": fivePerMinute})
	req := servertest.Request("api", servertest.Desc("model", "gpt-4o"))
	tests := []struct {
		level       string
		wantGoRedis bool
	}{
		{"debug", true},
		{"info", false},
	}
	for _, tt := range tests {
		t.Run(tt.level, func(t *testing.T) {
			p := startProc(t, "--config", dir, "--redis-url", "redis://"+refusing, "--log-level", tt.level,
				"--on-backend-failure", "allow", "--redis-dial-timeout", "50ms", "--backend-timeout", "100ms")
			rls := rlsClient(t, p.grpcAddr)
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
