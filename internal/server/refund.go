package server

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// RefundPolicy says what a refund (a descriptor with is_negative_hits,
// Envoy's way to give tokens back at stream done) may give back. The zero
// value means RefundsTaken.
type RefundPolicy int

const (
	// RefundsTaken, the default, gives back only what was taken: a refund
	// applies to limits that count tokens (counts: tokens), and gives back
	// at most what the bucket's refund ledger holds. The ledger holds the
	// tokens that calls without a refund took from the bucket (a
	// reservation: Envoy's hits_addend from the request's max_tokens),
	// less what refunds have given back, and slowly forgets (see
	// RefundLedgerWindow). A call that carries a refund earns no ledger
	// credit for what it takes: what a settle charges is final. So a
	// refund can never give back what nobody took, "[refund 1e9, take 1]"
	// admits no more than the bucket's rate and burst allow, and the
	// reserve-then-settle flow (reserve the estimate; at stream done give
	// it back and charge the actual use, in one call) works. A refund on a
	// limit that counts requests gives nothing back.
	RefundsTaken RefundPolicy = iota + 1
	// RefundsUnbounded gives back whatever a refund asks, on every limit,
	// up to a full bucket: envoyproxy/ratelimit's behaviour, for its
	// compatibility mode. Any caller of the gRPC port can then refill any
	// bucket.
	RefundsUnbounded
)

// RefundLedgerWindow is how long a refund ledger takes to forget all it
// can hold (a bucket's burst and overdraft), unless the bucket itself takes
// longer to fill, when it is that fill time. A ledger forgets linearly, at
// capacity/window: a 100,000-a-minute bucket's ledger forgets about 1.2
// tokens a second, so a stream that lasts a minute loses at most about 70
// tokens of the estimate it gives back. An idle ledger is dropped once it
// has forgotten everything, so ledgers are held about this long after
// their bucket's last reservation.
const RefundLedgerWindow = 24 * time.Hour

// RefundOutcome is what a call's refunds asked and were given, in tokens
// summed over the limits of every descriptor with is_negative_hits.
type RefundOutcome struct {
	// Asked is the tokens the refunds asked back.
	Asked int64
	// Given is the tokens the store was asked to give back: all of Asked
	// with RefundsUnbounded, else what the ledgers held. (A bucket is
	// never filled beyond full, so it may take back less.)
	Given int64
}

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

// credits are the ledger takes that record, with RefundsTaken, what the
// takes of an admitted p spent on limits that count tokens, so that a
// later refund may give it back; they are Shadow, so that a full ledger
// denies nothing. A call that carries a refund earns none, nor a tolerant
// quota-mode plan (whose settle may give spending back), nor a shadow
// take. The credit is what the take recorded: its hits, except a post-paid
// charge that stopped at its floor (MaxDebt below empty), which recorded
// less; admitted, its bucket was not in debt, so it recorded at least
// MaxDebt, which is then the credit.
func (s *Server) credits(p *plan, decisions []limiter.Decision) []limiter.Request {
	if s.refunds != RefundsTaken || len(p.refunds) > 0 || p.tolerant() {
		return nil
	}
	var out []limiter.Request
	for i := range p.items {
		it := &p.items[i]
		if !it.limited {
			continue
		}
		for j, l := range it.limits {
			r := p.takes[it.first+j]
			if l.Counts != config.Tokens || r.Hits == 0 || r.Shadow {
				continue
			}
			hits := r.Hits
			if r.Charge() && decisions[it.first+j].ResetAfter >= r.Limit.TimeFor(r.Limit.Burst+r.Limit.MaxDebt) {
				hits = min(hits, r.Limit.MaxDebt) // at its floor: see above
			}
			ll := ledgerLimit(r.Limit)
			out = append(out, limiter.Request{Key: ledgerKey(r.Key), Limit: ll, Hits: min(hits, ll.Burst), Shadow: true})
		}
	}
	return out
}

