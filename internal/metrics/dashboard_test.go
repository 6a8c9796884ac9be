package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/metrics"
)

// dashboard is what the tests read of the example Grafana dashboard.
type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile("../../examples/envoy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json is not valid JSON: %v", err)
	}
	return dash
}

// TestGrafanaDashboardUsesRealMetrics parses the example dashboard and
// checks that every metric its queries name is exported after some
// traffic, so the dashboard cannot drift from the metric names.
func TestGrafanaDashboardUsesRealMetrics(t *testing.T) {
	dash := readDashboard(t)
	if dash.Title == "" || len(dash.Panels) == 0 {
		t.Fatalf("dashboard has title %q and %d panels, want both", dash.Title, len(dash.Panels))
	}

	m := newMetrics(t, metrics.Options{Backend: "memory"})
	srv := newServer(t, m)
	for _, d := range [][]string{{"model", "gpt-4o"}, {"model", "unknown"}, {"caller", "internal"}} {
		if _, err := srv.ShouldRateLimit(context.Background(), request("api", d)); err != nil {
			t.Fatal(err)
		}
	}
	m.ConfigLoaded(mustParse(t, testConfig))
	m.ConfigRejected(errors.New("bad"))
	m.BackendError("timeout")
	m.FailureModeActivated("allow")
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var exported []string
	for _, mf := range mfs {
		exported = append(exported, mf.GetName())
	}

	name := regexp.MustCompile(`\bratelimitd_[a-z_]+`)
	used := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				used++
				base := n
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && strings.HasSuffix(b, "_seconds") {
						base = b
					}
				}
				if !slices.Contains(exported, base) {
					t.Errorf("panel %q queries %s, which ratelimitd does not export (it has %v)", p.Title, n, exported)
				}
			}
		}
	}
	if used == 0 {
		t.Errorf("the dashboard names no ratelimitd metric")
	}
}

// TestGrafanaDashboardFollowsItsVariables: every query of a metric with a
// domain label filters on the dashboard's $domain, and every outcome a
// query selects is one ratelimitd_descriptor_requests_total exports.
func TestGrafanaDashboardFollowsItsVariables(t *testing.T) {
	dash := readDashboard(t)
	m := newMetrics(t, metrics.Options{Backend: "memory"})
	srv := newServer(t, m)
	for _, d := range [][]string{{"model", "gpt-4o"}, {"model", "unknown"}} {
		if _, err := srv.ShouldRateLimit(context.Background(), request("api", d)); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	byDomain := map[string]bool{} // families with a domain label
	outcomes := map[string]bool{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				switch l.GetName() {
				case "domain":
					byDomain[mf.GetName()] = true
				case "outcome":
					outcomes[l.GetValue()] = true
				}
			}
		}
	}
	selector := regexp.MustCompile(`\b(ratelimitd_[a-z_]+)(\{[^}]*\})?`)
	outcome := regexp.MustCompile(`outcome="([^"]*)"`)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, s := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				if byDomain[s[1]] && !strings.Contains(s[2], `domain=~"$domain"`) {
					t.Errorf("panel %q queries %s%s, not filtered on $domain", p.Title, s[1], s[2])
				}
			}
			for _, o := range outcome.FindAllStringSubmatch(tg.Expr, -1) {
				if !outcomes[o[1]] {
					t.Errorf("panel %q selects outcome %q, which is not exported (%v)", p.Title, o[1], outcomes)
				}
			}
		}
	}
}
