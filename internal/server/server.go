// Package server implements Envoy's envoy.service.ratelimit.v3
// RateLimitService over a config.Set and a limiter.Store: it turns each
// ShouldRateLimit call into one all-or-nothing Store.Take and the decisions
// into the answer Envoy reads (statuses, headers, dynamic metadata).
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// Server answers ShouldRateLimit. It is safe for concurrent use; the config
// it decides with is swapped atomically by SetConfig.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	store    limiter.Store
	now      func() time.Time
	log      *slog.Logger
	limits   RequestLimits
	answer   answerOptions
	observer Observer
	maxWait  time.Duration
	shadow   bool // Options.ShadowMode
	quota    QuotaMode
	// The policies of policy.go, and the size bound of a request.
	onInvalid       InvalidOverride
	onOversized     OversizedRequest
	maxRequestBytes int
	current         atomic.Pointer[loaded]
	waits           waitQueues
	leases          leaseState
	refunds         RefundPolicy
	// refundLocks serialize the refunds of one ledger (see giveBack).
	refundLocks *refundLocks

	// overdraft is Options.Overdraft.
	overdraft Overdraft

	// lastFailureLog (Unix ns) and quietFailures keep backend failures to
	// one log line a second.
	lastFailureLog atomic.Int64
	quietFailures  atomic.Int64
}

var _ rlsv3.RateLimitServiceServer = (*Server)(nil)

// New returns a Server with no config: it answers UNAVAILABLE until
// SetConfig is called.
func New(opts Options) (*Server, error) {
	if opts.Store == nil {
		return nil, errors.New("server: Options.Store is required")
	}
	s := &Server{
		store:    opts.Store,
		now:      opts.Now,
		log:      opts.Logger,
		limits:   opts.Limits.withDefaults(),
		answer:   answerOptions{retryAfter: opts.RetryAfter, headers: opts.RateLimitHeaders, headerNames: opts.RateLimitHeaderNames, metadata: opts.DynamicMetadata, descMeta: opts.DescriptorMetadata},
		observer: opts.Observer,
		maxWait:  opts.MaxWait,
		shadow:   opts.ShadowMode,
		quota:    opts.QuotaMode,
		refunds:  opts.Refunds,

		refundLocks: newRefundLocks(),

		onInvalid:       cmp.Or(opts.OnInvalidOverride, InvalidOverrideDeny),
		onOversized:     cmp.Or(opts.OnOversizedRequest, OversizedDeny),
		maxRequestBytes: max(opts.MaxRequestBytes, 0),
	}
	if s.refunds == 0 {
		s.refunds = RefundsTaken
	}
	if s.refunds != RefundsTaken && s.refunds != RefundsUnbounded {
		return nil, fmt.Errorf("server: invalid Refunds %d", s.refunds)
	}
	if _, ok := invalidOverrideNames[s.onInvalid]; !ok {
		return nil, fmt.Errorf("server: invalid OnInvalidOverride %d", s.onInvalid)
	}
	if _, ok := oversizedNames[s.onOversized]; !ok {
		return nil, fmt.Errorf("server: invalid OnOversizedRequest %d", s.onOversized)
	}
	if s.quota == 0 {
		s.quota = QuotaModePerRule
	}
	if s.quota != QuotaModePerRule && s.quota != QuotaModeAll {
		return nil, fmt.Errorf("server: invalid QuotaMode %d", s.quota)
	}
	if s.answer.descMeta == 0 {
		s.answer.descMeta = DescriptorMetadataPassed
	}
	if s.answer.descMeta < DescriptorMetadataPassed || s.answer.descMeta > DescriptorMetadataOff {
		return nil, fmt.Errorf("server: invalid DescriptorMetadata %d", s.answer.descMeta)
	}
	s.overdraft = opts.Overdraft
	if s.maxWait <= 0 {
		s.maxWait = 5 * time.Second
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.leases.init(s.now, opts.Leases, opts.LeaseObserver)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.answer.retryAfter == 0 {
		s.answer.retryAfter = RetryAfterSend
	}
	if s.answer.headers == 0 {
		s.answer.headers = RateLimitHeadersOff
	}
	if s.answer.metadata == 0 {
		s.answer.metadata = DynamicMetadataNotable
	}
	if s.answer.metadata < DynamicMetadataAll || s.answer.metadata > DynamicMetadataOff {
		return nil, fmt.Errorf("server: invalid DynamicMetadata %d", s.answer.metadata)
	}
	if s.answer.retryAfter != RetryAfterSend && s.answer.retryAfter != RetryAfterOmit {
		return nil, fmt.Errorf("server: invalid RetryAfter %d", s.answer.retryAfter)
	}
	if s.answer.headers < RateLimitHeadersOff || s.answer.headers > RateLimitHeadersIncumbent {
		return nil, fmt.Errorf("server: invalid RateLimitHeaders %d", s.answer.headers)
	}
	if s.answer.headers == RateLimitHeadersIncumbent {
		n, def := &s.answer.headerNames, DefaultRateLimitHeaderNames()
		n.Limit, n.Remaining, n.Reset = cmp.Or(n.Limit, def.Limit), cmp.Or(n.Remaining, def.Remaining), cmp.Or(n.Reset, def.Reset)
		if err := n.Validate(); err != nil {
			return nil, fmt.Errorf("server: RateLimitHeaderNames: %w", err)
		}
	}
	return s, nil
}

// loaded is a config in force and what is built from it.
type loaded struct {
	set   *config.Set
	cache *protoCache
}

// SetConfig makes set the config for every request that starts after it.
func (s *Server) SetConfig(set *config.Set) {
	s.current.Store(&loaded{set: set, cache: &protoCache{}})
}

// Config returns the config in force, or nil before the first SetConfig.
func (s *Server) Config() *config.Set {
	if l := s.current.Load(); l != nil {
		return l.set
	}
	return nil
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := s.now()
	p, decisions, resp, err := s.decide(ctx, req, start)
	if s.observer != nil {
		s.observe(req, start, p, decisions, resp, err)
	}
	if err != nil {
		return nil, err
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "decided", "domain", req.GetDomain(), "descriptors", len(req.GetDescriptors()),
			"code", resp.GetOverallCode().String())
	}
	return resp, nil
}

