package limiter

import (
	"testing"
	"unsafe"
)

// TestShardFillsCacheLines: a shard's size is a whole number of 128-byte
// blocks, so that shards locked by different goroutines never share a
// cache line (nor an adjacent-line prefetch pair).
func TestShardFillsCacheLines(t *testing.T) {
	if n := unsafe.Sizeof(memoryShard{}); n%128 != 0 {
		t.Errorf("memoryShard is %d bytes, want a multiple of 128: adjust its padding", n)
	}
}
