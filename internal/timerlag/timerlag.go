// Package timerlag measures how late this process's timers fire: the
// time from when a timer is due to when the goroutine it wakes runs. A
// call answered per the failure mode at its budget's end reaches its
// caller that much later, so the budget keeps that much more margin
// before the caller's deadline (see failover.Options.TimerLateness).
//
// Timers fire late for reasons outside the process: the Go runtime's
// netpoller sleeps in whole milliseconds (runtime/netpoll_epoll.go), and
// a busy host, or a virtual machine's vCPU descheduled by its host, runs
// the woken thread later still. Measured on the project's 2-core virtual
// machine, a 5ms timer: idle, 0.26ms late at the median, 1.2ms at most
// over 6s; beside the fault suite's load (about half the CPU), 2.4ms at
// the 99th percentile and 4.9ms at most.
package timerlag

import (
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Start.
const (
	// DefaultEvery is how often the monitor's timer is due: 100 wake-ups
	// a second, a few microseconds of CPU each.
	DefaultEvery = 10 * time.Millisecond
	// DefaultHalfLife is how fast the estimate decays while no wake-up
	// is as late: on a host where late wake-ups come a few times a
	// second (as measured above), the estimate stays near their peak.
	DefaultHalfLife = 2 * time.Second
)

// Monitor keeps an estimate of how late this process's timers fire: the
// latest wake-up that was later than the estimate, halved for every
// half-life since. It is safe for concurrent use.
type Monitor struct {
	halfLife time.Duration
	// peak is the lateness last noted above the estimate, in ns, at
	// peakAt (Unix ns).
	peak, peakAt atomic.Int64

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// New returns a Monitor that measures nothing until Start, or is fed by
// Note; a halfLife of 0 or less means DefaultHalfLife.
func New(halfLife time.Duration) *Monitor {
	if halfLife <= 0 {
		halfLife = DefaultHalfLife
	}
	return &Monitor{halfLife: halfLife, stop: make(chan struct{}), done: make(chan struct{})}
}

// Start returns a Monitor whose goroutine sets a timer due every every
// (DefaultEvery for 0 or less) and notes how late each fires, until Stop.
func Start(every, halfLife time.Duration) *Monitor {
	if every <= 0 {
		every = DefaultEvery
	}
	m := New(halfLife)
	go m.run(every)
	return m
}

func (m *Monitor) run(every time.Duration) {
	defer close(m.done)
	t := time.NewTimer(every)
	defer t.Stop()
	due := time.Now().Add(every)
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		m.Note(now.Sub(due), now)
		due = now.Add(every)
		t.Reset(every)
	}
}

// Stop ends the monitor's goroutine and waits for it; the estimate stays
// readable. Later calls return at once. It must be called only on a
// Monitor from Start.
func (m *Monitor) Stop() {
	m.stopOnce.Do(func() { close(m.stop) })
	<-m.done
}

// Note records a wake-up late by late at now: it becomes the estimate
// when it is above the estimate at now.
func (m *Monitor) Note(late time.Duration, now time.Time) {
	if late <= 0 || late <= m.Lateness(now) {
		return
	}
	// A concurrent Note may interleave; either peak is a wake-up as late
	// as that, so the estimate stays one that was seen.
	m.peak.Store(int64(late))
	m.peakAt.Store(now.UnixNano())
}

// Lateness returns the estimate at now: the peak last noted, halved for
// every half-life since. Nil reports 0.
func (m *Monitor) Lateness(now time.Time) time.Duration {
	if m == nil {
		return 0
	}
	peak := m.peak.Load()
	if peak == 0 {
		return 0
	}
	halvings := time.Duration(now.UnixNano()-m.peakAt.Load()) / m.halfLife
	return time.Duration(peak >> min(max(halvings, 0), 62))
}
