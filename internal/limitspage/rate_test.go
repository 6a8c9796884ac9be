package limitspage

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/config"
)

func TestRateSaysWhatIsCounted(t *testing.T) {
	set, err := config.Parse([]config.File{{Name: "ai.yaml", Data: []byte(`domain: ai
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
`)}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"ai > model=gpt-4o": "500 per minute (group azure)",
		"ai > model=claude": "50 per minute; 8000 tokens per minute (overdraft 64000)",
		"ai > agent":        "1 per 2 seconds (waits up to 1s)",
	}
	for _, r := range set.Domains()[0].Rules {
		if got := rate(r); got != want[r.Path] {
			t.Errorf("rate(%s) = %q, want %q", r.Path, got, want[r.Path])
		}
	}
}
