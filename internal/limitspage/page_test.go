package limitspage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/limitspage"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

const testConfig = `
domain: ai-gateway
descriptors:
  - key: model
    value: gpt-4o
    rate_limit: {unit: minute, requests_per_unit: 600, burst: 6, name: gpt-4o}
    descriptors:
      - key: client
        rate_limit: {unit: second, requests_per_unit: 5, burst: 10, name: gpt-4o-per-client}
  - key: model
    value: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: shadowed}
  - key: caller
    value: internal
    rate_limit: {unlimited: true, name: internal}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 10, unit_multiplier: 5}
`

// fixture is a server on the memory store with a Tracker, and the page
// handler over them, all on one hand-set clock.
type fixture struct {
	clock   *clocktest.Clock
	srv     *server.Server
	tracker *limitspage.Tracker
	handler *limitspage.Handler
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newFixtureWith(t, testConfig)
}

// newFixtureWith is newFixture on the descriptor file yaml.
func newFixtureWith(t testing.TB, yaml string) *fixture {
	t.Helper()
	return newFixtureTracking(t, yaml, limitspage.TrackerOptions{})
}

// newFixtureTracking is newFixtureWith with a Tracker made with opts.
func newFixtureTracking(t testing.TB, yaml string, opts limitspage.TrackerOptions) *fixture {
	t.Helper()
	set := servertest.ParseConfig(t, "ai.yaml", yaml)
	clk := clocktest.New()
	tr := limitspage.NewTracker(opts)
	srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), Now: clk.Now, Observer: tr})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(set)
	h, err := limitspage.NewHandler(limitspage.Options{Config: srv.Config, Tracker: tr, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{clock: clk, srv: srv, tracker: tr, handler: h}
}

// call sends n requests with one descriptor of the given key/value pairs.
func (f *fixture) call(t testing.TB, n int, kv ...string) {
	t.Helper()
	req := servertest.Request("ai-gateway", servertest.Desc(kv...))
	for range n {
		if _, err := f.srv.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatalf("ShouldRateLimit(%v): %v", kv, err)
		}
	}
}

// script is the traffic the tests send: gpt-4o 8 times (6 pass, 2 shed),
// acme under gpt-4o 3 times, shadowed 3 times (2 shadow-shed), internal
// once, and an unknown model once.
func (f *fixture) script(t testing.TB) {
	f.call(t, 8, "model", "gpt-4o")
	f.call(t, 3, "model", "gpt-4o", "client", "acme")
	f.call(t, 3, "model", "shadowed")
	f.call(t, 1, "caller", "internal")
	f.call(t, 1, "model", "llama")
}

func get(t *testing.T, srv *httptest.Server, path string) (string, *http.Response) {
	t.Helper()
	resp, body := servertest.GetResponse(t, srv.URL+path)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d: %s", path, resp.StatusCode, body)
	}
	return body, resp
}

// scriptedPage serves the page of a fixture that has had the script's
// traffic, until the test ends.
func scriptedPage(t *testing.T) *httptest.Server {
	f := newFixture(t)
	f.script(t)
	hs := mount(f.handler)
	t.Cleanup(hs.Close)
	return hs
}

func mount(h http.Handler) *httptest.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /limits", h)
	mux.Handle("GET /limits.json", h)
	return httptest.NewServer(mux)
}

