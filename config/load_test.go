package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestIncumbentExamples loads envoyproxy/ratelimit's README examples, as
// written, from one directory, and checks the lookups the README describes.
func TestIncumbentExamples(t *testing.T) {
	s, err := Load("testdata/incumbent")
	if err != nil {
		t.Fatalf("Load(testdata/incumbent): %v", err)
	}
	var names []string
	for _, d := range s.Domains() {
		names = append(names, d.Name)
	}
	want := []string{"edge_proxy_per_ip", "example4", "example6", "example7", "example8", "example9", "internal", "messaging", "mongo_cps"}
	if !slices.Equal(names, want) {
		t.Errorf("Domains() = %q, want %q", names, want)
	}
	tests := []struct {
		domain  string
		entries []Entry
		want    string // Rule.Path, "" for none
		check   func(*Rule) bool
	}{
		{"edge_proxy_per_ip", e("remote_address", "50.0.0.5"), "edge_proxy_per_ip > remote_address=50.0.0.5", func(r *Rule) bool { return r.Kind == KindDenyAll && validKind(r) && r.Limits[0].Unit == Second }},
		{"edge_proxy_per_ip", e("remote_address", "10.0.0.1"), "edge_proxy_per_ip > remote_address", func(r *Rule) bool { return r.Kind == KindLimited && r.Limits[0].Limit.Count == 10 }},
		{"mongo_cps", e("database", "users"), "mongo_cps > database=users", func(r *Rule) bool { return r.Limits[0].Limit.Count == 500 && r.Limits[0].Unit == Second }},
		{"mongo_cps", e("database", "other"), "", nil},
		{"messaging", e("message_type", "marketing", "to_number", "2061111111"), "messaging > message_type=marketing > to_number", func(r *Rule) bool { return r.Limits[0].Limit.Count == 5 && r.Limits[0].Unit == Day }},
		{"messaging", e("to_number", "2061111111"), "messaging > to_number", func(r *Rule) bool { return r.Limits[0].Limit.Count == 100 }},
		{"messaging", e("message_type", "marketing"), "", nil},
		{"example4", e("key", "value"), "", nil},
		{"example4", e("key", "value", "subkey", "subvalue"), "example4 > key=value > subkey", func(r *Rule) bool { return r.Limits[0].Limit.Count == 300 }},
		{"internal", e("ldap", "x"), "internal > ldap", func(r *Rule) bool { return r.Kind == KindUnlimited && len(r.Limits) == 0 }},
		{"internal", e("azure", "x"), "internal > azure", func(r *Rule) bool { return r.Kind == KindLimited && r.Limits[0].Limit.Count == 100 }},
		{"example6", e("service", "auth-service", "user", "user-a"), "example6 > service > user=user-a", func(r *Rule) bool { return r.ShadowMode && r.Limits[0].Limit.Count == 10 }},
		{"example6", e("service", "auth-service", "user", "user-b"), "example6 > service > user=user-b", func(r *Rule) bool { return !r.ShadowMode && r.Limits[0].Limit.Count == 20 }},
		{"example7", e("key_1", "value_1", "user", "bkthomps"), "example7 > key_1=value_1 > user=bkthomps", func(r *Rule) bool { return r.Name == "specific_limit" }},
		{"example7", e("key_2", "value_2", "user", "bkthomps"), "example7 > key_2=value_2 > user=bkthomps", func(r *Rule) bool { return slices.Equal(r.Replaces, []string{"specific_limit"}) }},
		{"example8", e("key1", "anything"), "example8 > key1", func(r *Rule) bool { return r.DetailedMetric && r.Limits[0].Limit.Count == 10 }},
		{"example8", e("key1", "value1"), "example8 > key1=value1", func(r *Rule) bool { return !r.DetailedMetric && r.Limits[0].Limit.Count == 20 }},
		{"example9", e("key1", "value_1"), "example9 > key1=value*", func(r *Rule) bool { return r.Limits[0].Limit.Count == 20 && r.Limits[0].Unit == Minute }},
		{"example9", e("key1", "other"), "", nil},
	}
	for _, tt := range tests {
		r := s.Lookup(tt.domain, tt.entries)
		got := ""
		if r != nil {
			got = r.Path
		}
		if got != tt.want {
			t.Errorf("Lookup(%q, %q) = %q, want %q", tt.domain, tt.entries, got, tt.want)
			continue
		}
		if r != nil && !tt.check(r) {
			t.Errorf("Lookup(%q, %q) = %+v: wrong fields", tt.domain, tt.entries, r)
		}
	}
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

const oneRule = "domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"

func domainFile(name string) string { return strings.Replace(oneRule, "%s", name, 1) }

// TestLoadConfigMap lays out a directory the way Kubernetes mounts a
// ConfigMap: the files are links into a hidden, timestamped directory.
func TestLoadConfigMap(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "..2026_01_01_00_00_00.1", "a.yaml"), domainFile("a"))
	writeFile(t, filepath.Join(dir, "..2026_01_01_00_00_00.1", "b.yml"), domainFile("b"))
	must(t, os.Symlink("..2026_01_01_00_00_00.1", filepath.Join(dir, "..data")))
	must(t, os.Symlink("..data/a.yaml", filepath.Join(dir, "a.yaml")))
	must(t, os.Symlink("..data/b.yml", filepath.Join(dir, "b.yml")))
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), "not: valid")
	writeFile(t, filepath.Join(dir, "README.md"), "not yaml")
	writeFile(t, filepath.Join(dir, "sub", "c.yaml"), domainFile("c")) // not recursive
	must(t, os.Symlink("sub", filepath.Join(dir, "dir.yaml")))         // a link to a directory is skipped

	s, err := Load(dir)
	if err != nil {
		t.Fatalf("Load(%s): %v", dir, err)
	}
	var got []string
	for _, d := range s.Domains() {
		got = append(got, d.Name+":"+strings.Join(d.Files, ","))
	}
	want := []string{"a:" + filepath.Join(dir, "a.yaml"), "b:" + filepath.Join(dir, "b.yml")}
	if !slices.Equal(got, want) {
		t.Errorf("Load(configmap) domains = %q, want %q", got, want)
	}
	if r := s.Lookup("a", e("k", "v")); r == nil || r.File != filepath.Join(dir, "a.yaml") || r.Line != 3 {
		t.Errorf("Lookup(a, k=v) = %+v, want the rule at a.yaml:3", r)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want fs.ErrNotExist", err)
	}
	empty := filepath.Join(dir, "empty")
	must(t, os.Mkdir(empty, 0o755))
	writeFile(t, filepath.Join(empty, "notes.txt"), "x")
	if _, err := Load(empty); err == nil || !strings.Contains(err.Error(), "no *.yaml or *.yml files") {
		t.Errorf("Load(empty dir) = %v, want a no-files error", err)
	}
	dangling := filepath.Join(dir, "dangling")
	must(t, os.Mkdir(dangling, 0o755))
	must(t, os.Symlink("gone.yaml", filepath.Join(dangling, "a.yaml")))
	if _, err := Load(dangling); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(dangling link) = %v, want fs.ErrNotExist", err)
	}
	big := filepath.Join(dir, "big.yaml")
	writeFile(t, big, domainFile("big")+"# "+strings.Repeat("x", MaxFileSize)+"\n")
	var ce *Error
	// Under a total cap above the file's cap, Load reads one byte past the
	// file's: the message must not claim that is the file's size.
	if _, err := LoadWith(big, LoadOptions{MaxTotalBytes: 2 * MaxFileSize}); !errors.As(err, &ce) || ce.File != big ||
		!strings.Contains(ce.Msg, "more than 16 MiB") || strings.Contains(ce.Msg, strconv.Itoa(MaxFileSize+1)) {
		t.Errorf("LoadWith(big file) = %v, want a size *Error saying more than 16 MiB", err)
	}
	// Under the default cap, which is the file's, it is too large a config.
	if _, err := Load(big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Load(big file) = %v, want ErrTooLarge", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: minutes, requests_per_unit: 1}\n")
	want := bad + `:4:24: x > k: rate_limit.unit: unknown unit "minutes" (want second, minute, hour, day, week, month or year)`
	if _, err := Load(bad); err == nil || err.Error() != want {
		t.Errorf("Load(bad.yaml) = %v, want %s", err, want)
	}
}

