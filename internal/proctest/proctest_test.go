package proctest

import (
	"net"
	"strings"
	"sync"
	"testing"
)

// TestBufferConcurrent writes from several goroutines while reading and
// checks that every write lands whole.
func TestBufferConcurrent(t *testing.T) {
	var b Buffer
	const writers, lines = 4, 100
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range lines {
				if n, err := b.Write([]byte("line\n")); n != 5 || err != nil {
					t.Errorf("Write = %d, %v; want 5, nil", n, err)
				}
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if got := strings.Count(b.String(), "line\n"); got != writers*lines {
		t.Errorf("String holds %d lines, want %d", got, writers*lines)
	}
}

// TestFreeAddr: the address is on loopback and can be listened on.
func TestFreeAddr(t *testing.T) {
	addr := FreeAddr(t)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("FreeAddr = %q, want 127.0.0.1:port", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on FreeAddr %s: %v", addr, err)
	}
	l.Close()
}
