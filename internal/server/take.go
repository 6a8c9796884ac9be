package server

import (
	"context"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// taken is what the takes stage produced.
type taken struct {
	// decisions has the store's answer to each of plan.takes; nil when
	// the plan has none.
	decisions []limiter.Decision
	// queueFull[k], when set, says take k could not wait because too many
	// requests already waited on its bucket (see waitQueues.claim).
	queueFull []bool
	// claimed are the waiting slots the takes hold, which the caller
	// gives back (waitQueues.release) once the request is answered.
	claimed []bool
}

// take is the takes stage: it claims a waiting slot for each take of p
// that may wait for reserved tokens, then asks the store for all of p's
// takes in one all-or-nothing Take. A backend failure is answered as
// statusFromError says (its slots then given back); a Take answered per
// the store's failure mode is logged.
func (s *Server) take(ctx context.Context, now time.Time, p *plan) (taken, error) {
	if len(p.takes) == 0 {
		return taken{}, nil
	}
	claimed, full := s.waits.claim(p)
	decisions, err := s.store.Take(ctx, now, p.takes)
	if err != nil {
		s.waits.release(p, claimed)
		s.logFailure(ctx, now, p.domain, err)
		return taken{}, statusFromError(err)
	}
	if cause := decisions[0].Fallback; cause != limiter.FallbackNone {
		s.logFallback(ctx, now, p.domain, cause)
	}
	return taken{decisions: decisions, queueFull: full, claimed: claimed}, nil
}
