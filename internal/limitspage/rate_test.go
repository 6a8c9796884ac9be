package limitspage

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// TestRateSaysWhatIsCounted: the rate column of each rule, for every kind
// of rule; each rule the test expects must be there, and only those.
func TestRateSaysWhatIsCounted(t *testing.T) {
	set := servertest.ParseConfig(t, "ai.yaml", `domain: ai
quota_groups:
  azure: {unit: minute, requests_per_unit: 500}
descriptors:
  - {key: model, value: gpt-4o, quota_group: azure}
  - key: model
    value: claude
    rate_limits:
      - {unit: minute, requests_per_unit: 50}
      - {unit: minute, requests_per_unit: 8000, counts: tokens, overdraft: {max_debt: 64000}}
  - key: agent
    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 2, max_wait: 1s}
  - key: internal
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
`)
	want := map[string]string{
		"ai > model=gpt-4o": "500 per minute (group azure)",
		"ai > model=claude": "50 per minute; 8000 tokens per minute (overdraft 64000)",
		"ai > agent":        "1 per 2 seconds (waits up to 1s)",
		"ai > internal":     "unlimited",
		"ai > blocked":      "denies all (0 per hour)",
	}
	checked := map[string]int{}
	for _, d := range set.Domains() {
		for _, r := range d.Rules {
			w, ok := want[r.Path]
			if !ok {
				t.Errorf("rule %s: not expected (rate %q)", r.Path, rate(r))
				continue
			}
			checked[r.Path]++
			if got := rate(r); got != w {
				t.Errorf("rate(%s) = %q, want %q", r.Path, got, w)
			}
		}
	}
	for path := range want {
		if checked[path] != 1 {
			t.Errorf("rule %s checked %d times, want once", path, checked[path])
		}
	}
	if len(checked) != len(want) || len(checked) == 0 {
		t.Errorf("%d rules checked, want %d", len(checked), len(want))
	}
}
