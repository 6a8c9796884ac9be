package envoygateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// TestEnvoyGateway runs Envoy Gateway's control plane (RATELIMITD_EG_BIN,
// which `make test-eg` builds) and ratelimitd as its rate-limit service,
// then walks every shape of shapes() request by request: what Envoy would
// send is computed from EG's own route config (envoy_test.go), sent to
// ratelimitd over TLS, and its answer checked against the policy. Then a
// policy edit, EG restarted and ratelimitd restarted. It reports "N of M
// steps enforced" and fails unless N = M.
func TestEnvoyGateway(t *testing.T) {
	egBin := os.Getenv("RATELIMITD_EG_BIN")
	if egBin == "" {
		t.Skip("RATELIMITD_EG_BIN is not set: run make test-eg, which builds Envoy Gateway v1.9.1")
	}
	dir := t.TempDir()
	rlBin := buildRatelimit(t, dir)
	redis := redistest.Start(t)

	eg := newEnvoyGateway(t, egBin, filepath.Join(dir, "eg"), redis.Addr)
	all := shapes()
	eg.write(t, "gateway.yaml", gatewayYAML)
	for i, s := range all {
		eg.write(t, fmt.Sprintf("shape-%02d.yaml", i), s.yaml)
	}
	eg.write(t, "bad.yaml", badPolicy)
	eg.write(t, "edit.yaml", simple("edit", "- limit: {requests: 1000, unit: Hour}"))
	eg.write(t, "edit-after-restart.yaml", simple("edit-after-restart", "- limit: {requests: 1000, unit: Hour}"))
	began := time.Now()
	eg.start(t)
	t.Logf("Envoy Gateway serving xDS %.1fs after its start", time.Since(began).Seconds())

	rl := newRatelimit(t, rlBin, eg, redis.Addr, filepath.Join(dir, "runtime"))
	rl.start(t)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	routes, err := watchRoutes(ctx, egXDSAddr, filepath.Join(eg.certs, "envoy"), dnsName(t, filepath.Join(eg.certs, "envoy-gateway", "tls.crt")))
	if err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(eg.certs, "envoy-rate-limit")
	creds, err := clientTLS(certs, dnsName(t, filepath.Join(certs, "tls.crt")))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(rl.grpcAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h := &harness{t: t, routes: routes, client: rlsv3.NewRateLimitServiceClient(conn)}

	// Every route of every shape in EG's route config with its rate
	// limits, and in ratelimitd's config.
	var names []string
	for _, s := range all {
		for _, st := range s.steps {
			names = append(names, st.route)
		}
	}
	if !routes.waitFor(3*time.Minute, func() bool {
		for _, n := range names {
			if r := routes.route(n, 0); r == nil || len(r.GetTypedPerFilterConfig()) == 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("EG's route config lacks some shapes' routes after 3 minutes\n%s", eg.proc.tail(60))
	}
	waitConfig(t, rl, configMarkers, 2*time.Minute)
	t.Logf("every shape in EG's route config and in ratelimitd's %.1fs after EG's start", time.Since(began).Seconds())

	for _, s := range all {
		h.shape(s.name, s.steps)
	}

	// One resource EG cannot translate leaves the others in force: the
	// shapes above were enforced beside it; ratelimitd refused nothing
	// EG sent, and a later edit still reaches it (below).
	h.check("a bad policy freezes nothing", "ratelimitd_xds_refused_domains is 0", func() string {
		if v := metric(t, rl, "ratelimitd_xds_refused_domains"); v != "0" {
			return "ratelimitd_xds_refused_domains = " + v
		}
		return ""
	})

	// A policy edit reaches ratelimitd: 1000 an hour lowered to 1.
	h.shape("edit (before)", steps("edit", ok))
	h.edit(eg, "edit.yaml", "edit", "a policy edit reaches ratelimitd")

	// EG killed and restarted: ratelimitd keeps its limits and counters
	// meanwhile, takes EG's pushes again, and an edit reaches it.
	eg.proc.stop(t)
	h.shape("EG down: limits and counters kept", []step{at("per-route", over, request{}), at("header-distinct", over, header("x-tenant", "a"))})
	began = time.Now()
	eg.start(t)
	t.Logf("Envoy Gateway restarted, serving xDS in %.1fs", time.Since(began).Seconds())
	h.shape("EG restarted: limits and counters kept", []step{at("per-route", over, request{}), at("week", over, request{}), at("shared-b", over, request{})})
	h.shape("edit after EG restart (before)", steps("edit-after-restart", ok))
	h.edit(eg, "edit-after-restart.yaml", "edit-after-restart", "a policy edit after EG's restart reaches ratelimitd")

	// ratelimitd restarted on the same Redis: config from EG again,
	// counters kept.
	rl.proc.stop(t)
	began = time.Now()
	rl.start(t)
	waitConfig(t, rl, configMarkers, 2*time.Minute)
	t.Logf("ratelimitd restarted, config from EG in %.1fs", time.Since(began).Seconds())
	h.shape("ratelimitd restarted: limits and counters kept", []step{
		at("per-route", over, request{}), at("header-distinct", over, header("x-tenant", "a")), at("header-distinct", ok, header("x-tenant", "c")),
		at("week", over, request{}), at("shared-a", over, request{}), at(longRoute, over, request{}), at("edit", over, request{}),
	})

	t.Logf("Envoy Gateway v1.9.1 conformance:\n%s", strings.Join(h.report, "\n"))
	t.Logf("%d of %d steps enforced", h.passed, h.total)
	if h.passed != h.total {
		t.Errorf("%d of %d steps not enforced as the policy says", h.total-h.passed, h.total)
	}
}

// configMarkers are in ratelimitd's /rlconfig once it has EG's config:
// a route's descriptor key, a shared rule's and the last route written.
var configMarkers = []string{"httproute/default/per-route/rule/0", "default/shared", "httproute/default/edit-after-restart/rule/0"}

type harness struct {
	t             *testing.T
	routes        *routeWatch
	client        rlsv3.RateLimitServiceClient
	passed, total int
	report        []string
}

// shape runs steps in order and records each.
func (h *harness) shape(name string, steps []step) {
	passed := 0
	for i, st := range steps {
		if msg := h.step(st); msg != "" {
			h.t.Errorf("%s: step %d (%s rule %d): %s", name, i+1, short(st.route), st.rule, msg)
		} else {
			passed++
		}
	}
	h.passed += passed
	h.total += len(steps)
	h.report = append(h.report, fmt.Sprintf("  %-62s %d of %d", name, passed, len(steps)))
}

// check is one step that is not a request.
func (h *harness) check(name, what string, f func() string) {
	h.total++
	if msg := f(); msg != "" {
		h.t.Errorf("%s: %s", name, msg)
		h.report = append(h.report, fmt.Sprintf("  %-62s 0 of 1 (%s)", name, what))
		return
	}
	h.passed++
	h.report = append(h.report, fmt.Sprintf("  %-62s 1 of 1 (%s)", name, what))
}

// step sends what Envoy would for st and returns what went wrong, if
// anything.
func (h *harness) step(st step) string {
	r := h.routes.route(st.route, st.rule)
	if r == nil {
		return "no such route in EG's route config"
	}
	cs, err := calls(r, st.req, false)
	if err != nil {
		return err.Error()
	}
	got := ok
	var sent []string
	for _, c := range cs {
		resp, err := h.shouldRateLimit(c)
		sent = append(sent, describe(c, resp, err))
		if err != nil {
			return "ShouldRateLimit: " + strings.Join(sent, "; ")
		}
		if len(resp.GetStatuses()) != len(c.descriptors) {
			return fmt.Sprintf("%d statuses for %d descriptors: %s", len(resp.GetStatuses()), len(c.descriptors), strings.Join(sent, "; "))
		}
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			got = over // Envoy answers 429; the filters after it do not run
			break
		}
	}
	if got != st.want {
		if len(sent) == 0 {
			sent = []string{"no descriptor generated, nothing sent"}
		}
		return fmt.Sprintf("got %v, want %v: %s", got, st.want, strings.Join(sent, "; "))
	}
	if got == ok && st.end != nil {
		end := st.req
		end.metadata = st.end
		cs, err := calls(r, end, true)
		if err != nil {
			return err.Error()
		}
		if len(cs) == 0 {
			return "no stream-end descriptor generated"
		}
		for _, c := range cs {
			if resp, err := h.shouldRateLimit(c); err != nil {
				return "stream end: " + describe(c, resp, err)
			}
		}
	}
	return ""
}

func (h *harness) shouldRateLimit(c call) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: c.domain, Descriptors: c.descriptors})
}