// decide answers req at time now, or returns the gRPC error to answer. It
// is the stages of a decision, in order, each in the file of its name;
// each takes what the ones before it produced and returns what the next
// need, and a stage with nothing to do for the request passes it on:
//
//   - check (check.go): the request's shape and sizes; the config to use.
//   - plan (plan.go): each descriptor's rule, the buckets to take from and
//     the leases to hold.
//   - leases (leases.go): concurrency descriptors release, check and
//     acquire their leases; a denied one makes the takes checks.
//   - refunds (refund.go): is_negative_hits gives tokens back.
//   - takes (take.go): one all-or-nothing Take of the buckets.
//   - quota (quota.go): quota mode gives back what its verdict does not
//     let the request spend.
//   - verdict (verdict.go): whether the answer admits the request.
//   - overdraft (overdraft.go): the post-paid counting of a denied
//     request's hits.
//   - waits (wait.go): an admitted request waits for reserved tokens.
//   - credit (credit.go): the refund ledgers record what was spent.
//   - answer (response.go): statuses, headers and metadata for Envoy.
//
// The leases newly acquired are given back, and the waiting slots
// released, when decide returns.
func (s *Server) decide(ctx context.Context, req *rlsv3.RateLimitRequest, now time.Time) (plan, []limiter.Decision, *rlsv3.RateLimitResponse, error) {
	cur, err := s.check(ctx, req, now)
	if err != nil {
		return plan{}, nil, nil, err
	}
	p, err := s.plan(ctx, cur.set, req, now)
	if err != nil {
		return plan{}, nil, nil, err
	}
	held, now, err := s.acquireLeases(ctx, now, &p)
	if err != nil {
		return p, nil, nil, err
	}
	admitted := false
	if len(held) > 0 {
		defer func() {
			if !admitted {
				s.leases.giveBackAll(held)
			}
		}()
	}
	if err := s.refund(ctx, now, &p); err != nil {
		return p, nil, nil, err
	}
	t, err := s.take(ctx, now, &p)
	if err != nil {
		return p, nil, nil, err
	}
	defer s.waits.release(&p, t.claimed)
	decisions := s.settle(ctx, now, &p, t.decisions)
	admitted = admits(&p, decisions)
	decisions = s.countDenied(ctx, now, &p, decisions, admitted)
	if decisions, admitted, err = s.wait(ctx, &p, decisions, admitted); err != nil {
		return p, nil, nil, err
	}
	s.credit(ctx, now, &p, decisions, admitted)
	return p, decisions, buildResponse(req, p, decisions, t.queueFull, s.answer, cur.cache), nil
}
