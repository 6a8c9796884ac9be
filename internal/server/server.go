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
	"golang.org/x/net/http/httpguts"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// RetryAfter says whether OVER_LIMIT answers carry a Retry-After header.
// The zero value is invalid.
type RetryAfter int

const (
	// RetryAfterSend adds Retry-After (whole seconds, rounded up, at least 1)
	// and Cache-Control: no-store to OVER_LIMIT answers. Most deployed Envoys
	// do not emit Retry-After themselves.
	RetryAfterSend RetryAfter = iota + 1
	// RetryAfterOmit leaves Retry-After to Envoy (enable_retry_after_header).
	RetryAfterOmit
)

// RateLimitHeaders says which rate-limit headers the service adds itself,
// if any. The zero value is invalid.
type RateLimitHeaders int

const (
	// RateLimitHeadersOff leaves them to Envoy
	// (enable_x_ratelimit_headers), which picks the limit with the least
	// remaining, even if it is not the one that denied.
	RateLimitHeadersOff RateLimitHeaders = iota + 1
	// RateLimitHeadersDraft03 adds X-RateLimit-Limit, -Remaining and -Reset
	// (draft 03) computed from the limit that denied, or when admitted from
	// the one with the least remaining.
	RateLimitHeadersDraft03
	// RateLimitHeadersIETF adds RateLimit-Policy and RateLimit
	// (draft-ietf-httpapi-ratelimit-headers-11) of the same limit as
	// draft 03 picks, rate or concurrency alike (see ietf.go).
	RateLimitHeadersIETF
	// RateLimitHeadersIncumbent adds the three headers envoyproxy/ratelimit
	// adds with LIMIT_RESPONSE_HEADERS_ENABLED, named by
	// Options.RateLimitHeaderNames (RateLimit-Limit, -Remaining and -Reset
	// by default): the limit's count, its remaining and the seconds until
	// its reset (the status's duration_until_reset), of the same limit as
	// draft 03 picks.
	RateLimitHeadersIncumbent
)

// DefaultRateLimitHeaderNames are the names RateLimitHeadersIncumbent
// gives its headers by default: envoyproxy/ratelimit's defaults.
func DefaultRateLimitHeaderNames() HeaderNames {
	return HeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}
}

// HeaderNames name the headers of RateLimitHeadersIncumbent: each a valid
// HTTP header field name.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

// Validate reports the first name that is not an HTTP header field name.
func (n HeaderNames) Validate() error {
	for _, h := range []struct{ field, name string }{{"limit", n.Limit}, {"remaining", n.Remaining}, {"reset", n.Reset}} {
		if !httpguts.ValidHeaderFieldName(h.name) {
			return fmt.Errorf("the %s header's name %q is not an HTTP header name", h.field, h.name)
		}
	}
	return nil
}

// DynamicMetadata says which answers carry dynamic_metadata naming the
// rules involved (for Envoy's access logs). Envoy turns it into request
// metadata on every answer that carries it, which costs both sides a few
// microseconds per call. The zero value is invalid.
type DynamicMetadata int

const (
	// DynamicMetadataAll puts it on every answer in which a rule matched:
	// the rules that matched, and those that denied, would have denied
	// (shadow), were asked for more than their burst, waited or shed, and
	// quota-mode rules over their limit in an admitted answer.
	DynamicMetadataAll DynamicMetadata = iota + 1
	// DynamicMetadataNotable puts it only on answers where more happened
	// than a plain admission: a denial, a shadow denial, a request above
	// the burst, a wait, a full queue or a quota-mode rule over its limit.
	// It is the default: Envoy decodes the metadata of every answer that
	// carries it.
	DynamicMetadataNotable
	// DynamicMetadataOff never sends it.
	DynamicMetadataOff
)

// QuotaMode says which descriptors are quota-mode descriptors, as
// envoyproxy/ratelimit's QUOTA_MODE setting does. A request is denied when
// a descriptor that is not in quota mode is over its limit, or when every
// one of its quota-mode descriptors is; a quota-mode descriptor over its
// limit in an admitted request answers OVER_LIMIT in its own status. The
// zero value is invalid.
type QuotaMode int

const (
	// QuotaModePerRule: the descriptors whose rule sets quota_mode.
	QuotaModePerRule QuotaMode = iota + 1
	// QuotaModeAll: every descriptor but those of unlimited rules,
	// including those no rule matched (which pass), as the incumbent's
	// QUOTA_MODE=true does.
	QuotaModeAll
)

