package xdsconfig

import "time"

// retryWait is the wait before connection attempt n+1 after n failed ones
// in a row (n from 0): drawn uniformly, by u in [0, 1), from [lo, hi] where
// hi = min(most, first·2^(n+1)) and lo = max(first, hi/2). So every wait is
// between first and most, the first one is between first and twice first,
// each range doubles until it reaches most, and replicas that lost their
// stream at the same moment spread their redials over the range.
// most below first counts as first.
func retryWait(first, most time.Duration, n int, u float64) time.Duration {
	if first <= 0 {
		first = time.Millisecond
	}
	most = max(most, first)
	hi := first
	for i := 0; i <= n && hi < most; i++ {
		if hi > most/2 {
			hi = most
		} else {
			hi *= 2
		}
	}
	hi = min(hi, most)
	lo := max(first, hi/2)
	u = min(max(u, 0), 1)
	return lo + time.Duration(u*float64(hi-lo))
}