func TestLimitsJSON(t *testing.T) {
	hs := scriptedPage(t)

	body, resp := get(t, hs, "/limits.json")
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var page limitspage.Page
	if err := json.Unmarshal([]byte(body), &page); err != nil {
		t.Fatalf("decode /limits.json: %v\n%s", err, body)
	}
	if len(page.Domains) != 1 || page.Domains[0].Name != "ai-gateway" || page.ConfigHash == "" || page.WindowSeconds != 60 {
		t.Fatalf("page = %+v, want one domain ai-gateway, a config hash and a 60 s window", page)
	}
	rules := map[string]limitspage.RulePage{}
	for _, r := range page.Domains[0].Rules {
		rules[r.Label] = r
	}
	tests := []struct {
		rule       string
		rate       string
		burst      int64
		flags      string
		lastMinute limitspage.Counts
	}{
		{"gpt-4o", "600 per minute", 6, "", limitspage.Counts{Requests: 8, Shed: 2, Tokens: 8}},
		{"gpt-4o-per-client", "5 per second", 10, "", limitspage.Counts{Requests: 3, Tokens: 3}},
		{"shadowed", "1 per minute", 1, "shadow", limitspage.Counts{Requests: 3, ShadowShed: 2, Tokens: 3}},
		{"internal", "unlimited", 0, "unlimited", limitspage.Counts{Requests: 1, Tokens: 1}},
		{"ai-gateway > model", "10 per 5 minutes", 10, "", limitspage.Counts{Requests: 1, Tokens: 1}},
	}
	if len(rules) != len(tests) {
		t.Errorf("rules = %v, want %d", rules, len(tests))
	}
	for _, tt := range tests {
		r, ok := rules[tt.rule]
		flags := ""
		if r.ShadowMode {
			flags += "shadow"
		}
		if r.Unlimited {
			flags += "unlimited"
		}
		if !ok || r.Rate != tt.rate || r.Burst != tt.burst || flags != tt.flags || r.LastMinute != tt.lastMinute {
			t.Errorf("rule %s = %+v, want rate %q, burst %d, flags %q, last minute %+v", tt.rule, r, tt.rate, tt.burst, tt.flags, tt.lastMinute)
		}
	}
	// Busiest: gpt-4o is empty (6/6), shadowed full too (1/1), acme 3/10,
	// llama 1/10.
	var got []string
	for _, b := range page.Busiest {
		got = append(got, fmt.Sprintf("%s|%s|%d/%d", b.Rule, b.Descriptor, b.Used, b.Burst))
	}
	want := []string{
		"ai-gateway > model=gpt-4o|model=gpt-4o|6/6",
		"ai-gateway > model=shadowed|model=shadowed|1/1",
		"ai-gateway > model=gpt-4o > client|model=gpt-4o, client=acme|3/10",
		"ai-gateway > model|model=llama|1/10",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("busiest =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestLimitsWindowSlidesAndBucketsRefill(t *testing.T) {
	f := newFixture(t)
	f.script(t)
	steps := []struct {
		advance      time.Duration
		more         int // gpt-4o calls after advancing
		wantRequests int64
		wantBusiest  int
	}{
		{0, 0, 8, 4},
		{30 * time.Second, 0, 8, 1}, // acme, gpt-4o and llama refilled; shadowed (1/min) not yet
		{29 * time.Second, 1, 9, 2}, // 59 s: the first 8 are still in the window; gpt-4o has 1 in use
		{2 * time.Second, 0, 1, 0},  // 61 s: they left it; gpt-4o and shadowed refilled
		{10 * time.Minute, 0, 0, 0}, // nothing in the window
	}
	for i, st := range steps {
		f.clock.Advance(st.advance)
		f.call(t, st.more, "model", "gpt-4o")
		page := f.handler.Build(f.clock.Now())
		var gpt limitspage.RulePage
		for _, r := range page.Domains[0].Rules {
			if r.Name == "gpt-4o" {
				gpt = r
			}
		}
		if gpt.LastMinute.Requests != st.wantRequests {
			t.Errorf("step %d: gpt-4o requests over the last minute = %d, want %d", i, gpt.LastMinute.Requests, st.wantRequests)
		}
		if len(page.Busiest) != st.wantBusiest {
			t.Errorf("step %d: %d busy buckets (%+v), want %d", i, len(page.Busiest), page.Busiest, st.wantBusiest)
		}
	}
}

func TestLimitsHTML(t *testing.T) {
	hs := scriptedPage(t)
	body, resp := get(t, hs, "/limits")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("Content-Type = %q, want text/html", ct)
	}
	for _, want := range []string{
		"<title>ratelimitd limits</title>",
		`<tr data-rule="gpt-4o">`,
		`<td class="rate">600 per minute</td>`,
		`<td class="num requests">8</td>`,
		`<td class="num shed nonzero">2</td>`,
		`<span class="flag shadow">shadow</span>`,
		`<span class="flag unlimited">unlimited</span>`,
		`model=gpt-4o, client=acme`,
		"ai-gateway &gt; model",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/limits lacks %q", want)
		}
	}
	if strings.Contains(body, "http-equiv") {
		t.Errorf("/limits refreshes itself without ?refresh")
	}
	body, _ = get(t, hs, "/limits?refresh=5")
	if !strings.Contains(body, `<meta http-equiv="refresh" content="5">`) {
		t.Errorf("/limits?refresh=5 lacks the refresh meta tag")
	}
}

