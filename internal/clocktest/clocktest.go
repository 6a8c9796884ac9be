// Package clocktest provides a hand-set clock for tests of code that takes
// its time from an injected func() time.Time.
package clocktest

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when told. The zero Clock reads the zero
// time; New starts one at a fixed instant. It is safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// Start is the instant New starts at.
var Start = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// New returns a Clock reading Start.
func New() *Clock { return &Clock{t: Start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d (which may be negative: a clock that steps
// back).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}
