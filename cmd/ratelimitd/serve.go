package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/gctune"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/proctune"
	"github.com/ratelimitd/ratelimitd/internal/reload"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/tlsreload"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// healthNames are the gRPC health service names ratelimitd answers for: the
// whole server, the name envoyproxy/ratelimit deployments probe, and the
// service's full name.
var healthNames = []string{"", "ratelimit", rlsv3.RateLimitService_ServiceDesc.ServiceName}

// backend is the limiter.Store in use and what the server needs to know of it.
type backend struct {
	store limiter.Store
	name  string
	// ready reports whether the backend answers; nil means always.
	ready func(context.Context) error
	// prepare, when set, readies the backend for calls (loads its scripts,
	// opens connections): gRPC health says SERVING only once it succeeded
	// (see awaitBackend).
	prepare func(context.Context) error
	// close releases it.
	close func() error
	// sweep, when set, is called now and then to drop idle buckets.
	sweep func(time.Time)
	// healthy, when set, reports whether the backend is taken to be working
	// (false while its circuit breaker is open, until a call or a probe
	// succeeds); failureMode is then what is answered while it is not.
	healthy     func() bool
	failureMode failover.Mode
	// probe, when set, tries the backend if its circuit breaker is open and
	// due a probe (failover.Store.Probe): serve calls it about every
	// --breaker-open-for, so that a replica no call reaches (taken out of
	// rotation because its health said NOT_SERVING) still finds the
	// backend working again.
	probe func(context.Context) error
	// collectors are the backend's own metrics, for /metrics.
	collectors []prometheus.Collector
}

func newLogger(c serveConfig, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.logLevel}
	if c.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the service until ctx is done, then shuts down gracefully.
