package failover

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
)

// TestBreakerTransitions walks the breaker through timelines on a fake
// clock, with a threshold of 3 failures, FailingFor 20ms and OpenFor 500ms.
// Each step admits a call and ends it as the step says ("ok", "fail",
// "release"), or admits one and holds it in flight ("hold") for a later
// step to end ("end ok", "end fail", "end release", which admit nothing).
// An admit is "call" (closed: no probe), "probe" (the one call of a
// half-open breaker) or "refused"; a refusal reports the outage's
// openUntil.
func TestBreakerTransitions(t *testing.T) {
	const ms = time.Millisecond
	type step struct {
		at      time.Duration // since the start
		do      string
		admit   string        // for steps that admit: call, probe or refused
		until   time.Duration // a refusal's openUntil, since the start
		healthy bool          // after the step
	}
	// opened is a timeline that opens the breaker at 20ms, until 520ms
	// (3 failures over 20ms), then goes on with steps.
	opened := func(steps []step) []step {
		return append([]step{
			{0, "fail", "call", 0, true},
			{10 * ms, "fail", "call", 0, true},
			{20 * ms, "fail", "call", 0, false},
		}, steps...)
	}
	tests := []struct {
		name    string
		steps   []step
		changes []bool // OnChange's healthy arguments, in order
	}{
		{"closed: successes", []step{
			{0, "ok", "call", 0, true},
			{time.Hour, "ok", "call", 0, true},
		}, nil},
		{"failures below the threshold stay closed", []step{
			{0, "fail", "call", 0, true},
			{100 * ms, "fail", "call", 0, true},
			{200 * ms, "ok", "call", 0, true},
		}, nil},
		{"the threshold reached within FailingFor stays closed; after it, opens", []step{
			{0, "fail", "call", 0, true},
			{1 * ms, "fail", "call", 0, true},
			{2 * ms, "fail", "call", 0, true}, // 3 failures over 2ms
			{19 * ms, "fail", "call", 0, true},
			{20 * ms, "fail", "call", 0, false}, // over 20ms: opens until 520ms
			{21 * ms, "ok", "refused", 520 * ms, false},
			{519 * ms, "ok", "refused", 520 * ms, false},
		}, []bool{false}},
		{"after OpenFor, one probe; its success closes", opened([]step{
			{520 * ms, "hold", "probe", 0, false},
			{521 * ms, "ok", "refused", 520 * ms, false}, // the probe is in flight
			{600 * ms, "ok", "refused", 520 * ms, false},
			{601 * ms, "end ok", "", 0, true},
			{602 * ms, "ok", "call", 0, true},
			{603 * ms, "fail", "call", 0, true}, // the count starts again
		}), []bool{false, true}},
		{"a failed probe opens for another OpenFor", opened([]step{
			{520 * ms, "hold", "probe", 0, false},
			{530 * ms, "end fail", "", 0, false}, // open until 1030ms
			{531 * ms, "ok", "refused", 1030 * ms, false},
			{1029 * ms, "ok", "refused", 1030 * ms, false},
			{1030 * ms, "fail", "probe", 0, false}, // fails again: until 1530ms
			{1529 * ms, "ok", "refused", 1530 * ms, false},
			{1530 * ms, "ok", "probe", 0, true},
		}), []bool{false, true}},
		{"a failed probe reopens even when the clock stepped back", opened([]step{
			{520 * ms, "hold", "probe", 0, false},
			{5 * ms, "end fail", "", 0, false}, // before FailingFor had passed: open until 505ms
			{6 * ms, "ok", "refused", 505 * ms, false},
			{505 * ms, "ok", "probe", 0, true},
		}), []bool{false, true}},
		{"a probe released untried lets the next call probe", opened([]step{
			{520 * ms, "release", "probe", 0, false},
			{521 * ms, "hold", "probe", 0, false},
			{522 * ms, "ok", "refused", 520 * ms, false},
			{523 * ms, "end release", "", 0, false},
			{524 * ms, "ok", "probe", 0, true},
		}), []bool{false, true}},
		{"a success in between starts the count again", []step{
			{0, "fail", "call", 0, true},
			{1 * ms, "fail", "call", 0, true},
			{2 * ms, "ok", "call", 0, true},
			{30 * ms, "fail", "call", 0, true},
			{31 * ms, "fail", "call", 0, true},  // 2 since the success: closed
			{40 * ms, "fail", "call", 0, true},  // 3, over 10ms: closed
			{50 * ms, "fail", "call", 0, false}, // 4, over 20ms: opens
		}, []bool{false}},
		{"a success in between restarts FailingFor", []step{
			{0, "fail", "call", 0, true},
			{1 * ms, "ok", "call", 0, true},
			{15 * ms, "fail", "call", 0, true},
			{16 * ms, "fail", "call", 0, true},
			{25 * ms, "fail", "call", 0, true}, // 25ms since the first, 10 since the outage began
			{35 * ms, "fail", "call", 0, false},
		}, []bool{false}},
		{"a late failure while open leaves it as it is, reported once", []step{
			{0, "hold", "call", 0, true},
			{1 * ms, "fail", "call", 0, true},
			{2 * ms, "fail", "call", 0, true},
			{22 * ms, "fail", "call", 0, false}, // opens until 522ms
			{30 * ms, "end fail", "", 0, false}, // the held call, sent before it opened: still until 522ms
			{521 * ms, "ok", "refused", 522 * ms, false},
			{522 * ms, "ok", "probe", 0, true},
		}, []bool{false, true}},
		{"a late failure after OpenFor does not put the probe off", []step{
			{0, "hold", "call", 0, true},
			{1 * ms, "fail", "call", 0, true},
			{2 * ms, "fail", "call", 0, true},
			{22 * ms, "fail", "call", 0, false},  // opens until 522ms
			{600 * ms, "end fail", "", 0, false}, // a read timeout's, long after: no probe has come yet
			{601 * ms, "ok", "probe", 0, true},
		}, []bool{false, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktest.New()
			var changes []bool
			b := newBreaker(Options{Now: clk.Now, FailureThreshold: 3, FailingFor: 20 * time.Millisecond, OpenFor: 500 * time.Millisecond,
				OnChange: func(healthy bool, err error) {
					if !healthy && err == nil {
						t.Errorf("OnChange(false, nil), want the failure")
					}
					changes = append(changes, healthy)
				}})
			held, holding := false, false // the held call's probe flag
			for i, st := range tt.steps {
				clk.Set(clocktest.Start.Add(st.at))
				where := fmt.Sprintf("step %d (%v, %s)", i, st.at, st.do)
				do := st.do
				if end, ok := strings.CutPrefix(do, "end "); ok {
					if !holding {
						t.Fatalf("%s: no call held", where)
					}
					finish(t, b, end, held, where)
					holding = false
				} else {
					probe, ok, o := b.admit(true)
					got := "refused"
					switch {
					case ok && probe:
						got = "probe"
					case ok:
						got = "call"
					}
					if got != st.admit {
						t.Fatalf("%s: admit = %s, want %s", where, got, st.admit)
					}
					switch {
					case !ok:
						if want := clocktest.Start.Add(st.until); !o.openUntil.Equal(want) || o.err == nil {
							t.Errorf("%s: refused with outage %+v, want open until %v and its error", where, o, st.until)
						}
					case do == "hold":
						held, holding = probe, true
					default:
						finish(t, b, do, probe, where)
					}
				}
				if got := b.healthy(); got != st.healthy {
					t.Errorf("%s: healthy() = %v, want %v", where, got, st.healthy)
				}
				if got := b.closed(); got != st.healthy {
					t.Errorf("%s: closed() = %v, want %v (closed exactly while healthy)", where, got, st.healthy)
				}
			}
			if !slices.Equal(changes, tt.changes) {
				t.Errorf("OnChange calls = %v, want %v", changes, tt.changes)
			}
		})
	}
}

var errDown = errors.New("backend down")

// finish ends an admitted call as do says.
func finish(t *testing.T, b *breaker, do string, probe bool, where string) {
	t.Helper()
	switch do {
	case "ok":
		b.succeeded(probe)
	case "fail":
		b.failed(probe, fmt.Errorf("%s: %w", where, errDown))

	case "release":
		b.release(probe)
	default:
		t.Fatalf("%s: unknown step", where)
	}
}
