package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/reload"
	"github.com/ratelimitd/ratelimitd/internal/xdsconfig"
)

// A configSource keeps the server's descriptor config up to date: the
// files under Config.ConfigPath, or an xDS management server. A process
// uses one; each applies its configs as a whole, a bad one leaving the
// config in force.
type configSource interface {
	// run keeps the config up to date until ctx is done.
	run(ctx context.Context)
	// reload reloads now, what SIGHUP asks for.
	reload()
	// kind is "file" or "xds", for metrics, pages and logs; where names
	// the files or the server.
	kind() string
	where() string
}

// fileSource is the files under Config.ConfigPath, watched (unless
// Config.WatchConfig is false) and reloaded on SIGHUP.
type fileSource struct {
	path    string
	watcher *reload.Watcher
}

func (f *fileSource) run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.watcher.Run(ctx)
	}()
	f.watcher.Reload() // a change made between the first load and the watch
	<-done
}

func (f *fileSource) reload()       { f.watcher.Reload() }
func (f *fileSource) kind() string  { return "file" }
func (f *fileSource) where() string { return f.path }

// xdsSource is an xDS management server (Config.XDS), which pushes the
// config: SIGHUP has nothing to reload.
type xdsSource struct {
	addr   string
	client *xdsconfig.Client
	d      *Daemon
}

func (x *xdsSource) run(ctx context.Context) {
	if err := x.client.Run(ctx); err != nil {
		x.d.log.Error("xDS config client failed", "err", err)
	}
}

func (x *xdsSource) reload() {
	x.d.log.Info("the config comes from xDS: nothing to reload; it changes when the management server pushes one",
		"xds_server", x.addr, "version", x.client.Status().Version)
}

func (x *xdsSource) kind() string  { return "xds" }
func (x *xdsSource) where() string { return x.addr }

// initialConfig is the config the daemon starts with: the files', or, for
// xDS, an empty one with Config.StartWithoutConfig (every call answered
// as for an unknown domain) and none without it (calls refused, health
// NOT_SERVING, until the first push).
func initialConfig(cfg Config) (*config.Set, error) {
	switch {
	case cfg.XDS.Enabled() && cfg.ConfigPath != "":
		return nil, errors.New("daemon: Config.ConfigPath and Config.XDS are two sources of the config; give one")
	case cfg.XDS.Enabled():
		if !cfg.StartWithoutConfig {
			return nil, nil
		}
		return config.Parse(nil)
	case cfg.ConfigPath == "":
		return nil, errors.New("daemon: Config.ConfigPath (or Config.XDS) is required")
	}
	set, err := config.LoadWith(cfg.ConfigPath, config.LoadOptions{MaxTotalBytes: cfg.MaxConfigBytes})
	if err != nil {
		return nil, fmt.Errorf("load config %s:\n%w", cfg.ConfigPath, err)
	}
	return set, nil
}

// newSource returns the source cfg selects, starting from current.
func (d *Daemon) newSource(current *config.Set) (configSource, error) {
	if !d.cfg.XDS.Enabled() {
		w, err := d.newWatcher(current)
		if err != nil {
			return nil, err
		}
		return &fileSource{path: d.cfg.ConfigPath, watcher: w}, nil
	}
	opts := d.cfg.XDS
	opts.OnRefused = d.obs.metrics.ConfigRejected
	opts.Limits = config.LoadOptions{MaxTotalBytes: d.cfg.MaxConfigBytes}
	x := &xdsSource{addr: opts.Addr, d: d}
	c, err := xdsconfig.New(opts, d.applyXDS, d.log.With("xds_server", opts.Addr))
	if err != nil {
		return nil, fmt.Errorf("xDS config source: %w", err)
	}
	x.client = c
	return x, nil
}

// applyXDS puts a config pushed by the management server in force.
func (d *Daemon) applyXDS(set *config.Set, version string) {
	// Metrics first: a call decided on the new config must find its
	// rules' counters ready.
	d.obs.metrics.ConfigLoaded(set)
	d.obs.metrics.ConfigSource("xds", version)
	d.srv.SetConfig(set)
	d.configVersion.Store(&version)
	d.refreshHealth()
	names := make([]string, 0, len(set.Domains()))
	for _, dom := range set.Domains() {
		names = append(names, dom.Name)
	}
	d.log.Info("config applied from xDS", "version", version, "config_hash", set.Hash(), "domains", names)
}

// xdsCollectors are the metrics of the xDS client's state.
func xdsCollectors(c *xdsconfig.Client) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimitd_xds_connected",
			Help: "1 while the stream to the xDS management server is open, else 0.",
		}, func() float64 {
			if c.Status().Connected {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimitd_xds_nacks_total",
			Help: "Config pushes from the xDS management server refused (NACKed); the config in force stayed.",
		}, func() float64 { return float64(c.Status().NACKs) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimitd_xds_refused_domains",
			Help: "Domains of the last xDS push applied that could not be loaded (the rest of the push was): each keeps its last version that loaded, or, if none, its calls are answered UNAVAILABLE.",
		}, func() float64 { return float64(len(c.Status().Refused)) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimitd_xds_domain_refusals_total",
			Help: "Domains of xDS pushes that could not be loaded, each content of a domain counted once.",
		}, func() float64 { return float64(c.Status().Refusals) }),
	}
}