// DescriptorMetadata says what an answer's dynamic metadata carries of
// envoyproxy/ratelimit's own keys (beside the ratelimitd.* keys, which
// Options.DynamicMetadata governs). The zero value is invalid.
type DescriptorMetadata int

const (
	// DescriptorMetadataPassed puts the merged metadata of the
	// descriptors that passed under "metadata", on every answer where one
	// of them has metadata in the config.
	DescriptorMetadataPassed DescriptorMetadata = iota + 1
	// DescriptorMetadataIncumbent puts on every answer the keys the
	// incumbent sets with RESPONSE_DYNAMIC_METADATA=true: "domain",
	// "descriptors" (each descriptor's "entries" as "key=value" strings,
	// its "limit" override as text and its "hitsAddend"), the request's
	// "hitsAddend" when not 0, and "metadata" as with
	// DescriptorMetadataPassed.
	DescriptorMetadataIncumbent
	// DescriptorMetadataOff sends none of them.
	DescriptorMetadataOff
)

// RequestLimits bound what one request may ask, so that no caller can make
// the server use unbounded memory or time. Zero fields take the defaults.
//
// The defaults admit every request Envoy sends for the configs Envoy
// Gateway (EG) and Istio generate, with room (docs/security.md has the
// derivations); what bounds memory is the message size (the gRPC server's
// MaxRecvMsgSize): a request is decoded whole before these are checked, and
// everything done with it after is in proportion to its bytes. These bound
// the work per byte: descriptors looked up and buckets taken.
type RequestLimits struct {
	// MaxDomainBytes: default config.MaxDomainBytes (2,048; EG's longest
	// domain, a ListenerSet listener's name, is 889 bytes).
	MaxDomainBytes int
	// MaxDescriptors: default DefaultMaxDescriptors.
	MaxDescriptors int
	// MaxEntries bounds the entries of one descriptor; default
	// config.MaxDepth (2,048; EG sends one entry per match of a rule, up to
	// 1,157).
	MaxEntries int
	// MaxKeyBytes bounds an entry key; default config.MaxKeyBytes (1,024;
	// EG's longest, a route's, is 598 bytes).
	MaxKeyBytes int
	// MaxValueBytes bounds an entry value kept as it is; a longer one is
	// matched as it is, then stands as its first bytes, length and SHA-256;
	// default config.MaxValueBytes (4,096).
	MaxValueBytes int
	// MaxHits bounds hits_addend, per descriptor; default 1e9.
	MaxHits uint64
}

// DefaultMaxDescriptors is the default of RequestLimits.MaxDescriptors.
// Envoy sends one descriptor per rate limit of the route (and of its
// virtual host) whose actions all match, in one call per domain. EG makes
// one such rate limit per rule of a BackendTrafficPolicy, at most 256 a
// policy, and a route's policy may be merged with its Gateway's: 512 (a
// rule that lists methods makes one per method, and a request matches one
// of them unless they are inverted). Istio's rate limits are written by
// hand, one per action list. 1,024 leaves room; envoyproxy/ratelimit has no
// bound of its own.
const DefaultMaxDescriptors = 1024

// DefaultRequestLimits are the bounds of a zero RequestLimits.
func DefaultRequestLimits() RequestLimits { return RequestLimits{}.withDefaults() }

func (l RequestLimits) withDefaults() RequestLimits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	// The config's bounds, so that every rule it accepts can be matched.
	def(&l.MaxDomainBytes, config.MaxDomainBytes)
	def(&l.MaxDescriptors, DefaultMaxDescriptors)
	def(&l.MaxEntries, config.MaxDepth)
	def(&l.MaxKeyBytes, config.MaxKeyBytes)
	def(&l.MaxValueBytes, config.MaxValueBytes)
	if l.MaxHits == 0 {
		l.MaxHits = 1_000_000_000
	}
	l.MaxHits = min(l.MaxHits, limiter.MaxTokens)
	return l
}

