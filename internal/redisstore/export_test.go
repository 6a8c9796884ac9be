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
