package limiter

import "math/bits"

// WithOverdraft returns l made post-paid when it declares no overdraft
// (MaxDebt 0): MaxDebt becomes bursts × Burst tokens, at most MaxTokens and
// at most the deepest debt Validate accepts (one that is paid, and the
// bucket filled, within MaxFill). It is how a server records every charge,
// even one that overdraws its bucket, for limits whose config cannot say
// overdraft (the incumbent's files, the xDS proto).
//
// l is returned unchanged when bursts < 1, when l already has a MaxDebt, or
// when no debt fits (a bucket that already takes MaxFill to fill). For a
// valid l the result is valid.
func (l Limit) WithOverdraft(bursts int64) Limit {
	if bursts < 1 || l.MaxDebt > 0 || l.Burst < 1 || l.Count < 1 || l.Period < 1 {
		return l
	}
	debt := int64(MaxTokens)
	if bursts <= MaxTokens/l.Burst {
		debt = bursts * l.Burst
	}
	debt = min(debt, l.mostTokensWithinMaxFill()-l.Burst)
	if debt < 1 {
		return l
	}
	l.MaxDebt = debt
	return l
}

// mostTokensWithinMaxFill is the largest n whose time, floor(n·Period/
// Count) µs as span forms it, is at most MaxFill: n·P < (MaxFill+1)·Count,
// so n = ((MaxFill+1)·Count − 1)/P, formed in 128 bits; capped at
// 2·MaxTokens (Burst + MaxDebt is never more).
func (l Limit) mostTokensWithinMaxFill() int64 {
	const most = 2 * MaxTokens
	p := uint64(l.Period.Microseconds())
	hi, lo := bits.Mul64(uint64(MaxFill.Microseconds()+1), uint64(l.Count))
	lo, borrow := bits.Sub64(lo, 1, 0)
	hi -= borrow
	if hi >= p {
		return most // the quotient passes 2^64
	}
	n, _ := bits.Div64(hi, lo, p)
	return int64(min(n, most))
}
