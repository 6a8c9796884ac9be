package timerlag_test

import (
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/timerlag"
)

// TestEstimate: the estimate is the latest wake-up above it, halved for
// every half-life since; a wake-up below it changes nothing.
func TestEstimate(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ms := time.Millisecond
	tests := []struct {
		name  string
		notes []time.Duration // one a second from t0
		at    time.Duration   // after t0
		want  time.Duration
	}{
		{"none", nil, 0, 0},
		{"on time", []time.Duration{0, -ms}, 2 * time.Second, 0},
		{"one, at once", []time.Duration{4 * ms}, 0, 4 * ms},
		{"one, a half-life on", []time.Duration{4 * ms}, 2 * time.Second, 2 * ms},
		{"one, just under a half-life on", []time.Duration{4 * ms}, 2*time.Second - 1, 4 * ms},
		{"one, three half-lives on", []time.Duration{4 * ms}, 6 * time.Second, ms / 2},
		{"a later one below the estimate", []time.Duration{4 * ms, 3 * ms}, time.Second, 4 * ms},
		{"a later one above the decayed estimate", []time.Duration{4 * ms, 0, 0, 3 * ms}, 3 * time.Second, 3 * ms},
		{"long after", []time.Duration{4 * ms}, time.Hour, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := timerlag.New(2 * time.Second)
			for i, late := range tt.notes {
				m.Note(late, t0.Add(time.Duration(i)*time.Second))
			}
			if got := m.Lateness(t0.Add(tt.at)); got != tt.want {
				t.Errorf("Lateness = %v, want %v", got, tt.want)
			}
		})
	}
	var none *timerlag.Monitor
	if got := none.Lateness(t0); got != 0 {
		t.Errorf("nil Monitor: Lateness = %v, want 0", got)
	}
}

// TestStartMeasuresAndStops: a started monitor's timers fire on time in a
// bubble (its clock is exact), so the estimate stays 0; Stop returns
// once the goroutine has ended (synctest fails a test whose bubble keeps
// a goroutine).
func TestStartMeasuresAndStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := timerlag.Start(5*time.Millisecond, 0)
		time.Sleep(time.Second)
		if got := m.Lateness(time.Now()); got != 0 {
			t.Errorf("Lateness = %v in a bubble, want 0", got)
		}
		m.Stop()
	})
}

// TestStartNotesALateWakeUp: on a real clock, a monitor whose goroutine
// cannot run for a while (every P busy) notes a wake-up at least that
// late.
func TestStartNotesALateWakeUp(t *testing.T) {
	m := timerlag.Start(time.Millisecond, time.Hour)
	defer m.Stop()
	time.Sleep(5 * time.Millisecond) // the goroutine is waiting on its timer
	// Hold every P for 30ms: the monitor's timer, due within 1ms, cannot
	// run its goroutine until one lets go or the runtime preempts one
	// (after 10ms).
	const hold = 30 * time.Millisecond
	procs := runtime.GOMAXPROCS(0)
	done := make(chan struct{})
	for range procs {
		go func() {
			end := time.Now().Add(hold)
			for time.Now().Before(end) {
			}
			done <- struct{}{}
		}()
	}
	for range procs {
		<-done
	}
	time.Sleep(5 * time.Millisecond)
	if got := m.Lateness(time.Now()); got < 3*time.Millisecond {
		t.Errorf("Lateness = %v after every P was held for %v, want at least 3ms", got, hold)
	}
}
