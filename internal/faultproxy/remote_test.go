package faultproxy

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRemote drives a proxy in the proxy process through every fault, as
// a test of another package does: the faults behave as Proxy's own tests
// show, and a command the process rejects is an error, not a hang.
func TestRemote(t *testing.T) {
	t.Parallel()
	echo := startEcho(t)
	r, err := StartRemote(echo.addr())
	if err != nil {
		t.Fatal(err)
	}
	if r.Target() != echo.addr() || r.Port() == 0 || !strings.HasPrefix(r.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr %q, Port %d, Target %q; want a loopback proxy of %s", r.Addr(), r.Port(), r.Target(), echo.addr())
	}
	c, err := net.DialTimeout("tcp", r.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "hello", time.Second); err != nil || got != "hello" {
		t.Fatalf("round trip through the remote proxy = %q, %v", got, err)
	}
	if n, err := r.Conns(); err != nil || n != 1 {
		t.Errorf("Conns() = %d, %v; want 1", n, err)
	}

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("Blackhole", r.Blackhole())
	if got, err := roundTrip(c, "lost", 100*time.Millisecond); err == nil {
		t.Errorf("round trip in a blackhole = %q, want a timeout", got)
	}
	must("Pass", r.Pass())
	if got, err := roundTrip(c, "back", time.Second); err != nil || got != "back" {
		t.Errorf("round trip after Pass = %q, %v", got, err)
	}

	const delay = 30 * time.Millisecond
	must("Latency", r.Latency(delay))
	start := time.Now()
	if got, err := roundTrip(c, "slow", time.Second); err != nil || got != "slow" {
		t.Errorf("round trip with latency = %q, %v", got, err)
	} else if took := time.Since(start); took < 2*delay {
		t.Errorf("round trip with latency %v took %v, want at least %v", delay, took, 2*delay)
	}
	must("Pass", r.Pass())

	must("ResetPeer", r.ResetPeer())
	if err := readErr(c); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after ResetPeer: %v, want ECONNRESET", err)
	}
	must("Pass", r.Pass())

	if _, err := r.verb("latency", "soon"); err == nil || !strings.Contains(err.Error(), "latency") {
		t.Errorf("latency soon: %v, want the process's error", err)
	}
	if _, err := StartRemote("no-port"); err == nil {
		t.Error("StartRemote(no-port) succeeded, want the process's error")
	}

	must("Close", r.Close())
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	if err := dialReadErr(r.Addr()); err == nil {
		t.Error("the proxy still accepts after Close")
	}
	if err := r.Pass(); err == nil {
		t.Error("Pass after Close succeeded, want an error")
	}
}

// TestServeAnswersEveryLine: each command line gets one answer line, in
// order, and the proxies it started close when its input ends.
func TestServeAnswersEveryLine(t *testing.T) {
	t.Parallel()
	echo := startEcho(t)
	in := strings.NewReader("start " + echo.addr() + "\n1 conns\nbogus\n2 pass\n1 latency 5ms\n1 close\n1 pass\n")
	var out strings.Builder
	if err := Serve(in, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	want := []string{"ok 1 127.0.0.1:", "ok 0", "err ", "err ", "ok", "ok", "err "}
	if len(lines) != len(want) {
		t.Fatalf("Serve answered %q, want %d lines", lines, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) || (w == "ok" && lines[i] != "ok") {
			t.Errorf("answer %d = %q, want %q…", i, lines[i], w)
		}
	}
	addr := strings.Fields(lines[0])[2]
	if err := dialReadErr(addr); err == nil {
		t.Errorf("proxy %s still accepts after Serve returned", addr)
	}
}
