// Package daemon is ratelimitd's composition root: from a Config (no
// flags, no environment) it builds the rate-limit service, the backend it
// decides with, the listeners and what operators observe, and runs them
// until told to stop, in the shape of net/http.Server.
//
// cmd/ratelimitd turns its flags and environment into a Config; the
// descriptor config comes from a source (the files under Config.ConfigPath,
// watched or reloaded by Daemon.Reload) whose configs are applied as a
// whole, a bad one leaving the one in force.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/readlag"
	"github.com/ratelimitd/ratelimitd/internal/reload"
	"github.com/ratelimitd/ratelimitd/internal/runtimetune"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/timerlag"
	"github.com/ratelimitd/ratelimitd/internal/tlsreload"
)

// HealthNames are the gRPC health service names ratelimitd answers for: the
// whole server, the name envoyproxy/ratelimit deployments probe, and the
// service's full name.
var HealthNames = []string{"", "ratelimit", rlsv3.RateLimitService_ServiceDesc.ServiceName}

// Daemon is one ratelimitd: its listeners are open from New; Run serves
// them until its context is done, then drains and releases everything.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	backend  backend
	obs      *observability
	srv      *server.Server
	health   *health.Server
	source   configSource
	grpc     *grpc.Server
	http     *http.Server
	grpcLis  net.Listener
	httpLis  net.Listener
	extra    []*listener       // the debug and metrics listeners Config asks for
	reads    *timerlag.Monitor // how long requests waited in the gRPC sockets (readlag)
	tlsMode  string
	stopping context.Context // done when shutdown begins
	stop     context.CancelFunc

	shuttingDown atomic.Bool
	// backendServing is whether the backend lets this replica answer
	// (see refreshHealth); configVersion the xDS version in force, nil
	// for files and before the first push.
	backendServing atomic.Bool
	configVersion  atomic.Pointer[string]
	healthMu       sync.Mutex // orders refreshHealth's reads and writes
}

