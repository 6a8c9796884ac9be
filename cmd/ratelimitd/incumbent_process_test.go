package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// launchAs starts the test binary under the name prog (a link to it in a
// temporary directory, as the image's /bin/ratelimit is) with exactly env
// and args, and waits until it logs that it serves (which needs
// LOG_FORMAT=json or --log-format json, and info level). It returns the
// process, its gRPC address and its logs so far are in p.logs.
func launchAs(t *testing.T, prog string, env map[string]string, args ...string) *proc {
	t.Helper()
	link := filepath.Join(t.TempDir(), prog)
	if err := os.Symlink(binary(t), link); err != nil {
		t.Fatal(err)
	}
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	return spawn(t, prog, link, environ, false, args...).await(t)
}

// istioConfigMap lays root/ratelimit/config out as the kubelet mounts
// Istio's sample ConfigMap (key config.yaml): the data in a timestamped
// directory, ..data linked to it, config.yaml a link through ..data. Each
// call with a new version swaps ..data atomically, as an update does.
func istioConfigMap(t *testing.T, root string, version int, yaml string) {
	t.Helper()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, fmt.Sprintf("..2026_12_01_00_00_%02d.%d", version, version))
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "config.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(data), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "config.yaml")); os.IsNotExist(err) {
		if err := os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(dir, "config.yaml")); err != nil {
			t.Fatal(err)
		}
	}
}

// istioProcessEnv is Istio's sample environment (istioEnv) pointed at
// root and at loopback ports the kernel picks, with JSON logs to read the
// addresses from.
func istioProcessEnv(root string, extra ...string) map[string]string {
	return withEnv(istioEnv, append([]string{
		"RUNTIME_ROOT", root, "HOST", "127.0.0.1", "PORT", "0", "GRPC_HOST", "127.0.0.1", "GRPC_PORT", "0",
		"DEBUG_HOST", "127.0.0.1", "DEBUG_PORT", "0", "LOG_FORMAT", "json",
	}, extra...)...)
}

const istioV1 = `domain: istio
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`

// istioV2 adds a limit on path.
const istioV2 = istioV1 + `  - key: path
    rate_limit: {unit: minute, requests_per_unit: 1}
`

func ask(t *testing.T, client rlsv3.RateLimitServiceClient, key, value string) rlsv3.RateLimitResponse_Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, servertest.Request("istio", servertest.Desc(key, value)))
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s=%s): %v", key, value, err)
	}
	return resp.GetOverallCode()
}

// awaitPathLimited waits until the process p loaded a config that limits
// each path value to 1 (before, every path was unlimited): it asks twice
// for a new value every 20ms until the second ask is OVER_LIMIT, and fails
// the test, naming change, if that takes more than 15s.
func awaitPathLimited(t *testing.T, client rlsv3.RateLimitServiceClient, p *proc, change string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; ; i++ {
		v := fmt.Sprintf("/p%d", i)
		ask(t, client, "path", v)
		if ask(t, client, "path", v) == rlsv3.RateLimitResponse_OVER_LIMIT {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not loaded in 15s\n%s", change, p.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRunAsRatelimitWithIstiosEnvironment runs the binary as ratelimit
// with Istio's sample environment (a ConfigMap-style directory under
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config), on the memory backend and on
// a real redis-server: it answers from the ConfigMap's file, and reloads
// when the ConfigMap's ..data is swapped.
func TestRunAsRatelimitWithIstiosEnvironment(t *testing.T) {
	tests := []struct {
		name    string
		backend func(t *testing.T) ([]string, *redistest.Server)
		// warned is the startup warning's settings, "" for no warning.
		warned string
	}{
		{"memory", func(*testing.T) ([]string, *redistest.Server) { return []string{"BACKEND_TYPE", "memory"}, nil },
			"REDIS_SOCKET_TYPE: not used with BACKEND_TYPE=memory; REDIS_URL: not used with BACKEND_TYPE=memory"},
		{"redis", func(t *testing.T) ([]string, *redistest.Server) {
			r := redistest.Start(t)
			return []string{"REDIS_URL", r.Addr}, r
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "data")
			istioConfigMap(t, root, 1, istioV1)
			extra, redis := tt.backend(t)
			p := launchAs(t, "ratelimit", istioProcessEnv(root, extra...))
			if !strings.HasPrefix(p.grpcAddr, "127.0.0.1:") {
				t.Fatalf("gRPC on %q, want GRPC_HOST's 127.0.0.1", p.grpcAddr)
			}
			client := rlsClient(t, p.grpcAddr)
			for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
				if got := ask(t, client, "user", "alice"); got != want {
					t.Fatalf("call %d for user=alice: %v, want %v\n%s", i+1, got, want, p.logs)
				}
			}
			if redis != nil {
				n, err := redis.Client().DBSize(context.Background()).Result()
				if err != nil || n == 0 {
					t.Errorf("Redis holds %d keys (%v), want the bucket of user=alice", n, err)
				}
			}
			// Swap the ConfigMap: path gets a limit of 1 a minute. Until the
			// reload lands, every path is unlimited.
			istioConfigMap(t, root, 2, istioV2)
			awaitPathLimited(t, client, p, "the ConfigMap swap")
			var warned []string
			for _, line := range strings.Split(p.logs.String(), "\n") {
				var l struct{ Level, Msg, Settings string }
				if json.Unmarshal([]byte(line), &l) == nil && l.Level == "WARN" {
					warned = append(warned, l.Msg+": "+l.Settings)
				}
			}
			want := []string{"envoyproxy/ratelimit settings not honoured: " + tt.warned}
			if tt.warned == "" {
				want = nil
			}
			if !slices.Equal(warned, want) {
				t.Errorf("warnings %q, want %q", warned, want)
			}
		})
	}
}

