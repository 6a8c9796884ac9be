package config

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

const lookupYAML = `
domain: ai
descriptors:
  - key: model
    value: gpt-4o
    rate_limit: {unit: minute, requests_per_unit: 500, burst: 50, name: gpt-4o-rpm}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 20}
      - key: user
        value: bob
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: tier
        value: gold
        descriptors:
          - key: user
            rate_limit: {unit: hour, requests_per_unit: 1000, unit_multiplier: 2}
  - key: model
    value: gpt-4*
    rate_limit: {unit: minute, requests_per_unit: 300}
  - key: model
    value: gpt-4o-*
    rate_limit: {unit: minute, requests_per_unit: 200}
  - key: model
    value: "*-mini"
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: model
    value: "*"
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: team
    descriptors:
      - key: model
        value: "o*"
        rate_limit: {unit: SECOND, requests_per_unit: 7}
        shadow_mode: true
  - key: internal
    rate_limit: {unlimited: true, name: internal}
  - key: "ключ"
    value: "значение"
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: nul
    value: "a\0b"
    rate_limit: {unit: day, requests_per_unit: 4}
  - key: star
    value: "lit*"
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: star
    rate_limit: {unit: day, requests_per_unit: 6}
`

func mustParse(t testing.TB, files ...File) *Set {
	t.Helper()
	s, err := Parse(files)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return s
}

func e(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{kv[i], kv[i+1]})
	}
	return out
}

func TestLookup(t *testing.T) {
	s := mustParse(t, File{"ai.yaml", []byte(lookupYAML)})
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		want    string // Rule.Path, or "" for no rule
	}{
		{"exact", "ai", e("model", "gpt-4o"), "ai > model=gpt-4o"},
		{"longer wildcard beats shorter", "ai", e("model", "gpt-4o-2024"), "ai > model=gpt-4o-*"},
		{"prefix wildcard", "ai", e("model", "gpt-4.1"), "ai > model=gpt-4*"},
		{"wildcard matching empty rest", "ai", e("model", "gpt-4"), "ai > model=gpt-4*"},
		{"suffix wildcard", "ai", e("model", "o4-mini"), "ai > model=*-mini"},
		{"more literal bytes win", "ai", e("model", "gpt-4o-mini"), "ai > model=gpt-4o-*"},
		{"lone star beats key-only", "ai", e("model", "claude"), "ai > model=*"},
		{"lone star matches empty value", "ai", e("model", ""), "ai > model=*"},
		{"nested key-only", "ai", e("model", "gpt-4o", "user", "alice"), "ai > model=gpt-4o > user"},
		{"nested exact beats key-only", "ai", e("model", "gpt-4o", "user", "bob"), "ai > model=gpt-4o > user=bob"},
		{"intermediate without rate_limit", "ai", e("model", "gpt-4o", "tier", "gold"), ""},
		{"through intermediate", "ai", e("model", "gpt-4o", "tier", "gold", "user", "x"), "ai > model=gpt-4o > tier=gold > user"},
		{"unknown value under exact", "ai", e("model", "gpt-4o", "tier", "silver"), ""},
		{"no backtracking to wildcard", "ai", e("model", "gpt-4o", "region", "eu"), ""},
		{"entries longer than tree", "ai", e("model", "claude", "user", "bob"), ""},
		{"entries shorter than tree", "ai", e("team", "a"), ""},
		{"key-only intermediate then wildcard", "ai", e("team", "a", "model", "o3"), "ai > team > model=o*"},
		{"unknown key", "ai", e("region", "eu"), ""},
		{"keys are case-sensitive", "ai", e("Model", "gpt-4o"), ""},
		{"values are case-sensitive", "ai", e("model", "GPT-4O"), "ai > model=*"},
		{"unknown domain", "other", e("model", "gpt-4o"), ""},
		{"domain is case-sensitive", "AI", e("model", "gpt-4o"), ""},
		{"no entries", "ai", nil, ""},
		{"unlimited", "ai", e("internal", "svc"), "ai > internal"},
		{"unicode", "ai", e("ключ", "значение"), "ai > ключ=значение"},
		{"NUL in value", "ai", e("nul", "a\x00b"), `ai > nul="a\x00b"`},
		{"NUL prefix only", "ai", e("nul", "a"), ""},
		{"request star is literal", "ai", e("star", "*"), "ai > star"},
		{"pattern matches its own text", "ai", e("star", "lit*"), "ai > star=lit*"},
		{"pattern matches longer", "ai", e("star", "literal"), "ai > star=lit*"},
		{"no match falls to key-only", "ai", e("star", "li"), "ai > star"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := s.Lookup(tt.domain, tt.entries)
			got := ""
			if r != nil {
				got = r.Path
			}
			if got != tt.want {
				t.Errorf("Lookup(%q, %q) = %q, want %q\n%s", tt.domain, tt.entries, got, tt.want,
					strings.Join(s.Explain(tt.domain, tt.entries), "\n"))
			}
		})
	}
}