// credit records the credits of p, a plan whose call was admitted, in a
// store call of their own after the decision: a denied call costs nothing
// more, and the takes of a call stay one store request where they were
// one (the denial cache answers those; on a Redis Cluster the ledger need
// not share its bucket's slot). If it fails, or the call's context has
// ended, the credit is lost: a later refund gives back less, never more.
func (s *Server) credit(ctx context.Context, now time.Time, p *plan, decisions []limiter.Decision, domain string) {
	credits := s.credits(p, decisions)
	if len(credits) == 0 || ctx.Err() != nil {
		return
	}
	if _, err := s.store.Take(ctx, now, credits); err != nil {
		s.logFailure(ctx, now, domain, err)
	}
}

// giveBack makes p's refunds under the server's RefundPolicy, before its
// takes, so that a settle's charge sees the estimate given back.
//
// With RefundsTaken it reads each ledger (a check), gives back the least
// of what is asked and what the ledger holds (once per ledger, however
// many descriptors of the call name it), and spends that from the ledger
// in the same Refund call as the bucket's. The read and the refund are two
// store calls: on one replica, refunds of one ledger are serialized
// (refundLocks); two replicas refunding one bucket at the same instant may
// both give back what its ledger held.
func (s *Server) giveBack(ctx context.Context, now time.Time, p *plan, refunder limiter.Refunder) (RefundOutcome, error) {
	var out RefundOutcome
	for _, r := range p.refunds {
		out.Asked += r.Hits
	}
	if s.refunds == RefundsUnbounded {
		if err := refunder.Refund(ctx, now, p.refunds); err != nil {
			return out, err
		}
		out.Given = out.Asked
		return out, nil
	}
	var idx []int
	var checks []limiter.Request
	for k, r := range p.refunds {
		if p.refundable[k] && r.Hits > 0 {
			idx = append(idx, k)
			checks = append(checks, limiter.Request{Key: ledgerKey(r.Key), Limit: ledgerLimit(r.Limit), Shadow: true})
		}
	}
	if len(checks) == 0 {
		return out, nil
	}
	unlock := s.refundLocks.lock(checks)
	defer unlock()
	ds, err := s.store.Take(ctx, now, checks)
	if err != nil {
		return out, err
	}
	left := make(map[string]int64, len(checks)) // credit not yet given, per ledger
	var back []limiter.Request
	var given int64
	for c, k := range idx {
		lk := checks[c].Key
		avail, seen := left[lk]
		if !seen {
			// Remaining is rounded down: the credit read may exceed the
			// ledger's by less than one token.
			avail = checks[c].Limit.Burst - ds[c].Remaining
		}
		a := min(p.refunds[k].Hits, max(avail, 0))
		left[lk] = avail - a
		if a == 0 {
			continue
		}
		r := p.refunds[k]
		r.Hits = a
		back = append(back, r, limiter.Request{Key: lk, Limit: checks[c].Limit, Hits: a})
		given += a
	}
	if len(back) > 0 {
		if err := refunder.Refund(ctx, now, back); err != nil {
			return out, err
		}
	}
	out.Given = given
	return out, nil
}

// refundLocks serialize, on one replica, the refunds of ledgers that hash
// alike: a fixed number of mutexes, so memory does not grow with keys.
type refundLocks struct {
	seed maphash.Seed
	mu   [64]sync.Mutex
}

func newRefundLocks() *refundLocks { return &refundLocks{seed: maphash.MakeSeed()} }

// lock takes the locks of the reqs' keys, in order (so that two calls never
// wait on each other), and returns the function that releases them.
func (l *refundLocks) lock(reqs []limiter.Request) (unlock func()) {
	var ib [8]int
	ids := ib[:0]
	for _, r := range reqs {
		ids = append(ids, int(maphash.String(l.seed, r.Key)%uint64(len(l.mu))))
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	for _, id := range ids {
		l.mu[id].Lock()
	}
	return func() {
		for _, id := range ids {
			l.mu[id].Unlock()
		}
	}
}
