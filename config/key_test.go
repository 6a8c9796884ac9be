package config

import (
	"fmt"
	"testing"
)

func TestAppendKeyGolden(t *testing.T) {
	r := &Rule{Domain: "ai"}
	got := fmt.Sprintf("%q", r.AppendKey(nil, 0, []Entry{{"model", "gpt-4o"}, {"user", ""}}))
	want := `"v1\x02ai\x05model\x06gpt-4o\x04user\x00"`
	if got != want {
		t.Errorf("AppendKey = %s, want %s (a changed key resets every bucket in production: bump keyVersion)", got, want)
	}
}

func TestAppendKeyUnambiguous(t *testing.T) {
	r := &Rule{Domain: "d"}
	sets := [][]Entry{
		{{"a", "b_c"}},
		{{"a_b", "c"}},
		{{"a", "b"}, {"c", ""}},
		{{"a", "b\x00c"}},
		{{"a", "b"}, {"\x00c", ""}},
		{{"a", "bc"}},
		{{"a", "b"}, {"c", "d"}},
		{{"a", "b\x01c\x01d"}},
		{{"a", "é"}},
		{{"a", "e\u0301"}},
		{},
		{{"", ""}},
	}
	seen := map[string]int{}
	for i, s := range sets {
		k := string(r.AppendKey(nil, 0, s))
		if j, dup := seen[k]; dup {
			t.Errorf("entries %v and %v share the key %q", sets[j], s, k)
		}
		seen[k] = i
	}
	other := &Rule{Domain: "d\x02a"}
	if string(other.AppendKey(nil, 0, nil)) == string(r.AppendKey(nil, 0, []Entry{{"a", ""}})) {
		t.Errorf("domain bytes collide with an entry")
	}
}

// keysFile has the rules whose keys the goldens pin: one per user, a
// quota group's, and one with two limits.
const keysFile = `domain: llm
quota_groups:
  openai: {unit: minute, requests_per_unit: 10}
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: model
    value: gpt-4o
    descriptors:
      - key: client
        quota_group: openai
  - key: route
    rate_limits:
      - {unit: second, requests_per_unit: 10, name: rps}
      - {unit: minute, requests_per_unit: 100}
`

// TestAppendKeyGoldenShapes pins the two other shapes of key, from a
// parsed file: a quota group's (keyed by the key-only level's value) and
// the limits of a rule with several (by name, else counts and period).
// These keys live in Redis: changing them resets every bucket.
func TestAppendKeyGoldenShapes(t *testing.T) {
	set := parseOne(t, keysFile)
	group := []Entry{{"model", "gpt-4o"}, {"client", "ann"}}
	route := []Entry{{"route", "/v1/chat"}}
	tests := []struct {
		entries []Entry
		limit   int
		want    string
	}{
		{group, 0, `"v1\x03llm\x00\x05group\x06openai\x06client\x03ann"`},
		{route, 0, `"v1\x03llm\x05route\b/v1/chat\x00\bname:rps"`},
		{route, 1, `"v1\x03llm\x05route\b/v1/chat\x00\rrequests/1m0s"`},
	}
	for _, tt := range tests {
		r := set.Lookup("llm", tt.entries)
		if r == nil {
			t.Fatalf("no rule for %v", tt.entries)
		}
		if got := fmt.Sprintf("%q", r.AppendKey(nil, tt.limit, tt.entries)); got != tt.want {
			t.Errorf("AppendKey(%v, limit %d) = %s, want %s (a changed key resets every bucket in production: bump keyVersion)", tt.entries, tt.limit, got, tt.want)
		}
		buf := make([]byte, 0, 64)
		if n := testing.AllocsPerRun(100, func() { buf = r.AppendKey(buf[:0], tt.limit, tt.entries) }); n != 0 {
			t.Errorf("AppendKey(%v, limit %d) into a buffer: %v allocations, want none", tt.entries, tt.limit, n)
		}
		// The same rule with its limits set from outside this package (no
		// precomputed identities) keys its buckets alike.
		bare := *r
		bare.Limits = nil
		for _, l := range r.Limits {
			bare.Limits = append(bare.Limits, RateLimit{Name: l.Name, Counts: l.Counts, Limit: l.Limit, Unit: l.Unit, UnitMultiplier: l.UnitMultiplier, Group: l.Group, Shared: l.Shared})
		}
		if got := fmt.Sprintf("%q", bare.AppendKey(nil, tt.limit, tt.entries)); got != tt.want {
			t.Errorf("AppendKey(%v, limit %d) of a rule whose limits were built by hand = %s, want %s", tt.entries, tt.limit, got, tt.want)
		}
	}
}
