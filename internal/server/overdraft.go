package server

import (
	"slices"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// DefaultOverdraftBursts is the debt Overdraft{On: true} allows when Bursts
// is 0: one burst, what one period refills, as the incumbent's fixed
// window counts at most until the window ends.
const DefaultOverdraftBursts = 1

// Overdraft makes the server record every charge, even one that overdraws
// its bucket, for limits whose config declares no overdraft (the
// incumbent's files and the xDS proto cannot): each such limit is decided
// as if it had overdraft.max_debt = Bursts × its burst (limiter.Limit.
// WithOverdraft, clamped to what a limit may hold). Behind a control plane
// this is what keeps Envoy's stream-done charges (apply_on_stream_done, a
// response cost, AI Gateway's quota_cost) from being dropped when they find
// the bucket too low.
//
// It changes what every request with hits > 0 on those limits means: it is
// a post-paid charge (docs/how-it-decides.md): recorded even when it
// overdraws, down to the debt, and whatever the other limits of the
// request decide (see Counting), and admitted when its bucket is not in
// debt. This is the incumbent's counting (its Redis INCRBY counts every
// hit, admitted or not).
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

// apply gives the default debt to the takes of a request to domain.
func (o Overdraft) apply(domain string, takes []limiter.Request) {
	if !o.On || len(o.Domains) > 0 && !slices.Contains(o.Domains, domain) {
		return
	}
	bursts := o.Bursts
	if bursts <= 0 {
		bursts = DefaultOverdraftBursts
	}
	for i := range takes {
		if takes[i].Limit.MaxDebt > 0 {
			continue // declared in the rule
		}
		takes[i].Limit = takes[i].Limit.WithOverdraft(bursts)
		takes[i].Counting = o.Counting
	}
}