// TestRunAsRatelimitRefusesAndWarns: run as ratelimit, a setting that
// would change what is limited stops the start with its name, and one
// that is not honoured is named in the one startup warning.
func TestRunAsRatelimitRefusesAndWarns(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	istioConfigMap(t, root, 1, istioV1)
	link := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.Symlink(binary(t), link); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(link)
	for k, v := range istioProcessEnv(root, "BACKEND_TYPE", "memory", "GRPC_UDS", "/tmp/ratelimit.sock") {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); err == nil || code != 2 || !strings.Contains(string(out), "GRPC_UDS") {
		t.Errorf("GRPC_UDS set: exit %d (%v), output\n%s\nwant exit 2 naming GRPC_UDS", code, err, out)
	}

	p := launchAs(t, "ratelimit", istioProcessEnv(root, "BACKEND_TYPE", "memory", "USE_STATSD", "true", "STATSD_HOST", "statsd"))
	var warnings []string
	for _, line := range strings.Split(p.logs.String(), "\n") {
		if strings.Contains(line, "envoyproxy/ratelimit settings not honoured") {
			warnings = append(warnings, line)
		}
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "USE_STATSD=") || !strings.Contains(warnings[0], "STATSD_HOST=") {
		t.Errorf("warnings %q, want one naming USE_STATSD and STATSD_HOST", warnings)
	}
}

// TestNativeNameWarnsOfIncumbentEnvironment: ratelimitd under its own
// name, with REDIS_URL set as for envoyproxy/ratelimit, stays on the memory
// backend but says so at start, naming the variable and the switch.
func TestNativeNameWarnsOfIncumbentEnvironment(t *testing.T) {
	dir := writeConfig(t, map[string]string{"a.yaml": istioV1})
	p := launchAs(t, "ratelimitd", map[string]string{"REDIS_URL": "127.0.0.1:6379", "GRPC_PORT": "8081"},
		"--config", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json")
	logs := p.logs.String()
	var warned bool
	for _, line := range strings.Split(logs, "\n") {
		var l struct {
			Level, Msg, Variables string
		}
		if json.Unmarshal([]byte(line), &l) == nil && strings.Contains(l.Msg, "set but not read") {
			warned = l.Level == "WARN" && l.Variables == "GRPC_PORT,REDIS_URL" && strings.Contains(l.Msg, "RATELIMITD_ENV_COMPAT=envoyproxy")
		}
	}
	if !warned {
		t.Errorf("no warning naming GRPC_PORT,REDIS_URL and RATELIMITD_ENV_COMPAT:\n%s", logs)
	}
	if !strings.Contains(logs, `"backend":"memory"`) {
		t.Errorf("want the memory backend (REDIS_URL is not read):\n%s", logs)
	}
}

// TestRunAsRatelimitFollowsTheRootLink runs the binary as ratelimit with
// envoyproxy/ratelimit's default RUNTIME_WATCH_ROOT=true and RUNTIME_ROOT
// a link to a release tree: pointing the link at a new release (a new
// link renamed over it, as `ln -sfn` does) reloads without a SIGHUP.
func TestRunAsRatelimitFollowsTheRootLink(t *testing.T) {
	base := t.TempDir()
	for i, yaml := range []string{istioV1, istioV2} {
		dir := filepath.Join(base, fmt.Sprintf("v%d", i+1), "ratelimit", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	current := filepath.Join(base, "current")
	if err := os.Symlink(filepath.Join(base, "v1"), current); err != nil {
		t.Fatal(err)
	}
	env := istioProcessEnv(current, "BACKEND_TYPE", "memory", "REDIS_URL", "", "REDIS_SOCKET_TYPE", "")
	delete(env, "RUNTIME_WATCH_ROOT") // the default, true
	p := launchAs(t, "ratelimit", env)
	client := rlsClient(t, p.grpcAddr)
	if got := [2]rlsv3.RateLimitResponse_Code{ask(t, client, "path", "/a"), ask(t, client, "path", "/a")}; got[1] != rlsv3.RateLimitResponse_OK {
		t.Fatalf("path unlimited before the swap: got %v", got)
	}
	tmp := current + ".tmp"
	if err := os.Symlink(filepath.Join(base, "v2"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, current); err != nil {
		t.Fatal(err)
	}
	awaitPathLimited(t, client, p, "the swap of RUNTIME_ROOT")
}
