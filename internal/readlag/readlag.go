// Package readlag measures how long the bytes a server reads had waited
// in the kernel: on each read of a TCP connection, the time since the
// kernel received the last of them (its SO_TIMESTAMPNS receive stamp).
//
// gRPC starts a call's deadline when its transport parses the request,
// from the timeout the client sent. A request that waited in the socket
// before this process read it (its goroutines busy, or its threads
// waiting for a CPU) therefore gets a deadline later than its client's,
// by that wait. ratelimitd keeps a margin before each deadline
// (internal/failover); feeding it what this package measures keeps that
// margin at least as wide as the waits requests now see.
//
// Only Linux stamps receives this way; elsewhere Stamp fails, and the
// connections Listener accepts are returned as accepted, noting nothing.
package readlag

import (
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// NoteFunc receives, for each read that returned bytes with a receive
// stamp, how long before now the kernel received the last of them.
type NoteFunc func(waited time.Duration, now time.Time)

// Listener wraps l so that each TCP connection it accepts is a Conn
// noting every read's wait to note. A connection whose stamps cannot be
// turned on is returned as accepted, and notes nothing.
func Listener(l net.Listener, note NoteFunc) net.Listener {
	return &listener{Listener: l, note: note}
}

type listener struct {
	net.Listener
	note NoteFunc
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	sc, err := Stamp(tc, l.note)
	if err != nil {
		return c, nil
	}
	return sc, nil
}

// Conn is a TCP connection whose reads note when the kernel received the
// last bytes each returned. Reads must not run concurrently with each
// other (a gRPC transport has one reader); everything else is the
// embedded *net.TCPConn's.
type Conn struct {
	*net.TCPConn
	raw      syscall.RawConn
	oob      []byte
	note     NoteFunc
	received atomic.Int64 // Unix ns; 0 until a read carried a stamp

	// the read under way (Linux): its buffer, the poller's callback, and
	// what recvmsg returned
	buf     []byte
	recv    func(fd uintptr) bool
	n, oobn int
	rerr    error
}

// Received returns when the kernel received the last bytes a read
// returned, the zero Time until a read carried a stamp.
func (c *Conn) Received() time.Time {
	ns := c.received.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// noteStamp records a read's receive stamp, ns since the epoch (0: none;
// the kernel turns stamping on for the whole host lazily, so the first
// packets after the first socket asks carry none).
func (c *Conn) noteStamp(ns int64) {
	if ns <= 0 {
		return
	}
	c.received.Store(ns)
	if c.note != nil {
		now := time.Now()
		c.note(max(now.Sub(time.Unix(0, ns)), 0), now)
	}
}

// oobSize holds one SCM_TIMESTAMPNS control message (a timespec).
const oobSize = 64

// compile-time check that a Conn is a net.Conn
var _ net.Conn = (*Conn)(nil)
