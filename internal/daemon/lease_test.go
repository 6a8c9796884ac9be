package daemon_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// TestLeasesOnTheMemoryBackend: a daemon on the memory backend holds
// leases, and /metrics and /limits.json show them in flight.
func TestLeasesOnTheMemoryBackend(t *testing.T) {
	r := run(t, daemon.Config{}, `domain: ai
descriptors:
  - key: model
    value: vllm
    descriptors:
      - key: request_id
        concurrency: {max_in_flight: 2, lease: 1m, name: vllm-slots}
`)
	rls := rlsv3.NewRateLimitServiceClient(r.conn)
	callCtx, cancelCall := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelCall()
	var codes []string
	for _, id := range []string{"a", "b", "c"} {
		resp, err := rls.ShouldRateLimit(callCtx, servertest.Request("ai", servertest.Desc("model", "vllm", "request_id", id)))
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.GetOverallCode().String())
	}
	if got := strings.Join(codes, " "); got != "OK OK OVER_LIMIT" {
		t.Errorf("three leases of two slots: %s, want OK OK OVER_LIMIT", got)
	}
	get := func(path string) string {
		_, body := servertest.Get(t, "http://"+r.d.HTTPAddr().String()+path)
		return body
	}
	m := get("/metrics")
	for _, want := range []string{`ratelimitd_leases_in_flight{domain="ai",rule="vllm-slots"} 2`, `ratelimitd_leases_taken_total{domain="ai",rule="vllm-slots"} 2`, `ratelimitd_leases_denied_total{domain="ai",rule="vllm-slots"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	var page struct {
		InFlight []struct {
			Rule        string `json:"rule"`
			Pool        string `json:"pool"`
			InFlight    int64  `json:"in_flight"`
			MaxInFlight int64  `json:"max_in_flight"`
		} `json:"in_flight"`
	}
	if err := json.Unmarshal([]byte(get("/limits.json")), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.InFlight) != 1 || page.InFlight[0].Rule != "vllm-slots" || page.InFlight[0].Pool != "ai > model=vllm > request_id" || page.InFlight[0].InFlight != 2 || page.InFlight[0].MaxInFlight != 2 {
		t.Errorf("/limits.json in_flight = %+v, want vllm-slots' pool with 2 of 2", page.InFlight)
	}
	if html := get("/limits"); !strings.Contains(html, "Requests in flight") || !strings.Contains(html, "2 / 2") {
		t.Errorf("/limits lacks the pool in flight")
	}
}