// edit lowers route's policy to 1 an hour and probes every 200 ms until
// the second request of a probe pair is over the limit: the edit went
// from the file through EG to ratelimitd (and to EG's route config).
func (h *harness) edit(eg *envoyGateway, file, route, name string) {
	began := time.Now()
	eg.write(h.t, file, simple(route, "- limit: {requests: 1, unit: Hour}"))
	h.check(name, "within 120 s", func() string {
		for time.Since(began) < 120*time.Second {
			if h.step(at(route, over, request{})) == "" {
				h.report = append(h.report, fmt.Sprintf("    (%s: %.1f s from the file written to OVER_LIMIT)", route, time.Since(began).Seconds()))
				return ""
			}
			time.Sleep(200 * time.Millisecond)
		}
		return "the edit did not reach ratelimitd within 120 s"
	})
}

// waitConfig waits until ratelimitd's /rlconfig names each of markers.
func waitConfig(t *testing.T, rl *ratelimit, routes []string, d time.Duration) {
	t.Helper()
	var body, missing string
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		body = get(rl.debugAddr, "/rlconfig")
		missing = ""
		for _, r := range routes {
			if !strings.Contains(body, r) {
				missing = r
				break
			}
		}
		if missing == "" {
			return
		}
	}
	t.Fatalf("ratelimitd's /rlconfig lacks %q after %v:\n%.3000s\nratelimit:\n%s", missing, d, body, rl.proc.tail(40))
}

