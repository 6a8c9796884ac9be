package daemon_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// TestEveryListenerNamesTheBuild: the build serving is on /metrics of the
// HTTP listener and of the metrics listener (envoyproxy/ratelimit's
// PROMETHEUS_ADDR, with its names), on /limits.json, and in /rlconfig
// on the debug listener.
func TestEveryListenerNamesTheBuild(t *testing.T) {
	r := run(t, daemon.Config{DebugAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", IncumbentMetrics: true}, oneAnHour)
	b := buildinfo.Get()
	gauge := `ratelimitd_build_info{goversion="` + b.GoVersion + `",revision="` + b.Revision + `",version="` + b.Version + `"} 1` + "\n"
	for _, c := range []struct {
		url, want string
	}{
		{"http://" + r.d.HTTPAddr().String() + "/metrics", gauge},
		{"http://" + r.d.MetricsAddr().String() + daemon.DefaultMetricsPath, gauge},
		{"http://" + r.d.HTTPAddr().String() + "/limits.json", `"version": "` + b.Version + `"`},
		{"http://" + r.d.DebugAddr().String() + "/rlconfig", "\n# build: " + b.String() + "\n"},
	} {
		if code, body := servertest.Get(t, c.url); code != http.StatusOK || !strings.Contains(body, c.want) {
			t.Errorf("GET %s = %d, want 200 with %q:\n%s", c.url, code, c.want, body)
		}
	}
	if err := r.stop(); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}
