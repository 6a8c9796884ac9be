package gctune

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

const mib = 1 << 20

func TestPercent(t *testing.T) {
	tests := []struct {
		name              string
		live, scan, floor uint64
		base, want        int
	}{
		// 64 MiB at heapMinimum·p/100 is p = 1600: the runtime's own
		// minimum then makes the floor.
		{"tiny heap: the runtime's minimum is the floor", 1 * mib, 0, 64 * mib, 100, 1600},
		{"no collection yet", 0, 0, 64 * mib, 100, 1600},
		{"live heap sets the percent", 16 * mib, 0, 64 * mib, 100, 300},
		{"rounded down", 24 * mib, 0, 64 * mib, 100, 166},
		// goal = live + (live+scan)·p/100: 16 + 32·p/100 ≤ 64
		{"stacks and globals count", 16 * mib, 16 * mib, 64 * mib, 100, 150},
		{"near the floor: base", 40 * mib, 0, 64 * mib, 100, 100},
		{"at the floor: base", 64 * mib, 0, 64 * mib, 100, 100},
		{"above the floor: base", 1 << 30, 0, 64 * mib, 100, 100},
		{"a larger base wins", 16 * mib, 0, 64 * mib, 400, 400},
		{"a floor below the runtime's minimum changes nothing", 1 * mib, 0, 2 * mib, 100, 100},
		{"the largest floor: an int32 percent", 1, 0, MaxFloor, 100, math.MaxInt32 / 100 * 100},
		{"past the largest floor: the same", 1, 0, 1 << 62, 100, math.MaxInt32 / 100 * 100},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percent(tc.live, tc.scan, tc.floor, tc.base); got != tc.want {
				t.Errorf("Percent(%d, %d, %d, %d) = %d, want %d", tc.live, tc.scan, tc.floor, tc.base, got, tc.want)
			}
		})
	}
}

// TestTunerFollowsTheLiveHeap runs a Tuner in this process: the percent
// rises while the live heap is small, falls back to the base once a live
// heap above the floor is collected, rises again when that heap is freed,
// and is the base after Stop.
func TestTunerFollowsTheLiveHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	const floor = 64 * mib
	tu := Start(floor, 100)
	if tu == nil {
		t.Fatal("Start(64 MiB) = nil at GOGC=100")
	}
	defer tu.Stop()
	waitPercent(t, "small live heap", func(p int) bool { return p > 100 })

	big := make([]byte, 2*floor) // live, pointer-free: cheap to mark
	waitPercent(t, "live heap above the floor", func(p int) bool { return p == 100 })
	runtime.KeepAlive(big)
	big = nil
	waitPercent(t, "live heap freed", func(p int) bool { return p > 100 })

	tu.Stop()
	if p := readPercent(); p != 100 {
		t.Errorf("after Stop, GC percent = %d, want 100", p)
	}
	// A cleanup left armed runs apply once more: it must neither set the
	// percent nor arm another.
	if tu.apply() {
		t.Error("apply after Stop reports the Tuner running")
	}
	if p := readPercent(); p != 100 {
		t.Errorf("after Stop and a late apply, GC percent = %d, want 100", p)
	}
}

// waitPercent collects until the runtime's GC percent satisfies ok: the
// Tuner sets it from a cleanup, after a collection, asynchronously.
func waitPercent(t *testing.T, what string, ok func(int) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(readPercent()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: GC percent stayed %d", what, readPercent())
		}
		runtime.GC()
		time.Sleep(time.Millisecond) // let the cleanup goroutine run
	}
}

func TestStartDoesNothing(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	if tu := Start(0, 100); tu != nil {
		t.Error("Start(0, 100) started a Tuner")
	}
	if tu := Start(64*mib, -1); tu != nil {
		t.Error("Start with GOGC=off started a Tuner")
	}
	var tu *Tuner
	tu.Stop() // a nil Tuner stops without a fuss
}

// readPercent is the runtime's GC percent, -1 for off.
func readPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if p := s[0].Value.Uint64(); p <= math.MaxInt32 {
		return int(p)
	}
	return -1 // GOGC=off reads as the largest uint64
}