func serve(ctx context.Context, c serveConfig, logw io.Writer) error {
	// SIGHUP's default action ends the process. Take it first thing, so
	// that one sent while the service starts (a config tool's reload racing
	// a rollout) is a reload, not a crash; it is handled once the service
	// runs. From when shutdown begins (or start-up fails) it is ignored, not
	// restored to its default, so one sent during the drain does not cut the
	// in-flight calls short.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Ignore(syscall.SIGHUP)
	log := newLogger(c, logw)
	// GOGC unset (see parseServeFlags): the runtime's default, 100.
	defer gctune.Start(c.gcHeapFloor, 100).Stop()
	if c.adaptiveProcs {
		defer proctune.Start(proctune.Options{OnChange: func(procs int, wait time.Duration) {
			log.Debug("GOMAXPROCS changed", "procs", procs, "mean_sched_wait", wait)
		}}).Stop()
	}
	set, err := config.Load(c.configPath)
	if err != nil {
		return fmt.Errorf("load config %s:\n%w", c.configPath, err)
	}
	backendName := "memory"
	if c.redis.enabled() {
		backendName = "redis"
	}
	obs, err := newObservability(ctx, c, backendName)
	if err != nil {
		return err
	}
	defer obs.close()
	hs := health.NewServer()
	onHealth := func(healthy bool) {
		if !healthy {
			obs.metrics.FailureModeActivated(c.failure.Mode.String())
		}
		// Only with --on-backend-failure error does a failing backend make
		// this replica unable to answer: tell Envoy's health checks.
		if c.failure.Mode == failover.Error {
			st := healthpb.HealthCheckResponse_SERVING
			if !healthy {
				st = healthpb.HealthCheckResponse_NOT_SERVING
			}
			for _, name := range healthNames {
				hs.SetServingStatus(name, st)
			}
		}
	}
	be, err := openBackend(c, log, obs.metrics, onHealth)
	if err != nil {
		return err
	}
	if len(c.ignoredFlags) > 0 {
		log.Warn("flags only the Redis backend reads are ignored on the memory backend", "flags", strings.Join(c.ignoredFlags, ","))
	}
	defer be.close()
	for _, col := range be.collectors {
		if err := obs.metrics.Registry().Register(col); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}

	srv, err := server.New(server.Options{
		MaxWait:          c.maxWait,
		Store:            be.store,
		Logger:           log,
		Limits:           c.limits,
		RetryAfter:       c.retryAfter,
		RateLimitHeaders: c.rateLimitHeader,
		DynamicMetadata:  c.dynamicMetadata,
		Observer:         obs.observer(),
	})
	if err != nil {
		return err
	}
	obs.metrics.ConfigLoaded(set)
	srv.SetConfig(set)
	grpcOpts, tlsMode, err := grpcTLS(c.tls, log)
	if err != nil {
		return err
	}

	grpcLis, err := net.Listen("tcp", c.grpcAddr)
	if err != nil {
		return fmt.Errorf("listen for gRPC: %w", err)
	}
	httpLis, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("listen for HTTP: %w", err)
	}
	// The watcher last: with WatchFiles it holds a file watch (an inotify
	// descriptor and a goroutine) that only its Run releases, so nothing
	// may fail between it and Run. A change made since the first load is
	// caught by the Reload below.
	watcher, err := newWatcher(c, set, srv, log, obs.metrics)
	if err != nil {
		grpcLis.Close()
		httpLis.Close()
		return err
	}

	sopts := append(append(grpcOpts, obs.grpcOptions...), grpc.MaxRecvMsgSize(c.maxMessageBytes), server.Codec())
	if c.streamWorkers > 0 {
		// Every call used to start a goroutine whose stack then grew,
		// copy by copy, to what a call through the backend needs
		// (runtime.newstack was 7% of the CPU under load); workers keep
		// theirs. 128 covers the concurrency of a busy replica; busier
		// moments spill over to goroutines of their own, as without.
		sopts = append(sopts, grpc.NumStreamWorkers(uint32(c.streamWorkers)))
	}
	gs := grpc.NewServer(sopts...)
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	setHealth := func(st healthpb.HealthCheckResponse_ServingStatus) {
		for _, name := range healthNames {
			hs.SetServingStatus(name, st)
		}
	}
	// Done when shutdown begins: ends the health Watch streams, and the
	// background work (reloads, sweeps, probes).
	stopping, stop := context.WithCancel(context.Background())
	defer stop()
	if be.prepare == nil {
		setHealth(healthpb.HealthCheckResponse_SERVING)
	} else {
		// NOT_SERVING (health.NewServer says SERVING for "") until the
		// backend is ready, so that Envoy sends no call that would pay for
		// a dial, a TLS handshake and the scripts' first load.
		setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	}
	healthpb.RegisterHealthServer(gs, healthService{Server: hs, stopping: stopping})

	var shuttingDown atomic.Bool
	hsrv := &http.Server{
		Handler:           obs.handler(httpHandler(srv, be, shuttingDown.Load), srv),
		ReadHeaderTimeout: 5 * time.Second,
	}

	domains := set.Domains()
	rules := 0
	for _, d := range domains {
		rules += len(d.Rules)
	}
	log.Info("ratelimitd started",
		"config", c.configPath, "config_hash", set.Hash(), "domains", len(domains), "rules", rules,
		"backend", be.name, "grpc_addr", grpcLis.Addr().String(), "http_addr", httpLis.Addr().String(),
		"grpc_tls", tlsMode, "watch", c.watch)

	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Go(func() {
		if err := gs.Serve(grpcLis); err != nil {
			errc <- fmt.Errorf("gRPC server: %w", err)
		}
	})
	wg.Go(func() {
		if err := hsrv.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("HTTP server: %w", err)
		}
	})
	if be.prepare != nil {
		wg.Go(func() {
			awaitBackend(stopping, be, log, func() {
				if be.healthy == nil || be.healthy() {
					setHealth(healthpb.HealthCheckResponse_SERVING)
				}
			})
		})
	}
	if be.sweep != nil {
		wg.Go(func() {
			every(stopping, time.Minute, be.sweep)
		})
	}
	if be.probe != nil {
		// Half the open time (a due probe comes at most half of it late),
		// and at least a millisecond.
		openFor := c.failure.OpenFor
		if openFor <= 0 {
			openFor = failover.DefaultOpenFor
		}
		wg.Go(func() {
			every(stopping, max(openFor/2, time.Millisecond), func(time.Time) {
				if err := be.probe(stopping); err != nil {
					log.Debug("backend probe failed", "backend", be.name, "err", err)
				}
			})
		})
	}

	// Reload on file changes (unless --watch=false) and on SIGHUP.
	wg.Go(func() { watcher.Run(stopping) })
	watcher.Reload() // a change made between the first load and the watch
	wg.Go(func() {
		for {
			select {
			case <-stopping.Done():
				return
			case <-hup:
				log.Info("SIGHUP: reloading config", "config", c.configPath)
				watcher.Reload()
			}
		}
	})

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "timeout", c.shutdownTimeout)
	case runErr = <-errc:
		log.Error("server failed, shutting down", "err", runErr)
	}
	// From here a SIGHUP is ignored: no reload to make, and no default
	// action to end the drain.
	signal.Ignore(syscall.SIGHUP)
	// Tell health checkers first, so Envoy stops sending new calls here:
	// /readyz, gRPC health, then the Watch streams, which end (after their
	// NOT_SERVING) so that GracefulStop waits only for real calls.
	shuttingDown.Store(true)
	hs.Shutdown()
	stop()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	drained := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(drained)
	}()
	select {
	case <-drained:
	case <-shutdownCtx.Done():
		log.Warn("in-flight calls did not finish in time; closing them")
		gs.Stop()
		<-drained
	}
	if err := hsrv.Shutdown(shutdownCtx); err != nil {
		hsrv.Close()
	}
	wg.Wait()
	log.Info("stopped")
	return runErr
}

// Attempts of awaitBackend: each bounded, then retried after a pause.
const (
	prepareTimeout = 2 * time.Second
	prepareRetry   = 250 * time.Millisecond
)

