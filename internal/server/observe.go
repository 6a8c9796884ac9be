package server

import (
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// Observer learns the outcome of every ShouldRateLimit call, for metrics,
// pages and traces. ObserveCall is called once per call, on the call's
// goroutine, after the answer is built: implementations must be safe for
// concurrent use, quick, and must not keep the Call or its slices.
type Observer interface {
	ObserveCall(Call)
}

// Call is one ShouldRateLimit call as an Observer sees it.
type Call struct {
	// Domain is the request's domain. Unless Checked, it is whatever the
	// caller sent, of any length: an observer must not keep it (nor use it
	// as a label).
	Domain string
	// Checked reports whether the request passed the server's checks of
	// its shape and sizes (Options.Limits: domain, descriptors, entries,
	// hits). Only calls answered InvalidArgument can fail them; some that
	// pass them are still answered InvalidArgument (a bad limit override,
	// a refund the backend cannot make).
	Checked bool
	// Start is when the call began, by the server's clock, and Duration how
	// long it took to answer.
	Start    time.Time
	Duration time.Duration
	// Code is the gRPC status of the answer: OK, InvalidArgument,
	// Unavailable (backend failure or no config), Canceled, or
	// DeadlineExceeded (a wait the caller's deadline cut short).
	Code codes.Code
	// Err is the error answered, nil when Code is OK. It is a gRPC status
	// error; when a backend failure or a missing config (ErrNoConfig)
	// caused it, errors.Is and errors.As reach that cause.
	Err error
	// Overall is the answer's overall_code when Code is OK.
	Overall rlsv3.RateLimitResponse_Code
	// Descriptors has one entry per request descriptor, in order, when the
	// call reached a decision (Code OK); nil otherwise (and for a request
	// over Options.MaxRequestBytes, which is not decoded: Domain is then
	// empty and Checked false).
	Descriptors []DescriptorOutcome
	// Refunds is what the call's is_negative_hits descriptors asked back
	// and were given (see RefundPolicy); zero when it had none, or when it
	// was answered before they were made.
	Refunds RefundOutcome
	// Guard, when its Cause is set, is the policy that answered a request
	// Envoy would let through on an error: an invalid limit override or a
	// request over the size bound (Options.OnInvalidOverride,
	// Options.OnOversizedRequest).
	Guard Guard
}

// Outcome is what happened to one descriptor. The zero value is invalid.
type Outcome int

const (
	// NoRule: no rule matched and no override applied.
	NoRule Outcome = iota + 1
	// Unlimited: an unlimited rule matched (whether or not another
	// descriptor denied the request).
	Unlimited
	// Replaced: the matched rule was replaced by another (replaces).
	Replaced
	// WithinLimit: the descriptor's bucket had room and the request was
	// admitted.
	WithinLimit
	// OverLimit: the descriptor denied the request (its bucket had too few
	// tokens, or its rule has requests_per_unit: 0), or, in quota mode, was
	// over its limit in a request another quota-mode descriptor let pass
	// (its status says OVER_LIMIT; it took nothing).
	OverLimit
	// ShadowOverLimit: a shadow-mode rule would have denied.
	ShadowOverLimit
	// DeniedByOther: the descriptor's bucket had room, but another
	// descriptor denied the request, so nothing was taken from it (a
	// request is admitted and charged all or nothing), unless it is a
	// post-paid charge, which is recorded all the same (Charged).
	DeniedByOther
	// FailureMode: no bucket decided; the store answered per its failure
	// mode (--on-backend-failure allow, deny or local), because its backend
	// failed or the call's deadline came first (Decision.Fallback says
	// which). Not the rule's over_limit, whatever the answer.
	FailureMode
)

// String names the outcome as metrics label it.
func (o Outcome) String() string {
	switch o {
	case NoRule:
		return "no_rule"
	case Unlimited:
		return "unlimited"
	case Replaced:
		return "replaced"
	case WithinLimit:
		return "within_limit"
	case OverLimit:
		return "over_limit"
	case ShadowOverLimit:
		return "shadow_over_limit"
	case DeniedByOther:
		return "denied_by_other"
	case FailureMode:
		return "failure_mode"
	}
	return "invalid"
}

// DescriptorOutcome is one descriptor of an observed Call.
type DescriptorOutcome struct {
	// Descriptor is the request's descriptor, or a copy of it with each
	// value longer than RequestLimits.MaxValueBytes replaced by its
	// bounded stand-in (read only).
	Descriptor *ratelimitv3.RateLimitDescriptor
	// Rule is the matched rule (or one made for a limit override); nil when
	// Outcome is NoRule.
	Rule *config.Rule
	// Outcome is what happened.
	Outcome Outcome
	// Hits is the number of tokens the descriptor asked for: its
	// hits_addend, else the request's (where 0 means 1); 0 for a check,
	// negative for a refund (is_negative_hits). It is what was asked, not
	// what was taken: see Charged.
	Hits int64
	// Limit is the bucket's shape and Decision its answer, when the
	// descriptor had a bucket (Outcome WithinLimit, OverLimit,
	// ShadowOverLimit or DeniedByOther, except for requests_per_unit: 0
	// rules). For DeniedByOther, Decision is the bucket's state as
	// checked, without the tokens.
	Limit    limiter.Limit
	Decision limiter.Decision
	// Charged reports whether the answer took tokens for it (Hits > 0):
	// the whole request was admitted and so was the descriptor, or it is a
	// post-paid charge, which a store records whatever the request's
	// answer. An answer of --on-backend-failure allow or deny comes from no
	// store: it took nothing, whatever Charged says.
	Charged bool
}

// observe builds the Call for an answered request and hands it over.
func (s *Server) observe(req *rlsv3.RateLimitRequest, start time.Time, p plan, decisions []limiter.Decision, resp *rlsv3.RateLimitResponse, err error) {
	call := Call{Domain: req.GetDomain(), Checked: true, Start: start, Duration: s.now().Sub(start), Code: codes.OK, Err: err, Refunds: p.refunded, Guard: s.guardOf(p, err)}
	if err != nil {
		call.Code = status.Code(err)
		call.Checked = !malformed(err)
		s.observer.ObserveCall(call)
		return
	}
	call.Overall = resp.GetOverallCode()
	admitted := call.Overall == rlsv3.RateLimitResponse_OK
	call.Descriptors = make([]DescriptorOutcome, len(p.items))
	for i, it := range p.items {
		d := p.descs[i] // long values stand in shortened (planRequest)
		// The tokens asked, whether or not a bucket was asked for them
		// (deny-all and unlimited rules have none), and although a request
		// that a deny-all rule denies only checks its other buckets.
		o := DescriptorOutcome{Descriptor: d, Rule: it.rule, Outcome: WithinLimit, Hits: it.hits}
		if d.GetIsNegativeHits() {
			o.Hits = -o.Hits
		}
		st := resp.GetStatuses()[i]
		if it.limited {
			j := pickLimit(decisions[it.first : it.first+len(it.limits)])
			take := p.takes[it.first+j]
			o.Limit, o.Decision = it.limits[j].Limit, decisions[it.first+j]
			givenBack := p.spentBack != nil && p.spentBack[it.first+j] // see settle
			// A post-paid charge is recorded unless its request was denied
			// and it counts only where denied (limiter.CountWhereDenied)
			// on a bucket that did not deny.
			recorded := take.Charge() && (take.Counting == limiter.CountAlways || admitted || !o.Decision.Allowed)
			o.Charged = take.Hits > 0 && (recorded || admitted && o.Decision.Allowed && !givenBack)
		}
		switch {
		case it.rule == nil:
			o.Outcome = NoRule
		case it.replaced:
			o.Outcome = Replaced
		case it.rule.Kind == config.KindUnlimited && !it.limited:
			o.Outcome = Unlimited
		case it.limited && o.Decision.Fallback != limiter.FallbackNone:
			o.Outcome = FailureMode
		case st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			o.Outcome = OverLimit
		case it.shadow && (it.denyAll || it.limited && !o.Decision.Allowed):
			o.Outcome = ShadowOverLimit
		case !admitted:
			o.Outcome = DeniedByOther
		}
		call.Descriptors[i] = o
	}
	s.observer.ObserveCall(call)
}

// AppendEscaped appends s to b with "%" and every byte of reserved
// percent-escaped ("%" as %25, "," as %2C, "=" as %3D), and returns the
// extended slice. Observers that show a descriptor's keys and values as one
// string (a metric label, a page's row) escape each part with the bytes
// they join parts with, so that distinct descriptors read differently.
func AppendEscaped(b []byte, s, reserved string) []byte {
	const hex = "0123456789ABCDEF"
	for {
		i := 0 // s[:i] needs no escaping
		for i < len(s) && s[i] != '%' && strings.IndexByte(reserved, s[i]) < 0 {
			i++
		}
		b = append(b, s[:i]...)
		if i == len(s) {
			return b
		}
		c := s[i]
		b = append(b, '%', hex[c>>4], hex[c&0xF])
		s = s[i+1:]
	}
}
