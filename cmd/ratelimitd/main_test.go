package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

const fivePerMinute = `domain: api
descriptors:
  - key: model
    value: gpt-4o
    rate_limit: {unit: minute, requests_per_unit: 5, name: gpt-4o}
`

// writeConfig is the config directory of a run or a process, holding
// files (name → descriptor YAML): servertest.DescriptorDir's, removed when
// the test ends. It fails the test if a file cannot be written.
func writeConfig(t *testing.T, files map[string]string) string {
	t.Helper()
	return servertest.DescriptorDir(t, files)
}

// addrWatcher is a log writer that remembers where the server listens.
type addrWatcher struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ready chan [2]string
}

func newAddrWatcher() *addrWatcher { return &addrWatcher{ready: make(chan [2]string, 1)} }

func (w *addrWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		var line struct {
			Msg      string `json:"msg"`
			GRPCAddr string `json:"grpc_addr"`
			HTTPAddr string `json:"http_addr"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "ratelimitd started" {
			w.ready <- [2]string{line.GRPCAddr, line.HTTPAddr}
		}
	}
	return len(p), nil
}

func (w *addrWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// startRun runs the whole program in-process on loopback ports and returns
// its gRPC and HTTP addresses; cancel stops it and waitErr returns run's error.
func startRun(t *testing.T, extra ...string) (grpcAddr, httpAddr string, cancel func(), waitErr func() error) {
	t.Helper()
	return startRunWith(t, map[string]string{"api.yaml": fivePerMinute}, extra...)
}

// startRunWith is startRun with the config files given.
func startRunWith(t *testing.T, files map[string]string, extra ...string) (grpcAddr, httpAddr string, cancel func(), waitErr func() error) {
	t.Helper()
	dir := writeConfig(t, files)
	// GOMAXPROCS is the process's, and tests may run several servers in
	// this one: none of them tunes it (the process tests' binaries do).
	args := append([]string{"--config", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json", "--adaptive-procs=false"}, extra...)
	ctx, cancelCtx := context.WithCancel(context.Background())
	logs := newAddrWatcher()
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, func(string) string { return "" }, io.Discard, logs) }()
	select {
	case addrs := <-logs.ready:
		var once sync.Once
		var err error
		waitErr = func() error {
			once.Do(func() { err = <-done })
			return err
		}
		t.Cleanup(func() { cancelCtx(); waitErr() })
		return addrs[0], addrs[1], cancelCtx, waitErr
	case err := <-done:
		cancelCtx()
		t.Fatalf("run returned before serving: %v\nlogs:\n%s", err, logs)
	case <-time.After(10 * time.Second):
		cancelCtx()
		t.Fatalf("server did not start in 10s; logs:\n%s", logs)
	}
	return
}

// rlsClient is a RateLimitService client of the server at addr on a
// connection of its own (servertest.Dial's: it connects at the first call
// and is closed when the test ends).
func rlsClient(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsv3.NewRateLimitServiceClient(servertest.Dial(t, addr))
}

func TestServeAnswersHealthAndLimits(t *testing.T) {
	grpcAddr, httpAddr, cancel, waitErr := startRun(t)
	conn := servertest.Dial(t, grpcAddr)
	ctx := context.Background()

	hc := healthpb.NewHealthClient(conn)
	for _, name := range []string{"", "ratelimit"} {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q = %v, %v; want SERVING", name, resp.GetStatus(), err)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, _ := servertest.Get(t, "http://"+httpAddr+path); code != http.StatusOK {
			t.Errorf("GET %s = %d, want 200", path, code)
		}
	}

	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := servertest.Request("api", servertest.Desc("model", "gpt-4o"))
	var remaining []uint32
	for range 5 {
		resp, err := rls.ShouldRateLimit(ctx, req)
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit = %v, %v; want OK", resp.GetOverallCode(), err)
		}
		remaining = append(remaining, resp.GetStatuses()[0].GetLimitRemaining())
	}
	if got := remaining; !slices.Equal(got, []uint32{4, 3, 2, 1, 0}) {
		t.Errorf("limit_remaining = %v, want [4 3 2 1 0]", got)
	}
	resp, err := rls.ShouldRateLimit(ctx, req)
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("6th ShouldRateLimit = %v, %v; want OVER_LIMIT", resp.GetOverallCode(), err)
	}
	var retry string
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == "retry-after" {
			retry = h.GetValue()
		}
	}
	if retry == "" || retry == "0" {
		t.Errorf("Retry-After = %q, want at least 1", retry)
	}

	cancel()
	if err := waitErr(); err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	noEnv := func(string) string { return "" }
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no config", nil, nil, "--config is required"},
		{"bad retry-after", []string{"--config", "x", "--retry-after", "later"}, nil, `--retry-after "later"`},
		{"bad env duration", []string{"--config", "x"}, map[string]string{"RATELIMITD_SHUTDOWN_TIMEOUT": "soon"}, "RATELIMITD_SHUTDOWN_TIMEOUT"},
		{"missing config dir", []string{"--config", filepath.Join(t.TempDir(), "nope")}, nil, "nope"},
		{"bad dynamic-metadata", []string{"--config", "x", "--dynamic-metadata", "some"}, nil, `--dynamic-metadata "some"`},
		{"negative stream workers", []string{"--config", "x", "--grpc-stream-workers", "-1"}, nil, "--grpc-stream-workers -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := noEnv
			if tt.env != nil {
				getenv = func(k string) string { return tt.env[k] }
			}
			err := run(context.Background(), tt.args, getenv, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
			}
		})
	}
}

func TestEnvironmentSetsFlags(t *testing.T) {
	env := map[string]string{"RATELIMITD_CONFIG": "/etc/rl", "RATELIMITD_GRPC_ADDR": "127.0.0.1:9999", "RATELIMITD_MAX_DESCRIPTORS": "7"}
	c, err := parseServeFlags([]string{"--grpc-addr", "127.0.0.1:7777"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.ConfigPath != "/etc/rl" || c.GRPCAddr != "127.0.0.1:7777" || c.Limits.MaxDescriptors != 7 {
		t.Errorf("config %q, grpc %q, max descriptors %d; want /etc/rl, the flag's 127.0.0.1:7777, 7",
			c.ConfigPath, c.GRPCAddr, c.Limits.MaxDescriptors)
	}
}

func TestValidate(t *testing.T) {
	good := writeConfig(t, map[string]string{"api.yaml": fivePerMinute})
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"validate", good}, os.Getenv, &out, &errOut); err != nil {
		t.Fatalf("validate good config: %v\n%s", err, errOut.String())
	}
	if got, want := out.String(), "api: 1 rules from api.yaml\n"; got != want {
		t.Errorf("validate output = %q, want %q", got, want)
	}

	// Files that mean something else under envoyproxy/ratelimit load, with
	// a warning each on stderr.
	warned := writeConfig(t, map[string]string{"api.yaml": "domain: api\ndescriptors:\n" +
		"  - {key: m, value: a*, quota_mode: true, metadata: {x: 1}, rate_limit: {unit: second, requests_per_unit: 1}}\n" +
		"  - {key: m, value: ab*, rate_limit: {unit: second, requests_per_unit: 1}}\n"})
	out.Reset()
	errOut.Reset()
	if err := run(context.Background(), []string{"validate", warned}, os.Getenv, &out, &errOut); err != nil {
		t.Fatalf("validate warned config: %v\n%s", err, errOut.String())
	}
	if got, want := out.String(), "api: 2 rules from api.yaml (1 in quota mode, 1 with metadata)\n"; got != want {
		t.Errorf("validate output = %q, want %q", got, want)
	}
	if msg := errOut.String(); !strings.HasPrefix(msg, "warning: ") || !strings.Contains(msg, "api.yaml:4:") || !strings.Contains(msg, "first match in file order") {
		t.Errorf("validate warnings = %q, want the wildcard order at api.yaml:4", msg)
	}

	bad := writeConfig(t, map[string]string{"api.yaml": "domain: api\ndescriptors:\n  - key: model\n    rate_limit: {unit: minutes, requests_per_unit: 5}\n"})
	out.Reset()
	errOut.Reset()
	err := run(context.Background(), []string{"validate", bad}, os.Getenv, &out, &errOut)
	if err == nil {
		t.Fatal("validate bad config: nil error")
	}
	if msg := errOut.String(); !strings.Contains(msg, "api.yaml:4:") || !strings.Contains(msg, `"minutes"`) {
		t.Errorf("validate bad config printed %q, want file:line and the bad unit", msg)
	}
}