func TestLimitsWithoutConfig(t *testing.T) {
	tr := limitspage.NewTracker(limitspage.TrackerOptions{})
	h, err := limitspage.NewHandler(limitspage.Options{Config: func() *config.Set { return nil }, Tracker: tr})
	if err != nil {
		t.Fatal(err)
	}
	hs := mount(h)
	defer hs.Close()
	body, _ := get(t, hs, "/limits")
	if !strings.Contains(body, "No config loaded.") {
		t.Errorf("/limits without config lacks %q:\n%s", "No config loaded.", body)
	}
	body, _ = get(t, hs, "/limits.json")
	if !strings.Contains(body, `"domains": []`) {
		t.Errorf("/limits.json without config: %s, want empty domains", body)
	}
}

func TestTrackerBucketsAreBounded(t *testing.T) {
	f := newFixtureTracking(t, testConfig, limitspage.TrackerOptions{MaxBuckets: 20})
	clk, tr := f.clock, f.tracker
	for i := range 500 {
		f.call(t, 1+i%3, "model", fmt.Sprintf("m%d", i))
	}
	busiest := tr.Busiest(1000, clk.Now())
	if len(busiest) > 20 || len(busiest) == 0 {
		t.Fatalf("tracker holds %d buckets, want 1 to 20", len(busiest))
	}
	// The fullest (3 of 10 used) survive eviction.
	if b := busiest[0]; b.Used != 3 {
		t.Errorf("fullest bucket %+v, want 3 in use", b)
	}
}

func BenchmarkTrackerObserveCall(b *testing.B) {
	f := newFixture(b)
	set := f.srv.Config()
	rule := set.Lookup("ai-gateway", []config.Entry{{Key: "model", Value: "gpt-4o"}, {Key: "client", Value: "acme"}})
	d := servertest.Desc("model", "gpt-4o", "client", "acme")
	tr := limitspage.NewTracker(limitspage.TrackerOptions{})
	call := server.Call{Domain: "ai-gateway", Start: f.clock.Now(), Descriptors: []server.DescriptorOutcome{
		{Descriptor: d, Rule: rule, Outcome: server.WithinLimit, Hits: 1, Limit: rule.Limits[0].Limit, Decision: limiter.Decision{Allowed: true, Remaining: 4}},
	}}
	b.ReportAllocs()
	for b.Loop() {
		tr.ObserveCall(call)
	}
}

// TestTrackerKeepsABucketAddedAsItsRuleEmpties: when eviction drops every
// bucket of a rule, the bucket being added for that rule is still kept (and
// counted), so the tracker does not fill with ghosts and evict on every call.
func TestTrackerKeepsABucketAddedAsItsRuleEmpties(t *testing.T) {
	f := newFixtureTracking(t, testConfig, limitspage.TrackerOptions{MaxBuckets: 2})
	clk, tr := f.clock, f.tracker
	for round := range 50 {
		f.call(t, 1, "model", fmt.Sprint("a", round))
		f.call(t, 1, "model", fmt.Sprint("b", round))
		clk.Advance(time.Hour) // both refill
		f.call(t, 1, "model", fmt.Sprint("c", round))
		busiest := tr.Busiest(10, clk.Now())
		if len(busiest) != 1 || busiest[0].Used != 1 {
			t.Fatalf("round %d: busiest = %+v, want just the bucket added as its rule emptied", round, busiest)
		}
		clk.Advance(time.Hour)
	}
}