func TestLoadFile(t *testing.T) {
	name := filepath.Join(t.TempDir(), "limits.yml")
	writeFile(t, name, domainFile("one"))
	s, err := Load(name)
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Domains(); len(d) != 1 || d[0].Name != "one" || len(d[0].Rules) != 1 {
		t.Errorf("Load(%s).Domains() = %+v, want domain one with one rule", name, d)
	}
}

// TestSharedDomain merges files of one domain that do not collide.
func TestSharedDomain(t *testing.T) {
	a := File{"a.yaml", []byte(`
domain: shared
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 1, name: per-model}
`)}
	b := File{"b.yaml", []byte(`
domain: shared
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: per-model}]}
    descriptors:
      - key: model
        rate_limit: {unit: minute, requests_per_unit: 5}
`)}
	for _, files := range [][]File{{a, b}, {b, a}} {
		s := mustParse(t, files...)
		for _, tt := range []struct {
			entries []Entry
			file    string
			line    int
		}{
			{e("tenant", "acme", "user", "u"), "a.yaml", 7},
			{e("tenant", "acme", "model", "m"), "b.yaml", 8},
			{e("tenant", "acme"), "b.yaml", 4},
			{e("model", "m"), "a.yaml", 9},
		} {
			r := s.Lookup("shared", tt.entries)
			if r == nil || r.File != tt.file || r.Line != tt.line {
				t.Errorf("Lookup(shared, %q) = %+v, want the rule at %s:%d", tt.entries, r, tt.file, tt.line)
			}
		}
		d := s.Domains()[0]
		if !slices.Equal(d.Files, []string{"a.yaml", "b.yaml"}) || len(d.Rules) != 4 || d.Rules[0].File != "a.yaml" || d.Rules[3].File != "b.yaml" {
			t.Errorf("Domains()[0] = %+v, want files a.yaml, b.yaml and 4 rules in file order", d)
		}
	}
}

