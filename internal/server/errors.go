package server

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/limiter"
)

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

func (e *answerError) Error() string { return e.status.Err().Error() }

func (e *answerError) GRPCStatus() *status.Status { return e.status }

func (e *answerError) Unwrap() error { return e.cause }
