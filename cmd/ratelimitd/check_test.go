package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/goldentest"
)

// golden compares got with testdata/<name>, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if want, differ := goldentest.Compare(t, path, got); differ {
		t.Errorf("output differs from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// TestCheckGolden runs check against a real server (gpt-4o: 5 per minute,
// burst 5), in order: each step sees the bucket the steps before left.
// The server's clock is real, but the steps take far less than the
// second that would change a rounded-up reset.
func TestCheckGolden(t *testing.T) {
	grpcAddr, _, _, _ := startRun(t)
	steps := []struct {
		golden string
		args   []string
	}{
		// 2 of 5 taken: 3 left, full again in 24 s.
		{"check/ok.golden", []string{"--domain", "api", "-d", "model=gpt-4o", "--hits", "2"}},
		// 1 more: 2 left; an unknown model has no limit.
		{"check/ok.json.golden", []string{"--domain", "api", "-d", "model=gpt-4o", "-d", "model=llama", "--json"}},
		// 3 more do not fit: denied, with Retry-After and the rule in the metadata.
		{"check/over_limit.golden", []string{"--domain", "api", "-d", "model=gpt-4o,tier=free", "-d", "model=gpt-4o", "--hits", "3"}},
		{"check/over_limit.json.golden", []string{"--domain", "api", "-d", "model=gpt-4o", "--hits", "3", "--json"}},
	}
	for _, st := range steps {
		var out, errOut bytes.Buffer
		args := append([]string{"check", "--addr", grpcAddr}, st.args...)
		if err := run(context.Background(), args, func(string) string { return "" }, &out, &errOut); err != nil {
			t.Fatalf("run(%q) = %v\n%s", args, err, errOut.String())
		}
		golden(t, st.golden, out.String())
	}
}

func TestCheckErrors(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantUsage bool
		want      string
	}{
		{"no domain", []string{"-d", "a=b"}, true, "--domain is required"},
		{"no descriptor", []string{"--domain", "api"}, true, "at least one -d"},
		{"stray argument", []string{"--domain", "api", "-d", "a=b", "extra"}, true, `check: unexpected argument "extra"`},
		{"bad descriptor", []string{"--domain", "api", "-d", "model"}, true, `"model": want key=value`},
		{"empty key", []string{"--domain", "api", "-d", "=x"}, true, "want key=value"},
		{"hits too large", []string{"--domain", "api", "-d", "a=b", "--hits", "4294967296"}, true, "hits_addend"},
		{"client key without a CA", []string{"--domain", "api", "-d", "a=b", "--tls-key", "k.pem"}, true, "--tls-cert and --tls-key need --tls-ca"},
		{"client certificate without its key", []string{"--domain", "api", "-d", "a=b", "--tls-ca", "ca.pem", "--tls-cert", "c.pem"}, true, "--tls-cert and --tls-key go together"},
		{"no server", []string{"--addr", "127.0.0.1:1", "--timeout", "2s", "--domain", "api", "-d", "a=b"}, false, "ShouldRateLimit at 127.0.0.1:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), append([]string{"check"}, tt.args...), func(string) string { return "" }, &bytes.Buffer{}, &bytes.Buffer{})
			var usage usageError
			if err == nil || !strings.Contains(err.Error(), tt.want) || errors.As(err, &usage) != tt.wantUsage {
				t.Errorf("check %q = %v; want an error containing %q (usage error: %v)", tt.args, err, tt.want, tt.wantUsage)
			}
		})
	}
}

// TestExplainGolden walks testdata/explain/ai-gateway.yaml: an exact
// match and its nested key-only rule, a wildcard, the key-only fallback,
// an unlimited rule, a grouping descriptor, and the ways to find no rule.
func TestExplainGolden(t *testing.T) {
	tests := []struct {
		golden string
		args   []string
	}{
		{"explain/matches.golden", []string{"--domain", "ai-gateway",
			"-d", "model=gpt-4o", "-d", "model=gpt-4o,client=acme", "-d", "model=claude-sonnet",
			"-d", "model=llama", "-d", "caller=internal", "-d", "team=a,project=b"}},
		{"explain/no_rule.golden", []string{"--domain", "ai-gateway",
			"-d", "user=bob", "-d", "model=claude-sonnet,client=acme", "-d", "caller=external", "-d", "team=a"}},
		{"explain/unknown_domain.golden", []string{"--domain", "nope", "-d", "model=gpt-4o"}},
		// quota_mode, metadata, share_threshold and value_to_metric.
		{"explain/incumbent.golden", []string{"--domain", "ai",
			"-d", "backend=primary", "-d", "files=files/a.txt", "-d", "route=chat,user=bob"}},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		dir := "explain"
		if strings.HasPrefix(tt.golden, "explain/incumbent") {
			dir = "explain-incumbent"
		}
		args := append([]string{"explain", "--config", filepath.Join("testdata", dir)}, tt.args...)
		if err := run(context.Background(), args, func(string) string { return "" }, &out, &errOut); err != nil {
			t.Fatalf("run(%q) = %v\n%s", args, err, errOut.String())
		}
		golden(t, tt.golden, out.String())
	}
}

func TestExplainErrors(t *testing.T) {
	bad := writeConfig(t, map[string]string{"api.yaml": "domain: api\ndescriptors:\n  - key: model\n    rate_limit: {unit: minutes, requests_per_unit: 5}\n"})
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no config", []string{"--domain", "api", "-d", "a=b"}, "--config is required"},
		{"no domain", []string{"--config", bad, "-d", "a=b"}, "--domain is required"},
		{"no descriptor", []string{"--config", bad, "--domain", "api"}, "at least one -d"},
		{"stray argument", []string{"--config", bad, "--domain", "api", "-d", "a=b", "extra"}, `explain: unexpected argument "extra"`},
		{"invalid config", []string{"--config", bad, "--domain", "api", "-d", "a=b"}, "invalid configuration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var errOut bytes.Buffer
			err := run(context.Background(), append([]string{"explain"}, tt.args...), func(string) string { return "" }, &bytes.Buffer{}, &errOut)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("explain %q = %v; want an error containing %q", tt.args, err, tt.want)
			}
		})
	}
}

// TestCheckOverMutualTLS: check speaks TLS with a client certificate to a
// server that requires one, and is refused without it.
func TestCheckOverMutualTLS(t *testing.T) {
	ca := newTestCA(t, t.TempDir())
	srvCert, srvKey := ca.issue("server", true)
	cliCert, cliKey := ca.issue("client", false)
	grpcAddr, _, _, _ := startRun(t, "--grpc-tls-cert", srvCert, "--grpc-tls-key", srvKey, "--grpc-client-ca", ca.file)
	var out, errOut bytes.Buffer
	args := []string{"check", "--addr", grpcAddr, "--domain", "api", "-d", "model=gpt-4o", "--tls-ca", ca.file, "--tls-cert", cliCert, "--tls-key", cliKey}
	if err := run(context.Background(), args, os.Getenv, &out, &errOut); err != nil {
		t.Fatalf("check over mTLS: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "overall: OK") {
		t.Errorf("check over mTLS printed %q, want overall: OK", out.String())
	}
	out.Reset()
	if err := run(context.Background(), args[:len(args)-4], os.Getenv, &out, &errOut); err == nil {
		t.Errorf("check without a client certificate succeeded: %s", out.String())
	}
}
