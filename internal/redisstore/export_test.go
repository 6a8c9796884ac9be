package redisstore

import (
	"fmt"
	"strings"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Slot exposes slot to the tests, which compare it with CLUSTER KEYSLOT.
var Slot = slot

// TagOfSlot exposes tagOfSlot to the tests.
var TagOfSlot = tagOfSlot

// FmtSscan reads a stored "TAT:Frac:Count:Period", or the first format's
// "TAT:Frac".
func FmtSscan(v string, st *limiter.State) (int, error) {
	if strings.Count(v, ":") == 1 {
		return fmt.Sscanf(v, "%d:%d", &st.TAT, &st.Frac)
	}
	return fmt.Sscanf(v, "%d:%d:%d:%d", &st.TAT, &st.Frac, &st.Count, &st.PeriodUS)
}

// exec sends batch as one pipeline and hands each call its answer, as a
// sender does, for tests that build a batch by hand.
func (b *batcher) exec(batch []*call) {
	b.stats.pending.Add(int64(len(batch))) // as submit counts them
	b.answer(b.roundTrip(batch, nil))
}

// OnlyTakeLua makes s send every Take through take.lua, also one of one
// request sent alone (take_one.lua's call), so that tests can hold
// take.lua's path for one request to what they hold take_one.lua's.
func OnlyTakeLua(s *Store) { s.takeOne = nil }

// TakeScriptSource exposes takeScriptSource to the benchmarks, which run
// the take script alone beside floor scripts.
var TakeScriptSource = takeScriptSource

// TakeSpec exposes takeSpec: take.lua's argument for one request.
var TakeSpec = takeSpec
