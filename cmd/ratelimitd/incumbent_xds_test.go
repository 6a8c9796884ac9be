package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

// listenerAddr is the address the process logged for its extra listener
// name ("metrics", "debug").
func listenerAddr(t *testing.T, p *proc, name string) string {
	t.Helper()
	for _, line := range strings.Split(p.logs.String(), "\n") {
		var l struct{ Msg, Listener, Addr string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "listening" && l.Listener == name {
			return l.Addr
		}
	}
	t.Fatalf("no %s listener in the logs\n%s", name, p.logs)
	return ""
}

// egRule0 asks for rule 0 of xdstest.EGConfig on route.
func egRule0(t *testing.T, client rlsv3.RateLimitServiceClient, domain, route string) rlsv3.RateLimitResponse_Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, servertest.Request(domain, servertest.Desc(route, route, "rule-0-match-0", "rule-0-match-0")))
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.GetOverallCode()
}

// TestRunAsRatelimitWithEGsEnvironment runs the binary as ratelimit with
// the environment Envoy Gateway renders (egEnv), its paths and ports
// pointed at temporary ones: config over mutual TLS (TLS 1.3, client
// certificate required) from a go-control-plane management server keyed on
// envoy-ratelimit, gRPC over TLS, a real redis-server, Prometheus with the
// incumbent's names. It serves before the first push, applies EG-shaped
// snapshots, NACKs a bad one and keeps the last good config.
func TestRunAsRatelimitWithEGsEnvironment(t *testing.T) {
	certs := xdstest.NewCerts(t)
	xs := xdstest.Start(t, xdstest.Options{TLS: certs})
	redis := redistest.Start(t)
	env := withEnv(egEnv,
		"CONFIG_GRPC_XDS_SERVER_URL", xs.Addr(),
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", certs.ClientCert, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", certs.ClientKey,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", certs.CA.File,
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "50ms",
		"GRPC_SERVER_TLS_CERT", certs.ServerCert, "GRPC_SERVER_TLS_KEY", certs.ServerKey, "GRPC_SERVER_TLS_CA_CERT", certs.CA.File,
		"REDIS_URL", redis.Addr, "PROMETHEUS_ADDR", "127.0.0.1:0",
		"RUNTIME_ROOT", t.TempDir(),
		"HOST", "127.0.0.1", "PORT", "0", "GRPC_HOST", "127.0.0.1", "GRPC_PORT", "0", "DEBUG_HOST", "127.0.0.1", "DEBUG_PORT", "0",
		"LOG_FORMAT", "json")
	p := launchAs(t, "ratelimit", env)

	ca, err := os.ReadFile(certs.CA.File)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	conn := servertest.Dial(t, p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13})))
	client := rlsv3.NewRateLimitServiceClient(conn)
	const domain = "default/eg/http"
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 15s\n%s", what, p.logs)
			}
		}
	}

	// Serving before the first push (FORCE_START_WITHOUT_INITIAL_CONFIG),
	// once Redis is ready: /healthcheck as EG's probes ask it.
	waitFor("/healthcheck 200", func() bool {
		code, _ := servertest.Get(t, "http://"+p.httpAddr+"/healthcheck")
		return code == http.StatusOK
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health(ratelimit) = %v, %v; want SERVING", h.GetStatus(), err)
	}
	if c := egRule0(t, client, domain, "route-a"); c != rlsv3.RateLimitResponse_OK {
		t.Errorf("call before the first push = %v, want OK", c)
	}

	xs.SetSnapshot(xdstest.EGNodeID, "1", xdstest.EGConfig(domain, "route-a", false))
	req := xs.WaitForACK(t, "1")
	if req.NodeID != xdstest.EGNodeID || req.ClientCert != "ratelimitd-1" {
		t.Errorf("ACK from node %q with client certificate %q, want %q and ratelimitd-1", req.NodeID, req.ClientCert, xdstest.EGNodeID)
	}
	// Rule 0 is 10 per minute: wait until the push is in force (the
	// first OVER_LIMIT), then count nothing more than 10 were admitted.
	admitted := 0
	waitFor("version 1 in force", func() bool {
		if egRule0(t, client, domain, "route-a") == rlsv3.RateLimitResponse_OK {
			admitted++
			return false
		}
		return true
	})
	if admitted > 10+1 { // the call before the push was decided on the empty config
		t.Errorf("%d calls admitted before OVER_LIMIT on a 10-per-minute rule", admitted)
	}

	metrics := "http://" + listenerAddr(t, p, "metrics") + "/metrics"
	_, body := servertest.Get(t, metrics)
	for _, want := range []string{
		`ratelimit_service_rate_limit_over_limit{domain="default/eg/http",key1="route-a_route-a",key2="rule-0-match-0_rule-0-match-0"} 1`,
		`ratelimit_service_config_load_success 2`,
		`ratelimitd_config_source_info{source="xds",version="1"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	// A push whose domain cannot be loaded is ACKed, the refusal logged
	// with the descriptor; the limits of version 1 of the domain stay.
	bad := xdstest.EGConfig(domain, "route-a", false)
	bad.Descriptors[0].Descriptors[0].RateLimit.Unit = 99
	xs.SetSnapshot(xdstest.EGNodeID, "2", bad)
	xs.WaitForACK(t, "2")
	waitFor("the refusal logged", func() bool {
		return strings.Contains(p.logs.String(), domain+" > route-a=route-a > rule-0-match-0=rule-0-match-0")
	})
	if c := egRule0(t, client, domain, "route-a"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("call after the refusal = %v, want OVER_LIMIT (version 1 in force)", c)
	}
	n, err := redis.Client().DBSize(context.Background()).Result()
	if err != nil || n == 0 {
		t.Errorf("Redis holds %d keys (%v), want the buckets", n, err)
	}
}

// TestRunAsRatelimitWithAIGatewaysEnvironment runs the binary as
// ratelimit with Envoy AI Gateway's environment (aiGatewayEnv: plaintext
// xDS, node id envoy-ai-gateway-ratelimit, no start without config) on a
// real redis-server. Not ready until the first push; then quota-mode
// descriptors, as AI Gateway marks every level, decide as the incumbent
// does: a request is OVER_LIMIT only when all its candidate backends are.
func TestRunAsRatelimitWithAIGatewaysEnvironment(t *testing.T) {
	xs := xdstest.Start(t, xdstest.Options{})
	redis := redistest.Start(t)
	env := withEnv(aiGatewayEnv,
		"CONFIG_GRPC_XDS_SERVER_URL", xs.Addr(), "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "50ms",
		"REDIS_URL", redis.Addr, "RUNTIME_ROOT", t.TempDir(),
		"HOST", "127.0.0.1", "PORT", "0", "GRPC_HOST", "127.0.0.1", "GRPC_PORT", "0", "DEBUG_HOST", "127.0.0.1", "DEBUG_PORT", "0",
		"LOG_FORMAT", "json", "LOG_LEVEL", "info")
	p := launchAs(t, "ratelimit", env)
	if code, _ := servertest.Get(t, "http://"+p.httpAddr+"/healthcheck"); code != http.StatusInternalServerError {
		t.Errorf("/healthcheck before the first push = %d, want 500 (no FORCE_START_WITHOUT_INITIAL_CONFIG)", code)
	}

	backend := func(name string, n uint32) *rlsconfv3.RateLimitDescriptor {
		return &rlsconfv3.RateLimitDescriptor{Key: "backend_name", Value: name, QuotaMode: true,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "model_name_override", Value: "gpt-4o", QuotaMode: true,
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: n}}}}
	}
	xs.SetSnapshot(xdstest.AIGatewayNodeID, "1", &rlsconfv3.RateLimitConfig{Name: xdstest.AIGatewayDomain, Domain: xdstest.AIGatewayDomain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{backend("default/openai", 1), backend("default/azure", 3)}})
	if req := xs.WaitForACK(t, "1"); req.NodeID != xdstest.AIGatewayNodeID {
		t.Errorf("ACK from node %q, want %q", req.NodeID, xdstest.AIGatewayNodeID)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, _ := servertest.Get(t, "http://"+p.httpAddr+"/healthcheck"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck not 200 within 15s of the push\n%s", p.logs)
		}
	}

	client := rlsClient(t, p.grpcAddr)
	req := servertest.Request(xdstest.AIGatewayDomain,
		servertest.Desc("backend_name", "default/openai", "model_name_override", "gpt-4o"),
		servertest.Desc("backend_name", "default/azure", "model_name_override", "gpt-4o"))
	type answer struct{ overall, openai, azure rlsv3.RateLimitResponse_Code }
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	// openai allows 1 a minute, azure 3: the first call passes both; the
	// next two are OK on azure's room alone; then both are over.
	for i, want := range []answer{{ok, ok, ok}, {ok, over, ok}, {ok, over, ok}, {over, over, over}} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := client.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		st := resp.GetStatuses()
		got := answer{overall: resp.GetOverallCode()}
		if len(st) == 2 {
			got.openai, got.azure = st[0].GetCode(), st[1].GetCode()
		}
		if got != want {
			t.Errorf("call %d: overall %v, openai %v, azure %v; want %v, %v, %v", i+1, got.overall, got.openai, got.azure, want.overall, want.openai, want.azure)
		}
	}
}
