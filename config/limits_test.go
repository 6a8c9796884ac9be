package config

import (
	"testing"
	"time"
)

const logicalModels = `
domain: llm
quota_groups:
  openai-gpt4o: {unit: minute, requests_per_unit: 10}
  shared-pool: {unit: hour, requests_per_unit: 100, shared: true}
descriptors:
  - key: model
    value: gpt-4o
    quota_group: openai-gpt4o
  - key: model
    value: gpt-4o-latest
    quota_group: openai-gpt4o
  - key: model
    value: chat-*
    quota_group: openai-gpt4o
  - key: client
    quota_group: openai-gpt4o
  - key: team
    quota_group: shared-pool
  - key: model
    value: o3
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: o3-rps}
      - {unit: minute, requests_per_unit: 5}
      - unit: minute
        requests_per_unit: 1000
        counts: tokens
        overdraft: {max_debt: 5000}
        max_wait: 2s
`

func TestQuotaGroupsAndSeveralLimits(t *testing.T) {
	s, err := Parse([]File{{Name: "llm.yaml", Data: []byte(logicalModels)}})
	if err != nil {
		t.Fatal(err)
	}
	key := func(entries []Entry, limit int) string {
		t.Helper()
		r := s.Lookup("llm", entries)
		if r == nil {
			t.Fatalf("Lookup(%v) = nil", entries)
		}
		return string(r.AppendKey(nil, limit, entries))
	}
	gpt4o := key([]Entry{{"model", "gpt-4o"}}, 0)
	for _, alias := range []string{"gpt-4o-latest", "chat-default", "chat-fast"} {
		if got := key([]Entry{{"model", alias}}, 0); got != gpt4o {
			t.Errorf("alias %s draws from %q, want the group's bucket %q", alias, got, gpt4o)
		}
	}
	// A key-only rule in a group: one bucket per value, apart from the aliases'.
	ann, bob := key([]Entry{{"client", "ann"}}, 0), key([]Entry{{"client", "bob"}}, 0)
	if ann == bob || ann == gpt4o {
		t.Errorf("key-only group rule: ann %q, bob %q, aliases %q; want three buckets", ann, bob, gpt4o)
	}
	// A shared group: one bucket for every value.
	if a, b := key([]Entry{{"team", "a"}}, 0), key([]Entry{{"team", "b"}}, 0); a != b {
		t.Errorf("shared group: %q and %q, want one bucket", a, b)
	}

	o3 := s.Lookup("llm", []Entry{{"model", "o3"}})
	if len(o3.Limits) != 3 || o3.Name != "o3-rps" {
		t.Fatalf("o3: %d limits, name %q; want 3 and o3-rps", len(o3.Limits), o3.Name)
	}
	tokens := o3.Limits[2]
	if tokens.Counts != Tokens || tokens.Limit.MaxDebt != 5000 || tokens.MaxWait != 2*time.Second || tokens.MaxWaiters != DefaultMaxWaiters {
		t.Errorf("tokens limit = %+v", tokens)
	}
	seen := map[string]bool{}
	for i := range o3.Limits {
		k := key([]Entry{{"model", "o3"}}, i)
		if seen[k] {
			t.Errorf("limit %d of o3 shares a bucket with another", i)
		}
		seen[k] = true
	}
	gpt := s.Lookup("llm", []Entry{{"model", "gpt-4o"}})
	if gpt.Name != "" || gpt.Limits[0].Limit.Count != 10 || gpt.Limits[0].Group != "openai-gpt4o" {
		t.Errorf("gpt-4o rule: name %q, limit %v, group %q", gpt.Name, gpt.Limits[0].Limit, gpt.Limits[0].Group)
	}
}

func TestSeveralLimitKeysSurviveEdits(t *testing.T) {
	parse := func(rate string) *Rule {
		s, err := Parse([]File{{Name: "a.yaml", Data: []byte(`domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: ` + rate + `}
      - {unit: hour, requests_per_unit: 1000}
`)}})
		if err != nil {
			t.Fatal(err)
		}
		return s.Lookup("d", []Entry{{"k", "v"}})
	}
	a, b := parse("2"), parse("7")
	for i := range 2 {
		if string(a.AppendKey(nil, i, []Entry{{"k", "v"}})) != string(b.AppendKey(nil, i, []Entry{{"k", "v"}})) {
			t.Errorf("limit %d: a changed rate changed the bucket key", i)
		}
	}
}
