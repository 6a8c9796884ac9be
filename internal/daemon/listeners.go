package daemon

import (
	"context"
	"errors"
	"expvar"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
)

// DefaultMetricsPath is where the metrics listener (Config.MetricsAddr)
// serves the metrics: envoyproxy/ratelimit's PROMETHEUS_PATH default.
const DefaultMetricsPath = "/metrics"

// listener is one of the daemon's extra HTTP listeners (debug, metrics):
// opened in New, served by Run, shut down with the HTTP one.
type listener struct {
	name string // for errors and the start line: "debug", "metrics"
	lis  net.Listener
	srv  *http.Server
}

// openListeners opens the listeners of Config.DebugAddr and
// Config.MetricsAddr, those that are set. On error it closes what it
// opened.
func (d *Daemon) openListeners() (_ []*listener, err error) {
	var ls []*listener
	defer func() {
		if err != nil {
			for _, l := range ls {
				l.lis.Close()
			}
		}
	}()
	add := func(name, addr string, h http.Handler) error {
		if addr == "" {
			return nil
		}
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen for %s HTTP: %w", name, err)
		}
		ls = append(ls, &listener{name: name, lis: lis, srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}})
		return nil
	}
	if err := add("debug", d.cfg.DebugAddr, d.debugHandler()); err != nil {
		return nil, err
	}
	if p := d.cfg.MetricsPath; !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("Config.MetricsPath %q: want a path that starts with /", p)
	}
	metrics := d.obs.metricsHandler()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path != d.cfg.MetricsPath:
			http.NotFound(w, r)
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		default:
			metrics.ServeHTTP(w, r)
		}
	})
	if err := add("metrics", d.cfg.MetricsAddr, h); err != nil {
		return nil, err
	}
	return ls, nil
}

// DebugAddr and MetricsAddr are the addresses of the debug and metrics
// listeners; nil for one that Config did not ask for.
func (d *Daemon) DebugAddr() net.Addr   { return d.extraAddr("debug") }
func (d *Daemon) MetricsAddr() net.Addr { return d.extraAddr("metrics") }

func (d *Daemon) extraAddr(name string) net.Addr {
	for _, l := range d.extra {
		if l.name == name {
			return l.lis.Addr()
		}
	}
	return nil
}

// serveExtra serves each extra listener until shutdown, sending a server's
// failure to errc.
func (d *Daemon) serveExtra(goFn func(func()), errc chan<- error) {
	for _, l := range d.extra {
		goFn(func() {
			if err := l.srv.Serve(l.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s HTTP server: %w", l.name, err)
			}
		})
	}
}

// shutdownExtra drains the extra listeners by ctx's deadline, then closes
// them.
func (d *Daemon) shutdownExtra(ctx context.Context) {
	for _, l := range d.extra {
		if err := l.srv.Shutdown(ctx); err != nil {
			l.srv.Close()
		}
	}
}

// healthcheck is envoyproxy/ratelimit's GET /healthcheck (its
// src/server/health.go@f2fb157), which Envoy Gateway's startup, readiness
// and liveness probes ask: 200 with the body "OK" while the daemon is
// SERVING under the gRPC health name "ratelimit" (so in step with gRPC
// health: not before the Redis backend is ready, not while failure mode
// error finds it failing, not once shutdown has begun) and has a config
// (unless Config.StartWithoutConfig); else 500 with no body. Like the
// incumbent's it answers any method.
func (d *Daemon) healthcheck(w http.ResponseWriter, r *http.Request) {
	if d.healthy(r.Context()) {
		io.WriteString(w, "OK")
		return
	}
	w.WriteHeader(http.StatusInternalServerError)
}

// healthy reports whether gRPC health says SERVING for "ratelimit", the
// daemon is not shutting down and it has a config, or need not wait for
// one (Config.StartWithoutConfig: envoyproxy/ratelimit with
// FORCE_START_WITHOUT_INITIAL_CONFIG is healthy before its first config).
func (d *Daemon) healthy(ctx context.Context) bool {
	if d.shuttingDown.Load() || d.srv.Config() == nil && !d.cfg.StartWithoutConfig {
		return false
	}
	resp, err := d.health.Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// debugHandler serves the debug listener, the operators' endpoints
// envoyproxy/ratelimit keeps on its debug port (server_impl.go and
// runner.go@f2fb157): / lists them, /rlconfig is the loaded config as
// text, /stats the process's expvar variables and, with Config.Pprof,
// /debug/pprof/.
func (d *Daemon) debugHandler() http.Handler {
	mux := http.NewServeMux()
	endpoints := map[string]string{
		"/rlconfig": "the loaded config, one line per rule",
		"/stats":    "the process's expvar variables (command line, memory statistics)",
	}
	mux.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		d.writeConfig(w, d.srv.Config())
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		expvar.Do(func(kv expvar.KeyValue) { fmt.Fprintf(w, "%s: %s\n", kv.Key, kv.Value) })
	})
	if d.cfg.Pprof {
		endpoints["/debug/pprof/"] = "Go's profiler: CPU (profile), trace, heap and the others"
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		paths := make([]string, 0, len(endpoints))
		for p := range endpoints {
			paths = append(paths, p)
		}
		slices.Sort(paths)
		for _, p := range paths {
			fmt.Fprintf(w, "%s: %s\n", p, endpoints[p])
		}
	})
	return mux
}

// writeConfig writes set as text for /rlconfig: where it came from, its
// hash and the build serving it (buildinfo.Info.String), then
// config.Set.WriteText's line per rule; nil (no config yet) says so, and
// which build.
func (d *Daemon) writeConfig(w io.Writer, set *config.Set) {
	kind, version := d.configSource()
	if set == nil {
		fmt.Fprintf(w, "no config loaded (source %s %s)\n# build: %s\n", kind, d.source.where(), buildinfo.Get())
		return
	}
	fmt.Fprintf(w, "# source: %s %s", kind, d.source.where())
	if version != "" {
		fmt.Fprintf(w, " version %s", version)
	}
	fmt.Fprintf(w, "\n# config_hash: %s\n# build: %s\n", set.Hash(), buildinfo.Get())
	set.WriteText(w)
}

// keepaliveOptions are the gRPC server options of Config.MaxConnectionAge:
// grpc-go closes a connection (GOAWAY) after MaxConnectionAge, to which it
// adds a random ±10% of its own, and then gives the calls in flight
// MaxConnectionAgeGrace (0: for ever) before it closes the transport.
func keepaliveOptions(c Config) []grpc.ServerOption {
	if c.MaxConnectionAge <= 0 {
		return nil
	}
	p := keepalive.ServerParameters{MaxConnectionAge: c.MaxConnectionAge, MaxConnectionAgeGrace: c.MaxConnectionAgeGrace}
	return []grpc.ServerOption{grpc.KeepaliveParams(p)}
}