// New builds the daemon cfg describes and opens its listeners: it loads
// the config, connects the backend (a Redis that is down is no error:
// calls are answered per the failure mode until it answers) and listens.
// Call Run to serve; Run releases what New opened. log receives every log
// line.
func New(cfg Config, log *slog.Logger) (_ *Daemon, err error) {
	cfg = cfg.withDefaults()
	set, err := initialConfig(cfg)
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, health: health.NewServer()}
	d.stopping, d.stop = context.WithCancel(context.Background())
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	backendName := "memory"
	if cfg.Redis.Enabled() {
		backendName = "redis"
	}
	if d.obs, err = newObservability(context.Background(), cfg, backendName); err != nil {
		return nil, err
	}
	undo = append(undo, d.obs.close)
	d.reads = timerlag.New(0)
	if d.backend, err = d.openBackend(); err != nil {
		return nil, err
	}
	undo = append(undo, func() { d.backend.Close() })
	for _, col := range d.backend.Collectors() {
		if err := d.obs.metrics.Registry().Register(col); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	d.srv, err = server.New(server.Options{
		MaxWait:              cfg.MaxWait,
		Store:                d.backend.Store(),
		Logger:               log,
		Limits:               cfg.Limits,
		RetryAfter:           cfg.RetryAfter,
		RateLimitHeaders:     cfg.RateLimitHeaders,
		RateLimitHeaderNames: cfg.RateLimitHeaderNames,
		DynamicMetadata:      cfg.DynamicMetadata,
		Observer:             d.obs.observer(),
		ShadowMode:           cfg.ShadowMode,
		QuotaMode:            cfg.QuotaMode,
		Refunds:              cfg.Refunds,
		DescriptorMetadata:   cfg.DescriptorMetadata,
		Overdraft:            cfg.Overdraft,
		Leases:               d.backend.Leases(),
		LeaseObserver:        d.obs.leases,
		OnInvalidOverride:    cfg.OnInvalidOverride,
		OnOversizedRequest:   cfg.OnOversizedRequest,
		MaxRequestBytes:      cfg.MaxMessageBytes,
	})
	if err != nil {
		return nil, err
	}
	d.obs.leases.SetPools(d.srv.LeasePools)
	if set != nil {
		d.obs.metrics.ConfigLoaded(set)
		d.srv.SetConfig(set)
	}
	if !cfg.XDS.Enabled() {
		d.obs.metrics.ConfigSource("file", "")
	}
	grpcOpts, err := d.grpcTLS()
	if err != nil {
		return nil, err
	}
	if d.grpcLis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("listen for gRPC: %w", err)
	}
	d.grpcLis = readlag.Listener(d.grpcLis, d.reads.Note)
	undo = append(undo, func() { d.grpcLis.Close() })
	if d.httpLis, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("listen for HTTP: %w", err)
	}
	undo = append(undo, func() { d.httpLis.Close() })
	if d.extra, err = d.openListeners(); err != nil {
		return nil, err
	}
	undo = append(undo, func() {
		for _, l := range d.extra {
			l.lis.Close()
		}
	})
	// The source last: a file watcher holds a file watch (an inotify
	// descriptor and a goroutine) that only its run releases, so nothing
	// may fail between it and Run.
	if d.source, err = d.newSource(set); err != nil {
		return nil, err
	}
	if x, ok := d.source.(*xdsSource); ok {
		for _, col := range xdsCollectors(x.client) {
			if err := d.obs.metrics.Registry().Register(col); err != nil {
				return nil, fmt.Errorf("metrics: %w", err)
			}
		}
	}

	sopts := append(append(grpcOpts, d.obs.grpcOptions...), grpc.MaxRecvMsgSize(server.ReadLimit(cfg.MaxMessageBytes)), server.Codec())
	sopts = append(sopts, keepaliveOptions(cfg)...)
	if cfg.StreamWorkers > 0 {
		// Calls beyond the workers get goroutines of their own.
		sopts = append(sopts, grpc.NumStreamWorkers(uint32(cfg.StreamWorkers)))
	}
	d.grpc = grpc.NewServer(sopts...)
	d.srv.Register(d.grpc) // requests over MaxMessageBytes answered per OnOversizedRequest
	// With Redis, NOT_SERVING (health.NewServer says SERVING for "")
	// until the backend is ready, so that Envoy sends no call that would
	// pay for a dial, a TLS handshake and the scripts' first load.
	d.backendServing.Store(!cfg.Redis.Enabled())
	d.refreshHealth()
	healthpb.RegisterHealthServer(d.grpc, healthService{Server: d.health, stopping: d.stopping})
	d.http = &http.Server{
		Handler:           d.obs.handler(d.probes(), d.srv, d.configSource),
		ReadHeaderTimeout: 5 * time.Second,
	}
	return d, nil
}

// GRPCAddr and HTTPAddr are the addresses the daemon listens on.
func (d *Daemon) GRPCAddr() net.Addr { return d.grpcLis.Addr() }
func (d *Daemon) HTTPAddr() net.Addr { return d.httpLis.Addr() }

// Reload reloads the config now (what SIGHUP asks for); a config that fails
// validation leaves the one in force. After shutdown has begun it does
// nothing. It is safe to call from any goroutine, before Run too.
func (d *Daemon) Reload() {
	if d.stopping.Err() != nil {
		return
	}
	d.log.Info("reloading config", "source", d.source.kind(), "config", d.source.where())
	d.source.reload()
}

