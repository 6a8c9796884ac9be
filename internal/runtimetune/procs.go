package runtimetune

import (
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"time"
)

// ProcsOptions tune a ProcsTuner. Zero fields take the defaults.
type ProcsOptions struct {
	// Interval is how often the wait is measured. Default 250ms.
	Interval time.Duration
	// Up: on one P, a mean wait above it brings every P back at once.
	// Default 150µs (at 64 callers, one P made goroutines wait 400–500 µs
	// on average; at 16, 75–90 µs, where one P was still the faster).
	Up time.Duration
	// Down: on every P, a mean wait below it for DownAfter intervals in a
	// row goes to one P. Default 30µs (one caller: 10–15 µs).
	Down time.Duration
	// DownAfter is how many intervals in a row the wait must stay below
	// Down. Default 4 (1 s at the default Interval).
	DownAfter int
	// OnChange, when set, is called from the ProcsTuner's goroutine after
	// each change, with the new number of Ps and the mean wait that caused
	// it.
	OnChange func(procs int, wait time.Duration)
}

func (o ProcsOptions) withDefaults() ProcsOptions {
	if o.Interval <= 0 {
		o.Interval = 250 * time.Millisecond
	}
	if o.Up <= 0 {
		o.Up = 150 * time.Microsecond
	}
	if o.Down <= 0 {
		o.Down = 30 * time.Microsecond
	}
	if o.DownAfter <= 0 {
		o.DownAfter = 4
	}
	return o
}

// procsState is a ProcsTuner's decision: the Ps in use and, on every P,
// how many intervals in a row the wait has been below Down.
type procsState struct {
	one bool // running on one P
	low int
}

// next is the state after an interval whose mean wait was wait.
func (s procsState) next(wait time.Duration, o ProcsOptions) procsState {
	switch {
	case s.one && wait > o.Up:
		return procsState{}
	case s.one:
		return s
	case wait >= o.Down:
		return procsState{}
	case s.low+1 >= o.DownAfter:
		return procsState{one: true}
	}
	return procsState{low: s.low + 1}
}

// A ProcsTuner runs the process on one P (GOMAXPROCS=1) while its
// goroutines seldom wait for one, and on every P the runtime would give it
// otherwise as soon as they do.
//
// It measures how long runnable goroutines wait for a P (the runtime's
// /sched/latencies histogram) every ProcsOptions.Interval: up to every P
// at once when, on one P, the mean wait passes ProcsOptions.Up; down to one
// P only after the mean wait has stayed below ProcsOptions.Down on all of
// them for ProcsOptions.DownAfter intervals. GOMAXPROCS is the process's:
// a ProcsTuner assumes nothing else sets it, and does not start when the
// GOMAXPROCS environment variable is set. Start one with StartProcs; Stop
// may be called from any goroutine, more than once.
//
// Why one P under light load, and the measurements behind the thresholds,
// are in docs/design/adaptive-procs.md.
type ProcsTuner struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// StartProcs starts a ProcsTuner, unless the GOMAXPROCS environment
// variable is set (the operator chose) or the runtime's default is already
// one P; then it returns nil, which Stop accepts. GOMAXPROCS is the
// process's: a ProcsTuner assumes nothing else sets it. While it runs on every P, the runtime's
// default (and its updates, as a container's CPU limit changes) is in
// force.
func StartProcs(o ProcsOptions) *ProcsTuner {
	if os.Getenv("GOMAXPROCS") != "" || runtime.GOMAXPROCS(0) <= 1 {
		return nil
	}
	t := &ProcsTuner{stop: make(chan struct{}), done: make(chan struct{})}
	ticker := time.NewTicker(o.withDefaults().Interval)
	go func() {
		defer close(t.done)
		defer ticker.Stop()
		t.run(o, ticker.C, newWaitReader().mean, setProcs)
	}()
	return t
}

// Stop stops the ProcsTuner and gives the runtime its default back. It may
// be called more than once, and on a nil ProcsTuner.
func (t *ProcsTuner) Stop() {
	if t == nil {
		return
	}
	t.once.Do(func() {
		close(t.stop)
		<-t.done
		runtime.SetDefaultGOMAXPROCS()
	})
}

// run decides at every tick, from the mean wait that wait returns, and
// calls set on each change (one: GOMAXPROCS=1; else the default).
func (t *ProcsTuner) run(o ProcsOptions, ticks <-chan time.Time, wait func() time.Duration, set func(one bool) int) {
	o = o.withDefaults()
	var s procsState
	wait() // the first interval starts now
	for {
		select {
		case <-t.stop:
			return
		case <-ticks:
		}
		w := wait()
		n := s.next(w, o)
		if n.one != s.one {
			procs := set(n.one)
			if o.OnChange != nil {
				o.OnChange(procs, w)
			}
		}
		s = n
	}
}

// setProcs runs the process on one P, or gives the runtime its default
// back; it returns the Ps now in use.
func setProcs(one bool) int {
	if one {
		runtime.GOMAXPROCS(1)
	} else {
		runtime.SetDefaultGOMAXPROCS()
	}
	return runtime.GOMAXPROCS(0)
}

// schedLatencies is the runtime's histogram of the time goroutines spent
// runnable before they ran.
const schedLatencies = "/sched/latencies:seconds"

// waitReader reads the mean of the waits since its last read.
type waitReader struct {
	sample []metrics.Sample
	prev   []uint64
}

func newWaitReader() *waitReader {
	return &waitReader{sample: []metrics.Sample{{Name: schedLatencies}}}
}

func (r *waitReader) mean() time.Duration {
	metrics.Read(r.sample)
	if r.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0 // not in this runtime: never more than one P's worth
	}
	h := r.sample[0].Value.Float64Histogram()
	m := meanSince(r.prev, h)
	r.prev = append(r.prev[:0], h.Counts...)
	return m
}

// meanSince is the mean of the values h counts beyond prev (h's counts at
// an earlier read, nil for none), each taken as the middle of its bucket
// (the lower bound for a bucket without an upper one); 0 when there are
// none.
func meanSince(prev []uint64, h *metrics.Float64Histogram) time.Duration {
	var n, sum float64
	for i, c := range h.Counts {
		if i < len(prev) {
			c -= prev[i]
		}
		if c == 0 {
			continue
		}
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		v := (lo + hi) / 2
		switch {
		case math.IsInf(lo, -1):
			v = max(hi, 0)
		case math.IsInf(hi, 1):
			v = lo
		}
		n += float64(c)
		sum += float64(c) * v
	}
	if n == 0 {
		return 0
	}
	return time.Duration(sum / n * float64(time.Second))
}
