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
