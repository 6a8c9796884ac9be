package daemon_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/internal/xdsconfig"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

const egDomain = "default/eg/http"

// egCall asks for rule 0 of xdstest.EGConfig on route, hits 1, and returns
// the overall code.
func egCall(t *testing.T, r *running, route string) rlsv3.RateLimitResponse_Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := servertest.Request(egDomain, servertest.Desc(route, route, "rule-0-match-0", "rule-0-match-0"))
	req.HitsAddend = 1
	resp, err := rlsv3.NewRateLimitServiceClient(r.conn).ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.GetOverallCode()
}

// eventually polls cond every 10 ms for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// limitsSource is what /limits.json says about the config's source.
func limitsSource(t *testing.T, base string) (source, version string) {
	t.Helper()
	_, body := servertest.Get(t, base+"/limits.json")
	var p struct {
		Source  string `json:"config_source"`
		Version string `json:"config_version"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("/limits.json: %v\n%s", err, body)
	}
	return p.Source, p.Version
}

// TestConfigFromXDS runs a daemon as Envoy Gateway deploys
// envoyproxy/ratelimit: config over mutual TLS from a go-control-plane
// management server keyed on node id envoy-ratelimit, serving before the
// first push (FORCE_START_WITHOUT_INITIAL_CONFIG). Until then every call is
// OK; a push puts EG-shaped limits in force without a restart; a new
// version keeps the buckets of rules it did not change; an invalid push is
// NACKed and changes nothing; the server going away and coming back is
// survived on the last good config.
func TestConfigFromXDS(t *testing.T) {
	certs := xdstest.NewCerts(t)
	xs := xdstest.Start(t, xdstest.Options{TLS: certs})
	r := run(t, daemon.Config{
		XDS: xdsconfig.Options{
			Addr: xs.Addr(), NodeID: xdstest.EGNodeID,
			TLS:                  &xdsconfig.TLSFiles{CAFile: certs.CA.File, CertFile: certs.ClientCert, KeyFile: certs.ClientKey},
			ConnectRetryInterval: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		},
		StartWithoutConfig: true,
	}, "")
	base := "http://" + r.d.HTTPAddr().String()

	// Before the first push: serving, every call OK.
	if st := healthOf(t, r.conn); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health before the first push = %v, want SERVING (StartWithoutConfig)", st)
	}
	if code, body := servertest.Get(t, base+"/healthcheck"); code != http.StatusOK || body != "OK" {
		t.Errorf("/healthcheck before the first push = %d %q, want 200 OK", code, body)
	}
	if code, body := servertest.Get(t, base+"/readyz"); code != http.StatusOK || !strings.Contains(body, "no config from the xDS server") {
		t.Errorf("/readyz before the first push = %d %q, want 200 saying no config came yet", code, body)
	}
	for range 12 {
		if c := egCall(t, r, "route-a"); c != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call before the first push = %v, want OK (as for an unknown domain)", c)
		}
	}

	// The first push: rule 0 is 10 per minute.
	xs.SetSnapshot(xdstest.EGNodeID, "1", xdstest.EGConfig(egDomain, "route-a", false))
	xs.WaitForACK(t, "1")
	eventually(t, "the config of version 1 in force", func() bool {
		s, v := limitsSource(t, base)
		return s == "xds" && v == "1"
	})
	for i := range 6 {
		if c := egCall(t, r, "route-a"); c != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d under version 1 = %v, want OK", i, c)
		}
	}
	if m := scrape(t, base+"/metrics"); m[`ratelimitd_config_source_info{source="xds",version="1"}`] != 1 || m["ratelimitd_xds_connected"] != 1 {
		t.Errorf("metrics: config_source_info %v, xds_connected %v; want 1 and 1",
			m[`ratelimitd_config_source_info{source="xds",version="1"}`], m["ratelimitd_xds_connected"])
	}

	// Version 2 adds a route; rule 0 of route-a is unchanged, so its
	// bucket keeps the 6 spent: 4 more are admitted, then OVER_LIMIT.
	xs.SetSnapshot(xdstest.EGNodeID, "2", xdstest.EGConfig(egDomain, "route-a", false), xdstest.EGConfig("other/eg/http", "route-b", false))
	xs.WaitForACK(t, "2")
	eventually(t, "version 2 in force", func() bool { _, v := limitsSource(t, base); return v == "2" })
	for i := range 4 {
		if c := egCall(t, r, "route-a"); c != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d after version 2 = %v, want OK (4 left of 10)", i, c)
		}
	}
	if c := egCall(t, r, "route-a"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("11th call in the minute = %v, want OVER_LIMIT: the bucket kept across versions", c)
	}

	// A push whose EG domain cannot be loaded applies the rest (a new
	// domain) and is ACKed; the refused domain keeps version 2's config.
	bad := &rlsconfv3.RateLimitConfig{Name: egDomain, Domain: egDomain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "route-a", Value: "route-a", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_UNKNOWN, RequestsPerUnit: 5}}}}}}
	xs.SetSnapshot(xdstest.EGNodeID, "3", bad, xdstest.EGConfig("third/eg/http", "route-t", false))
	xs.WaitForACK(t, "3")
	eventually(t, "the refusal counted", func() bool {
		m := scrape(t, base+"/metrics")
		return m["ratelimitd_xds_refused_domains"] == 1 && m["ratelimitd_xds_domain_refusals_total"] == 1
	})
	if _, v := limitsSource(t, base); v != "3" {
		t.Errorf("version after the partial push = %q, want 3", v)
	}
	if c := egCall(t, r, "route-a"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("call after its domain was refused = %v, want OVER_LIMIT (version 2 of it in force)", c)
	}
	if m := scrape(t, base+"/metrics"); m["ratelimitd_xds_nacks_total"] != 0 {
		t.Errorf("ratelimitd_xds_nacks_total = %v after a partial push, want 0", m["ratelimitd_xds_nacks_total"])
	}

	// The server goes away: the config stays, calls are still decided.
	xs.Stop()
	eventually(t, "the disconnect seen", func() bool { return scrape(t, base+"/metrics")["ratelimitd_xds_connected"] == 0 })
	if c := egCall(t, r, "route-a"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("call while the server is away = %v, want OVER_LIMIT (last good config)", c)
	}
	if code, body := servertest.Get(t, base+"/readyz"); code != http.StatusOK || !strings.Contains(body, `stays in force`) {
		t.Errorf("/readyz while the server is away = %d %q, want 200 saying the last config stays", code, body)
	}
	if code, _ := servertest.Get(t, base+"/healthcheck"); code != http.StatusOK {
		t.Errorf("/healthcheck while the server is away = %d, want 200", code)
	}
	xs.Restart(t)
	xs.SetSnapshot(xdstest.EGNodeID, "4", xdstest.EGConfig(egDomain, "route-c", false))
	xs.WaitForACK(t, "4")
	eventually(t, "version 4 in force after the restart", func() bool { _, v := limitsSource(t, base); return v == "4" })
	if c := egCall(t, r, "route-c"); c != rlsv3.RateLimitResponse_OK {
		t.Errorf("call on route-c under version 4 = %v, want OK", c)
	}
}

// TestXDSWithoutStartWithoutConfig: without StartWithoutConfig the daemon
// is not ready, and says why, until the first push; then it serves.
func TestXDSWithoutStartWithoutConfig(t *testing.T) {
	xs := xdstest.Start(t, xdstest.Options{})
	r := run(t, daemon.Config{XDS: xdsconfig.Options{Addr: xs.Addr(), NodeID: xdstest.AIGatewayNodeID,
		ConnectRetryInterval: 20 * time.Millisecond}}, "")
	base := "http://" + r.d.HTTPAddr().String()
	if st := healthOf(t, r.conn); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health before the first push = %v, want NOT_SERVING", st)
	}
	if code, _ := servertest.Get(t, base+"/healthcheck"); code != http.StatusInternalServerError {
		t.Errorf("/healthcheck before the first push = %d, want 500", code)
	}
	if code, body := servertest.Get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for the first config from the xDS server") {
		t.Errorf("/readyz before the first push = %d %q, want 503 waiting for the first config", code, body)
	}
	xs.SetSnapshot(xdstest.AIGatewayNodeID, "1", xdstest.EGConfig(egDomain, "route-a", false))
	xs.WaitForACK(t, "1")
	eventually(t, "SERVING after the first push", func() bool { return healthOf(t, r.conn) == healthpb.HealthCheckResponse_SERVING })
	if code, body := servertest.Get(t, base+"/healthcheck"); code != http.StatusOK || body != "OK" {
		t.Errorf("/healthcheck after the first push = %d %q, want 200 OK", code, body)
	}
	if c := egCall(t, r, "route-a"); c != rlsv3.RateLimitResponse_OK {
		t.Errorf("call after the first push = %v, want OK", c)
	}
}

// TestXDSWrongCAFailsClosed: a management server whose certificate is not
// signed by the CA given is never trusted: no config is taken from it, and
// readiness says why.
func TestXDSWrongCAFailsClosed(t *testing.T) {
	certs := xdstest.NewCerts(t)
	xs := xdstest.Start(t, xdstest.Options{TLS: certs})
	xs.SetSnapshot(xdstest.EGNodeID, "1", xdstest.EGConfig(egDomain, "route-a", false))
	other := xdstest.NewCA(t, t.TempDir(), "another CA")
	r := run(t, daemon.Config{XDS: xdsconfig.Options{Addr: xs.Addr(), NodeID: xdstest.EGNodeID,
		TLS:                  &xdsconfig.TLSFiles{CAFile: other.File, CertFile: certs.ClientCert, KeyFile: certs.ClientKey},
		ConnectRetryInterval: 20 * time.Millisecond}}, "")
	base := "http://" + r.d.HTTPAddr().String()
	eventually(t, "readiness naming the certificate problem", func() bool {
		_, body := servertest.Get(t, base+"/readyz")
		return strings.Contains(body, "certificate")
	})
	if code, _ := servertest.Get(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with a wrong CA = %d, want 503", code)
	}
	if got := len(xs.Requests()); got != 0 {
		t.Errorf("the management server saw %d requests over an untrusted connection, want 0", got)
	}
	if st := healthOf(t, r.conn); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health = %v, want NOT_SERVING", st)
	}
}

// TestXDSRotatedToAWrongCAKeepsTheConfig: the CA file is replaced by one
// that did not sign the management server's certificate (a botched
// rotation) and the connection is re-made: the client refuses the server,
// the last good config keeps deciding, and readiness says why.
func TestXDSRotatedToAWrongCAKeepsTheConfig(t *testing.T) {
	certs := xdstest.NewCerts(t)
	xs := xdstest.Start(t, xdstest.Options{TLS: certs})
	xs.SetSnapshot(xdstest.EGNodeID, "1", xdstest.EGConfig(egDomain, "route-a", false))
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	copyFile(t, certs.CA.File, caFile)
	r := run(t, daemon.Config{XDS: xdsconfig.Options{Addr: xs.Addr(), NodeID: xdstest.EGNodeID,
		TLS:                  &xdsconfig.TLSFiles{CAFile: caFile, CertFile: certs.ClientCert, KeyFile: certs.ClientKey},
		ConnectRetryInterval: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}}, "")
	base := "http://" + r.d.HTTPAddr().String()
	xs.WaitForACK(t, "1")
	eventually(t, "version 1 in force", func() bool { _, v := limitsSource(t, base); return v == "1" })
	for range 10 {
		egCall(t, r, "route-a")
	}
	if c := egCall(t, r, "route-a"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("11th call under version 1 = %v, want OVER_LIMIT", c)
	}

	copyFile(t, xdstest.NewCA(t, t.TempDir(), "another CA").File, caFile)
	xs.Stop()
	xs.Restart(t)
	eventually(t, "readiness naming the certificate problem", func() bool {
		_, body := servertest.Get(t, base+"/readyz")
		return strings.Contains(body, "certificate") && strings.Contains(body, `the config of version "1" stays in force`)
	})
	if c := egCall(t, r, "route-a"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("call with the server untrusted = %v, want OVER_LIMIT (version 1 still in force)", c)
	}
	if st := healthOf(t, r.conn); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health = %v, want SERVING on the last good config", st)
	}
}

// copyFile copies src to dst, replacing dst atomically.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesTwoSources: files and xDS are two sources of one config.
func TestNewRefusesTwoSources(t *testing.T) {
	_, err := daemon.New(daemon.Config{ConfigPath: t.TempDir(), XDS: xdsconfig.Options{Addr: "127.0.0.1:1"},
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, nil)
	if err == nil || !strings.Contains(err.Error(), "two sources") {
		t.Errorf("New with ConfigPath and XDS = %v, want an error about two sources", err)
	}
}
