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
	"slices"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// decide answers req at time now, or returns the gRPC error to answer.
func (s *Server) decide(ctx context.Context, req *rlsv3.RateLimitRequest, now time.Time) (plan, []limiter.Decision, *rlsv3.RateLimitResponse, error) {
	if err := s.limits.check(req); err != nil {
		return plan{}, nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	cur := s.current.Load()
	if cur == nil {
		return plan{}, nil, nil, answerFor(codes.Unavailable, ErrNoConfig)
	}
	if why, refused := cur.set.Refused(req.GetDomain()); refused {
		s.logThrottled(ctx, now, "call for a domain whose config was refused", "domain", req.GetDomain(), "err", why)
		return plan{}, nil, nil, answerFor(codes.Unavailable, &RefusedDomainError{Domain: req.GetDomain(), Reason: why})
	}
	p, err := planRequest(ctx, cur.set, req, s.waitCap(ctx, now), s.limits.MaxValueBytes, s.shadow, s.quota, s.onInvalid)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return plan{}, nil, nil, status.FromContextError(err).Err()
		}
		return plan{}, nil, nil, answerFor(codes.InvalidArgument, err)
	}
	if planLeases(&p, req); len(p.leases) > 0 {
		return s.decideLeases(ctx, req, now, cur, p)
	}
	return s.decidePlan(ctx, req, now, cur, p)
}

// decidePlan answers the planned request p at time now: its refunds, its
// takes and its waits for reserved tokens.
func (s *Server) decidePlan(ctx context.Context, req *rlsv3.RateLimitRequest, now time.Time, cur *loaded, p plan) (plan, []limiter.Decision, *rlsv3.RateLimitResponse, error) {
	if len(p.refunds) > 0 {
		refunder, ok := s.store.(limiter.Refunder)
		if !ok {
			return p, nil, nil, status.Error(codes.InvalidArgument, "is_negative_hits: this backend cannot give tokens back")
		}
		// Refunds first: a settle's charge sees its estimate given back.
		out, err := s.giveBack(ctx, now, &p, refunder)
		p.refunded = out
		if err != nil {
			s.logFailure(ctx, now, req.GetDomain(), err)
			return p, nil, nil, statusFromError(err)
		}
	}
	if len(p.takes) == 0 {
		return p, nil, buildResponse(req, p, nil, nil, s.answer, cur.cache), nil
	}
	claimed, full := s.waits.claim(&p)
	defer s.waits.release(&p, claimed)
	decisions, err := s.store.Take(ctx, now, p.takes)
	if err != nil {
		s.logFailure(ctx, now, req.GetDomain(), err)
		return p, nil, nil, statusFromError(err)
	}
	if cause := decisions[0].Fallback; cause != limiter.FallbackNone {
		s.logFallback(ctx, now, req.GetDomain(), cause)
	}
	if p.tolerant() {
		decisions = s.settle(ctx, &p, decisions, now)
	}
	resp := buildResponse(req, p, decisions, full, s.answer, cur.cache)
	if s.overdraft.covers(req.GetDomain()) {
		var changed bool
		// Unspent: the store denied the Take, or quota mode's settle gave
		// its takes back (the verdict is OVER_LIMIT).
		denied := takeDenied(p.takes, decisions) || p.tolerant() && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
		if decisions, changed = s.countDenied(ctx, now, req.GetDomain(), &p, decisions, denied); changed {
			resp = buildResponse(req, p, decisions, full, s.answer, cur.cache)
		}
	}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK && waits(decisions) {
		if left, err := s.hold(ctx, p, decisions, s.now()); err != nil {
			if s.refund(p, decisions, s.now()) {
				s.waits.moveUp(left)
			}
			if errors.Is(err, errWaitPastDeadline) {
				// Denied instead: its tokens come too late for this caller.
				decisions = deniedForWaits(decisions)
				return p, decisions, buildResponse(req, p, decisions, full, s.answer, cur.cache), nil
			}
			return p, nil, nil, status.FromContextError(err).Err()
		}
	}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK && decisions[0].Fallback == limiter.FallbackNone {
		s.credit(ctx, now, &p, decisions, req.GetDomain())
	}
	return p, decisions, resp, nil
}

// deadlineMargin is kept between a wait and the caller's deadline, for the
// answer to reach it.
const deadlineMargin = 5 * time.Millisecond

// waitCap is the longest a call may wait for reserved tokens: --max-wait,
// and less than the caller's deadline (Envoy's timeout), since a caller
// that gives up mid-wait falls back to its failure mode, unmetered.
func (s *Server) waitCap(ctx context.Context, now time.Time) time.Duration {
	limit := s.maxWait
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, dl.Sub(now)-deadlineMargin)
	}
	return max(limit, 0)
}

// deniedForWaits is decisions with every admission that waits for reserved
// tokens turned into a denial until they arrive.
func deniedForWaits(decisions []limiter.Decision) []limiter.Decision {
	out := slices.Clone(decisions)
	for k, d := range out {
		if d.Wait > 0 {
			out[k] = limiter.Decision{RetryAfter: d.Wait, ResetAfter: d.ResetAfter}
		}
	}
	return out
}

func waits(decisions []limiter.Decision) bool {
	for _, d := range decisions {
		if d.Wait > 0 {
			return true
		}
	}
	return false
}

// refund gives back what an admitted request took, when its caller gave
// up while it waited for reserved tokens, and reports whether the store
// took it back. Post-paid charges stay, and a shadow take that was denied
// took nothing.
func (s *Server) refund(p plan, decisions []limiter.Decision, now time.Time) bool {
	refunder, ok := s.store.(limiter.Refunder)
	if !ok {
		return false
	}
	var back []limiter.Request
	for k, r := range p.takes {
		if r.Hits > 0 && !r.Charge() && decisions[k].Allowed {
			back = append(back, r)
		}
	}
	if len(back) == 0 {
		return true
	}
	// The caller's context is done; the refund gets its own short one.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := refunder.Refund(ctx, now, back); err != nil {
		s.logFailure(ctx, now, "", err)
		return false
	}
	return true
}

// logFailure logs a backend failure (or a call whose deadline came before
// the backend could answer it), through logThrottled.
func (s *Server) logFailure(ctx context.Context, now time.Time, domain string, err error) {
	if errors.Is(err, limiter.ErrInvalidRequest) || errors.Is(err, context.Canceled) {
		return
	}
	msg := "backend failed"
	if errors.Is(err, limiter.ErrOverloaded) {
		msg = "deadline reached before the backend could answer"
	}
	s.logThrottled(ctx, now, msg, "domain", domain, "err", err)
}

// logFallback logs a call answered per the store's failure mode (a store
// answers a Take that way as a whole, so its first decision tells), through
// logThrottled.
func (s *Server) logFallback(ctx context.Context, now time.Time, domain string, cause limiter.Fallback) {
	s.logThrottled(ctx, now, "answered per the failure mode", "domain", domain, "cause", cause.String())
}

// logThrottled logs a warning at most once a second (failures and
// fallbacks share the second), with the number of lines not logged since
// the last.
func (s *Server) logThrottled(ctx context.Context, now time.Time, msg string, attrs ...any) {
	last := s.lastFailureLog.Load()
	if now.UnixNano()-last < int64(time.Second) || !s.lastFailureLog.CompareAndSwap(last, now.UnixNano()) {
		s.quietFailures.Add(1)
		return
	}
	s.log.WarnContext(ctx, msg, append(attrs, "unlogged_since_last", s.quietFailures.Swap(0))...)
}
