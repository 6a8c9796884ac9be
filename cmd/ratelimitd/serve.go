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
	"sync"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/gctune"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
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
	// close releases it.
	close func() error
	// sweep, when set, is called now and then to drop idle buckets.
	sweep func(time.Time)
	// healthy, when set, reports whether the backend is taken to be working
	// (false while its circuit breaker is open, until a call succeeds);
	// failureMode is then what is answered while it is not.
	healthy     func() bool
	failureMode failover.Mode
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
	log := newLogger(c, logw)
	// GOGC unset (see parseServeFlags): the runtime's default, 100.
	defer gctune.Start(c.gcHeapFloor, 100).Stop()
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
	be, err := openBackend(c, log, onHealth)
	if err != nil {
		return err
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
	watcher, err := newWatcher(c, set, srv, log, obs.metrics)
	if err != nil {
		return err
	}
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
	for _, name := range healthNames {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(gs, hs)

	hsrv := &http.Server{
		Handler:           obs.handler(httpHandler(srv, be), srv),
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
	stopSweep := make(chan struct{})
	if be.sweep != nil {
		wg.Go(func() {
			t := time.NewTicker(time.Minute)
			defer t.Stop()
			for {
				select {
				case <-stopSweep:
					return
				case now := <-t.C:
					be.sweep(now)
				}
			}
		})
	}

	// Reload on file changes (unless --watch=false) and on SIGHUP.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	wg.Go(func() { watcher.Run(watchCtx) })
	watcher.Reload() // a change made between the first load and the watch
	wg.Go(func() {
		for {
			select {
			case <-watchCtx.Done():
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
	close(stopSweep)
	signal.Stop(hup)
	stopWatch()
	// Tell health checkers first, so Envoy stops sending new calls here.
	hs.Shutdown()
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

// httpHandler serves liveness and readiness.
func httpHandler(srv *server.Server, be backend) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
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
func openBackend(c serveConfig, log *slog.Logger, onHealth func(healthy bool)) (backend, error) {
	if !c.redis.enabled() {
		m := limiter.NewMemoryStore(limiter.MemoryOptions{})
		return backend{store: m, name: "memory", close: func() error { return nil }, sweep: m.Sweep}, nil
	}
	return openRedis(c.redis, c.failure, log, onHealth)
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
