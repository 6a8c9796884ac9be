package server

import "github.com/ratelimitd/ratelimitd/limiter"

// admits is the verdict stage: whether the answer to p, whose takes got
// decisions, admits the request (the overall code buildResponse sets). A
// descriptor denies it when it is over its limit (over) or its lease was
// denied, unless its rule is a shadow rule, or it is a quota-mode one and
// another quota-mode descriptor is not over (quotaDenied).
func admits(p *plan, decisions []limiter.Decision) bool {
	quotaDeny := quotaDenied(p, decisions)
	for i := range p.items {
		it := &p.items[i]
		over := it.over(decisions) || it.lease > 0 && !p.leases[it.lease-1].admitted()
		if over && !it.shadow && (!it.quota || quotaDeny) {
			return false
		}
	}
	return true
}

// over reports whether item it, of a plan whose takes got decisions, is
// over its limit: a deny-all rule, or a bucket that denied.
func (it *item) over(decisions []limiter.Decision) bool {
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

// quotaDenied reports whether p's quota-mode descriptors deny the request:
// they deny only together, when every one of them is over its limit
// (shadow rules never are).
func quotaDenied(p *plan, decisions []limiter.Decision) bool {
	if p.quotas == 0 {
		return false
	}
	failed := 0
	for i := range p.items {
		if it := &p.items[i]; it.quota && it.rule != nil && !it.shadow && it.over(decisions) {
			failed++
		}
	}
	return failed == p.quotas
}
