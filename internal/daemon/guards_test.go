package daemon_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/redact"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/internal/xdsconfig"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

// clientCall asks oneAnHour's rule for client value, with the override o
// when set.
func clientCall(value string, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) *rlsv3.RateLimitRequest {
	req := servertest.Request("api", servertest.Desc("client", value))
	req.Descriptors[0].Limit = o
	return req
}

// TestDaemonAnswersPerPolicy: through the daemon's gRPC server, an
// invalid override and a request over MaxMessageBytes are answered per
// the policies, and counted in the metrics.
func TestDaemonAnswersPerPolicy(t *testing.T) {
	invalid := &ratelimitv3.RateLimitDescriptor_RateLimitOverride{Unit: typev3.RateLimitUnit_MINUTE} // requests_per_unit 0
	tests := []struct {
		name        string
		cfg         daemon.Config
		req         *rlsv3.RateLimitRequest
		wantCode    codes.Code
		wantOverall rlsv3.RateLimitResponse_Code
		wantMetric  string
	}{
		{"invalid override, default", daemon.Config{}, clientCall("a", invalid), codes.OK, rlsv3.RateLimitResponse_OVER_LIMIT,
			`ratelimitd_request_policy_total{action="deny",cause="invalid_override"}`},
		{"invalid override, ignore", daemon.Config{OnInvalidOverride: server.InvalidOverrideIgnore}, clientCall("a", invalid), codes.OK, rlsv3.RateLimitResponse_OK,
			`ratelimitd_request_policy_total{action="ignore",cause="invalid_override"}`},
		{"invalid override, error", daemon.Config{OnInvalidOverride: server.InvalidOverrideError}, clientCall("a", invalid), codes.InvalidArgument, 0,
			`ratelimitd_request_policy_total{action="error",cause="invalid_override"}`},
		{"oversized, default", daemon.Config{MaxMessageBytes: 2048}, clientCall(strings.Repeat("x", 3000), nil), codes.OK, rlsv3.RateLimitResponse_OVER_LIMIT,
			`ratelimitd_request_policy_total{action="deny",cause="oversized_request"}`},
		{"oversized, error", daemon.Config{MaxMessageBytes: 2048, OnOversizedRequest: server.OversizedError}, clientCall(strings.Repeat("x", 3000), nil), codes.ResourceExhausted, 0,
			`ratelimitd_request_policy_total{action="error",cause="oversized_request"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, httpAddr := start(t, tt.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, tt.req)
			if status.Code(err) != tt.wantCode || tt.wantCode == codes.OK && resp.GetOverallCode() != tt.wantOverall {
				t.Errorf("ShouldRateLimit = %v, %v; want code %v, overall %v", resp.GetOverallCode(), err, tt.wantCode, tt.wantOverall)
			}
			if got := scrape(t, "http://"+httpAddr+"/metrics")[tt.wantMetric]; got != 1 {
				t.Errorf("%s = %v, want 1", tt.wantMetric, got)
			}
		})
	}
}

// TestDaemonRedactsValues: with RedactValues, /limits.json shows a
// bucket's value as its hash and nowhere as it is; every answer of the
// page says nosniff.
func TestDaemonRedactsValues(t *testing.T) {
	const key = "sk-live-0123456789"
	conn, httpAddr := start(t, daemon.Config{RedactValues: redact.Hash})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, clientCall(key, nil)); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(key))
	want := "client=sha256:" + hex.EncodeToString(sum[:4])
	for _, path := range []string{"/limits.json", "/limits"} {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("GET %s: X-Content-Type-Options %q, want nosniff", path, got)
		}
		_, body := servertest.Get(t, "http://"+httpAddr+path)
		if strings.Contains(body, key) || !strings.Contains(body, want) {
			t.Errorf("GET %s shows the value as it is, or not as %q:\n%s", path, want, body)
		}
	}
}

// TestNewRefusesConfigOverTheCap: a directory whose files together are
// over MaxConfigBytes is refused at start, with the total and the cap.
func TestNewRefusesConfigOverTheCap(t *testing.T) {
	files := map[string]string{}
	for i := range 3 {
		files[fmt.Sprintf("d%d.yaml", i)] = fmt.Sprintf("domain: d%d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n# %s\n", i, strings.Repeat("x", 500))
	}
	dir := servertest.DescriptorDir(t, files)
	cfg := daemon.Config{ConfigPath: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MaxConfigBytes: 1024}
	_, err := daemon.New(cfg, slog.New(slog.DiscardHandler))
	if !errors.Is(err, config.ErrTooLarge) || !strings.Contains(err.Error(), "3 files of") || !strings.Contains(err.Error(), "more than the cap of 1024 bytes") {
		t.Errorf("New = %v, want config.ErrTooLarge naming 3 files and the cap", err)
	}
	cfg.MaxConfigBytes = 0 // the default, 16 MiB
	d, err := daemon.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New under the default cap = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d.Run(ctx) // releases what New opened
}

// TestXDSPushOverTheCap: a push over MaxConfigBytes is NACKed naming the
// cap, and the config in force stays.
func TestXDSPushOverTheCap(t *testing.T) {
	xs := xdstest.Start(t, xdstest.Options{})
	r := run(t, daemon.Config{MaxConfigBytes: 1500, StartWithoutConfig: true,
		XDS: xdsconfig.Options{Addr: xs.Addr(), NodeID: xdstest.EGNodeID, ConnectRetryInterval: 20 * time.Millisecond}}, "")
	base := "http://" + r.d.HTTPAddr().String()
	xs.SetSnapshot(xdstest.EGNodeID, "1", xdstest.EGConfig(egDomain, "route-a", false))
	xs.WaitForACK(t, "1")
	var big []*rlsconfv3.RateLimitConfig
	for i := range 20 {
		big = append(big, xdstest.EGConfig(fmt.Sprintf("other%d/eg/http", i), "route-b", false))
	}
	xs.SetSnapshot(xdstest.EGNodeID, "2", big...)
	if msg := xs.WaitForNACK(t); !strings.Contains(msg, "more than the cap of 1500 bytes") {
		t.Errorf("NACK %q does not name the cap", msg)
	}
	if _, v := limitsSource(t, base); v != "1" {
		t.Errorf("version after the NACK = %q, want 1", v)
	}
}
