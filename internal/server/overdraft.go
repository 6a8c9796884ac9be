package server

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// DefaultOverdraftBursts is the debt Overdraft{On: true} allows when Bursts
// is 0: one burst, what one period refills, as the incumbent's fixed
// window counts at most until the window ends.
const DefaultOverdraftBursts = 1

// Overdraft makes the server record every charge, even one that overdraws
// its bucket, on limits whose config declares no overdraft (the
// incumbent's files and the xDS proto cannot): behind a control plane this
// is what keeps Envoy's stream-done charges (apply_on_stream_done, a
// response cost, AI Gateway's quota_cost) from being dropped when they
// find the bucket too low.
//
// Admission does not change: a request is admitted only when its tokens
// are there, as without it. What changes is a request that is not: its
// hits are recorded all the same (see Counting), as a post-paid charge
// down to Bursts × the limit's burst below empty (limiter.Limit.
// WithOverdraft, clamped to what a limit may hold), and its Retry-After is
// when its tokens are there again, that charge paid. This is the
// incumbent's counting: its Redis INCRBY counts every hit, admitted or
// not, and answers OVER_LIMIT once the count is past the limit. The charge
// is a second store call, made only for a request that was denied.
//
// The zero Overdraft is off: a denied request spends nothing.
type Overdraft struct {
	// On turns it on.
	On bool
	// Bursts is the debt as a multiple of each limit's burst; 0 means
	// DefaultOverdraftBursts.
	Bursts int64
	// Domains, when not empty, limits it to these domains.
	Domains []string
	// Counting is what the charges it makes record when their request is
	// denied: limiter.CountAlways (the zero value) on every bucket, as the
	// incumbent counts by default; limiter.CountWhereDenied only on the
	// buckets that denied it, as the incumbent with
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true. Rules that declare
	// their own overdraft keep CountAlways.
	Counting limiter.Counting
}

// covers reports whether o records the denied charges of domain.
func (o Overdraft) covers(domain string) bool {
	return o.On && (len(o.Domains) == 0 || slices.Contains(o.Domains, domain))
}

// takeDenied reports whether a Take of takes was denied as a whole (and so
// spent nothing): a request other than a shadow one was denied, not by a
// failure mode.
func takeDenied(takes []limiter.Request, decisions []limiter.Decision) bool {
	for i, d := range decisions {
		if !d.Allowed && !takes[i].Shadow && d.Fallback == limiter.FallbackNone {
			return true
		}
	}
	return false
}

// countDenied is the post-paid counting stage: when Options.Overdraft
// covers p's domain, it records the hits of the takes of p that decisions
// left unspent: every take with hits of a denied request (the store
// denied the Take, or, in a tolerant quota-mode plan, the verdict is not
// admitted and settle gave the takes back; with limiter.CountWhereDenied,
// only the takes that denied it), and a denied shadow take of an admitted
// one. Limits that declare their own overdraft were charged by the store
// already. The takes recorded are replaced in p by the charges made, so
// that observers count them. It returns the decisions with the
// Retry-After of each recorded denial moved to when its tokens are there
// again (never its Allowed: the verdict stands). A failed charge is
// logged and leaves the decisions as they are: the request was answered.
func (s *Server) countDenied(ctx context.Context, now time.Time, p *plan, decisions []limiter.Decision, admitted bool) []limiter.Decision {
	if len(decisions) == 0 || !s.overdraft.covers(p.domain) {
		return decisions
	}
	denied := takeDenied(p.takes, decisions) || p.tolerant() && !admitted
	o := s.overdraft
	bursts := o.Bursts
	if bursts <= 0 {
		bursts = DefaultOverdraftBursts
	}
	var charges []limiter.Request
	var which []int
	for i, t := range p.takes {
		switch {
		case t.Hits <= 0 || t.Limit.MaxDebt > 0 || decisions[i].Fallback != limiter.FallbackNone:
			continue
		case decisions[i].Allowed && (!denied || o.Counting == limiter.CountWhereDenied):
			continue // spent, or not counted where it did not deny
		}
		c := t
		c.Limit, c.MaxWait, c.Shadow, c.Counting = t.Limit.WithOverdraft(bursts), 0, false, limiter.CountAlways
		charges = append(charges, c)
		which = append(which, i)
	}
	if len(charges) == 0 {
		return decisions
	}
	charged, err := s.store.Take(ctx, now, charges)
	if err != nil {
		s.logFailure(ctx, now, p.domain, fmt.Errorf("recording denied hits: %w", err))
		return decisions
	}
	out := slices.Clone(decisions)
	for j, i := range which {
		p.takes[i] = charges[j] // what was recorded, for the observer
		if out[i].Allowed {
			continue
		}
		// The bucket is full again in charged[j].ResetAfter (rounded up);
		// the request's tokens are there the time of burst − hits tokens
		// (rounded down) before that: never early.
		l, h := charges[j].Limit, charges[j].Hits
		retry := charged[j].ResetAfter - l.TimeFor(l.Burst-min(h, l.Burst))
		out[i].RetryAfter = max(out[i].RetryAfter, retry)
		out[i].ResetAfter = max(out[i].ResetAfter, charged[j].ResetAfter)
		out[i].Remaining = 0
	}
	return out
}