// Options configures a Server. Store is required; the zero value of every
// other field means its documented default.
type Options struct {
	// Store keeps the buckets.
	Store limiter.Store
	// Now is the clock; default time.Now. A request is decided at the time
	// read when it arrives; later reads time its wait, its refund and its
	// duration.
	Now func() time.Time
	// Logger receives debug lines per request and warnings; default discards.
	Logger *slog.Logger
	// Limits bound the size of requests.
	Limits RequestLimits
	// RetryAfter defaults to RetryAfterSend.
	RetryAfter RetryAfter
	// RateLimitHeaders defaults to RateLimitHeadersOff.
	RateLimitHeaders RateLimitHeaders
	// RateLimitHeaderNames name RateLimitHeadersIncumbent's headers; an
	// empty field takes its name in DefaultRateLimitHeaderNames. Other
	// modes ignore it.
	RateLimitHeaderNames HeaderNames
	// DynamicMetadata defaults to DynamicMetadataNotable.
	DynamicMetadata DynamicMetadata
	// Observer, when set, learns the outcome of every call.
	Observer Observer
	// MaxWait caps every limit's max_wait: how long a call may be held for
	// reserved tokens. Default 5s.
	MaxWait time.Duration
	// ShadowMode makes every rule, limit overrides included, a shadow
	// rule: decided and counted, never denying (envoyproxy/ratelimit's
	// SHADOW_MODE).
	ShadowMode bool
	// QuotaMode defaults to QuotaModePerRule.
	QuotaMode QuotaMode
	// DescriptorMetadata defaults to DescriptorMetadataPassed.
	DescriptorMetadata DescriptorMetadata

	// Overdraft, when on, records every charge even when it overdraws
	// (see Overdraft). Default off.
	Overdraft Overdraft
	// Leases keeps the lease pools of concurrency rules; default a
	// limiter.MemoryLeases of this process. A store shared by replicas
	// wakes waiters elsewhere through Server.LeaseReleased.
	Leases limiter.LeaseStore
	// LeaseObserver, when set, learns of every lease call (metrics).
	LeaseObserver LeaseObserver
	// Refunds says what is_negative_hits may give back; default
	// RefundsTaken (RefundsUnbounded is envoyproxy/ratelimit's behaviour).
	Refunds RefundPolicy
	// OnInvalidOverride and OnOversizedRequest answer the requests Envoy
	// would let through on an error (see policy.go); default deny. A
	// request larger than MaxRequestBytes (0: no bound of the server's own)
	// is oversized when served through Register with Codec.
	OnInvalidOverride  InvalidOverride
	OnOversizedRequest OversizedRequest
	MaxRequestBytes    int
}

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

// ErrNoConfig is the cause of the UNAVAILABLE answered before any config
// is loaded.
var ErrNoConfig = errors.New("no rate limit configuration loaded yet")

// RefusedDomainError is the cause of the UNAVAILABLE answered for a domain
// whose config its source refused while none of it was ever loaded
// (config.Set.Refused): not a domain nobody configured, whose calls pass,
// but one the control plane configured and this server cannot enforce, so
// Envoy's failure_mode_deny decides, as for a backend failure.
// errors.Is(err, ErrNoConfig) holds, so it is counted with calls answered
// before any config (ratelimitd_backend_errors_total{kind="no_config"}).
type RefusedDomainError struct {
	Domain, Reason string
}

func (e *RefusedDomainError) Error() string {
	return fmt.Sprintf("domain %q: its rate limit configuration was refused: %s", e.Domain, e.Reason)
}

// Is reports ErrNoConfig: there is no configuration of this domain.
func (e *RefusedDomainError) Is(target error) bool { return target == ErrNoConfig }

// statusFromError maps a Store error to the gRPC status Envoy sees. A
// backend failure is UNAVAILABLE, so that Envoy's failure_mode_deny decides.
func statusFromError(err error) error {
	switch {
	case errors.Is(err, limiter.ErrInvalidRequest):
		return answerFor(codes.InvalidArgument, err)
	case errors.Is(err, context.Canceled):
		return answerFor(codes.Canceled, err)
	default:
		return answerFor(codes.Unavailable, err)
	}
}

// answerError is a gRPC status answered because of cause: gRPC sends the
// status (code, and cause's message), while errors.Is and errors.As on it
// still reach cause, for observers that classify failures (Call.Err).
type answerError struct {
	status *status.Status
	cause  error
}

func answerFor(code codes.Code, cause error) error {
	return &answerError{status: status.New(code, cause.Error()), cause: cause}
}

func (e *answerError) Error() string              { return e.status.Err().Error() }
func (e *answerError) GRPCStatus() *status.Status { return e.status }
func (e *answerError) Unwrap() error              { return e.cause }
