package server

import (
	"context"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// credit is the credit stage: for an admitted request whose takes a
// bucket decided (not a failure mode), it records the credits of p in a
// store call of their own after the decision: a denied call costs nothing
// more, and the takes of a call stay one store request where they were
// one (the denial cache answers those; on a Redis Cluster the ledger need
// not share its bucket's slot). If it fails, or the call's context has
// ended, the credit is lost: a later refund gives back less, never more.
func (s *Server) credit(ctx context.Context, now time.Time, p *plan, decisions []limiter.Decision, admitted bool) {
	if !admitted || len(decisions) == 0 || decisions[0].Fallback != limiter.FallbackNone {
		return
	}
	credits := s.credits(p, decisions)
	if len(credits) == 0 || ctx.Err() != nil {
		return
	}
	if _, err := s.store.Take(ctx, now, credits); err != nil {
		s.logFailure(ctx, now, p.domain, err)
	}
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
