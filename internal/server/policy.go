package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
)

// Envoy lets a request through when the rate-limit service answers with an
// error (its failure_mode_deny is false by default), so an answer of
// INVALID_ARGUMENT or RESOURCE_EXHAUSTED to a request a client can shape is
// a way past every limit. The policies below say what the server answers
// instead; their defaults deny.

// InvalidOverride is what the server answers for a descriptor whose limit
// override (Envoy's route metadata, or a client's choice) is invalid: a
// unit outside SECOND…YEAR, requests_per_unit 0, a unit_multiplier of 0,
// or a period or rate beyond what a bucket holds. The zero value means
// InvalidOverrideDeny.
type InvalidOverride int

const (
	// InvalidOverrideDeny denies the request: the descriptor answers
	// OVER_LIMIT with a current_limit named InvalidOverrideName (0 per
	// second), as a rule of requests_per_unit 0 would, and the request's
	// other descriptors are only checked.
	InvalidOverrideDeny InvalidOverride = iota + 1
	// InvalidOverrideIgnore drops the override: the descriptor is decided
	// by its configured rule, or passes if none matched.
	InvalidOverrideIgnore
	// InvalidOverrideError answers INVALID_ARGUMENT, naming the field, as
	// envoyproxy/ratelimit does; Envoy then lets the request through
	// unless its failure_mode_deny is set.
	InvalidOverrideError
)

// InvalidOverrideName is the current_limit name of a descriptor denied for
// its invalid override.
const InvalidOverrideName = "invalid limit override"

// OversizedRequest is what the server answers for a request larger than
// Options.MaxRequestBytes. The zero value means OversizedDeny.
type OversizedRequest int

const (
	// OversizedDeny answers OVER_LIMIT, without statuses: the request is
	// not decoded, so its descriptors are not known.
	OversizedDeny OversizedRequest = iota + 1
	// OversizedError answers RESOURCE_EXHAUSTED, as gRPC does for a message
	// over its limit; Envoy then lets the request through unless its
	// failure_mode_deny is set.
	OversizedError
)

// Policy causes, as Guard.Cause and the metrics name them.
const (
	CauseInvalidOverride  = "invalid_override"
	CauseOversizedRequest = "oversized_request"
)

// Guard is the policy that answered a call Envoy would otherwise have let
// through on an error (see Call.Guard). The zero value means none did.
type Guard struct {
	// Cause is CauseInvalidOverride or CauseOversizedRequest.
	Cause string
	// Action is the policy's name: "deny", "ignore" or "error".
	Action string
}

var invalidOverrideNames = map[InvalidOverride]string{
	InvalidOverrideDeny: "deny", InvalidOverrideIgnore: "ignore", InvalidOverrideError: "error"}

var oversizedNames = map[OversizedRequest]string{OversizedDeny: "deny", OversizedError: "error"}

// String is the policy's name, as ParseInvalidOverride takes it.
func (p InvalidOverride) String() string {
	if s, ok := invalidOverrideNames[p]; ok {
		return s
	}
	return fmt.Sprintf("InvalidOverride(%d)", int(p))
}

// String is the policy's name, as ParseOversizedRequest takes it.
func (p OversizedRequest) String() string {
	if s, ok := oversizedNames[p]; ok {
		return s
	}
	return fmt.Sprintf("OversizedRequest(%d)", int(p))
}

