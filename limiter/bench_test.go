package limiter_test

import (
	"context"
	"encoding/binary"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// benchKey builds a bucket key shaped like those config.Rule.AppendKey
// builds (version, then length-prefixed domain, key and value): about 30–40
// bytes. It is spelled out here because limiter must not import config.
func benchKey(dst []byte, i int) []byte {
	part := func(dst []byte, s string) []byte {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		return append(dst, s...)
	}
	dst = append(dst, "v1"...)
	dst = part(dst, "ai-gateway")
	dst = part(dst, "client")
	n := len(dst)
	dst = append(dst, 0) // length placeholder, patched below
	dst = append(dst, "tenant-"...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst[n] = byte(len(dst) - n - 1)
	return dst
}

// benchLimit never runs dry under a benchmark whose clock advances 1µs a call.
var benchLimit = limiter.Limit{Count: 1_000_000, Period: time.Second, Burst: 1_000_000}

func BenchmarkDecide(b *testing.B) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	b.Run("admit", func(b *testing.B) {
		b.ReportAllocs()
		var s limiter.State
		now := t0
		for b.Loop() {
			now = now.Add(time.Microsecond)
			s, _ = limiter.Decide(limiter.Request{Limit: benchLimit, Hits: 1}, s, now)
		}
	})
	b.Run("deny", func(b *testing.B) {
		l := limiter.Limit{Count: 3, Period: time.Hour, Burst: 3}
		s, _ := limiter.Decide(limiter.Request{Limit: l, Hits: 3}, limiter.State{}, t0) // empty for an hour
		b.ReportAllocs()
		for b.Loop() {
			if _, d := limiter.Decide(limiter.Request{Limit: l, Hits: 1}, s, t0); d.Allowed {
				b.Fatal("Decide on an empty bucket admitted")
			}
		}
	})
	b.Run("odd-rate", func(b *testing.B) {
		// 7 per 3 s: every refill carries a fraction of a microsecond.
		l := limiter.Limit{Count: 7, Period: 3 * time.Second, Burst: 1000}
		var s limiter.State
		now := t0
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(time.Second)
			s, _ = limiter.Decide(limiter.Request{Limit: l, Hits: 2}, s, now)
		}
	})
}

func BenchmarkMemoryStoreTake(b *testing.B) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		reqs []limiter.Request
	}{
		{"single-key", []limiter.Request{{Key: string(benchKey(nil, 42)), Limit: benchLimit, Hits: 1}}},
		{"three-keys", []limiter.Request{
			{Key: string(benchKey(nil, 1)), Limit: benchLimit, Hits: 1},
			{Key: string(benchKey(nil, 2)), Limit: benchLimit, Hits: 1},
			{Key: string(benchKey(nil, 3)), Limit: benchLimit, Hits: 1},
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := limiter.NewMemoryStore(limiter.MemoryOptions{})
			now := t0
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(time.Microsecond)
				if _, err := m.Take(ctx, now, bc.reqs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("parallel-many-keys", func(b *testing.B) {
		// 64k keys taken from every P at once: the shards' locks are what is
		// measured. Keys are built up front so the loop allocates only what
		// Take does.
		const keys = 1 << 16
		names := make([]string, keys)
		for i := range names {
			names[i] = string(benchKey(nil, i))
		}
		m := limiter.NewMemoryStore(limiter.MemoryOptions{})
		var tick atomic.Int64
		var worker atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := int(worker.Add(1)) * 7919
			reqs := []limiter.Request{{Limit: benchLimit, Hits: 1}}
			for pb.Next() {
				i = (i + 1) & (keys - 1)
				reqs[0].Key = names[i]
				now := t0.Add(time.Duration(tick.Add(1)) * time.Microsecond)
				if _, err := m.Take(ctx, now, reqs); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
