package runtimetune

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

const mib = 1 << 20

func TestGCPercent(t *testing.T) {
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
		{"the largest floor: an int32 percent", 1, 0, MaxHeapFloor, 100, math.MaxInt32 / 100 * 100},
		{"past the largest floor: the same", 1, 0, 1 << 62, 100, math.MaxInt32 / 100 * 100},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := GCPercent(tc.live, tc.scan, tc.floor, tc.base); got != tc.want {
				t.Errorf("GCPercent(%d, %d, %d, %d) = %d, want %d", tc.live, tc.scan, tc.floor, tc.base, got, tc.want)
			}
		})
	}
}

// TestGCTunerFollowsTheLiveHeap runs a GCTuner in this process: the percent
// rises while the live heap is small, falls back to the base once a live
// heap above the floor is collected, rises again when that heap is freed,
// and is the base after Stop.
func TestGCTunerFollowsTheLiveHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	const floor = 64 * mib
	tu := StartGC(floor, 100)
	if tu == nil {
		t.Fatal("StartGC(64 MiB) = nil at GOGC=100")
	}
	defer tu.Stop()
	waitGCPercent(t, "small live heap", func(p int) bool { return p > 100 })

	big := make([]byte, 2*floor) // live, pointer-free: cheap to mark
	waitGCPercent(t, "live heap above the floor", func(p int) bool { return p == 100 })
	runtime.KeepAlive(big)
	big = nil
	waitGCPercent(t, "live heap freed", func(p int) bool { return p > 100 })

	tu.Stop()
	if p := readGCPercent(); p != 100 {
		t.Errorf("after Stop, GC percent = %d, want 100", p)
	}
	// A cleanup left armed runs apply once more: it must neither set the
	// percent nor arm another.
	if tu.apply() {
		t.Error("apply after Stop reports the GCTuner running")
	}
	if p := readGCPercent(); p != 100 {
		t.Errorf("after Stop and a late apply, GC percent = %d, want 100", p)
	}
}

// waitGCPercent collects until the runtime's GC percent satisfies ok: the
// GCTuner sets it from a cleanup, after a collection, asynchronously.
func waitGCPercent(t *testing.T, what string, ok func(int) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(readGCPercent()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: GC percent stayed %d", what, readGCPercent())
		}
		runtime.GC()
		time.Sleep(time.Millisecond) // let the cleanup goroutine run
	}
}

func TestStartGCDoesNothing(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	if tu := StartGC(0, 100); tu != nil {
		t.Error("StartGC(0, 100) started a GCTuner")
	}
	if tu := StartGC(64*mib, -1); tu != nil {
		t.Error("StartGC with GOGC=off started a GCTuner")
	}
	var tu *GCTuner
	tu.Stop() // a nil GCTuner stops without a fuss
}

// readGCPercent is the runtime's GC percent, -1 for off.
func readGCPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if p := s[0].Value.Uint64(); p <= math.MaxInt32 {
		return int(p)
	}
	return -1 // GOGC=off reads as the largest uint64
}
