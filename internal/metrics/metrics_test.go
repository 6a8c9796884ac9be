package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

const testConfig = `
domain: api
descriptors:
  - key: model
    value: gpt-4o
    rate_limit: {unit: minute, requests_per_unit: 5, name: gpt-4o}
  - key: model
    value: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: shadowed}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: caller
    value: internal
    rate_limit: {unlimited: true, name: internal}
`

// mustParse parses one descriptor file.
func mustParse(t testing.TB, yaml string) *config.Set {
	t.Helper()
	return servertest.ParseConfig(t, "api.yaml", yaml)
}

// newServer returns a server on the memory store, deciding at a fixed
// instant, that reports to m.
func newServer(t testing.TB, m server.Observer) *server.Server {
	t.Helper()
	srv := newServerWithoutConfig(t, m)
	srv.SetConfig(mustParse(t, testConfig))
	return srv
}

// newServerWithoutConfig is newServer before its first config.
func newServerWithoutConfig(t testing.TB, m server.Observer) *server.Server {
	t.Helper()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	return newServerClocked(t, m, func() time.Time { return now })
}

// newServerClocked returns a server on the memory store, without a config
// yet, that reads the time from now and reports to m. It fails the test if
// server.New does.
func newServerClocked(t testing.TB, m server.Observer, now func() time.Time) *server.Server {
	t.Helper()
	srv, err := server.New(server.Options{
		Store:    limiter.NewMemoryStore(limiter.MemoryOptions{}),
		Now:      now,
		Observer: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// newMetrics returns the metrics opts describe. It fails the test if
// metrics.New does.
func newMetrics(t testing.TB, opts metrics.Options) *metrics.Metrics {
	t.Helper()
	m, err := metrics.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func request(domain string, descs ...[]string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain}
	for _, kv := range descs {
		req.Descriptors = append(req.Descriptors, servertest.Desc(kv...))
	}
	return req
}

// value returns the value of the series name{labels} in reg, and whether
// it exists. Labels not given must be absent or empty.
func value(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range got {
				if labels[k] != v {
					continue metrics
				}
			}
			for k, v := range labels {
				if got[k] != v {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue(), true
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), true
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func TestMetricsFollowScriptedCalls(t *testing.T) {
	m := newMetrics(t, metrics.Options{Backend: "memory", MaxValuesPerRule: 3})
	srv := newServer(t, m)
	ctx := context.Background()
	call := func(req *rlsv3.RateLimitRequest) {
		t.Helper()
		if _, err := srv.ShouldRateLimit(ctx, req); err != nil {
			t.Fatalf("ShouldRateLimit(%v): %v", req, err)
		}
	}
	// gpt-4o: 5 admitted (the 5th leaves 0 of 5: near limit), then 2 denied.
	for range 7 {
		call(request("api", []string{"model", "gpt-4o"}))
	}
	// shadowed: 1 admitted, then 2 that shadow mode lets through.
	for range 3 {
		call(request("api", []string{"model", "shadowed"}))
	}
	// internal: unlimited; unknown model and unknown domain: no rule.
	call(request("api", []string{"caller", "internal"}))
	call(request("api", []string{"model", "llama"}))
	call(request("elsewhere", []string{"model", "gpt-4o"}))
	// user is detailed: ten users, but only 3 values are labelled.
	for i := range 10 {
		call(request("api", []string{"user", fmt.Sprintf("u%d", i)}))
	}
	// user a,b must not collide with a user "a,b".
	call(request("api", []string{"user", "a,b"}))
	// An invalid request.
	if _, err := srv.ShouldRateLimit(ctx, request("")); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty request: %v, want InvalidArgument", err)
	}
	// Two loads that keep every rule: the counters go on.
	first := mustParse(t, testConfig)
	second := mustParse(t, testConfig+"  - key: extra\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	m.ConfigLoaded(first)
	m.ConfigLoaded(second)
	m.ConfigRejected(errors.New("bad yaml"))
	m.FailureModeActivated("allow")
	m.BackendError("timeout")

	reg := m.Registry()
	tests := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "gpt-4o"}, 7},
		{"ratelimitd_descriptor_within_limit_total", map[string]string{"domain": "api", "rule": "gpt-4o"}, 5},
		{"ratelimitd_descriptor_near_limit_total", map[string]string{"domain": "api", "rule": "gpt-4o"}, 1},
		{"ratelimitd_descriptor_over_limit_total", map[string]string{"domain": "api", "rule": "gpt-4o"}, 2},
		{"ratelimitd_descriptor_shadow_mode_total", map[string]string{"domain": "api", "rule": "gpt-4o"}, 0},
		{"ratelimitd_descriptor_requests_total", map[string]string{"domain": "api", "rule": "gpt-4o", "outcome": "over_limit"}, 2},
		{"ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "shadowed"}, 3},
		{"ratelimitd_descriptor_within_limit_total", map[string]string{"domain": "api", "rule": "shadowed"}, 1},
		{"ratelimitd_descriptor_shadow_mode_total", map[string]string{"domain": "api", "rule": "shadowed"}, 2},
		{"ratelimitd_descriptor_over_limit_total", map[string]string{"domain": "api", "rule": "shadowed"}, 0},
		{"ratelimitd_descriptor_requests_total", map[string]string{"domain": "api", "rule": "shadowed", "outcome": "shadow_over_limit"}, 2},
		{"ratelimitd_descriptor_requests_total", map[string]string{"domain": "api", "rule": "internal", "outcome": "unlimited"}, 1},
		{"ratelimitd_descriptor_unmatched_total", map[string]string{"domain": "api"}, 1},
		{"ratelimitd_descriptor_unmatched_total", map[string]string{"domain": "elsewhere"}, 1},
		{"ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "api > user", "value": "u0"}, 1},
		{"ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "api > user", "value": "u2"}, 1},
		{"ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "api > user", "value": "_other"}, 8},
		{"ratelimitd_requests_total", map[string]string{"domain": "api", "code": "OK", "overall_code": "OVER_LIMIT"}, 2},
		{"ratelimitd_requests_total", map[string]string{"domain": "api", "code": "OK", "overall_code": "OK"}, 21},
		{"ratelimitd_requests_total", map[string]string{"domain": "_invalid", "code": "InvalidArgument", "overall_code": ""}, 1},
		{"ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "internal"}, 1},
		{"ratelimitd_descriptor_within_limit_total", map[string]string{"domain": "api", "rule": "internal"}, 1},
		{"ratelimitd_request_duration_seconds", map[string]string{"backend": "memory", "code": "OK"}, 24},
		{"ratelimitd_config_reloads_total", map[string]string{"result": "ok"}, 2},
		{"ratelimitd_config_reloads_total", map[string]string{"result": "failed"}, 1},
		{"ratelimitd_config_info", map[string]string{"hash": second.Hash()}, 1},
		{"ratelimitd_failure_mode_activations_total", map[string]string{"mode": "allow"}, 1},
		{"ratelimitd_backend_errors_total", map[string]string{"backend": "memory", "kind": "timeout"}, 1},
	}
	for _, tt := range tests {
		got, ok := value(t, reg, tt.name, tt.labels)
		if !ok || got != tt.want {
			t.Errorf("%s%v = %v (present %v), want %v", tt.name, tt.labels, got, ok, tt.want)
		}
	}
	if _, ok := value(t, reg, "ratelimitd_config_info", map[string]string{"hash": first.Hash()}); ok {
		t.Errorf("ratelimitd_config_info of the first config still present after loading the second")
	}
	if _, ok := value(t, reg, "ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "api > user", "value": "u3"}); ok {
		t.Errorf("a 4th detailed value was labelled; want it counted as _other")
	}
}

func TestDetailedValuesAreBounded(t *testing.T) {
	tests := []struct {
		max, users int
		wantSeries int
	}{
		{max: 1, users: 1, wantSeries: 1},
		{max: 1, users: 50, wantSeries: 2},
		{max: 100, users: 100, wantSeries: 100},
		{max: 100, users: 5000, wantSeries: 101},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("max%d_users%d", tt.max, tt.users), func(t *testing.T) {
			m := newMetrics(t, metrics.Options{MaxValuesPerRule: tt.max})
			srv := newServer(t, m)
			for i := range tt.users {
				if _, err := srv.ShouldRateLimit(context.Background(), request("api", []string{"user", fmt.Sprint(i)})); err != nil {
					t.Fatal(err)
				}
			}
			mfs, err := m.Registry().Gather()
			if err != nil {
				t.Fatal(err)
			}
			var series []*dto.Metric
			var total float64
			for _, mf := range mfs {
				if mf.GetName() == "ratelimitd_descriptor_hits_total" {
					series = mf.GetMetric()
				}
			}
			for _, s := range series {
				total += s.GetCounter().GetValue()
			}
			if len(series) != tt.wantSeries || total != float64(tt.users) {
				t.Errorf("%d users, at most %d values: %d series totalling %v hits; want %d series totalling %d",
					tt.users, tt.max, len(series), total, tt.wantSeries, tt.users)
			}
		})
	}
}

func TestRefundDoesNotPanic(t *testing.T) {
	m := newMetrics(t, metrics.Options{})
	set := mustParse(t, testConfig)
	gpt := set.Lookup("api", []config.Entry{{Key: "model", Value: "gpt-4o"}})
	req := request("api", []string{"model", "gpt-4o"})
	m.ObserveCall(server.Call{Domain: "api", Code: codes.OK, Descriptors: []server.DescriptorOutcome{
		{Descriptor: req.Descriptors[0], Rule: gpt, Outcome: server.WithinLimit, Hits: -3, Limit: gpt.Limits[0].Limit, Decision: limiter.Decision{Allowed: true, Remaining: 5}},
	}})
	hits, _ := value(t, m.Registry(), "ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "gpt-4o"})
	reqs, _ := value(t, m.Registry(), "ratelimitd_descriptor_requests_total", map[string]string{"domain": "api", "rule": "gpt-4o", "outcome": "within_limit"})
	if hits != 0 || reqs != 1 {
		t.Errorf("after a refund of 3: hits %v, requests %v; want 0 and 1", hits, reqs)
	}
}

func TestNewRejectsBadRatio(t *testing.T) {
	for _, r := range []float64{-0.1, 1.5} {
		if _, err := metrics.New(metrics.Options{NearLimitRatio: r}); err == nil {
			t.Errorf("New(NearLimitRatio %v) = nil error, want one", r)
		}
	}
}

func TestNearLimitRatio(t *testing.T) {
	// gpt-4o has a burst of 5: remaining after each of 5 calls is 4..0.
	tests := []struct {
		ratio float64
		want  float64 // near_limit hits
	}{
		{0.8, 1},  // remaining < 1
		{0.5, 3},  // remaining < 2.5: 2, 1, 0
		{1, 0},    // remaining < 0: never
		{0.01, 5}, // remaining < 4.95: all
	}
	for _, tt := range tests {
		m := newMetrics(t, metrics.Options{NearLimitRatio: tt.ratio})
		srv := newServer(t, m)
		for range 5 {
			if _, err := srv.ShouldRateLimit(context.Background(), request("api", []string{"model", "gpt-4o"})); err != nil {
				t.Fatal(err)
			}
		}
		got, _ := value(t, m.Registry(), "ratelimitd_descriptor_near_limit_total", map[string]string{"domain": "api", "rule": "gpt-4o"})
		if got != tt.want {
			t.Errorf("ratio %v: near_limit = %v, want %v", tt.ratio, got, tt.want)
		}
	}
}

func TestHandlerServesText(t *testing.T) {
	m := newMetrics(t, metrics.Options{ProcessMetrics: true})
	srv := newServer(t, m)
	if _, err := srv.ShouldRateLimit(context.Background(), request("api", []string{"model", "gpt-4o"})); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{`ratelimitd_descriptor_hits_total{domain="api",rule="gpt-4o",value=""} 1`, "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// BenchmarkObserveCall counts a call of two descriptors, with and without
// envoyproxy/ratelimit's names beside ratelimitd's.
func BenchmarkObserveCall(b *testing.B) {
	b.Run("native", func(b *testing.B) { benchmarkObserveCall(b, metrics.Options{}) })
	b.Run("incumbent names too", func(b *testing.B) { benchmarkObserveCall(b, metrics.Options{IncumbentNames: true}) })
}

func benchmarkObserveCall(b *testing.B, opts metrics.Options) {
	m := newMetrics(b, opts)
	set := mustParse(b, testConfig)
	gpt := set.Lookup("api", []config.Entry{{Key: "model", Value: "gpt-4o"}})
	user := set.Lookup("api", []config.Entry{{Key: "user", Value: "u1"}})
	req := request("api", []string{"model", "gpt-4o"}, []string{"user", "u1"})
	call := server.Call{
		Domain: "api", Checked: true, Start: time.Now(), Duration: time.Millisecond, Code: codes.OK, Overall: rlsv3.RateLimitResponse_OK,
		Descriptors: []server.DescriptorOutcome{
			{Descriptor: req.Descriptors[0], Rule: gpt, Outcome: server.WithinLimit, Hits: 1, Limit: gpt.Limits[0].Limit, Decision: limiter.Decision{Allowed: true, Remaining: 3}},
			{Descriptor: req.Descriptors[1], Rule: user, Outcome: server.WithinLimit, Hits: 1, Limit: user.Limits[0].Limit, Decision: limiter.Decision{Allowed: true, Remaining: 90}},
		},
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.ObserveCall(call)
		}
	})
}

// TestReloadDropsSeriesOfRemovedRules: a reload that removes a rule
// deletes its series (they could never move again); the rules it keeps go
// on counting from where they were.
func TestReloadDropsSeriesOfRemovedRules(t *testing.T) {
	m := newMetrics(t, metrics.Options{})
	srv := newServer(t, m)
	m.ConfigLoaded(mustParse(t, testConfig))
	ctx := context.Background()
	for _, d := range [][]string{{"model", "gpt-4o"}, {"model", "shadowed"}, {"user", "u1"}} {
		if _, err := srv.ShouldRateLimit(ctx, request("api", d)); err != nil {
			t.Fatal(err)
		}
	}
	reg := m.Registry()
	series := []map[string]string{
		{"domain": "api", "rule": "gpt-4o", "value": ""},
		{"domain": "api", "rule": "shadowed", "value": ""},
		{"domain": "api", "rule": "api > user", "value": "u1"},
	}
	for _, labels := range series {
		if _, ok := value(t, reg, "ratelimitd_descriptor_hits_total", labels); !ok {
			t.Fatalf("no hits series %v before the reload", labels)
		}
	}
	for _, rule := range []string{"shadowed", "api > user"} {
		n := ruleSeries(t, reg, rule)
		for _, family := range []string{"hits", "within_limit", "near_limit", "over_limit", "shadow_mode", "requests"} {
			if n["ratelimitd_descriptor_"+family+"_total"] == 0 {
				t.Fatalf("rule %q has no %s series before the reload: %v", rule, family, n)
			}
		}
	}

	kept := `
domain: api
descriptors:
  - key: model
    value: gpt-4o
    rate_limit: {unit: minute, requests_per_unit: 50, name: gpt-4o}
`
	m.ConfigLoaded(mustParse(t, kept))
	if got, ok := value(t, reg, "ratelimitd_descriptor_hits_total", series[0]); !ok || got != 1 {
		t.Errorf("kept rule gpt-4o: hits %v (present %v), want 1 kept across the reload", got, ok)
	}
	// Calls decided under the old config and observed after the reload
	// (srv still has it): a kept rule goes on counting, a removed one does
	// not come back.
	for _, d := range [][]string{{"model", "gpt-4o"}, {"model", "shadowed"}, {"user", "u2"}} {
		if _, err := srv.ShouldRateLimit(ctx, request("api", d)); err != nil {
			t.Fatal(err)
		}
	}
	if got, ok := value(t, reg, "ratelimitd_descriptor_hits_total", series[0]); !ok || got != 2 {
		t.Errorf("kept rule gpt-4o after a late call: hits %v (present %v), want 2", got, ok)
	}
	for _, rule := range []string{"shadowed", "api > user"} {
		if n := ruleSeries(t, reg, rule); len(n) > 0 {
			t.Errorf("rule %q still has series %v after a reload removed it", rule, n)
		}
	}

	// Back to the first config: a removed rule that returns counts again,
	// on live series (not on the counters the reload deleted).
	m.ConfigLoaded(mustParse(t, testConfig))
	if _, err := srv.ShouldRateLimit(ctx, request("api", []string{"model", "shadowed"})); err != nil {
		t.Fatal(err)
	}
	if got, ok := value(t, reg, "ratelimitd_descriptor_hits_total", series[1]); !ok || got != 1 {
		t.Errorf("rule shadowed back after two reloads: hits %v (present %v), want 1", got, ok)
	}
}

// ruleSeries counts, per per-rule metric family, the series of the rule
// labelled rule.
func ruleSeries(t *testing.T, reg prometheus.Gatherer, rule string) map[string]int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" && l.GetValue() == rule {
					n[mf.GetName()]++
				}
			}
		}
	}
	return n
}

// TestReloadKeepsDetailedValuesBounded: a reload that keeps a
// detailed_metric rule keeps its labelled values, so the bound on them
// holds across any number of reloads.
func TestReloadKeepsDetailedValuesBounded(t *testing.T) {
	m := newMetrics(t, metrics.Options{MaxValuesPerRule: 2})
	srv := newServer(t, m)
	for reload := range 5 {
		m.ConfigLoaded(mustParse(t, testConfig))
		for i := range 3 {
			if _, err := srv.ShouldRateLimit(context.Background(), request("api", []string{"user", fmt.Sprintf("r%du%d", reload, i)})); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := ruleSeries(t, m.Registry(), "api > user")["ratelimitd_descriptor_hits_total"]; n != 3 {
		t.Errorf("after 5 reloads, rule api > user has %d hits series, want 3 (2 values and _other)", n)
	}
}

// TestReloadFlipsDetailedMetric: a reload that turns detailed_metric off
// for a rule replaces its per-value series with one series for every
// value, and turning it back on does the reverse; the new series start at
// zero.
func TestReloadFlipsDetailedMetric(t *testing.T) {
	m := newMetrics(t, metrics.Options{})
	rule := func(detailed bool) string {
		return fmt.Sprintf(`
domain: api
descriptors:
  - key: user
    detailed_metric: %v
    rate_limit: {unit: minute, requests_per_unit: 100}
`, detailed)
	}
	srv := newServerWithoutConfig(t, m)
	reg := m.Registry()
	hits := func(v string) (float64, bool) {
		return value(t, reg, "ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "api > user", "value": v})
	}
	steps := []struct {
		detailed bool
		calls    []string           // users, one call each
		want     map[string]float64 // hits by value label: exactly these series
	}{
		{true, []string{"u1", "u2", "u1"}, map[string]float64{"u1": 2, "u2": 1}},
		{false, []string{"u1", "u3"}, map[string]float64{"": 2}},
		{true, []string{"u3"}, map[string]float64{"u3": 1}},
	}
	for i, st := range steps {
		set := mustParse(t, rule(st.detailed))
		srv.SetConfig(set)
		m.ConfigLoaded(set)
		for _, u := range st.calls {
			if _, err := srv.ShouldRateLimit(context.Background(), request("api", []string{"user", u})); err != nil {
				t.Fatal(err)
			}
		}
		for v, want := range st.want {
			if got, ok := hits(v); !ok || got != want {
				t.Errorf("step %d (detailed_metric %v): hits{value=%q} = %v (present %v), want %v", i, st.detailed, v, got, ok, want)
			}
		}
		if n := ruleSeries(t, reg, "api > user")["ratelimitd_descriptor_hits_total"]; n != len(st.want) {
			t.Errorf("step %d (detailed_metric %v): %d hits series, want %d", i, st.detailed, n, len(st.want))
		}
	}
}
