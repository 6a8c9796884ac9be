package failover

import (
	"sync"
	"time"
)

// breaker is the Store's circuit breaker. Closed, it lets every call
// through. It opens on a failed probe, or once threshold consecutive
// failures have gone on for failingFor since the first of them (as they
// are reported: failures that land at once, one slow batch or a stall of
// this process, do not open it however many they are); a success in
// between starts the count again. Open, it refuses calls for openFor,
// then lets exactly one call (or Probe) through as the probe: a success
// closes it, a failure opens it for another openFor, and a probe released
// untried (see release) lets the next call probe instead; with
// probeByCheck (Options.ProbeInBackground), only a Probe's check is the
// probe, never a call. The failure of
// a call sent before it opened leaves it as it is: only the probe tells
// anything new of an open breaker's backend.
//
// Health is whether the breaker has opened since the last success; its
// changes are reported to onChange (see Options.OnChange). Time is read from
// now. It is safe for concurrent use.
type breaker struct {
	now        func() time.Time
	threshold  int
	failingFor time.Duration
	openFor    time.Duration
	// probeByCheck: only a Probe's check probes the open breaker.
	probeByCheck bool
	onChange     func(healthy bool, err error) // nil: not reported

	mu          sync.Mutex
	failures    int       // consecutive
	openUntil   time.Time // zero when closed
	probing     bool      // a half-open probe is in flight
	outageStart time.Time // when the first of the failures failed; zero after a success
	open        bool      // the breaker has opened since the last success (healthy false)
	lastErr     error
	lastSuccess time.Time // the last success, on now
	notified    bool      // the health onChange last reported (initially true)
	notifying   bool      // a goroutine is calling onChange
}

// newBreaker returns a closed, healthy breaker with the options' (already
// defaulted) thresholds, clock and OnChange.
func newBreaker(opts Options) *breaker {
	return &breaker{
		now:          opts.Now,
		threshold:    opts.FailureThreshold,
		failingFor:   opts.FailingFor,
		openFor:      opts.OpenFor,
		probeByCheck: opts.ProbeInBackground,
		onChange:     opts.OnChange,
		notified:     true,
	}
}

// outage is what a call that is answered per the failure mode knows of the
// outage, read under the breaker's lock together with the decision not to
// use (or the failure of) the backend, so that a success racing in between
// cannot change it.
type outage struct {
	start     time.Time // the first of the consecutive failures
	openUntil time.Time
	err       error
}

// admit reports whether to call the backend now, for a call (byCall) or
// a Probe's check, and whether that is the one probe of a half-open
// breaker; when not, the outage as it is.
func (b *breaker) admit(byCall bool) (probe, ok bool, o outage) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.openUntil.IsZero() {
		return false, true, outage{}
	}
	if b.probing || b.now().Before(b.openUntil) || byCall && b.probeByCheck {
		return false, false, outage{start: b.outageStart, openUntil: b.openUntil, err: b.lastErr}
	}
	b.probing = true
	return true, true, outage{}
}

// release gives back an admitted call that tells nothing of the backend
// (an invalid request, an overloaded process): if it was the probe, the
// next call probes instead.
func (b *breaker) release(probe bool) {
	if probe {
		b.mu.Lock()
		b.probing = false
		b.mu.Unlock()
	}
}

// succeeded records a backend success, closing the breaker, and reports
// the recovery if the breaker had opened.
func (b *breaker) succeeded(probe bool) {
	b.mu.Lock()
	recovered := b.open
	b.failures, b.openUntil, b.outageStart, b.open, b.lastErr = 0, time.Time{}, time.Time{}, false, nil
	b.lastSuccess = b.now()
	if probe {
		b.probing = false
	}
	b.mu.Unlock()
	if recovered {
		b.notify()
	}
}

// failed records a backend failure: the outage starts at the first, and
// the breaker opens on a failed probe, or, closed, once threshold
// consecutive failures have gone on for failingFor since it started. An
// open breaker stays as it is on any other failure: the call was sent
// before it opened (while open, only the probe is), and its failure,
// coming late (a black hole holds a round trip until the read timeout,
// long after the backend may have come back), must not hold the breaker
// open past the probe that would find the backend answering again. The
// first opening after a success is reported to onChange. It returns the
// outage as this failure left it.
func (b *breaker) failed(probe bool, err error) outage {
	now := b.now()
	b.mu.Lock()
	if b.outageStart.IsZero() {
		b.outageStart = now
	}
	b.failures++
	b.lastErr = err
	opened := false
	if probe || b.openUntil.IsZero() && b.failures >= b.threshold && now.Sub(b.outageStart) >= b.failingFor {
		b.openUntil = now.Add(b.openFor)
		opened = !b.open
		b.open = true
	}
	if probe {
		b.probing = false
	}
	o := outage{start: b.outageStart, openUntil: b.openUntil, err: err}
	b.mu.Unlock()
	if opened {
		b.notify()
	}
	return o
}

// failedSent records the failure of something sent to the backend at
// sent, as failed does, unless the backend has answered a call since:
// a round trip that a network black hole swallowed fails at the read
// timeout, long after the fault ended and the backend answered again, and
// must not open the breaker then. It reports whether it counted.
func (b *breaker) failedSent(sent time.Time, err error) bool {
	b.mu.Lock()
	stale := !b.lastSuccess.IsZero() && sent.Before(b.lastSuccess)
	b.mu.Unlock()
	if stale {
		return false
	}
	b.failed(false, err)
	return true
}

// notify calls onChange until it has reported the current health. One
// goroutine at a time does: a change made while it calls is left to it,
// and reported after, so calls are never out of order.
func (b *breaker) notify() {
	if b.onChange == nil {
		return
	}
	b.mu.Lock()
	if b.notifying {
		b.mu.Unlock()
		return
	}
	b.notifying = true
	for b.notified != !b.open {
		healthy, err := !b.open, b.lastErr
		b.notified = healthy
		b.mu.Unlock()
		b.onChange(healthy, err)
		b.mu.Lock()
	}
	b.notifying = false
	b.mu.Unlock()
}

// healthy reports whether the breaker has not opened since the last
// success.
func (b *breaker) healthy() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.open
}

// state reports whether the breaker has not opened since the last
// success, and the last failure's error.
func (b *breaker) state() (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.open, b.lastErr
}

// closed reports whether the breaker lets every call through (it has not
// opened, or a success closed it).
func (b *breaker) closed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.openUntil.IsZero()
}
