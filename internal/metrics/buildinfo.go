package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
)

// newBuildInfo is ratelimitd_build_info: 1, labelled with the build's
// version, revision and Go version, as Prometheus's own and other Go
// daemons' *_build_info gauges are, so that a query such as
// `count by (version) (ratelimitd_build_info)` says which replicas run
// which build during a rollout. An unknown revision is "".
func newBuildInfo(b buildinfo.Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "ratelimitd_build_info",
		Help:        "1, labelled with the version, VCS revision and Go version of the running ratelimitd (ratelimitd version says more).",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}
