package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
	"github.com/ratelimitd/ratelimitd/internal/limitspage"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
)

// observability is what the daemon adds for operators: Prometheus metrics, the
// /limits page's tracker, and tracing's gRPC options.
type observability struct {
	metrics *metrics.Metrics
	leases  *metrics.Leases
	tracker *limitspage.Tracker
	// calls hands each call to metrics and tracker off its answer's path;
	// whatever reads them flushes it first (flushing).
	calls       *metrics.Deferred
	grpcOptions []grpc.ServerOption
	stopTracing func(context.Context) error
	pprof       bool
}

// newObservability builds them from c; backend labels the latency
// histogram and backend errors.
func newObservability(ctx context.Context, c Config, backend string) (*observability, error) {
	m, err := metrics.New(metrics.Options{
		NearLimitRatio:   c.NearLimitRatio,
		MaxValuesPerRule: c.MaxMetricValues,
		Backend:          backend,
		ProcessMetrics:   true,
		IncumbentNames:   c.IncumbentMetrics,
		Redact:           c.RedactValues,
	})
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	leases, err := metrics.NewLeases(m.Registry())
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	opts, stop, err := tracing.Setup(ctx, c.Tracing)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	tracker := limitspage.NewTracker(limitspage.TrackerOptions{Redact: c.RedactValues})
	return &observability{
		metrics:     m,
		leases:      leases,
		tracker:     tracker,
		calls:       metrics.NewDeferred(metrics.Tee(m, tracker), 0, 0),
		grpcOptions: opts,
		stopTracing: stop,
		pprof:       c.Pprof,
	}, nil
}

// observer is the server.Observer that feeds metrics and the page.
func (o *observability) observer() server.Observer { return o.calls }

// flushing is h after the calls not yet handed to metrics and the page
// are: what h serves counts every call answered before the request came.
func (o *observability) flushing(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.calls.Flush()
		h.ServeHTTP(w, r)
	})
}

// metricsHandler serves the metrics, on the HTTP port and on
// Config.MetricsAddr alike, counting the queued calls first.
func (o *observability) metricsHandler() http.Handler {
	return o.flushing(promhttp.HandlerFor(o.metrics.Registry(), promhttp.HandlerOpts{}))
}

// close hands the calls still queued to metrics and the page, and flushes
// the spans not yet exported.
func (o *observability) close() {
	o.calls.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	o.stopTracing(ctx)
}

// handler serves /metrics, /limits, /limits.json and, with --pprof,
// /debug/pprof/; everything else goes to next.
func (o *observability) handler(next http.Handler, srv *server.Server, source func() (kind, version string)) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", next)
	mux.Handle("GET /metrics", o.metricsHandler())
	page, err := limitspage.NewHandler(limitspage.Options{Config: srv.Config, Tracker: o.tracker, Source: source, Pools: srv.LeasePools, Build: buildinfo.Get()})
	if err == nil { // it fails only without Config or Tracker
		mux.Handle("GET /limits", o.flushing(page))
		mux.Handle("GET /limits.json", o.flushing(page))
	}
	if o.pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
