package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/failover"
)

// setHealth sets every name of HealthNames to st.
func (d *Daemon) setHealth(st healthpb.HealthCheckResponse_ServingStatus) {
	for _, name := range HealthNames {
		d.health.SetServingStatus(name, st)
	}
}

// onHealth follows the backend's health (its circuit breaker): only with
// failure mode error does a failing backend make this replica unable to
// answer, which gRPC health then says.
func (d *Daemon) onHealth(healthy bool) {
	if !healthy {
		d.obs.metrics.FailureModeActivated(d.cfg.Failure.Mode.String())
	}
	if d.cfg.Failure.Mode == failover.Error || d.cfg.Failure.Mode == 0 {
		d.setBackendServing(func() bool { return healthy })
	}
}

// setBackendServing sets whether the backend lets this replica answer to
// what serving says, read under the lock that orders health's updates (so
// that a breaker opening between the read and the write is not lost), and
// refreshes health.
func (d *Daemon) setBackendServing(serving func() bool) {
	d.healthMu.Lock()
	defer d.healthMu.Unlock()
	d.backendServing.Store(serving())
	d.refreshHealthLocked()
}

// refreshHealth sets gRPC health from the backend's state and the
// config's: SERVING only while the backend lets this replica answer and a
// config is in force (the files', a push's, or the empty one that
// Config.StartWithoutConfig starts with). Once shutdown has begun,
// health.Server ignores it.
func (d *Daemon) refreshHealth() {
	d.healthMu.Lock()
	defer d.healthMu.Unlock()
	d.refreshHealthLocked()
}

// refreshHealthLocked is refreshHealth with healthMu held.
func (d *Daemon) refreshHealthLocked() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if d.backendServing.Load() && d.srv.Config() != nil {
		st = healthpb.HealthCheckResponse_SERVING
	}
	d.setHealth(st)
}

// Attempts of awaitBackend: each bounded, then retried after a pause.
const (
	prepareTimeout = 2 * time.Second
	prepareRetry   = 250 * time.Millisecond
)

// awaitBackend prepares the backend until it succeeds or shutdown begins,
// and says SERVING once it has (it logs the first failure, and each later
// one at debug level). In a failure mode other than error, it says
// SERVING after the first failure too: the replica then answers per that
// mode, which is what the operator chose for a backend that is down,
// rather than staying out of rotation until Redis is up. Health changes
// before the line that says so is logged: whoever reads "backend ready"
// finds gRPC health SERVING (unless a failure came in between).
func (d *Daemon) awaitBackend() {
	serving := func() {
		if d.stopping.Err() == nil {
			// The breaker's state now, not before the lock: an onHealth
			// (false) in between must win.
			d.setBackendServing(func() bool { return d.backend.Healthy() || d.backendServing.Load() })
		}
	}
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(d.stopping, prepareTimeout)
		err := d.backend.Prepare(ctx)
		cancel()
		if err == nil {
			serving()
			d.log.Info("backend ready", "backend", d.backend.Name())
			return
		}
		if attempt == 0 {
			if d.backend.FailureMode() != failover.Error {
				serving()
			}
			d.log.Warn("backend not ready; answering per --on-backend-failure until it is", "backend", d.backend.Name(),
				"mode", d.backend.FailureMode().String(), "err", err)
		} else {
			d.log.Debug("backend still not ready", "backend", d.backend.Name(), "err", err)
		}
		select {
		case <-d.stopping.Done():
			return
		case <-time.After(prepareRetry):
		}
	}
}

// readyCheckTimeout bounds /readyz's check of the backend: well inside
// the kubelet's default probe timeout (1 s), so that a Redis that does
// not answer (a network black hole) gets a 503, not a timed-out probe;
// a Redis that takes longer than this to decide one probe fails callers
// who wait 20 ms anyway.
const readyCheckTimeout = 250 * time.Millisecond

// probes serves liveness (/healthz) and readiness (/readyz): readiness
// fails while shutting down, without a config, and, in failure mode error,
// while the backend fails (else it says degraded); and envoyproxy/ratelimit's
// /healthcheck (see Daemon.healthcheck).
func (d *Daemon) probes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", d.healthcheck)
	// envoyproxy/ratelimit's HTTP ShouldRateLimit, for Lua and other
	// non-gRPC clients: it spends tokens like a gRPC call.
	mux.Handle("/json", d.srv.JSONHandler(d.cfg.MaxMessageBytes))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if d.shuttingDown.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		if d.srv.Config() == nil {
			http.Error(w, "no config loaded"+d.sourceNote(), http.StatusServiceUnavailable)
			return
		}
		var failing error
		if !d.backend.Healthy() {
			failing = errors.New("its circuit breaker is open: calls to it failed")
		} else {
			ctx, cancel := context.WithTimeout(r.Context(), readyCheckTimeout)
			failing = d.backend.Ready(ctx)
			cancel()
		}
		if failing != nil {
			// Only in error mode does a failing backend stop this replica
			// from answering; otherwise it answers, degraded.
			mode := d.backend.FailureMode()
			msg := fmt.Sprintf("degraded: backend %s: %v; answering per --on-backend-failure %s", d.backend.Name(), failing, mode)
			if mode == failover.Error {
				http.Error(w, msg, http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, msg)
			return
		}
		fmt.Fprintln(w, "ready"+d.sourceNote())
	})
	return mux
}

// healthService is the gRPC health service whose Watch streams end once
// stopping is done (shutdown began), after telling the watcher the status
// then in force (NOT_SERVING: health.Server.Shutdown is called first).
// GracefulStop waits for every open stream, and a health checker's Watch
// would otherwise hold the shutdown for all of --shutdown-timeout.
type healthService struct {
	*health.Server
	stopping context.Context
}

// Watch implements healthpb.HealthServer.
func (h healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(h.stopping, cancel)()
	ws := &watchStream{Health_WatchServer: stream, ctx: ctx, last: -1}
	err := h.Server.Watch(req, ws)
	if h.stopping.Err() == nil || stream.Context().Err() != nil {
		return err // the watcher left, or could not be sent to
	}
	// The inner Watch may have seen the end before the last change: send
	// the status in force unless it was the last one sent.
	st := healthpb.HealthCheckResponse_SERVICE_UNKNOWN
	if resp, err := h.Server.Check(stream.Context(), req); err == nil {
		st = resp.GetStatus()
	}
	if st != ws.last {
		if err := stream.Send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
			return err
		}
	}
	return status.Error(codes.Unavailable, "ratelimitd is shutting down")
}

// watchStream is a Watch stream whose context ends at shutdown too, and
// which remembers the last status sent. It is used by one goroutine.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx  context.Context
	last healthpb.HealthCheckResponse_ServingStatus // -1: none yet
}

func (s *watchStream) Context() context.Context { return s.ctx }

func (s *watchStream) Send(resp *healthpb.HealthCheckResponse) error {
	if err := s.Health_WatchServer.Send(resp); err != nil {
		return err
	}
	s.last = resp.GetStatus()
	return nil
}
