package limiter_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// A bucket of 3 a second: three requests pass at once, the fourth is told
// when to retry, and a third of a second later one token is back.
func ExampleDecide() {
	limit := limiter.Limit{Count: 3, Period: time.Second, Burst: 3}
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var s limiter.State // the zero State is a full bucket
	for _, at := range []time.Duration{0, 0, 0, 0, 333334 * time.Microsecond} {
		var d limiter.Decision
		s, d = limiter.Decide(limiter.Request{Key: "client=a", Limit: limit, Hits: 1}, s, t0.Add(at))
		fmt.Printf("t0+%v: allowed %v, remaining %d, retry after %v, full after %v\n",
			at, d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter)
	}
	// Output:
	// t0+0s: allowed true, remaining 2, retry after 0s, full after 333.334ms
	// t0+0s: allowed true, remaining 1, retry after 0s, full after 666.667ms
	// t0+0s: allowed true, remaining 0, retry after 0s, full after 1s
	// t0+0s: allowed false, remaining 0, retry after 333.334ms, full after 1s
	// t0+333.334ms: allowed true, remaining 0, retry after 0s, full after 1s
}

// A Take is all or nothing: the per-client bucket has room, the global one
// does not, so neither is charged, and the per-client one reports what it
// holds.
func ExampleMemoryStore_Take() {
	store := limiter.NewMemoryStore(limiter.MemoryOptions{})
	perClient := limiter.Limit{Count: 10, Period: time.Minute, Burst: 10}
	global := limiter.Limit{Count: 100, Period: time.Minute, Burst: 5}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ctx := context.Background()
	for _, hits := range []int64{4, 4} {
		d, err := store.Take(ctx, now, []limiter.Request{
			{Key: "client=a", Limit: perClient, Hits: hits},
			{Key: "global", Limit: global, Hits: hits},
		})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%d tokens: client %v (%d left), global %v (%d left, retry after %v)\n",
			hits, d[0].Allowed, d[0].Remaining, d[1].Allowed, d[1].Remaining, d[1].RetryAfter)
	}
	// Output:
	// 4 tokens: client true (6 left), global true (1 left, retry after 0s)
	// 4 tokens: client true (6 left), global false (0 left, retry after 1.8s)
}

// Validate says why a limit cannot be used.
func ExampleLimit_Validate() {
	for _, l := range []limiter.Limit{
		{Count: 10, Period: time.Minute, Burst: 20},
		{Count: 1, Period: time.Nanosecond, Burst: 1},
		{Count: 1, Period: 24 * time.Hour, Burst: 100_000},
	} {
		fmt.Printf("%v: %v\n", l, l.Validate())
	}
	// Output:
	// 10/1m0s burst 20: <nil>
	// 1/1ns burst 1: period 1ns: must be at least 1µs
	// 1/24h0m0s burst 100000: burst 100000 at 1 per 24h0m0s: the bucket would take 2400000h0m0s to fill, more than 876000h0m0s
}