// ParseInvalidOverride returns the policy named s: deny, ignore or error.
func ParseInvalidOverride(s string) (InvalidOverride, error) {
	for p, name := range invalidOverrideNames {
		if name == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown policy %q (want deny, ignore or error)", s)
}

// ParseOversizedRequest returns the policy named s: deny or error.
func ParseOversizedRequest(s string) (OversizedRequest, error) {
	for p, name := range oversizedNames {
		if name == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown policy %q (want deny or error)", s)
}

// ReadLimit is the gRPC MaxRecvMsgSize that lets the server answer
// requests of up to 4 × maxRequestBytes per its OversizedRequest policy:
// gRPC refuses larger ones itself (RESOURCE_EXHAUSTED) before reading them,
// so memory stays bounded by it. The server reads an oversized request but
// does not decode it.
func ReadLimit(maxRequestBytes int) int {
	return 4 * maxRequestBytes
}

// overrideError is planRequest's error for descriptor index's invalid limit
// override.
type overrideError struct {
	index int
	err   error
}

func (e *overrideError) Error() string {
	return fmt.Sprintf("descriptors[%d].limit: %v", e.index, e.err)
}
func (e *overrideError) Unwrap() error { return e.err }

// invalidOverride applies policy to it, descriptor i of domain, whose
// override failed with err (override leaves it untouched when it fails).
// It returns the error to answer, nil when the request goes on.
func invalidOverride(policy InvalidOverride, it *item, domain string, i int, err error) error {
	switch policy {
	case InvalidOverrideIgnore:
		it.invalidOverride = true
		return nil
	case InvalidOverrideError:
		return &overrideError{index: i, err: err}
	}
	// Deny: a rule of its own with requests_per_unit 0, which denies the
	// request outright and names why in its status. Shadow mode, quota
	// mode and replaces do not apply to it: it is no configured rule.
	path := fmt.Sprintf("%s > descriptors[%d] (%s: %v)", domain, i, InvalidOverrideName, err)
	it.rule = &config.Rule{Domain: domain, Path: path, Kind: config.KindDenyAll,
		Limits: []config.RateLimit{{Unit: config.Second, UnitMultiplier: 1, Name: InvalidOverrideName}}}
	it.limited, it.denyAll, it.limits, it.configured = false, true, nil, false
	it.invalidOverride = true
	return nil
}

// guardOf is the Guard of an answered request: planned as p, or failed
// with err.
func (s *Server) guardOf(p plan, err error) Guard {
	if err != nil && isOverrideError(err) {
		return Guard{Cause: CauseInvalidOverride, Action: InvalidOverrideError.String()}
	}
	for _, it := range p.items {
		if it.invalidOverride {
			return Guard{Cause: CauseInvalidOverride, Action: s.onInvalid.String()}
		}
	}
	return Guard{}
}

// isOverrideError reports whether err is an *overrideError. Apart from
// guardOf, so that the target errors.As needs is allocated only for an
// error, not for every call.
func isOverrideError(err error) bool {
	var oe *overrideError
	return errors.As(err, &oe)
}

// sizedRequest is what the RateLimitService handler Register installs
// decodes into: the request, and the size of its message, which the
// server's codec (Codec) records, leaving the request empty when the
// message is over max.
type sizedRequest struct {
	*rlsv3.RateLimitRequest
	max  int // 0: no bound
	size int
}

// over reports whether the message was over the bound, and so not decoded.
func (r *sizedRequest) over() bool { return r.max > 0 && r.size > r.max }

// unmarshal is requestCodec.Unmarshal for a sizedRequest.
func (c requestCodec) unmarshalSized(data mem.BufferSlice, r *sizedRequest) error {
	r.size = data.Len()
	if r.over() {
		return nil // not decoded: the handler answers per its policy
	}
	return c.Unmarshal(data, r.RateLimitRequest)
}

// Register registers s on g as the RateLimitService, in place of
// rlsv3.RegisterRateLimitServiceServer: with the server's Codec among g's
// options, a request larger than Options.MaxRequestBytes (and within the
// ReadLimit given to gRPC) is answered per Options.OnOversizedRequest
// rather than refused by gRPC. Without the Codec it registers the service
// as rlsv3 does.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	desc := rlsv3.RateLimitService_ServiceDesc // a copy; its Methods are replaced
	desc.Methods = []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: s.handle}}
	g.RegisterService(&desc, s)
}

// handle is the ShouldRateLimit method's gRPC handler (see Register).
func (s *Server) handle(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := &sizedRequest{RateLimitRequest: new(rlsv3.RateLimitRequest), max: s.maxRequestBytes}
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil { // no closure to allocate
		return s.serve(ctx, in, in.RateLimitRequest)
	}
	info := &grpc.UnaryServerInfo{Server: s, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, in.RateLimitRequest, info, func(ctx context.Context, req any) (any, error) {
		r, ok := req.(*rlsv3.RateLimitRequest) // an interceptor may have replaced it
		if !ok {
			r = in.RateLimitRequest
		}
		return s.serve(ctx, in, r)
	})
}

// serve answers r, the request decoded into in unless an interceptor
// replaced it, or in's size per Options.OnOversizedRequest.
func (s *Server) serve(ctx context.Context, in *sizedRequest, r *rlsv3.RateLimitRequest) (any, error) {
	if in.over() {
		return s.oversized(ctx, in.size)
	}
	return s.ShouldRateLimit(ctx, r)
}

// oversized answers a request of size bytes, over Options.MaxRequestBytes,
// per Options.OnOversizedRequest.
func (s *Server) oversized(ctx context.Context, size int) (*rlsv3.RateLimitResponse, error) {
	start := s.now()
	call := Call{Start: start, Guard: Guard{Cause: CauseOversizedRequest, Action: s.onOversized.String()}}
	var resp *rlsv3.RateLimitResponse
	if s.onOversized == OversizedError {
		call.Err = status.Errorf(codes.ResourceExhausted, "request is %d bytes, more than the %d allowed (--max-message-bytes)", size, s.maxRequestBytes)
		call.Code = codes.ResourceExhausted
	} else {
		resp = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}
		call.Overall = resp.OverallCode
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "request over the size bound", "bytes", size, "max_bytes", s.maxRequestBytes, "policy", s.onOversized.String())
	}
	if s.observer != nil {
		call.Duration = s.now().Sub(start)
		s.observer.ObserveCall(call)
	}
	if call.Err != nil {
		return nil, call.Err
	}
	return resp, nil
}
