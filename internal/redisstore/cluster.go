package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// groupBy returns a function that groups request indexes by part(key), in
// order of first appearance.
func groupBy[P comparable](part func(string) P) func([]string) [][]int {
	return func(keys []string) [][]int {
		var parts []P
		var groups [][]int
		for i, k := range keys {
			p := part(k)
			j := slices.Index(parts, p)
			if j < 0 {
				j = len(parts)
				parts = append(parts, p)
				groups = append(groups, nil)
			}
			groups[j] = append(groups[j], i)
		}
		return groups
	}
}

// groups splits keys by hash slot (or Ring shard): nil when one script call
// covers them all.
func (s *Store) groups(keys []string) [][]int {
	if s.group == nil {
		return nil
	}
	return s.group(keys)
}

// groupOf returns the keys and requests at indexes idx (one group), in
// order.
func groupOf(keys []string, reqs []limiter.Request, idx []int) ([]string, []limiter.Request) {
	gkeys := make([]string, len(idx))
	greqs := make([]limiter.Request, len(idx))
	for j, i := range idx {
		gkeys[j], greqs[j] = keys[i], reqs[i]
	}
	return gkeys, greqs
}

// giveBackRecord is what giveback.lua needs to take one bucket from the
// state the admitted Take left to the one a denied Take leaves.
type giveBackRecord struct {
	needed                    bool
	admittedTAT, admittedFrac int64
	deniedTAT, deniedFrac     int64
}

// giveBackRecords works out, for a Take that one slot admitted, what its
// requests answer if another slot denies it (limiter.DecideDenied), and for the
// last request naming each key whose admitted state differs from the
// denied one, the record giveback.lua needs.
func giveBackRecords(now time.Time, reqs []limiter.Request, stored []limiter.State, decisions []limiter.Decision, next []limiter.State) ([]limiter.Decision, []giveBackRecord) {
	denied, deniedNext := limiter.DecideDenied(now, reqs, stored, decisions)
	records := make([]giveBackRecord, len(reqs))
	for i, r := range reqs {
		last := !slices.ContainsFunc(reqs[i+1:], func(later limiter.Request) bool { return later.Key == r.Key })
		if last && next[i] != deniedNext[i] {
			records[i] = giveBackRecord{
				needed:      true,
				admittedTAT: next[i].TAT, admittedFrac: next[i].Frac,
				deniedTAT: deniedNext[i].TAT, deniedFrac: deniedNext[i].Frac,
			}
		}
	}
	return denied, records
}

// takeGroups takes each group (one hash slot) in parallel, and if one
// denies or fails, gives back what the others took, under ctx. See Take.
func (s *Store) takeGroups(ctx context.Context, now time.Time, keys []string, reqs []limiter.Request, groups [][]int) ([]limiter.Decision, error) {
	results := make([]takeResult, len(groups))
	errs := make([]error, len(groups))
	calls := make([]scriptCall, len(groups))
	greqs := make([][]limiter.Request, len(groups))
	for g, idx := range groups {
		var gkeys []string
		gkeys, greqs[g] = groupOf(keys, reqs, idx)
		calls[g] = scriptCall{script: s.take, keys: gkeys, args: s.takeArgs(now, greqs[g]), take: greqs[g], now: now}
	}
	for g, cmd := range s.scripts(ctx, calls) {
		results[g], errs[g] = decodeTakeCmd(cmd, greqs[g], true)
	}

	allowed, denied := true, false
	var failed []error
	for g := range groups {
		switch {
		case errs[g] != nil:
			failed = append(failed, errs[g])
			allowed = false
		case !results[g].allowed:
			allowed, denied = false, true
		}
	}
	decisions := make([]limiter.Decision, len(reqs))
	for g, idx := range groups {
		res := results[g]
		for j, i := range idx {
			switch {
			case errs[g] != nil:
				// Unknown: not what denied the Take, nothing known left.
				decisions[i] = limiter.Decision{Allowed: true}
			case allowed || !res.allowed:
				// Admitted everywhere, or this slot denied: it already
				// answered as DecideAll does.
				decisions[i] = res.decisions[j]
			default:
				// Admitted here, denied elsewhere: as DecideAll, the
				// post-paid charges alone, the others reported as checks.
				decisions[i] = res.denied[j]
			}
		}
	}
	if allowed {
		return decisions, nil
	}
	// Under ctx: the caller gets its answer by its deadline; a give-back
	// not done by then leaves tokens spent, which errs toward denying.
	gerr := s.giveBackGroups(ctx, now, keys, reqs, groups, results, errs)
	if denied {
		// The admission is known: denied. Failures only cost accuracy
		// (tokens left spent, a failed slot's state unknown).
		if len(failed) > 0 {
			s.stats.deniedWithFailures.Add(1)
		}
		return decisions, nil
	}
	if gerr != nil {
		failed = append(failed, gerr)
	}
	return nil, takeError(errors.Join(failed...))
}

// giveBackGroups runs giveback.lua on every group that admitted, for the
// buckets whose state differs from what a denied Take leaves, under ctx,
// and counts the calls that fail in Stats.GiveBackFailures.
func (s *Store) giveBackGroups(ctx context.Context, now time.Time, keys []string, reqs []limiter.Request, groups [][]int, results []takeResult, errs []error) error {
	var calls []scriptCall
	for g, idx := range groups {
		res := results[g]
		if errs[g] != nil || !res.allowed {
			continue
		}
		var gkeys []string
		args := []any{s.nowArg(now), res.now}
		for j, i := range idx {
			r := res.giveBack[j]
			if !r.needed {
				continue
			}
			gkeys = append(gkeys, keys[i])
			l := reqs[i].Limit
			args = append(args, l.Count, l.Period.Microseconds(), r.admittedTAT, r.admittedFrac, r.deniedTAT, r.deniedFrac)
		}
		if len(gkeys) == 0 {
			continue
		}
		calls = append(calls, scriptCall{script: s.giveBack, keys: gkeys, args: args})
	}
	if len(calls) == 0 {
		return nil
	}
	var gerrs []error
	for i, cmd := range s.scripts(ctx, calls) {
		if err := cmd.Err(); err != nil {
			s.stats.giveBackFailures.Add(1)
			gerrs = append(gerrs, fmt.Errorf("give back %d buckets: %w", len(calls[i].keys), err))
		}
	}
	return errors.Join(gerrs...)
}
