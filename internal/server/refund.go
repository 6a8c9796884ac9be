package server

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// refundPlan is the refunds stage's part of a plan.
type refundPlan struct {
	// refunds give back the hits of descriptors with is_negative_hits
	// before the takes (which then only check them).
	refunds []limiter.Request
	// refundable has one flag per refund: its limit counts tokens, so
	// that RefundsTaken may give back to it (see giveBack).
	refundable []bool
	// refunded is what the refunds asked and were given, once made.
	refunded RefundOutcome
}

// refund is the refunds stage: it makes p's refunds (giveBack), before
// its takes, and records what they asked and were given in p.refunded. A
// backend that cannot give tokens back answers INVALID_ARGUMENT.
func (s *Server) refund(ctx context.Context, now time.Time, p *plan) error {
	if len(p.refunds) == 0 {
		return nil
	}
	refunder, ok := s.store.(limiter.Refunder)
	if !ok {
		return status.Error(codes.InvalidArgument, "is_negative_hits: this backend cannot give tokens back")
	}
	// Refunds first: a settle's charge sees its estimate given back.
	out, err := s.giveBack(ctx, now, p, refunder)
	p.refunded = out
	if err != nil {
		s.logFailure(ctx, now, p.domain, err)
		return statusFromError(err)
	}
	return nil
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
