package redisproc_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redisproc"
)

func start(t *testing.T, opts redisproc.Options) *redisproc.Server {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	s, err := redisproc.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	return s
}

func client(t *testing.T, s *redisproc.Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestStartKillRestart: a server answers once Start returns, saves
// nothing, is gone after Kill, and comes back empty on the same port.
func TestStartKillRestart(t *testing.T) {
	prepared := false
	s := start(t, redisproc.Options{Prepare: func(*exec.Cmd) { prepared = true }})
	if !prepared {
		t.Error("Options.Prepare was not called")
	}
	if !strings.HasPrefix(s.Addr, "127.0.0.1:") || s.Port == 0 {
		t.Errorf("Addr %q, Port %d: want 127.0.0.1 and a port", s.Addr, s.Port)
	}
	c := client(t, s)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on %s: %v", s.Addr, err)
	}
	if got := c.ConfigGet(ctx, "save").Val()["save"]; got != "" {
		t.Errorf("CONFIG GET save = %q, want \"\" (no persistence)", got)
	}
	exited := s.Exited()
	s.Kill()
	select {
	case <-exited:
	default:
		t.Error("Exited not closed after Kill returned")
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := c.Ping(short).Err(); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart on %s: %v", s.Addr, err)
	}
	if n := c.Exists(ctx, "k").Val(); n != 0 {
		t.Errorf("after Restart, k exists: want an empty server")
	}
}

// TestTerminate: SIGTERM stops a server, which exits on its own.
func TestTerminate(t *testing.T) {
	s := start(t, redisproc.Options{})
	exited := s.Exited()
	if err := s.Terminate(5 * time.Second); err != nil {
		t.Fatalf("Terminate = %v", err)
	}
	select {
	case <-exited:
	default:
		t.Error("Exited not closed after Terminate returned")
	}
	if err := s.Terminate(time.Second); err != nil {
		t.Errorf("Terminate on a stopped server = %v, want nil", err)
	}
}

// TestArgs: extra arguments reach the server, {bus} becomes a second free
// port, and a config file comes first.
func TestArgs(t *testing.T) {
	dir := t.TempDir()
	s := start(t, redisproc.Options{Dir: dir, Args: []string{"--cluster-enabled", "yes", "--cluster-port", "{bus}", "--cluster-config-file", "nodes.conf"}})
	c := client(t, s)
	ctx := context.Background()
	got := c.ConfigGet(ctx, "cluster-port").Val()["cluster-port"]
	if got == "" || got == "0" || got == "{bus}" || strings.HasSuffix(s.Addr, ":"+got) {
		t.Errorf("CONFIG GET cluster-port = %q (server on %s), want a second port", got, s.Addr)
	}
	if dirGot := c.ConfigGet(ctx, "dir").Val()["dir"]; dirGot != dir {
		t.Errorf("CONFIG GET dir = %q, want %s", dirGot, dir)
	}
}

// TestMissingRedisIsLoud: without redis-server the error says how to
// install it; a server that exits at once says why.
func TestMissingRedisIsLoud(t *testing.T) {
	_, err := redisproc.Start(context.Background(), redisproc.Options{Dir: t.TempDir(), Bin: "/nonexistent/redis-server"})
	if err == nil || !strings.Contains(err.Error(), "not found: install it (apt-get install -y redis-server)") {
		t.Errorf("Start with a missing binary = %v, want the install hint", err)
	}
	_, err = redisproc.Start(context.Background(), redisproc.Options{Dir: t.TempDir(), Args: []string{"--no-such-option", "1"}})
	if err == nil || !strings.Contains(err.Error(), "no-such-option") {
		t.Errorf("Start with a bad option = %v, want an error quoting redis-server's complaint", err)
	}
}