// awaitBackend prepares be until it succeeds or ctx is done, and calls
// serving once it has (it logs the first failure, and each later one at
// debug level). In a failure mode other than error, serving is also called
// after the first failure: the replica then answers per that mode, which is
// what the operator chose for a backend that is down, rather than staying
// out of rotation until Redis is up.
func awaitBackend(ctx context.Context, be backend, log *slog.Logger, serving func()) {
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, prepareTimeout)
		err := be.prepare(actx)
		cancel()
		if err == nil {
			log.Info("backend ready", "backend", be.name)
			serving()
			return
		}
		if attempt == 0 {
			log.Warn("backend not ready; answering per --on-backend-failure until it is", "backend", be.name,
				"mode", be.failureMode.String(), "err", err)
			if be.failureMode != failover.Error {
				serving()
			}
		} else {
			log.Debug("backend still not ready", "backend", be.name, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(prepareRetry):
		}
	}
}

// every calls f with the time every period until ctx is done.
func every(ctx context.Context, period time.Duration, f func(time.Time)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			f(now)
		}
	}
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

// httpHandler serves liveness and readiness; shuttingDown reports whether
// shutdown has begun (readiness then fails, as gRPC health does).
func httpHandler(srv *server.Server, be backend, shuttingDown func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if shuttingDown() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		if srv.Config() == nil {
			http.Error(w, "no config loaded", http.StatusServiceUnavailable)
			return
		}
		var failing error
		if be.healthy != nil && !be.healthy() {
			failing = errors.New("its circuit breaker is open: calls to it failed")
		} else if be.ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), time.Second)
			failing = be.ready(ctx)
			cancel()
		}
		if failing != nil {
			// Only in error mode does a failing backend stop this replica
			// from answering; otherwise it answers, degraded.
			msg := fmt.Sprintf("degraded: backend %s: %v; answering per --on-backend-failure %s", be.name, failing, be.failureMode)
			if be.failureMode == failover.Error {
				http.Error(w, msg, http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, msg)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// openBackend returns the store the flags select.
func openBackend(c serveConfig, log *slog.Logger, m *metrics.Metrics, onHealth func(healthy bool)) (backend, error) {
	if !c.redis.enabled() {
		ms := limiter.NewMemoryStore(limiter.MemoryOptions{})
		return backend{store: ms, name: "memory", close: func() error { return nil }, sweep: ms.Sweep}, nil
	}
	return openRedis(c.redis, c.failure, log, m, onHealth)
}

// newWatcher returns the watcher that reloads the config into srv, logging
// each reload (at info the new hash and domains, at error the full
// validation message of a rejected config, the one in force staying) and
// counting it in m.
func newWatcher(c serveConfig, current *config.Set, srv *server.Server, log *slog.Logger, m *metrics.Metrics) (*reload.Watcher, error) {
	mode := reload.WatchFiles
	if !c.watch {
		mode = reload.WatchReloadOnly
	}
	w, err := reload.New(reload.Options{
		Path:    c.configPath,
		Current: current,
		Watch:   mode,
		OnLoad: func(set *config.Set) {
			// Metrics first: a call decided on the new config must find
			// its rules' counters ready.
			m.ConfigLoaded(set)
			srv.SetConfig(set)
			var names []string
			for _, d := range set.Domains() {
				names = append(names, d.Name)
			}
			log.Info("config reloaded", "config", c.configPath, "config_hash", set.Hash(), "domains", names)
		},
		OnError: func(err error) {
			if errors.Is(err, reload.ErrWatch) {
				log.Warn("watching the config failed; reloading to be sure", "err", err)
				return
			}
			log.Error("config rejected; the previous config stays in force",
				"config", c.configPath, "config_hash", srv.Config().Hash(), "err", err)
			m.ConfigRejected(err)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%w (--watch=false turns file watching off; SIGHUP still reloads)", err)
	}
	return w, nil
}

// grpcTLS returns the gRPC server options the TLS flags call for, and the
// mode for the start line: off, tls or mtls. The files are re-read when
// they change.
func grpcTLS(f tlsFlags, log *slog.Logger) ([]grpc.ServerOption, string, error) {
	if f.certFile == "" {
		return nil, "off", nil
	}
	r, err := tlsreload.New(tlsreload.Options{
		CertFile:     f.certFile,
		KeyFile:      f.keyFile,
		ClientCAFile: f.clientCA,
		OnReload: func() {
			log.Info("gRPC TLS files reloaded", "cert", f.certFile, "client_ca", f.clientCA)
		},
		OnError: func(err error) {
			log.Error("gRPC TLS files changed but cannot be used; the previous ones stay in use", "err", err)
		},
	})
	if err != nil {
		return nil, "", fmt.Errorf("gRPC TLS: %w", err)
	}
	mode := "tls"
	if f.clientCA != "" {
		mode = "mtls"
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(r.ServerConfig()))}, mode, nil
}