// Run serves until ctx is done, then shuts down gracefully: health says
// NOT_SERVING first, calls in flight are answered (for at most
// Config.ShutdownTimeout), and everything New opened is released. It
// returns the error of a server that failed, nil after a shutdown asked
// for by ctx that answered every call in flight, and an error wrapping
// ErrDrainCut (joined with a server's failure, if any) after one that had
// to close calls at the timeout. Call it once.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.obs.close()
	defer d.backend.Close()
	defer d.stop()
	// GOGC unset (see Config.GCHeapFloor): the runtime's default, 100.
	defer runtimetune.StartGC(d.cfg.GCHeapFloor, 100).Stop()
	if d.cfg.AdaptiveProcs {
		defer runtimetune.StartProcs(runtimetune.ProcsOptions{OnChange: func(procs int, wait time.Duration) {
			d.log.Debug("GOMAXPROCS changed", "procs", procs, "mean_sched_wait", wait)
		}}).Stop()
	}
	set := d.srv.Config()
	domains := set.Domains()
	rules := 0
	for _, dom := range domains {
		rules += len(dom.Rules)
	}
	d.log.Info("ratelimitd started", "version", buildinfo.Get().Version,
		"config_source", d.source.kind(), "config", d.source.where(), "config_hash", set.Hash(), "domains", len(domains), "rules", rules,
		"backend", d.backend.Name(), "grpc_addr", d.grpcLis.Addr().String(), "http_addr", d.httpLis.Addr().String(),
		"grpc_tls", d.tlsMode, "watch", d.cfg.WatchConfig, "shadow_mode", d.cfg.ShadowMode)
	for _, l := range d.extra {
		d.log.Info("listening", "listener", l.name, "addr", l.lis.Addr().String())
	}

	var wg sync.WaitGroup
	errc := make(chan error, 2+len(d.extra))
	wg.Go(func() {
		if err := d.grpc.Serve(d.grpcLis); err != nil {
			errc <- fmt.Errorf("gRPC server: %w", err)
		}
	})
	wg.Go(func() {
		if err := d.http.Serve(d.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("HTTP server: %w", err)
		}
	})
	d.serveExtra(wg.Go, errc)
	if d.cfg.Redis.Enabled() {
		wg.Go(d.awaitBackend)
		// The open breaker's only probe (failover.Options.ProbeInBackground):
		// a quarter of the open time, at most probeEvery (a due probe comes
		// that late at most), at least a millisecond.
		openFor := d.cfg.Failure.OpenFor
		if openFor <= 0 {
			openFor = failover.DefaultOpenFor
		}
		wg.Go(func() {
			every(d.stopping, min(max(openFor/4, time.Millisecond), probeEvery), func(time.Time) {
				if err := d.backend.Probe(d.stopping); err != nil {
					d.log.Debug("backend probe failed", "backend", d.backend.Name(), "err", err)
				}
			})
		})
	}
	wg.Go(func() { every(d.stopping, time.Minute, d.backend.Sweep) })
	wg.Go(func() { d.backend.WatchLeases(d.stopping, d.srv.LeaseReleased) })
	wg.Go(func() { every(d.stopping, leaseRefresh, d.refreshLeases) })
	// Files: reload on changes (unless WatchConfig is false) and on
	// Reload; xDS: apply what the management server pushes.
	wg.Go(func() { d.source.run(d.stopping) })

	var runErr error
	select {
	case <-ctx.Done():
		d.log.Info("shutting down", "timeout", d.cfg.ShutdownTimeout)
	case runErr = <-errc:
		d.log.Error("server failed, shutting down", "err", runErr)
	}
	// Tell health checkers first, so Envoy stops sending new calls here:
	// /readyz, gRPC health, then the Watch streams, which end (after their
	// NOT_SERVING) so that GracefulStop waits only for real calls.
	d.shuttingDown.Store(true)
	d.health.Shutdown()
	d.stop()
	cut := d.drain()
	wg.Wait()
	if cut != nil {
		d.log.Error("stopped, with calls cut short", "err", cut)
		return errors.Join(runErr, cut)
	}
	d.log.Info("stopped")
	return runErr
}

// openBackend returns the backend cfg selects.
func (d *Daemon) openBackend() (backend, error) {
	if !d.cfg.Redis.Enabled() {
		return newMemoryBackend(), nil
	}
	return openRedis(d.cfg.Redis, d.cfg.Failure, d.reads.Lateness, d.log, d.obs.metrics, d.onHealth)
}

