package limiter

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"time"
)

// MemoryStore keeps buckets in this process. It is the store of a single
// replica: two processes with a MemoryStore each enforce two limits.
//
// Buckets live in shards, each behind its own mutex, so requests for
// different keys rarely contend. A bucket that is full again is dropped the
// next time its shard is swept; shards sweep themselves as they grow, so
// memory follows the number of buckets that are not full, not the number of
// keys ever seen. Sweep drops idle buckets on demand.
//
// The zero MemoryStore is not usable; call NewMemoryStore. It is safe for
// concurrent use.
type MemoryStore struct {
	seed   maphash.Seed
	shards []memoryShard
}

type memoryShard struct {
	mu      sync.Mutex
	buckets map[string]State
	// latest is the latest now this shard has seen, in Unix microseconds: a
	// clock that steps back is read as standing still.
	latest int64
	// sweepAt is the size at which the shard next sweeps full buckets.
	sweepAt int
	_       [96]byte // 128 bytes a shard: no two share a cache line (nor an adjacent-line prefetch pair)
}

// minSweep is the shard size below which the shard never sweeps on its own.
const minSweep = 1024

// MemoryOptions configures a MemoryStore. The zero value means the defaults.
type MemoryOptions struct {
	// Shards is the number of shards, rounded up to a power of two.
	// Default 256.
	Shards int
}

// shardCount returns the number of shards opts asks for: Shards rounded up
// to a power of two, or 256 when Shards is zero.
func (opts MemoryOptions) shardCount() int {
	if opts.Shards == 0 {
		return 256
	}
	n := 1
	for n < max(opts.Shards, 1) {
		n <<= 1
	}
	return n
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore(opts MemoryOptions) *MemoryStore {
	n := opts.shardCount()
	m := &MemoryStore{seed: maphash.MakeSeed(), shards: make([]memoryShard, n)}
	for i := range m.shards {
		m.shards[i].buckets = make(map[string]State)
		m.shards[i].sweepAt = minSweep
	}
	return m
}

func (m *MemoryStore) shardOf(key string) int {
	return int(maphash.String(m.seed, key) & uint64(len(m.shards)-1))
}

// Take implements Store.
func (m *MemoryStore) Take(ctx context.Context, now time.Time, reqs []Request) ([]Decision, error) {
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
	}
	var buf [8]int
	ids := buf[:0]
	for _, r := range reqs {
		ids = append(ids, m.shardOf(r.Key))
	}
	var lbuf [8]int
	locks := append(lbuf[:0], ids...)
	slices.Sort(locks)
	locks = slices.Compact(locks) // lock in one global order: no deadlock
	nowUS := now.UnixMicro()
	for _, id := range locks {
		sh := &m.shards[id]
		sh.mu.Lock()
		nowUS = max(nowUS, sh.latest)
	}
	defer func() {
		for _, id := range locks {
			m.shards[id].mu.Unlock()
		}
	}()
	now = time.UnixMicro(nowUS)
	// The states on the stack for up to 8 requests (the decisions are
	// returned: on the heap).
	var sbuf, nbuf [8]State
	stored, next := sbuf[:0], nbuf[:0]
	for i, r := range reqs {
		stored = append(stored, m.shards[ids[i]].buckets[r.Key])
		next = append(next, State{})
	}
	decisions := make([]Decision, len(reqs))
	decideAll(now, reqs, stored, decisions, next)
	for _, id := range locks {
		m.shards[id].latest = nowUS
	}
	for i, r := range reqs {
		sh := &m.shards[ids[i]]
		if next[i] == sh.buckets[r.Key] {
			continue
		}
		sh.buckets[r.Key] = next[i]
		if len(sh.buckets) >= sh.sweepAt {
			sh.sweep(nowUS)
		}
	}
	return decisions, nil
}

// Refund implements Refunder.
func (m *MemoryStore) Refund(ctx context.Context, now time.Time, reqs []Request) error {
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	}
	for _, r := range reqs {
		sh := &m.shards[m.shardOf(r.Key)]
		sh.mu.Lock()
		nowUS := max(now.UnixMicro(), sh.latest)
		if s, ok := sh.buckets[r.Key]; ok {
			switch n := Refund(r.Limit, s, time.UnixMicro(nowUS), r.Hits); {
			case n.Full(time.UnixMicro(nowUS)):
				delete(sh.buckets, r.Key)
			case n != s:
				sh.buckets[r.Key] = n
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// Sweep drops every bucket that is full at now. Call it now and then on an
// idle store; a busy one sweeps itself.
func (m *MemoryStore) Sweep(now time.Time) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.sweep(max(now.UnixMicro(), sh.latest))
		sh.mu.Unlock()
	}
}

// sweep drops the shard's full buckets; the caller holds sh.mu.
func (sh *memoryShard) sweep(nowUS int64) {
	now := time.UnixMicro(nowUS)
	before := len(sh.buckets)
	for k, s := range sh.buckets {
		if s.Full(now) {
			delete(sh.buckets, k)
		}
	}
	if len(sh.buckets) < before/2 {
		// Go maps never shrink: copy the survivors into a right-sized one.
		// (maps.Clone keeps the old size.)
		fresh := make(map[string]State, len(sh.buckets))
		for k, s := range sh.buckets {
			fresh[k] = s
		}
		sh.buckets = fresh
	}
	sh.sweepAt = max(minSweep, 2*len(sh.buckets))
}

// Len returns the number of buckets held, full or not.
func (m *MemoryStore) Len() int {
	return countLocked(m.shards,
		func(sh *memoryShard) *sync.Mutex { return &sh.mu },
		func(sh *memoryShard) int { return len(sh.buckets) })
}

// countLocked returns the sum of count(sh) over the shards, each shard's
// taken while holding its mutex mu(sh): MemoryStore's buckets and
// MemoryLeases' pools are counted alike.
func countLocked[S any](shards []S, mu func(*S) *sync.Mutex, count func(*S) int) int {
	n := 0
	for i := range shards {
		sh := &shards[i]
		mu(sh).Lock()
		n += count(sh)
		mu(sh).Unlock()
	}
	return n
}

var (
	_ Store    = (*MemoryStore)(nil)
	_ Refunder = (*MemoryStore)(nil)
)
