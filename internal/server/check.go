package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
)

// check is the first stage of a decision: it refuses a request whose shape
// or sizes break the server's RequestLimits (INVALID_ARGUMENT), and one
// that comes before any config, or for a domain whose config was refused
// (UNAVAILABLE). It returns the config to decide req with.
func (s *Server) check(ctx context.Context, req *rlsv3.RateLimitRequest, now time.Time) (*loaded, error) {
	if err := s.limits.check(req); err != nil {
		return nil, answerFor(codes.InvalidArgument, malformedError{err})
	}
	cur := s.current.Load()
	if cur == nil {
		return nil, answerFor(codes.Unavailable, ErrNoConfig)
	}
	if why, refused := cur.set.Refused(req.GetDomain()); refused {
		s.logThrottled(ctx, now, "call for a domain whose config was refused", "domain", req.GetDomain(), "err", why)
		return nil, answerFor(codes.Unavailable, &RefusedDomainError{Domain: req.GetDomain(), Reason: why})
	}
	return cur, nil
}

// malformedError is the cause of the INVALID_ARGUMENT answered to a
// request that failed RequestLimits.check.
type malformedError struct{ error }

// malformed reports whether err answers a request that failed
// RequestLimits.check (see Call.Checked).
func malformed(err error) bool {
	var me malformedError
	return errors.As(err, &me)
}

// check returns what is wrong with req, or nil.
func (l RequestLimits) check(req *rlsv3.RateLimitRequest) error {
	domain := req.GetDomain()
	switch {
	case domain == "":
		return fmt.Errorf("domain is empty")
	case len(domain) > l.MaxDomainBytes:
		return fmt.Errorf("domain is %d bytes, more than the %d allowed", len(domain), l.MaxDomainBytes)
	case len(req.GetDescriptors()) == 0:
		return fmt.Errorf("no descriptors: a request needs at least one")
	case len(req.GetDescriptors()) > l.MaxDescriptors:
		return fmt.Errorf("%d descriptors, more than the %d allowed", len(req.GetDescriptors()), l.MaxDescriptors)
	}
	for i, d := range req.GetDescriptors() {
		entries := d.GetEntries()
		switch {
		case len(entries) > l.MaxEntries:
			return fmt.Errorf("descriptors[%d] has %d entries, more than the %d allowed", i, len(entries), l.MaxEntries)
		case d.GetHitsAddend() != nil && d.GetHitsAddend().GetValue() > l.MaxHits:
			return fmt.Errorf("descriptors[%d].hits_addend %d is more than the %d allowed", i, d.GetHitsAddend().GetValue(), l.MaxHits)
		}
		for j, e := range entries {
			switch {
			case e.GetKey() == "":
				return fmt.Errorf("descriptors[%d].entries[%d] has an empty key", i, j)
			case len(e.GetKey()) > l.MaxKeyBytes:
				return fmt.Errorf("descriptors[%d].entries[%d].key is %d bytes, more than the %d allowed", i, j, len(e.GetKey()), l.MaxKeyBytes)
			}
		}
	}
	if uint64(req.GetHitsAddend()) > l.MaxHits {
		return fmt.Errorf("hits_addend %d is more than the %d allowed", req.GetHitsAddend(), l.MaxHits)
	}
	return nil
}
