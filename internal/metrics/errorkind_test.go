package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// failingStore fails every Take with err.
type failingStore struct{ err error }

func (s failingStore) Take(context.Context, time.Time, []limiter.Request) ([]limiter.Decision, error) {
	return nil, s.err
}

// timeoutError is a net.Error that timed out, as a dial or read does.
type timeoutError struct{}

func (timeoutError) Error() string   { return "read tcp 127.0.0.1:1: operation timed out" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

var _ net.Error = timeoutError{}

// TestBackendErrorKinds: a failed backend call (what failover reports to
// BackendFailure, in every mode) is counted by what caused it, found
// through the error chain, not its wording; a call answered UNAVAILABLE
// before a config is loaded counts as no_config. An UNAVAILABLE answer is
// not counted again by the server's observer: the backend's failures are
// counted where they happen, once.
func TestBackendErrorKinds(t *testing.T) {
	unavailable := func(err error) error { return fmt.Errorf("redis take: %w: %w", limiter.ErrUnavailable, err) }
	tests := []struct {
		name string
		err  error // nil: no config loaded
		want string
	}{
		{"no config", nil, "no_config"},
		{"backend deadline", unavailable(fmt.Errorf("waiting for a batched call: %w", context.DeadlineExceeded)), "timeout"},
		{"at the backend past its timeout", fmt.Errorf("redis take: %w", &limiter.DeadlineError{InFlight: 20 * time.Millisecond, Err: context.DeadlineExceeded}), "timeout"},
		{"socket deadline", unavailable(&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}), "timeout"},
		{"network timeout", unavailable(timeoutError{}), "timeout"},
		{"refused", unavailable(errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")), "unavailable"},
		{"timeout only in the words", unavailable(errors.New("ERR script timeout setting is odd")), "unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMetrics(t, metrics.Options{Backend: "redis"})
			srv, err := server.New(server.Options{Store: failingStore{tt.err}, Observer: m})
			if err != nil {
				t.Fatal(err)
			}
			if tt.err != nil {
				srv.SetConfig(mustParse(t, testConfig))
			}
			_, err = srv.ShouldRateLimit(context.Background(), request("api", []string{"model", "gpt-4o"}))
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("answer = %v, want UNAVAILABLE", err)
			}
			if tt.err != nil {
				if status.Convert(err).Message() != tt.err.Error() {
					t.Errorf("message = %q, want the cause's %q", status.Convert(err).Message(), tt.err.Error())
				}
				if got, _ := value(t, m.Registry(), "ratelimitd_backend_errors_total", map[string]string{"backend": "redis", "kind": tt.want}); got != 0 {
					t.Errorf("the UNAVAILABLE answer counted %v backend errors, want 0 (the backend's failures are counted by failover)", got)
				}
				m.BackendFailure(tt.err)
			}
			got, ok := value(t, m.Registry(), "ratelimitd_backend_errors_total", map[string]string{"backend": "redis", "kind": tt.want})
			if !ok || got != 1 {
				t.Errorf("backend_errors_total{kind=%s} = %v (present %v), want 1", tt.want, got, ok)
			}
		})
	}
}
