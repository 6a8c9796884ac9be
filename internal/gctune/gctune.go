// Package gctune keeps the Go garbage collector from running every few
// megabytes while the live heap is small.
//
// A Tuner raises the GC percent while the live heap is below a floor, so
// that the heap may grow to about the floor between collections, and gives
// the percent back (the base, GOGC) as the live heap approaches the floor:
// above it the collector paces as GOGC says. After each collection the heap
// goal is at most max(floor, what GOGC alone allows), until the next one;
// a memory limit (GOMEMLIMIT) still holds. The GC percent is the
// process's: a Tuner assumes nothing else sets it. Its methods are safe
// for concurrent use.
//
// Why ratelimitd needs it, and how Percent follows the runtime's pacer, is
// in docs/design/gc-tuning.md.
package gctune

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

// Percent is the GC percent that lets a heap whose last collection found
// live bytes live, and scanned scan bytes of goroutine stacks and globals,
// grow to about floor bytes before the next one, and never below base: with
// percent p the runtime's heap goal is
// max(live + (live+scan)·p/100, heapMinimum·p/100) (runtime/mgcpacer.go),
// so Percent is the largest p that keeps both at or below floor, or base if
// that is larger. A live heap of 0 (no collection yet) counts as 1 byte.
// floor is at most MaxFloor.
func Percent(live, scan, floor uint64, base int) int {
	live = max(live, 1)
	floor = min(floor, MaxFloor)
	if live >= floor {
		return base
	}
	pct := min((floor-live)*100/(live+scan), floor*100/heapMinimum)
	return max(int(pct), base)
}

// MaxFloor is the largest floor: its percent, 100·MaxFloor/heapMinimum,
// is still an int32, what the runtime keeps.
const MaxFloor = math.MaxInt32 / 100 * heapMinimum

// DefaultFloor is ratelimitd's floor unless told otherwise: 64 MiB, a few
// seconds of allocation under heavy load, and far below any machine's
// memory.
const DefaultFloor = 64 << 20

// A Tuner sets the GC percent after every collection (see the package doc).
// Start one with Start; its methods are safe for concurrent use.
type Tuner struct {
	floor uint64
	base  int

	mu      sync.Mutex
	stopped bool
	last    int
	samples []metrics.Sample
}

// Start starts a Tuner that keeps the heap goal at about floor bytes (at
// most MaxFloor) or above, with base as the percent once the live heap
// reaches the floor: the process's GOGC, 100 when unset. It sets the percent
// at once, then after every collection. A floor of 0, or a negative base
// (GOGC=off), starts nothing and returns nil.
//
// The GC percent is the process's: a Tuner assumes nothing else sets it,
// and two Tuners with the same floor and base agree.
func Start(floor uint64, base int) *Tuner {
	floor = min(floor, MaxFloor)
	if floor == 0 || base < 0 {
		return nil
	}
	t := &Tuner{
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
// Tuner does nothing.
func (t *Tuner) Stop() {
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
func (t *Tuner) arm() {
	sentinel := new([16]byte) // not tiny-allocated: a cleanup needs its own object
	runtime.AddCleanup(sentinel, func(t *Tuner) {
		if t.apply() {
			t.arm()
		}
	}, t)
}

// apply sets the percent for the live heap the last collection found, and
// reports whether t is still running.
func (t *Tuner) apply() bool {
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
	if p := Percent(read[0], read[1]+read[2], t.floor, t.base); p != t.last {
		debug.SetGCPercent(p)
		t.last = p
	}
	return true
}
