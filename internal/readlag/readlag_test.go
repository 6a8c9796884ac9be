//go:build linux

package readlag_test

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/readlag"
)

// pair returns a connection accepted through readlag.Listener, whose waits
// go to notes, and the client end.
func pair(t *testing.T) (server net.Conn, client net.Conn, notes func() []time.Duration) {
	t.Helper()
	var mu sync.Mutex
	var got []time.Duration
	l := listen(t)
	rl := readlag.Listener(l, func(waited time.Duration, now time.Time) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, waited)
	})
	client, server = connect(t, l, rl)
	if _, ok := server.(*readlag.Conn); !ok {
		t.Fatalf("Accept = %T, want a *readlag.Conn", server)
	}
	return server, client, func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Duration(nil), got...)
	}
}

// listen returns a listener on a free loopback port, closed when the test
// ends.
func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// connect dials l and accepts the connection through accept (l, or a
// listener wrapping it); both ends are closed when the test ends.
func connect(t *testing.T, l, accept net.Listener) (client, server net.Conn) {
	t.Helper()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = accept.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

// exchange writes msg from client, waits wait, and reads it whole on
// server.
func exchange(t *testing.T, server, client net.Conn, msg string, wait time.Duration) {
	t.Helper()
	if _, err := client.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(wait)
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(server, buf); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(buf) != msg {
		t.Fatalf("read %q, want %q", buf, msg)
	}
}

// TestReadNotesTheWait: bytes read 40 ms after they arrived are noted as
// having waited at least that long (and not absurdly longer). The kernel
// turns stamping on lazily, so the first exchanges may carry no stamp.
func TestReadNotesTheWait(t *testing.T) {
	server, client, notes := pair(t)
	const wait = 40 * time.Millisecond
	for i := range 20 {
		exchange(t, server, client, "ping", wait)
		if got := notes(); len(got) > 0 {
			last := got[len(got)-1]
			if last < wait || last > wait+2*time.Second {
				t.Fatalf("exchange %d: noted a wait of %v for bytes read %v after they were sent, want at least that", i, last, wait)
			}
			if r := server.(*readlag.Conn).Received(); r.IsZero() || time.Since(r) < wait {
				t.Fatalf("Received() = %v, %v ago; want the arrival of the bytes read, at least %v ago", r, time.Since(r), wait)
			}
			return
		}
	}
	t.Fatal("20 exchanges and no read carried a receive stamp")
}

// TestReadIsARead: a Conn reads as a TCP connection does: in pieces into
// a small buffer, io.EOF when the peer closes, and a read deadline ends a
// read that waits.
func TestReadIsARead(t *testing.T) {
	server, client, _ := pair(t)
	if _, err := client.Write([]byte("abcdefgh")); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 3)
	for len(got) < 8 {
		n, err := server.Read(buf)
		if err != nil {
			t.Fatalf("read after %q: %v", got, err)
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != "abcdefgh" {
		t.Fatalf("read %q in pieces of 3, want abcdefgh", got)
	}

	server.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start := time.Now()
	if n, err := server.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing sent and a 30ms deadline = %d, %v; want os.ErrDeadlineExceeded", n, err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the read's deadline ended it after %v", took)
	}
	server.SetReadDeadline(time.Time{})

	client.Close()
	if n, err := server.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer closed = %d, %v; want 0, io.EOF", n, err)
	}
}

// TestReceivedIsTheArrival: a stamped client connection's Received is
// when the kernel received the bytes, not when they were read: bytes left
// unread for 50 ms are stamped within a few ms of their send.
func TestReceivedIsTheArrival(t *testing.T) {
	ln := listen(t)
	nc, peer := connect(t, ln, ln)
	c, err := readlag.Stamp(nc.(*net.TCPConn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The host's first stamped packets may carry none: a few answers,
	// until one is stamped.
	for try := range 20 {
		sent := time.Now()
		if _, err := peer.Write([]byte("answer")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		buf := make([]byte, 16)
		n, err := c.Read(buf)
		read := time.Now()
		if err != nil || string(buf[:n]) != "answer" {
			t.Fatalf("Read = %q, %v; want \"answer\"", buf[:n], err)
		}
		got := c.Received()
		if got.IsZero() {
			t.Logf("answer %d carried no stamp", try+1)
			continue
		}
		if got.Before(sent.Add(-time.Millisecond)) || got.After(sent.Add(10*time.Millisecond)) {
			t.Errorf("received stamped %v after the send (read %v after it), want within 10ms of the send", got.Sub(sent), read.Sub(sent))
		}
		return
	}
	t.Errorf("20 answers, none stamped")
}

// TestReadAllocatesNothing: a read is on every gRPC request's path, so a
// stamped read costs no allocation (the control message is parsed in
// place, and the poller's callback is made once per connection).
func TestReadAllocatesNothing(t *testing.T) {
	l := listen(t)
	var noted atomic.Int64
	rl := readlag.Listener(l, func(time.Duration, time.Time) { noted.Add(1) })
	client, server := connect(t, l, rl)
	msg, buf := []byte("x"), make([]byte, 1)
	roundTrip := func() {
		if _, err := client.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(server, buf); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel turns stamping on lazily (from a work queue, once the
	// first socket asks): read until a stamp is noted.
	for start := time.Now(); noted.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Since(start) > 2*time.Second {
			t.Fatal("no stamp noted in 2 s of reads")
		}
		roundTrip()
	}
	if allocs := testing.AllocsPerRun(200, roundTrip); allocs > 0 {
		t.Errorf("a stamped read allocates %.1f times, want none", allocs)
	}
	if noted.Load() < 100 {
		t.Errorf("%d reads noted of 200, want the reads to carry stamps", noted.Load())
	}
}
