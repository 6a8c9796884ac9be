// Package proctest holds what tests that run processes share: a buffer the
// process's output is copied into while the test reads it, and free
// loopback addresses to give it.
package proctest

import (
	"net"
	"strings"
	"sync"
	"testing"
)

// FreeAddr returns a loopback address (127.0.0.1:port) whose port was free
// a moment ago, for a process the test starts to listen on. It fails the
// test if no port can be had.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Buffer collects text written by one goroutine (a copy of a process's
// stderr, say) while others read it. The zero value is an empty buffer
// ready to use; it is safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p. It never fails.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
