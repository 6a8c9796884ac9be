package server

import (
	"context"
	"slices"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// This file composes envoyproxy/ratelimit's quota mode with ratelimitd's
// all-or-nothing Take. The incumbent's rule (src/service/ratelimit.go@f2fb157):
// a request is OVER_LIMIT when a descriptor not in quota mode is over its
// limit, or when every quota-mode descriptor is; each status still says
// OVER_LIMIT for a descriptor over its limit. ratelimitd keeps "a denied
// request spends nothing" and adds "a descriptor over its limit spends
// nothing": in an admitted request, a quota-mode descriptor that is over
// is tolerated and takes nothing from any of its buckets, and the others
// take their tokens; in a denied one, nothing is taken (post-paid charges
// are recorded, as always).
//
// With one quota-mode descriptor the rule is the store's own (it denies
// when that one is over). With two or more, the store cannot know the
// verdict: their takes are Shadow (a denied Shadow take neither denies
// the Take nor is charged), no take of the request waits, and settle gives
// back, after the Take, what the verdict does not let the request spend.

// quotaPlan is the quota stage's part of a plan.
type quotaPlan struct {
	// quotas counts the quota-mode items (see item.quota). When there are
	// two or more, the request's verdict is not the store's (see
	// quotaVerdict): their takes are Shadow, no take waits, and settle
	// gives back what the verdict does not let the request spend, marked
	// in spentBack (one per take; nil when nothing was given back).
	quotas    int
	spentBack []bool
}

// tolerant reports whether some quota-mode descriptor may be over its
// limit in a request that is admitted.
func (q *quotaPlan) tolerant() bool { return q.quotas >= 2 }

// quotaVerdict reports whether the request of plan p is denied, given the
// store's decisions: a descriptor not in quota mode is over, or every
// quota-mode one is. Shadow rules (Options.ShadowMode too) are never over.
func quotaVerdict(p plan, decisions []limiter.Decision) bool {
	for i := range p.items {
		if it := &p.items[i]; it.rule != nil && !it.shadow && !it.quota && it.over(decisions) {
			return true
		}
	}
	return quotaDenied(&p, decisions)
}

// settle is the quota stage: for a tolerant plan (see quotaPlan) whose
// Take the store admitted, it gives back the tokens the verdict does not
// let the request spend: all of them when quotaVerdict denies it, else
// those that the over quota-mode descriptors took from their other
// buckets. Any other plan's decisions it returns as they are. It returns the
// decisions the answer reports: a take given back reports its bucket as
// a check would (the tokens back in Remaining and ResetAfter). If the
// store cannot give tokens back, or fails to, they stay spent: later
// requests may be denied early, never admitted beyond a limit.
func (s *Server) settle(ctx context.Context, now time.Time, p *plan, decisions []limiter.Decision) []limiter.Decision {
	if !p.tolerant() || len(decisions) == 0 {
		return decisions
	}
	for k, r := range p.takes {
		if !r.Shadow && !decisions[k].Allowed {
			return decisions // denied by the store: nothing was taken
		}
	}
	over := quotaVerdict(*p, decisions)
	var back []limiter.Request
	var at []int
	for i := range p.items {
		it := &p.items[i]
		if !it.limited || !(over || it.quota && !it.shadow && it.over(decisions)) {
			continue
		}
		for k := it.first; k < it.first+len(it.limits); k++ {
			if r := p.takes[k]; r.Hits > 0 && !r.Charge() && decisions[k].Allowed {
				back = append(back, r)
				at = append(at, k)
			}
		}
	}
	if len(back) == 0 {
		return decisions
	}
	refunder, ok := s.store.(limiter.Refunder)
	if !ok {
		return decisions
	}
	if err := refunder.Refund(ctx, now, back); err != nil {
		s.logFailure(ctx, now, "", err)
		return decisions
	}
	out := slices.Clone(decisions)
	p.spentBack = make([]bool, len(p.takes))
	for i, k := range at {
		r, d := back[i], out[k]
		d.Remaining = min(d.Remaining+r.Hits, r.Limit.Burst)
		d.ResetAfter = max(0, d.ResetAfter-r.Limit.TimeFor(r.Hits))
		out[k] = d
		p.spentBack[k] = true
	}
	return out
}
