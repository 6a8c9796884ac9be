package runtimetune

import (
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestProcsNext(t *testing.T) {
	o := ProcsOptions{Up: 150 * time.Microsecond, Down: 30 * time.Microsecond, DownAfter: 3}
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	tests := []struct {
		name string
		from procsState
		wait time.Duration
		want procsState
	}{
		{"all Ps, a long wait", procsState{low: 2}, us(500), procsState{}},
		{"all Ps, a wait at Down", procsState{low: 2}, us(30), procsState{}},
		{"all Ps, a short wait counts", procsState{}, us(10), procsState{low: 1}},
		{"all Ps, the DownAfter-th short wait goes to one", procsState{low: 2}, us(10), procsState{one: true}},
		{"all Ps, no waits at all count as short", procsState{low: 1}, 0, procsState{low: 2}},
		{"one P, a wait at Up stays", procsState{one: true}, us(150), procsState{one: true}},
		{"one P, a wait between Down and Up stays", procsState{one: true}, us(80), procsState{one: true}},
		{"one P, a wait above Up brings every P back", procsState{one: true}, us(151), procsState{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.from.next(tt.wait, o); got != tt.want {
				t.Errorf("%+v.next(%v) = %+v, want %+v", tt.from, tt.wait, got, tt.want)
			}
		})
	}
}

func TestMeanSince(t *testing.T) {
	h := &metrics.Float64Histogram{
		Buckets: []float64{math.Inf(-1), 0, 10e-6, 20e-6, 100e-6, math.Inf(1)},
		Counts:  []uint64{0, 4, 2, 1, 1},
	}
	tests := []struct {
		name string
		prev []uint64
		want time.Duration
	}{
		// 4 at 5µs, 2 at 15µs, 1 at 60µs, 1 at 100µs (no upper bound).
		{"from the start", nil, (4*5 + 2*15 + 60 + 100) * time.Microsecond / 8},
		{"since a read", []uint64{0, 4, 2, 0, 0}, (60 + 100) * time.Microsecond / 2},
		{"nothing since", []uint64{0, 4, 2, 1, 1}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := meanSince(tt.prev, h)
			if d := got - tt.want; d < -time.Nanosecond || d > time.Nanosecond {
				t.Errorf("meanSince = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestProcsRun drives a ProcsTuner with made-up waits: it moves to one P after
// DownAfter short waits, back at once on a long one, and reports each
// change with the wait that caused it.
func TestProcsRun(t *testing.T) {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	waits := []time.Duration{us(40), us(5), us(5), us(5), us(100), us(900), us(20), us(5), us(5)}
	var (
		sets    []bool
		changes []time.Duration
	)
	ticks := make(chan time.Time)
	next := make(chan time.Duration)
	reads := 0
	tu := &ProcsTuner{stop: make(chan struct{}), done: make(chan struct{})}
	o := ProcsOptions{Up: us(150), Down: us(30), DownAfter: 3, OnChange: func(procs int, w time.Duration) {
		changes = append(changes, w)
	}}
	go func() {
		defer close(tu.done)
		tu.run(o, ticks, func() time.Duration {
			if reads++; reads == 1 {
				return 0 // the read that starts the first interval
			}
			return <-next
		}, func(one bool) int {
			sets = append(sets, one)
			if one {
				return 1
			}
			return 4
		})
	}()
	for _, w := range waits {
		ticks <- time.Time{}
		next <- w
	}
	close(tu.stop) // run decides on the last wait before it looks again
	<-tu.done

	// 40 (long) 5 5 5 → one P; 100 stays; 900 → every P; 20 5 5 → one P.
	wantSets := []bool{true, false, true}
	wantChanges := []time.Duration{us(5), us(900), us(5)}
	if len(sets) != len(wantSets) {
		t.Fatalf("set calls %v, want %v", sets, wantSets)
	}
	for i := range sets {
		if sets[i] != wantSets[i] || changes[i] != wantChanges[i] {
			t.Errorf("change %d: one P %v after a wait of %v, want %v after %v", i, sets[i], changes[i], wantSets[i], wantChanges[i])
		}
	}
}

func TestStartProcsLeavesAnOperatorsGOMAXPROCS(t *testing.T) {
	t.Setenv("GOMAXPROCS", "2")
	if tu := StartProcs(ProcsOptions{}); tu != nil {
		tu.Stop()
		t.Fatal("StartProcs ran with GOMAXPROCS set")
	}
}

// TestStartProcsStop runs a real ProcsTuner in this (idle) process: it goes to one P,
// and Stop gives the default back.
func TestStartProcsStop(t *testing.T) {
	// The default Stop gives back, which differs from the current value
	// under go test -cpu.
	prev := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)
	if def < 2 || os.Getenv("GOMAXPROCS") != "" {
		t.Skip("needs a default of two Ps or more")
	}
	changed := make(chan int, 10)
	tu := StartProcs(ProcsOptions{Interval: time.Millisecond, Down: time.Second, DownAfter: 2, OnChange: func(procs int, _ time.Duration) {
		changed <- procs
	}})
	defer tu.Stop()
	select {
	case procs := <-changed:
		if procs != 1 || runtime.GOMAXPROCS(0) != 1 {
			t.Errorf("changed to %d Ps, GOMAXPROCS %d; want 1", procs, runtime.GOMAXPROCS(0))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no change in 10 s")
	}
	tu.Stop()
	if got := runtime.GOMAXPROCS(0); got != def {
		t.Errorf("after Stop, GOMAXPROCS %d, want the default %d", got, def)
	}
}
