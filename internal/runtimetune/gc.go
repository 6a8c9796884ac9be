package runtimetune

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// heapMinimum is the runtime's smallest heap goal at GOGC=100 (runtime's
// defaultHeapMinimum); it scales with the percent, so a percent p alone puts
// the goal at heapMinimum·p/100 or above.
const heapMinimum = 4 << 20

// GCPercent is the GC percent that lets a heap whose last collection found
// live bytes live, and scanned scan bytes of goroutine stacks and globals,
// grow to about floor bytes before the next one, and never below base: with
// percent p the runtime's heap goal is
// max(live + (live+scan)·p/100, heapMinimum·p/100) (runtime/mgcpacer.go),
// so GCPercent is the largest p that keeps both at or below floor, or base if
// that is larger. A live heap of 0 (no collection yet) counts as 1 byte.
// floor is at most MaxHeapFloor.
func GCPercent(live, scan, floor uint64, base int) int {
	live = max(live, 1)
	floor = min(floor, MaxHeapFloor)
	if live >= floor {
		return base
	}
	pct := min((floor-live)*100/(live+scan), floor*100/heapMinimum)
	return max(int(pct), base)
}

// MaxHeapFloor is the largest floor: its percent,
// 100·MaxHeapFloor/heapMinimum, is still an int32, what the runtime keeps.
const MaxHeapFloor = math.MaxInt32 / 100 * heapMinimum

// DefaultHeapFloor is ratelimitd's floor unless told otherwise: 64 MiB, a
// few seconds of allocation under heavy load, and far below any machine's
// memory.
const DefaultHeapFloor = 64 << 20

// A GCTuner raises the GC percent while the live heap is below a floor, so
// that the heap may grow to about the floor between collections, and gives
// the percent back (the base, GOGC) as the live heap approaches the floor:
// above it the collector paces as GOGC says. After each collection the heap
// goal is at most max(floor, what GOGC alone allows), until the next one;
// a memory limit (GOMEMLIMIT) still holds. The GC percent is the
// process's: a GCTuner assumes nothing else sets it. Start one with
// StartGC; its methods are safe for concurrent use.
//
// Why ratelimitd needs it, and how GCPercent follows the runtime's pacer,
// is in docs/design/gc-tuning.md.
type GCTuner struct {
	floor uint64
	base  int

	mu      sync.Mutex
	stopped bool
	last    int
	samples []metrics.Sample
}

// StartGC starts a GCTuner that keeps the heap goal at about floor bytes (at
// most MaxHeapFloor) or above, with base as the percent once the live heap
// reaches the floor: the process's GOGC, 100 when unset. It sets the percent
// at once, then after every collection. A floor of 0, or a negative base
// (GOGC=off), starts nothing and returns nil.
//
// The GC percent is the process's: a GCTuner assumes nothing else sets it,
// and two GCTuners with the same floor and base agree.
func StartGC(floor uint64, base int) *GCTuner {
	floor = min(floor, MaxHeapFloor)
	if floor == 0 || base < 0 {
		return nil
	}
	t := &GCTuner{
		floor: floor,
		base:  base,
		last:  -2, // not a percent: the first apply sets it
		samples: []metrics.Sample{
			{Name: "/gc/heap/live:bytes"},
			{Name: "/gc/scan/stack:bytes"},
			{Name: "/gc/scan/globals:bytes"},
		},
	}
	t.apply()
	t.arm()
	return t
}

// Stop stops t and gives the runtime back the base percent. Stopping a nil
// GCTuner does nothing.
func (t *GCTuner) Stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.stopped = true
	debug.SetGCPercent(t.base)
}

// arm asks for t.apply after the next collection: the cleanup of an
// object nothing keeps runs after the cycle that finds it unreachable, and
// arms the next.
func (t *GCTuner) arm() {
	sentinel := new([16]byte) // not tiny-allocated: a cleanup needs its own object
	runtime.AddCleanup(sentinel, func(t *GCTuner) {
		if t.apply() {
			t.arm()
		}
	}, t)
}

// apply sets the percent for the live heap the last collection found, and
// reports whether t is still running.
func (t *GCTuner) apply() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	metrics.Read(t.samples)
	var read [3]uint64 // live, stack scan, globals scan; 0 if unsupported
	for i, s := range t.samples {
		if s.Value.Kind() == metrics.KindUint64 {
			read[i] = s.Value.Uint64()
		}
	}
	if p := GCPercent(read[0], read[1]+read[2], t.floor, t.base); p != t.last {
		debug.SetGCPercent(p)
		t.last = p
	}
	return true
}
