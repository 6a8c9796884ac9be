package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

const slotConfig = `domain: ai
descriptors:
  - key: model
    value: solo
    descriptors:
      - key: request_id
        concurrency: {max_in_flight: 1, lease: 30s, name: solo-slot}
`

// TestCheckConcurrency takes, is denied, releases and takes a slot with
// check against a real server sending the IETF RateLimit headers.
func TestCheckConcurrency(t *testing.T) {
	grpcAddr, _, _, _ := startRunWith(t, map[string]string{"ai.yaml": slotConfig}, "--ratelimit-headers", "ietf")
	steps := []struct {
		golden string
		args   []string
	}{
		{"check/concurrency_taken.golden", []string{"-d", "model=solo,request_id=a"}},
		{"check/concurrency_denied.golden", []string{"-d", "model=solo,request_id=b"}},
		{"check/concurrency_released.golden", []string{"-d", "model=solo,request_id=a", "--release"}},
		{"check/concurrency_retaken.json.golden", []string{"-d", "model=solo,request_id=b", "--json"}},
	}
	for _, st := range steps {
		var out, errOut bytes.Buffer
		args := append([]string{"check", "--addr", grpcAddr, "--domain", "ai"}, st.args...)
		if err := run(context.Background(), args, func(string) string { return "" }, &out, &errOut); err != nil {
			t.Fatalf("run(%q) = %v\n%s", args, err, errOut.String())
		}
		golden(t, st.golden, out.String())
	}
}

// TestExplainConcurrency: a concurrency level, one under a per-client
// level, and a concurrency quota group shared by wildcard aliases.
func TestExplainConcurrency(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"explain", "--config", filepath.Join("testdata", "explain-concurrency"), "--domain", "ai-gateway",
		"-d", "model=llama-3.1-70b,request_id=7f3c", "-d", "model=qwen,client=acme,request_id=9a", "-d", "model=vllm-a,request_id=1"}
	if err := run(context.Background(), args, func(string) string { return "" }, &out, &errOut); err != nil {
		t.Fatalf("run(%q) = %v\n%s", args, err, errOut.String())
	}
	golden(t, "explain/concurrency.golden", out.String())
}

func TestValidateConcurrency(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"validate", filepath.Join("testdata", "explain-concurrency")}
	if err := run(context.Background(), args, func(string) string { return "" }, &out, &errOut); err != nil {
		t.Fatalf("run(%q) = %v\n%s", args, err, errOut.String())
	}
	if !strings.Contains(out.String(), "3 rules") || !strings.Contains(out.String(), "3 concurrency limits") {
		t.Errorf("validate printed %q, want 3 rules, 3 concurrency limits", out.String())
	}
	bad := writeConfig(t, map[string]string{"bad.yaml": `domain: ai
descriptors:
  - key: request_id
    value: fixed
    concurrency: {max_in_flight: 0, lease: 1m}
`})
	out.Reset()
	errOut.Reset()
	err := run(context.Background(), []string{"validate", bad}, func(string) string { return "" }, &out, &errOut)
	if err == nil || !strings.Contains(errOut.String(), "bad.yaml:5:5: ai > request_id=fixed: concurrency: only on a key-only level") {
		t.Errorf("validate of a bad file = %v, stderr %q; want the file:line of the problem", err, errOut.String())
	}
}
