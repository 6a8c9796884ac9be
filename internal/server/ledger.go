package server

import (
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// A bucket's refund ledger holds what calls took from it and refunds may
// give back (see RefundsTaken): the refunds stage reads and spends it, the
// credit stage adds to it.

// RefundLedgerWindow is how long a refund ledger takes to forget all it
// can hold (a bucket's burst and overdraft), unless the bucket itself takes
// longer to fill, when it is that fill time. A ledger forgets linearly, at
// capacity/window: a 100,000-a-minute bucket's ledger forgets about 1.2
// tokens a second, so a stream that lasts a minute loses at most about 70
// tokens of the estimate it gives back. An idle ledger is dropped once it
// has forgotten everything, so ledgers are held about this long after
// their bucket's last reservation.
const RefundLedgerWindow = 24 * time.Hour

// ledgerLimit is the shape of the refund ledger of a bucket of limit l:
// it holds up to the bucket's burst and overdraft and forgets it in
// RefundLedgerWindow, or in the bucket's own fill time if longer (at most
// limiter.MaxFill). The ledger's tokens are the credit not held: a
// missing (full) ledger holds no credit, a take from it adds credit, a
// refund to it spends credit, and refilling forgets credit.
func ledgerLimit(l limiter.Limit) limiter.Limit {
	burst := min(l.Burst+l.MaxDebt, limiter.MaxTokens)
	window := min(max(RefundLedgerWindow, l.TimeFor(l.Burst+l.MaxDebt)), limiter.MaxFill)
	// Period = window·Count/burst, so that burst tokens take window; in
	// floating point, since the product may not fit an int64 (the rate is
	// a forgetting rate: rounding is harmless, and both stores are given
	// the same Limit).
	period := float64(window) * float64(l.Count) / float64(burst)
	if period <= float64(limiter.MaxFill) {
		ll := limiter.Limit{Count: l.Count, Period: max(time.Duration(period).Truncate(time.Microsecond), time.Microsecond), Burst: burst}
		if ll.Validate() == nil {
			return ll
		}
	}
	return limiter.Limit{Count: l.Count, Period: l.Period, Burst: burst}
}

func ledgerKey(bucket string) string {
	return string(config.AppendLedgerKey(make([]byte, 0, len(bucket)+8), []byte(bucket)))
}
