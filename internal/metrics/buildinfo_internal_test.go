package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
)

const helpBuildInfo = "# HELP ratelimitd_build_info 1, labelled with the version, VCS revision and Go version of the running ratelimitd (ratelimitd version says more).\n" +
	"# TYPE ratelimitd_build_info gauge\n"

// TestBuildInfoLabels: the gauge is 1 and carries the build's version,
// revision and Go version as they are, an unknown revision as "".
func TestBuildInfoLabels(t *testing.T) {
	for _, c := range []struct {
		name string
		info buildinfo.Info
		want string
	}{
		{
			"release",
			buildinfo.Info{Version: "v1.2.3", Revision: "4c35b9250afefede41c5f5acd76191f90f625898", GoVersion: "go1.26.8", Platform: "linux/amd64"},
			`ratelimitd_build_info{goversion="go1.26.8",revision="4c35b9250afefede41c5f5acd76191f90f625898",version="v1.2.3"} 1`,
		},
		{
			"no VCS stamp",
			buildinfo.Info{Version: buildinfo.Devel, GoVersion: "go1.26.8"},
			`ratelimitd_build_info{goversion="go1.26.8",revision="",version="(devel)"} 1`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := helpBuildInfo + c.want + "\n"
			if err := testutil.CollectAndCompare(newBuildInfo(c.info), strings.NewReader(want), "ratelimitd_build_info"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestBuildInfoRegistered: every registry New makes has the running
// binary's build_info, with envoyproxy/ratelimit's names too (their
// listener serves the same registry).
func TestBuildInfoRegistered(t *testing.T) {
	b := buildinfo.Get()
	want := helpBuildInfo + `ratelimitd_build_info{goversion="` + b.GoVersion + `",revision="` + b.Revision + `",version="` + b.Version + `"} 1` + "\n"
	for _, opts := range []Options{{}, {IncumbentNames: true, ProcessMetrics: true}} {
		m, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "ratelimitd_build_info"); err != nil {
			t.Errorf("New(%+v): %v", opts, err)
		}
	}
}
