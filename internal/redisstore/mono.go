package redisstore

import "time"

// monoBase is the origin of mono's stamps, read once from the monotonic
// clock, a second back so that no stamp is 0: the fields that hold stamps
// take 0 for "never".
var monoBase = time.Now().Add(-time.Second)

// mono is the time as the batchers and the node routes stamp it (queued,
// sent, answered, busy until, failed, last used): ns since monoBase on the
// monotonic clock, which a step of the wall clock does not move. Stamps are
// only compared with one another. On the wall clock a step forward would
// look like Redis holding every round trip in flight that long (reported
// slow, detached, stalled) and a step back would keep a load busy.
func mono() int64 { return monoOf(time.Now()) }

// monoOf is t, a reading that carries the monotonic clock (time.Now's, a
// ticker's), as mono stamps it.
func monoOf(t time.Time) int64 { return int64(t.Sub(monoBase)) }
