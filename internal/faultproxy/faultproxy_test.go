package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// echoServer is a TCP server on loopback that writes back what it reads.
type echoServer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// startEcho starts an echo server, stopped when the test ends.
func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln, conns: make(map[net.Conn]struct{})}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns[c] = struct{}{}
			e.mu.Unlock()
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				io.Copy(c, c)
				c.Close()
				e.mu.Lock()
				delete(e.conns, c)
				e.mu.Unlock()
			}()
		}
	}()
	t.Cleanup(e.close)
	return e
}

func (e *echoServer) addr() string { return e.ln.Addr().String() }

func (e *echoServer) close() {
	e.ln.Close()
	e.mu.Lock()
	for c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// startProxy starts a proxy to target, closed when the test ends.
func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// dial connects to the proxy; the connection is closed when the test ends.
func dial(t *testing.T, p *Proxy) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", p.Addr(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// roundTrip writes msg and reads len(msg) bytes back within timeout.
func roundTrip(c net.Conn, msg string, timeout time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	n, err := io.ReadFull(c, buf)
	return string(buf[:n]), err
}

// waitConns waits up to a second until p.Conns() is want.
func waitConns(t *testing.T, p *Proxy, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for p.Conns() != want {
		if time.Now().After(deadline) {
			t.Fatalf("Conns() = %d, want %d", p.Conns(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPass(t *testing.T) {
	t.Parallel()
	p := startProxy(t, startEcho(t).addr())
	c := dial(t, p)
	for _, msg := range []string{"hello", "again"} {
		if got, err := roundTrip(c, msg, time.Second); err != nil || got != msg {
			t.Fatalf("round trip %q = %q, %v; want it echoed", msg, got, err)
		}
	}
	waitConns(t, p, 1)
	c.Close()
	waitConns(t, p, 0)
}

func TestBlackhole(t *testing.T) {
	t.Parallel()
	p := startProxy(t, startEcho(t).addr())
	c := dial(t, p)
	if got, err := roundTrip(c, "before", time.Second); err != nil || got != "before" {
		t.Fatalf("round trip before Blackhole = %q, %v", got, err)
	}

	p.Blackhole()
	_, err := roundTrip(c, "lost", 150*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip during Blackhole: err = %v, want a read timeout", err)
	}
	// A new connection is accepted and connected, but silent too.
	c2 := dial(t, p)
	waitConns(t, p, 2)
	if _, err := roundTrip(c2, "lost too", 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip on a new conn during Blackhole: err = %v, want a read timeout", err)
	}

	p.Pass()
	// What was written during the blackhole is gone: the echo is exactly
	// the new message.
	for _, conn := range []net.Conn{c, c2} {
		if got, err := roundTrip(conn, "after", time.Second); err != nil || got != "after" {
			t.Fatalf("round trip after Pass = %q, %v; want \"after\"", got, err)
		}
		conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if n, err := conn.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("after the echo, Read = %d, %v: bytes from the blackhole were forwarded", n, err)
		}
	}
	if n := p.Conns(); n != 2 {
		t.Errorf("Conns() = %d after Blackhole and Pass, want 2 (the blackhole closes nothing)", n)
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	const d = 50 * time.Millisecond
	p := startProxy(t, startEcho(t).addr())
	c := dial(t, p)
	p.Latency(d)

	start := time.Now()
	if got, err := roundTrip(c, "x", 2*time.Second); err != nil || got != "x" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	if rtt := time.Since(start); rtt < 2*d {
		t.Errorf("round trip with Latency(%v) took %v, want ≥ %v (d each way)", d, rtt, 2*d)
	}

	// 50 chunks written 2 ms apart (separate reads at the proxy) all come
	// back about 2·d after they were sent: the delays overlap.
	const chunks = 50
	var sent bytes.Buffer
	c.SetDeadline(time.Now().Add(2 * time.Second))
	start = time.Now()
	done := make(chan error, 1)
	got := make([]byte, 0, chunks*4)
	go func() {
		buf := make([]byte, 256)
		for len(got) < chunks*4 {
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := range chunks {
		msg := []byte{'<', byte('0' + i/10), byte('0' + i%10), '>'}
		sent.Write(msg)
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("write chunk %d: %v", i, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatalf("reading %d pipelined chunks back: %v (got %d bytes)", chunks, err, len(got))
	}
	elapsed := time.Since(start)
	if !bytes.Equal(got, sent.Bytes()) {
		t.Errorf("pipelined chunks came back as %q, want %q (order kept)", got, sent.Bytes())
	}
	if limit := chunks * d / 4; elapsed >= limit {
		t.Errorf("%d pipelined chunks with Latency(%v) took %v, want < %v (delays must overlap)", chunks, d, elapsed, limit)
	}
	if elapsed < 2*d {
		t.Errorf("%d pipelined chunks with Latency(%v) took %v, want ≥ %v", chunks, d, elapsed, 2*d)
	}

	p.Pass()
	start = time.Now()
	if got, err := roundTrip(c, "y", time.Second); err != nil || got != "y" {
		t.Fatalf("round trip after Pass = %q, %v", got, err)
	}
	t.Logf("round trip after Pass: %v", time.Since(start))
}

func TestResetPeer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// open says whether the connection is open (and has echoed)
		// before ResetPeer, or dialled after it.
		open bool
	}{
		{name: "open connection", open: true},
		{name: "new connection", open: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startProxy(t, startEcho(t).addr())
			var c *net.TCPConn
			if tc.open {
				c = dial(t, p)
				if got, err := roundTrip(c, "hi", time.Second); err != nil || got != "hi" {
					t.Fatalf("round trip before ResetPeer = %q, %v", got, err)
				}
			}
			p.ResetPeer()
			var err error
			if tc.open {
				err = readErr(c)
			} else {
				err = dialReadErr(p.Addr())
			}
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("after ResetPeer: %v; want ECONNRESET", err)
			}
			waitConns(t, p, 0)

			p.Pass()
			c2 := dial(t, p)
			if got, err := roundTrip(c2, "back", time.Second); err != nil || got != "back" {
				t.Fatalf("round trip on a new conn after Pass = %q, %v", got, err)
			}
		})
	}
}

func TestRefusedTargetResets(t *testing.T) {
	t.Parallel()
	// A port nobody listens on: take one, then free it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	ln.Close()

	p := startProxy(t, target)
	if err := dialReadErr(p.Addr()); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("through a proxy to a refusing %s: %v; want ECONNRESET", target, err)
	}
}

// readErr reads c (for a second at most) and returns the error.
func readErr(c net.Conn) error {
	c.SetReadDeadline(time.Now().Add(time.Second))
	n, err := c.Read(make([]byte, 16))
	if err == nil {
		return fmt.Errorf("Read = %d bytes, no error", n)
	}
	return fmt.Errorf("Read: %w", err)
}

// dialReadErr dials addr and reads, and returns the error of either: a
// connection reset at once on loopback may fail the dial itself (the RST
// arrives before the dialler checks the socket) or the first read.
func dialReadErr(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	return readErr(c)
}

func TestStartBadTarget(t *testing.T) {
	t.Parallel()
	if p, err := Start("no-port"); err == nil {
		p.Close()
		t.Fatal(`Start("no-port") succeeded, want an error`)
	}
}

// TestCloseLeavesNoGoroutines is not parallel: it counts the goroutines of
// the whole test binary.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	e := startEcho(t)
	before := runtime.NumGoroutine()

	p, err := Start(e.addr())
	if err != nil {
		t.Fatal(err)
	}
	var clients []net.Conn
	for range 3 {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
		if got, err := roundTrip(c, "ping", time.Second); err != nil || got != "ping" {
			t.Fatalf("round trip = %q, %v", got, err)
		}
	}
	// Chunks held for a minute must not hold Close up.
	p.Latency(time.Minute)
	for _, c := range clients {
		if _, err := c.Write([]byte("held")); err != nil {
			t.Fatal(err)
		}
	}
	waitConns(t, p, 3)

	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Close took %v with chunks held by Latency, want it prompt", took)
	}
	if n := p.Conns(); n != 0 {
		t.Errorf("Conns() after Close = %d, want 0", n)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	for _, c := range clients {
		c.Close()
	}

	// The echo server's handlers end once the proxy's side closes; give
	// the runtime a moment to retire them.
	var now int
	for range 100 {
		if now = runtime.NumGoroutine(); now <= before {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, 1<<16)
	t.Fatalf("goroutines: %d before Start, %d after Close:\n%s", before, now, buf[:runtime.Stack(buf, true)])
}
