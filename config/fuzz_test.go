package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzLoadConfig feeds Parse arbitrary files, seeded with every file under
// testdata: it must never panic, must return a Set or an error (never both,
// never neither), must report only *Error problems, and must be
// deterministic.
func FuzzLoadConfig(f *testing.F) {
	seeds, err := filepath.Glob("testdata/*/*.yaml")
	if err != nil {
		f.Fatal(err)
	}
	more, _ := filepath.Glob("testdata/*/*/*.yaml")
	for _, name := range append(seeds, more...) {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(lookupYAML))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: a*b\n    share_threshold: yes\n    value_to_metric: on\n    quota_mode: true\n    metadata: {a: [1, {b: ~}], 2: 3.5, c: {d: e}}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - {key: k, value: x*, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: k, value: xy*, rate_limit: {unlimited: true, requests_per_unit: 3}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		files := []File{{Name: "fuzz.yaml", Data: data}}
		s, err := Parse(files)
		if (s == nil) == (err == nil) {
			t.Fatalf("Parse = %v, %v: want exactly one of a Set and an error", s, err)
		}
		if err != nil {
			var list interface{ Unwrap() []error }
			if !errors.As(err, &list) {
				t.Fatalf("Parse error %T is not joined", err)
			}
			for _, e := range list.Unwrap() {
				if _, ok := e.(*Error); !ok {
					t.Fatalf("Parse error %T (%v) is no *Error", e, e)
				}
			}
			if _, again := Parse(files); again == nil || again.Error() != err.Error() {
				t.Fatalf("Parse is not deterministic: %v, then %v", err, again)
			}
			return
		}
		var text strings.Builder
		if err := s.WriteText(&text); err != nil {
			t.Fatalf("WriteText: %v", err)
		}
		domains := s.Domains()
		if !slices.IsSortedFunc(domains, func(a, b *Domain) int { return strings.Compare(a.Name, b.Name) }) {
			t.Fatalf("Domains() not sorted")
		}
		for _, d := range domains {
			for _, r := range d.Rules {
				if r.Domain != d.Name || !validKind(r) {
					t.Fatalf("rule %+v of domain %q is invalid", r, d.Name)
				}
			}
			for _, entries := range [][]Entry{nil, {{"k", "v"}}, {{"key", "value"}, {"", ""}}} {
				r := s.Lookup(d.Name, entries)
				lines := s.Explain(d.Name, entries)
				if (r != nil) != strings.HasPrefix(lines[len(lines)-1], "rule ") {
					t.Fatalf("Lookup(%q) = %v but Explain says %q", entries, r, lines)
				}
				if r != nil && !strings.HasPrefix(r.StatKey(entries), r.Domain) {
					t.Fatalf("StatKey(%q) = %q does not start with the domain", entries, r.StatKey(entries))
				}
			}
		}
	})
}