func TestHash(t *testing.T) {
	a, b := File{"a.yaml", []byte(domainFile("a"))}, File{"b.yaml", []byte(domainFile("b"))}
	h1 := mustParse(t, a, b).Hash()
	if h2 := mustParse(t, b, a).Hash(); h1 != h2 {
		t.Errorf("Hash depends on file order: %s != %s", h1, h2)
	}
	if len(h1) != 64 || strings.Trim(h1, "0123456789abcdef") != "" {
		t.Errorf("Hash() = %q, want 64 hex digits", h1)
	}
	renamed := File{"c.yaml", b.Data}
	edited := File{"b.yaml", append([]byte("# comment\n"), b.Data...)}
	for _, files := range [][]File{{a, renamed}, {a, edited}, {a}} {
		if h := mustParse(t, files...).Hash(); h == h1 {
			t.Errorf("Hash(%s…) = Hash(a.yaml, b.yaml)", files[len(files)-1].Name)
		}
	}
	if _, err := Parse([]File{a, a}); err == nil || !strings.Contains(err.Error(), "file given twice") {
		t.Errorf("Parse(a.yaml twice) = %v, want an error", err)
	}
}

func TestParseNothing(t *testing.T) {
	s, err := Parse(nil)
	if err != nil || len(s.Domains()) != 0 || s.Lookup("x", e("k", "v")) != nil {
		t.Errorf("Parse(nil) = %v, %v; want an empty Set", s, err)
	}
	var nilSet *Set
	if nilSet.Lookup("x", e("k", "v")) != nil || nilSet.Domains() != nil || nilSet.Hash() != "" || len(nilSet.Explain("x", nil)) != 1 {
		t.Errorf("a nil *Set is not empty")
	}
}

// TestBooleans accepts what envoyproxy/ratelimit's YAML 1.1 parser reads as
// booleans, and refuses quoted words.
func TestBooleans(t *testing.T) {
	for _, tt := range []struct {
		text string
		want bool
		ok   bool
	}{
		{"true", true, true}, {"True", true, true}, {"false", false, true}, {"yes", true, true},
		{"on", true, true}, {"no", false, true}, {"OFF", false, true},
		{`"yes"`, false, false}, {`"true"`, false, false}, {"1", false, false}, {"maybe", false, false},
	} {
		s, err := Parse([]File{{"b.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: " + tt.text +
			"\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}})
		if (err == nil) != tt.ok {
			t.Errorf("shadow_mode: %s: err = %v, want ok=%v", tt.text, err, tt.ok)
			continue
		}
		if err == nil && s.Lookup("d", e("k", "v")).ShadowMode != tt.want {
			t.Errorf("shadow_mode: %s read as %v", tt.text, !tt.want)
		}
	}
}

func TestUnits(t *testing.T) {
	for _, u := range []string{"second", "Minute", "HOUR", "day", "week", "month", "year"} {
		s, err := Parse([]File{{"u.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: " + u + ", requests_per_unit: 1}\n")}})
		if err != nil {
			t.Errorf("unit %s: %v", u, err)
			continue
		}
		l := s.Lookup("d", e("k", "v")).Limits[0]
		if !strings.EqualFold(l.Unit.String(), u) || l.Limit.Period != l.Unit.Duration() {
			t.Errorf("unit %s read as %v, period %v", u, l.Unit, l.Limit.Period)
		}
	}
}
