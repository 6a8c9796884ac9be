package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

func TestRuleLimitInfoSaysWhatIsCounted(t *testing.T) {
	set := servertest.ParseConfig(t, "ai.yaml", `domain: ai
descriptors:
  - key: model
    value: claude
    rate_limits:
      - {unit: minute, requests_per_unit: 50, name: rpm}
      - {unit: minute, requests_per_unit: 8000, counts: tokens, overdraft: {max_debt: 64000}, name: tpm}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0, name: blocked}
  - key: free
    rate_limit: {unlimited: true, name: free}
`)
	m := newMetrics(t, metrics.Options{})
	srv := newServerClocked(t, m, time.Now)
	srv.SetConfig(set)
	m.ConfigLoaded(set)
	// Rules without a bucket (deny-all, unlimited) describe no limit.
	for _, d := range [][]string{{"model", "claude"}, {"blocked", "x"}, {"free", "x"}} {
		if _, err := srv.ShouldRateLimit(context.Background(), request("ai", d)); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP ratelimitd_rule_limit_info 1 for each limit of each rule that has seen traffic: what its tokens count (requests or tokens), its quota group, and its rate.
# TYPE ratelimitd_rule_limit_info gauge
ratelimitd_rule_limit_info{counts="requests",domain="ai",group="",limit="rpm",rate="50 per minute",rule="rpm"} 1
ratelimitd_rule_limit_info{counts="tokens",domain="ai",group="",limit="tpm",rate="8000 per minute",rule="rpm"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "ratelimitd_rule_limit_info"); err != nil {
		t.Error(err)
	}
	m.ConfigLoaded(mustParse(t, "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if n := testutil.CollectAndCount(m.Registry(), "ratelimitd_rule_limit_info"); n != 0 {
		t.Errorf("after a reload, %d rule_limit_info series remain from the old config", n)
	}
}