// configSource says where the config in force came from, for the
// /limits page.
func (d *Daemon) configSource() (kind, version string) {
	if v := d.configVersion.Load(); v != nil {
		version = *v
	}
	return d.source.kind(), version
}

// sourceNote is what readiness adds about an xDS source: that no config
// has come yet (and so every call is answered as for an unknown domain,
// with Config.StartWithoutConfig), or that the server is unreachable and
// the last config stays in force; "" when there is nothing to say.
func (d *Daemon) sourceNote() string {
	x, ok := d.source.(*xdsSource)
	if !ok {
		return ""
	}
	st := x.client.Status()
	why := ""
	switch {
	case st.LastError != "":
		why = ": " + st.LastError
	case st.LastNACK != "":
		why = ": its last push was refused: " + st.LastNACK
	}
	switch {
	case !st.Applied && d.cfg.StartWithoutConfig:
		return fmt.Sprintf("; no config from the xDS server %s yet%s; until one comes every call is answered OK, as for an unknown domain", x.addr, why)
	case !st.Applied:
		return fmt.Sprintf(": waiting for the first config from the xDS server %s%s", x.addr, why)
	case why != "":
		return fmt.Sprintf("; xDS server %s%s; the config of version %q stays in force", x.addr, why, st.Version)
	}
	return ""
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

// newWatcher returns the watcher that reloads the config into the server,
// logging each reload (at info the new hash and domains, at error the full
// validation message of a rejected config, the one in force staying) and
// counting it in the metrics.
func (d *Daemon) newWatcher(current *config.Set) (*reload.Watcher, error) {
	mode := reload.WatchFiles
	if !d.cfg.WatchConfig {
		mode = reload.WatchReloadOnly
	}
	m, srv, log, path := d.obs.metrics, d.srv, d.log, d.cfg.ConfigPath
	w, err := reload.New(reload.Options{
		Path:    path,
		Current: current,
		Watch:   mode,
		Limits:  config.LoadOptions{MaxTotalBytes: d.cfg.MaxConfigBytes},
		OnLoad: func(set *config.Set) {
			// Metrics first: a call decided on the new config must find
			// its rules' counters ready.
			m.ConfigLoaded(set)
			srv.SetConfig(set)
			var names []string
			for _, d := range set.Domains() {
				names = append(names, d.Name)
			}
			log.Info("config reloaded", "config", path, "config_hash", set.Hash(), "domains", names)
		},
		OnError: func(err error) {
			if errors.Is(err, reload.ErrWatch) {
				log.Warn("watching the config failed; reloading to be sure", "err", err)
				return
			}
			log.Error("config rejected; the previous config stays in force",
				"config", path, "config_hash", srv.Config().Hash(), "err", err)
			m.ConfigRejected(err)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%w (--watch=false turns file watching off; SIGHUP still reloads)", err)
	}
	return w, nil
}

// grpcTLS returns the gRPC server options Config.GRPCTLS calls for, and
// sets the mode for the start line: off, tls or mtls. The files are re-read
// when they change.
func (d *Daemon) grpcTLS() ([]grpc.ServerOption, error) {
	f, log := d.cfg.GRPCTLS, d.log
	d.tlsMode = "off"
	if f.CertFile == "" {
		return nil, nil
	}
	r, err := tlsreload.New(tlsreload.Options{
		CertFile:     f.CertFile,
		KeyFile:      f.KeyFile,
		ClientCAFile: f.ClientCAFile,
		OnReload: func() {
			log.Info("gRPC TLS files reloaded", "cert", f.CertFile, "client_ca", f.ClientCAFile)
		},
		OnError: func(err error) {
			log.Error("gRPC TLS files changed but cannot be used; the previous ones stay in use", "err", err)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("gRPC TLS: %w", err)
	}
	d.tlsMode = "tls"
	if f.ClientCAFile != "" {
		d.tlsMode = "mtls"
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(r.ServerConfig()))}, nil
}
