package config

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

const concurrencyYAML = `domain: ai-gateway
quota_groups:
  vllm-pool: {concurrency: {max_in_flight: 16, lease: 10m}}
descriptors:
  - key: model
    value: llama-3.1-70b
    descriptors:
      - key: request_id
        concurrency:
          max_in_flight: 8
          lease: 10m
          max_wait: 2s
          max_waiters: 100
  - key: model
    value: qwen
    descriptors:
      - key: client
        descriptors:
          - key: request_id
            concurrency: {max_in_flight: 2, lease: 1m, name: qwen-per-client}
  - key: model
    value: vllm-a
    descriptors:
      - {key: request_id, quota_group: vllm-pool}
  - key: model
    value: vllm-b*
    descriptors:
      - {key: request_id, quota_group: vllm-pool}
`

func TestConcurrencyRules(t *testing.T) {
	set, err := Parse([]File{{Name: "c.yaml", Data: []byte(concurrencyYAML)}})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	e := func(kv ...string) []Entry {
		var out []Entry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, Entry{kv[i], kv[i+1]})
		}
		return out
	}
	pool := func(entries []Entry) string {
		r := set.Lookup("ai-gateway", entries)
		if r == nil || r.Kind != KindConcurrency || r.Concurrency == nil {
			t.Fatalf("Lookup(%v) = %+v, want a concurrency rule", entries, r)
		}
		return string(r.AppendPool(nil, entries))
	}
	r := set.Lookup("ai-gateway", e("model", "llama-3.1-70b", "request_id", "abc"))
	want := Concurrency{Pool: limiter.PoolLimit{MaxInFlight: 8, Lease: 10 * time.Minute}, MaxWait: 2 * time.Second, MaxWaiters: 100}
	want.finish()
	if r == nil || *r.Concurrency != want {
		t.Fatalf("llama rule = %+v, want concurrency %+v", r, want)
	}
	if v := r.Concurrency.RateLimit(); v != r.Concurrency.RateLimit() || v.Limit.Count != 8 || v.Unit != 0 {
		t.Errorf("RateLimit() = %+v, want one shared view of 8 with no unit", v)
	}
	if len(r.Limits) != 0 {
		t.Errorf("llama rule has Limits %v, want none", r.Limits)
	}
	// Two leases of one request path share one pool.
	if a, b := pool(e("model", "llama-3.1-70b", "request_id", "a")), pool(e("model", "llama-3.1-70b", "request_id", "b")); a != b {
		t.Errorf("pools of two leases differ: %q, %q", a, b)
	}
	// A level above the lease: one pool per client.
	if a, b := pool(e("model", "qwen", "client", "x", "request_id", "1")), pool(e("model", "qwen", "client", "y", "request_id", "1")); a == b {
		t.Errorf("two clients share pool %q", a)
	}
	// Aliases naming one concurrency group share its pool.
	if a, b := pool(e("model", "vllm-a", "request_id", "1")), pool(e("model", "vllm-b2", "request_id", "2")); a != b {
		t.Errorf("group aliases' pools differ: %q, %q", a, b)
	}
	g := set.Lookup("ai-gateway", e("model", "vllm-a", "request_id", "1"))
	if g.Concurrency.Group != "vllm-pool" || g.Concurrency.Pool.MaxInFlight != 16 || g.Concurrency.Name != "vllm-pool" || g.Name != "" {
		t.Errorf("group rule = %+v %+v, want group vllm-pool of 16", g, g.Concurrency)
	}
	if got := set.Lookup("ai-gateway", e("model", "qwen", "client", "x", "request_id", "1")).Label(); got != "qwen-per-client" {
		t.Errorf("Label = %q, want qwen-per-client", got)
	}
	ex := strings.Join(set.Explain("ai-gateway", e("model", "qwen", "client", "x", "request_id", "1")), "\n")
	if !strings.Contains(ex, "at most 2 in flight per pool") || !strings.Contains(ex, "request_id") {
		t.Errorf("Explain = %s, want the concurrency limit described", ex)
	}
	if got := r.PoolLabel(e("model", "llama-3.1-70b", "request_id", "abc")); got != "ai-gateway > model=llama-3.1-70b > request_id" {
		t.Errorf("PoolLabel = %q", got)
	}
}

// concurrencyFile is a file of one level, key request_id in domain d,
// whose concurrency is c.
func concurrencyFile(c string) string {
	return "domain: d\ndescriptors:\n  - key: request_id\n    concurrency: " + c + "\n"
}

func TestConcurrencyBadShapes(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"on a value", `domain: d
descriptors:
  - key: request_id
    value: x
    concurrency: {max_in_flight: 1, lease: 1m}
`, "b.yaml:5:5: d > request_id=x: concurrency: only on a key-only level"},
		{"beside rate_limit", `domain: d
descriptors:
  - key: request_id
    rate_limit: {unit: second, requests_per_unit: 1}
    concurrency: {max_in_flight: 1, lease: 1m}
`, "b.yaml:4:5: d > request_id: rate_limit: not allowed beside concurrency"},
		{"zero max_in_flight", concurrencyFile("{max_in_flight: 0, lease: 1m}"), "b.yaml:4:34: d > request_id: concurrency.max_in_flight: must be at least 1, got 0"},
		{"negative max_in_flight", concurrencyFile("{max_in_flight: -3, lease: 1m}"), "concurrency.max_in_flight: must be at least 1, got -3"},
		{"too many in flight", concurrencyFile("{max_in_flight: 2000000, lease: 1m}"), "concurrency.max_in_flight: 2000000 is too large (at most 1048576)"},
		{"no max_in_flight", concurrencyFile("{lease: 1m}"), "b.yaml:4:5: d > request_id: concurrency.max_in_flight: missing"},
		{"lease too long", concurrencyFile("{max_in_flight: 1, lease: 200h}"), "b.yaml:4:44: d > request_id: concurrency.lease: 200h0m0s is out of range [1ms, 168h0m0s]"},
		{"lease too short", concurrencyFile("{max_in_flight: 1, lease: 10us}"), "concurrency.lease: 10µs is out of range"},
		{"max_wait too long", concurrencyFile("{max_in_flight: 1, lease: 1m, max_wait: 200h}"), "concurrency.max_wait: 200h0m0s is more than 168h0m0s"},
		{"negative lease", concurrencyFile("{max_in_flight: 1, lease: -1s}"), "concurrency.lease: want a positive duration"},
		{"no lease", concurrencyFile("{max_in_flight: 1}"), "b.yaml:4:5: d > request_id: concurrency.lease: missing"},
		{"zero max_waiters", concurrencyFile("{max_in_flight: 1, lease: 1m, max_wait: 1s, max_waiters: 0}"), "concurrency.max_waiters: must be at least 1, got 0"},
		{"max_waiters alone", concurrencyFile("{max_in_flight: 1, lease: 1m, max_waiters: 3}"), "concurrency.max_waiters: only means something with max_wait"},
		{"group on a value", `domain: d
quota_groups:
  g: {concurrency: {max_in_flight: 1, lease: 1m}}
descriptors:
  - {key: model, value: m, quota_group: g}
`, "b.yaml:5:41: d > model=m: quota_group: \"g\" is a concurrency group: name it on a key-only level"},
		{"group mixing", `domain: d
quota_groups:
  g: {unit: second, concurrency: {max_in_flight: 1, lease: 1m}}
descriptors: []
`, "b.yaml:3:7: d: quota_groups.g.unit: not allowed beside concurrency"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]File{{Name: "b.yaml", Data: []byte(tc.yaml)}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
