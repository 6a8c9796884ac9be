package redistest

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	c := s.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on %s: %v", s.Addr, err)
	}
	if got := c.ConfigGet(ctx, "save").Val()["save"]; got != "" {
		t.Errorf("CONFIG GET save = %q, want \"\" (no persistence)", got)
	}
	s.Stop()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := c.Ping(short).Err(); err == nil {
		t.Fatal("PING after Stop succeeded")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if n := c.Exists(ctx, "k").Val(); n != 0 {
		t.Errorf("after Restart, k exists: want an empty server")
	}
}

func TestTwoServersDiffer(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.Addr == b.Addr {
		t.Fatalf("two servers on %s", a.Addr)
	}
}

func TestMissingRedisIsLoud(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := NewServer()
	if err == nil || !strings.Contains(err.Error(), "redis-server not found: install it (apt-get install -y redis-server)") {
		t.Errorf("NewServer without redis-server on PATH = %v, want the install hint", err)
	}
}
