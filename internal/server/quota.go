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

// itemOver reports whether item it, of a plan whose takes got decisions,
// is over its limit: a deny-all rule, or a bucket that denied.
func itemOver(it item, decisions []limiter.Decision) bool {
	if it.denyAll {
		return true
	}
	if !it.limited || decisions == nil {
		return false
	}
	for _, d := range decisions[it.first : it.first+len(it.limits)] {
		if !d.Allowed {
			return true
		}
	}
	return false
}

// quotaVerdict reports whether the request of plan p is denied, given the
// store's decisions: a descriptor not in quota mode is over, or every
// quota-mode one is. Shadow rules (Options.ShadowMode too) are never over.
func quotaVerdict(p plan, decisions []limiter.Decision) bool {
	failed := 0
	for _, it := range p.items {
		if it.rule == nil || it.shadow || !itemOver(it, decisions) {
			continue
		}
		if !it.quota {
			return true
		}
		failed++
	}
	return p.quotas > 0 && failed == p.quotas
}

// settle gives back, for a tolerant plan (see plan.quotas) whose Take the
// store admitted, the tokens the verdict does not let the request spend:
// all of them when quotaVerdict denies it, else those that the over
// quota-mode descriptors took from their other buckets. It returns the
// decisions the answer reports: a take given back reports its bucket as
// a check would (the tokens back in Remaining and ResetAfter). If the
// store cannot give tokens back, or fails to, they stay spent: later
// requests may be denied early, never admitted beyond a limit.
func (s *Server) settle(ctx context.Context, p *plan, decisions []limiter.Decision, now time.Time) []limiter.Decision {
	for k, r := range p.takes {
		if !r.Shadow && !decisions[k].Allowed {
			return decisions // denied by the store: nothing was taken
		}
	}
	over := quotaVerdict(*p, decisions)
	var back []limiter.Request
	var at []int
	for _, it := range p.items {
		if !it.limited || !(over || it.quota && !it.shadow && itemOver(it, decisions)) {
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
