package redisstore

import (
	"fmt"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Slot exposes slot to the tests, which compare it with CLUSTER KEYSLOT.
var Slot = slot

// fmtSscan reads a stored "TAT:Frac".
func fmtSscan(v string, st *limiter.State) (int, error) {
	return fmt.Sscanf(v, "%d:%d", &st.TAT, &st.Frac)
}

// exec sends batch as one pipeline and hands each call its answer, as a
// sender does, for tests that build a batch by hand.
func (b *batcher) exec(batch []*call) {
	answer(b.roundTrip(batch))
}