func get(addr, path string) string {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return string(b)
}

// metric is the value of an unlabelled metric on ratelimitd's /metrics.
func metric(t *testing.T, rl *ratelimit, name string) string {
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(get(rl.promAddr, "/metrics"))
	if m == nil {
		return "absent"
	}
	return m[1]
}

// describe is a call and its answer in one line, long keys shortened.
func describe(c call, resp *rlsv3.RateLimitResponse, err error) string {
	var ds []string
	for _, d := range c.descriptors {
		ds = append(ds, descriptorString(d))
	}
	if len(ds) > 4 {
		ds = append(ds[:4], fmt.Sprintf("… %d descriptors", len(c.descriptors)))
	}
	answer := ""
	if err != nil {
		answer = err.Error()
	} else {
		answer = resp.GetOverallCode().String()
		var st []string
		for _, s := range resp.GetStatuses() {
			st = append(st, fmt.Sprintf("%v/%d", s.GetCode(), s.GetLimitRemaining()))
		}
		if len(st) > 4 {
			st = append(st[:4], "…")
		}
		answer += " " + strings.Join(st, ",")
	}
	return fmt.Sprintf("domain %s [%s] → %s", short(c.domain), strings.Join(ds, " "), answer)
}

func descriptorString(d *ratelimitv3.RateLimitDescriptor) string {
	var es []string
	for _, e := range d.GetEntries() {
		es = append(es, short(e.GetKey())+"="+short(e.GetValue()))
	}
	if len(es) > 4 {
		es = append(es[:3], fmt.Sprintf("… %d entries", len(d.GetEntries())))
	}
	s := "{" + strings.Join(es, ", ")
	if d.GetHitsAddend() != nil {
		s += fmt.Sprintf(" hits=%d", d.GetHitsAddend().GetValue())
	}
	if l := d.GetLimit(); l != nil {
		s += fmt.Sprintf(" limit=%d/%v", l.GetRequestsPerUnit(), l.GetUnit())
	}
	return s + "}"
}

func short(s string) string {
	if len(s) > 60 {
		return fmt.Sprintf("%s…(%d bytes)", s[:40], len(s))
	}
	return s
}