func TestRuleFields(t *testing.T) {
	s := mustParse(t, File{"ai.yaml", []byte(lookupYAML)})
	r := s.Lookup("ai", e("model", "gpt-4o"))
	want := Rule{
		Domain: "ai", Path: "ai > model=gpt-4o", Name: "gpt-4o-rpm", Kind: KindLimited,
		Limits: []RateLimit{{Name: "gpt-4o-rpm", Limit: limiter.Limit{Count: 500, Period: time.Minute, Burst: 50},
			Unit: Minute, UnitMultiplier: 1, Counts: Requests}},
		File: "ai.yaml", Line: 4,
	}
	if r == nil || r.Domain != want.Domain || r.Path != want.Path || r.Name != want.Name || r.Kind != want.Kind ||
		len(r.Limits) != 1 || !sameLimit(r.Limits[0], want.Limits[0]) || r.File != want.File || r.Line != want.Line ||
		r.ShadowMode || r.DetailedMetric || len(r.Replaces) != 0 {
		t.Errorf("Lookup(model=gpt-4o) = %+v, want %+v", r, want)
	}
	r = s.Lookup("ai", e("model", "gpt-4o", "tier", "gold", "user", "x"))
	if want := (limiter.Limit{Count: 1000, Period: 2 * time.Hour, Burst: 1000}); r == nil || r.Kind != KindLimited || len(r.Limits) != 1 ||
		r.Limits[0].Limit != want || r.Limits[0].Unit != Hour || r.Limits[0].UnitMultiplier != 2 {
		t.Errorf("Lookup(…tier=gold > user) = %+v, want Limit %v per 2 hours", r, want)
	}
	r = s.Lookup("ai", e("internal", "x"))
	if r == nil || r.Kind != KindUnlimited || len(r.Limits) != 0 || r.Name != "internal" {
		t.Errorf("Lookup(internal) = %+v, want an unlimited rule without limits", r)
	}
}

// TestFlagsNotInherited pins what envoyproxy/ratelimit does with
// shadow_mode and detailed_metric: they belong to the descriptor's own
// rule; on a descriptor without one they are accepted and mean nothing.
func TestFlagsNotInherited(t *testing.T) {
	s := mustParse(t, File{"f.yaml", []byte(`
domain: d
descriptors:
  - key: tenant
    shadow_mode: true
    detailed_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: team
        shadow_mode: true
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
`)})
	for _, tt := range []struct {
		entries          []Entry
		shadow, detailed bool
	}{
		{e("tenant", "a", "user", "u"), false, false},
		{e("tenant", "a", "team", "t"), true, true},
	} {
		r := s.Lookup("d", tt.entries)
		if r == nil || r.ShadowMode != tt.shadow || r.DetailedMetric != tt.detailed {
			t.Errorf("Lookup(%q) = %+v, want ShadowMode %v, DetailedMetric %v", tt.entries, r, tt.shadow, tt.detailed)
		}
	}
}
