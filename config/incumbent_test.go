package config

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/goldentest"
)

// TestIncumbentFixtures loads our counterpart of every YAML file of
// envoyproxy/ratelimit's test/config (testdata/incumbent/testconfig, same
// meaning, our own text) the way its config_test.go does, and checks that
// we accept what it accepts and refuse what it refuses, naming the same
// problem. Where we differ, differs says why (the compatibility table in
// docs/replacing-envoyproxy-ratelimit.md repeats it).
func TestIncumbentFixtures(t *testing.T) {
	const dir = "testdata/incumbent/testconfig/"
	tests := []struct {
		files []string
		// incumbentOK is what its config_test.go expects; wantErr, when
		// we refuse, is a part of our message.
		incumbentOK bool
		wantErr     string
		// differs explains a decision unlike the incumbent's.
		differs string
	}{
		{files: []string{"basic_config.yaml"}, incumbentOK: true},
		{files: []string{"shadowmode_config.yaml"}, incumbentOK: true},
		{files: []string{"wildcard.yaml"}, incumbentOK: true},
		{files: []string{"metadata.yaml"}, incumbentOK: true},
		{files: []string{"share_threshold.yaml"}, incumbentOK: true},
		{files: []string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}, incumbentOK: true}, // with MERGE_DOMAIN_CONFIG
		{files: []string{"basic_config.yaml", "duplicate_domain.yaml"}, incumbentOK: false,
			differs: "ratelimitd always merges the files of one domain (the incumbent's MERGE_DOMAIN_CONFIG=true); validate warns"},
		// TestDuplicateKeyDomainMerge: one file twice, merged.
		{files: []string{"merge_domain_key1.yaml", "merge_domain_key1.yaml"}, wantErr: "this descriptor already has one"},
		{files: []string{"empty_domain.yaml"}, wantErr: "domain: missing"},
		{files: []string{"empty_key.yaml"}, wantErr: "key: missing"},
		{files: []string{"duplicate_key.yaml"}, wantErr: "duplicate descriptor"},
		{files: []string{"bad_limit_unit.yaml"}, wantErr: `unknown unit "foo"`},
		{files: []string{"replaces_self.yaml"}, wantErr: "this rule's own name"},
		{files: []string{"replaces_empty.yaml"}, wantErr: "replaces.name: must not be empty"},
		{files: []string{"bad_yaml.yaml"}, wantErr: "invalid YAML"},
		{files: []string{"misspelled_key.yaml"}, wantErr: `unknown field "ratelimit"`},
		{files: []string{"misspelled_key2.yaml"}, wantErr: `unknown field "requestsperunit"`},
		{files: []string{"non_string_key.yaml"}, wantErr: `unknown field "0.25"`},
		{files: []string{"non_map_list.yaml"}, wantErr: `want a mapping`},
		{files: []string{"unlimited_with_unit.yaml"}, wantErr: "rate_limit.unit: not allowed with unlimited"},
	}
	for _, tt := range tests {
		name := strings.Join(tt.files, "+")
		t.Run(name, func(t *testing.T) {
			var files []File
			for i, f := range tt.files {
				file := readTestFile(t, dir+f)
				if i > 0 && tt.files[i-1] == f {
					file.Name += "#2" // the same content under another name
				}
				files = append(files, file)
			}
			s, err := Parse(files)
			gotOK := err == nil
			wantOK := tt.incumbentOK != (tt.differs != "")
			if gotOK != wantOK {
				t.Fatalf("Parse(%s) = %v, %v; want ok=%v (incumbent ok=%v, differs %q)", name, s, err, wantOK, tt.incumbentOK, tt.differs)
			}
			if err != nil {
				if tt.wantErr == "" || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("Parse(%s) error = %v, want it to say %q", name, err, tt.wantErr)
				}
				var ce *Error
				if !errors.As(err, &ce) || ce.File == "" {
					t.Errorf("Parse(%s) error %v names no file", name, err)
				}
			}
		})
	}
}

// TestIncumbentLookups pins, on the fixtures, the rule the incumbent's
// config_test.go finds for a descriptor, its stats key, and the fields
// the newer features set.
func TestIncumbentLookups(t *testing.T) {
	load := func(names ...string) *Set {
		t.Helper()
		var files []File
		for _, n := range names {
			files = append(files, readTestFile(t, "testdata/incumbent/testconfig/"+n))
		}
		s, err := Parse(files)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	basic, share, meta, wild := load("basic_config.yaml"), load("share_threshold.yaml"), load("metadata.yaml"), load("wildcard.yaml")
	tests := []struct {
		set     *Set
		entries []Entry
		count   int64  // 0: no rule
		statKey string // StatKey(entries)
	}{
		{basic, e("key1", "value1", "subkey1", "something"), 5, "test-domain.key1_value1.subkey1"},
		{basic, e("key1", "value1", "subkey1", "subvalue1"), 10, "test-domain.key1_value1.subkey1_subvalue1"},
		{basic, e("key2", "value2"), 30, "test-domain.key2_value2"},
		{basic, e("key2", "value3"), 0, ""},
		{basic, e("key7", "unspecified"), 70, "test-domain.key7_unspecified"}, // detailed_metric
		{basic, e("key1", "value1"), 0, ""},
		{wild, e("wild", "foo-bar"), 20, "test-domain.wild_foo*"},
		{wild, e("midWild", "barab"), 20, "test-domain.midWild_bar*b"},
		{wild, e("midWild", "barabc"), 0, ""},
		{wild, e("multiWild", "foo1bar2baz"), 10, "test-domain.multiWild_foo*bar*baz"},
		{wild, e("nestedWild", "val1", "wild", "goo-x"), 20, "test-domain.nestedWild_val1.wild_goo*"},
		{share, e("files", "files/a.txt"), 100, "test-domain.files_files/*"},
		{share, e("route", "api/v1", "method", "GET"), 60, "test-domain.route_api/*.method"},
		{share, e("service", "svc/user", "endpoint", "get"), 80, "test-domain.service_svc/*.endpoint_get"},
		{share, e("nested", "parent", "files", "nested/file1.txt"), 200, "test-domain.nested_parent.files_nested/*"},
		{share, e("files", "top/file1.txt", "files", "nested/file1.txt"), 300, "test-domain.files_top/*.files_nested/*"},
		{share, e("path", "path/foo", "file", "file/doc1", "type", "pdf"), 120, "test-domain.path_path/*.file_file/*.type"},
		{share, e("user", "user/alice", "resource", "res/file1", "action", "read"), 150, "test-domain.user_user/*.resource_res/*.action"},
		{share, e("file", "test1"), 50, "test-domain.file_test1"},
		{share, e("file", "test2"), 100, "test-domain.file_test*"},
		{share, e("midpath", "/api/v1"), 100, "test-domain.midpath_/api*v1"},
		{share, e("midpath", "/api/v2"), 0, ""},
		{share, e("multiroute", "svcXepYrpc"), 50, "test-domain.multiroute_svc*ep*rpc"},
		{share, e("multiroute", "svcABCrpc"), 0, ""},
		{share, e("midroute", "/api-beta-v2"), 80, "test-domain.midroute_/api*v2"},
		{share, e("tenant", "t1prod", "resource", "resAv2"), 60, "test-domain.tenant_t*prod.resource_res*v2"},
		{meta, e("key2", "x"), 20, "test-domain.key2"},
	}
	for _, tt := range tests {
		r := tt.set.Lookup("test-domain", tt.entries)
		switch {
		case r == nil && tt.count == 0:
			continue
		case r == nil || tt.count == 0:
			t.Errorf("Lookup(%v) = %v, want a rule of %d", tt.entries, r, tt.count)
			continue
		}
		if got := r.Limits[0].Limit.Count; got != tt.count {
			t.Errorf("Lookup(%v).Limits[0].Count = %d, want %d", tt.entries, got, tt.count)
		}
		if got := r.StatKey(tt.entries); got != tt.statKey {
			t.Errorf("Lookup(%v).StatKey = %q, want %q", tt.entries, got, tt.statKey)
		}
	}
}

// TestValueToMetric pins StatKey against the value_to_metric cases of the
// incumbent's config_test.go (#996).
func TestValueToMetric(t *testing.T) {
	s := parseOne(t, `domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: mid
    descriptors:
      - key: m2
        value_to_metric: true
        descriptors:
          - key: m3
            rate_limit: {unit: second, requests_per_unit: 1}
  - key: plain
    descriptors:
      - key: p2
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: det
    value_to_metric: true
    descriptors:
      - key: d2
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: conf
    value: fixed
    value_to_metric: true
    descriptors:
      - key: c2
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: w
    value: pre*
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	tests := []struct {
		entries []Entry
		want    string
		varies  bool
	}{
		{e("route", "draw", "http_method", "GET", "subject_id", "123"), "d.route_draw.http_method_GET.subject_id", true},
		{e("k1", "A", "k2", "foo"), "d.k1_A.k2", true},
		{e("mid", "x", "m2", "y", "m3", "z"), "d.mid.m2_y.m3", true},
		{e("plain", "x", "p2", "y"), "d.plain.p2", false},
		{e("det", "x", "d2", "y"), "d.det_x.d2_y", true}, // detailed_metric wins
		{e("conf", "fixed", "c2", "v"), "d.conf_fixed.c2", false},
		{e("w", "prefix-1"), "d.w_prefix-1", true},
		{e("k1", "", "k2", "foo"), "d.k1.k2", true},
	}
	for _, tt := range tests {
		r := s.Lookup("d", tt.entries)
		if r == nil {
			t.Errorf("Lookup(%v) = nil", tt.entries)
			continue
		}
		if got := r.StatKey(tt.entries); got != tt.want {
			t.Errorf("StatKey(%v) = %q, want %q", tt.entries, got, tt.want)
		}
		if got := r.StatKeyVaries(); got != tt.varies {
			t.Errorf("StatKeyVaries(%v) = %v, want %v", tt.entries, got, tt.varies)
		}
	}
}

// TestOverrideStatKey: the incumbent's TestConfigLimitOverride keys.
func TestOverrideStatKey(t *testing.T) {
	if got, want := OverrideStatKey("test-domain", e("key1", "value1", "subkey1", "something")), "test-domain.key1_value1.subkey1_something"; got != want {
		t.Errorf("OverrideStatKey = %q, want %q", got, want)
	}
	if got, want := OverrideStatKey("d", e("k", "")), "d.k"; got != want {
		t.Errorf("OverrideStatKey(empty value) = %q, want %q", got, want)
	}
}

// TestShareThresholdBuckets checks that every value a share_threshold
// wildcard matches draws from one bucket, and that without it each value
// has its own.
func TestShareThresholdBuckets(t *testing.T) {
	s := parseOne(t, `domain: d
descriptors:
  - {key: files, value: files/*, share_threshold: true, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: own, value: own/*, rate_limit: {unit: hour, requests_per_unit: 10}}
  - key: top
    value: t/*
    share_threshold: true
    descriptors:
      - {key: user, rate_limit: {unit: hour, requests_per_unit: 10}}
`)
	key := func(entries ...string) string {
		r := s.Lookup("d", e(entries...))
		if r == nil {
			t.Fatalf("Lookup(%v) = nil", entries)
		}
		return string(r.AppendKey(nil, 0, e(entries...)))
	}
	if a, b := key("files", "files/a"), key("files", "files/b"); a != b {
		t.Errorf("share_threshold: keys of files/a and files/b differ: %q, %q", a, b)
	}
	if a, b := key("own", "own/a"), key("own", "own/b"); a == b {
		t.Errorf("no share_threshold: files own/a and own/b share key %q", a)
	}
	if a, b := key("top", "t/1", "user", "u"), key("top", "t/2", "user", "u"); a != b {
		t.Errorf("share_threshold above the rule: keys differ: %q, %q", a, b)
	}
	if a, b := key("top", "t/1", "user", "u"), key("top", "t/1", "user", "v"); a == b {
		t.Errorf("share_threshold above a key-only rule: users share key %q", a)
	}
	if !s.Lookup("d", e("files", "files/a")).SharesBucket() || s.Lookup("d", e("own", "own/a")).SharesBucket() {
		t.Error("SharesBucket is wrong")
	}
}

func parseOne(t *testing.T, yaml string) *Set {
	t.Helper()
	return mustParse(t, File{Name: "t.yaml", Data: []byte(yaml)})
}

// TestQuotaModeAndMetadata reads quota_mode and metadata as the
// incumbent's example does, and metadata values as a Struct holds them.
func TestQuotaModeAndMetadata(t *testing.T) {
	s, err := Load("testdata/incumbent/examples")
	if err != nil {
		t.Fatal(err)
	}
	r := s.Lookup("rl", e("service", "service_1"))
	if r == nil || !r.QuotaMode {
		t.Fatalf("Lookup(service_1) = %+v, want a quota-mode rule", r)
	}
	want := map[string]any{"service_with_quota": map[string]any{"name": "service_1"}}
	if !reflect.DeepEqual(r.Metadata, want) {
		t.Errorf("Metadata = %#v, want %#v", r.Metadata, want)
	}
	if r := s.Lookup("rl", e("foo", "x")); r == nil || r.QuotaMode || r.Metadata != nil {
		t.Errorf("Lookup(foo) = %+v, want no quota mode nor metadata", r)
	}

	s = parseOne(t, `domain: d
descriptors:
  - key: k
    quota_mode: yes
    metadata:
      int: 7
      big: 18446744073709551616
      float: 1.5
      yes: yes
      quoted: "yes"
      "null": ~
      list: [1, a, {b: true}]
      1: numeric key
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: empty
    metadata: {}
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	r = s.Lookup("d", e("k", "v"))
	want = map[string]any{
		"int": 7.0, "big": 18446744073709551616.0, "float": 1.5, "yes": true, "quoted": "yes", "null": nil,
		"list": []any{1.0, "a", map[string]any{"b": true}}, "1": "numeric key",
	}
	if !r.QuotaMode || !reflect.DeepEqual(r.Metadata, want) {
		t.Errorf("rule = quota %v, metadata %#v; want quota, %#v", r.QuotaMode, r.Metadata, want)
	}
	if r := s.Lookup("d", e("empty", "v")); r.Metadata != nil {
		t.Errorf("empty metadata = %#v, want nil", r.Metadata)
	}
}

func TestMetadataErrors(t *testing.T) {
	tests := []struct{ yaml, want string }{
		{"metadata: [1]", "metadata: want a mapping"},
		{"metadata: {a: .inf}", "metadata.a: .inf: a Struct holds only finite numbers"},
		{"metadata: {a: {b: 1, b: 2}}", `metadata.a: "b": repeated`},
		{"metadata: {[a]: 1}", "metadata: keys must be scalars"},
		{"metadata: {a: " + strings.Repeat("[", 110) + strings.Repeat("]", 110) + "}", "nested deeper than 100 levels"},
		{"share_threshold: true", "share_threshold: only a wildcard value"},
		{"quota_mode: maybe", "quota_mode: want true or false"},
		{"value_to_metric: 2", "value_to_metric: want true or false"},
	}
	for _, tt := range tests {
		src := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    " + tt.yaml + "\n"
		_, err := Parse([]File{{Name: "t.yaml", Data: []byte(src)}})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%s) = %v, want an error with %q", tt.yaml, err, tt.want)
		}
	}
}

func TestMergeMetadata(t *testing.T) {
	a := map[string]any{"s": map[string]any{"x": 1.0}, "n": "first"}
	b := map[string]any{"s": map[string]any{"x": 2.0, "y": 3.0}, "n": "second", "m": []any{"l"}}
	got := MergeMetadata(nil, a)
	got = MergeMetadata(got, b)
	want := map[string]any{"s": map[string]any{"x": 1.0, "y": 3.0}, "n": "first", "m": []any{"l"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("MergeMetadata = %#v, want %#v", got, want)
	}
	if !reflect.DeepEqual(a, map[string]any{"s": map[string]any{"x": 1.0}, "n": "first"}) {
		t.Errorf("MergeMetadata modified its source: %#v", a)
	}
	if MergeMetadata(nil, nil) != nil {
		t.Error("MergeMetadata(nil, nil) != nil")
	}
}

// TestWarnings pins what validate warns about: files that mean something
// else, or are refused, under envoyproxy/ratelimit.
func TestWarnings(t *testing.T) {
	s, err := Parse([]File{
		{Name: "a.yaml", Data: []byte(`domain: d
descriptors:
  - {key: m, value: gpt-*, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: m, value: gpt-4*, rate_limit: {unit: second, requests_per_unit: 2}}
  - {key: m, value: claude*, rate_limit: {unit: second, requests_per_unit: 3}}
  - {key: n, value: a*, rate_limit: {unit: second, requests_per_unit: 3}}
  - {key: n, value: b*, rate_limit: {unit: second, requests_per_unit: 3}}
  - {key: u, rate_limit: {unlimited: true, requests_per_unit: 5}}
  - {key: r, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: nowhere}]}}
`)},
		{Name: "b.yaml", Data: []byte("domain: d\ndescriptors:\n  - {key: z, rate_limit: {unit: second, requests_per_unit: 1}}\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range s.Warnings() {
		got = append(got, w.Error())
	}
	want := []string{
		`a.yaml:4:6: d > m=gpt-4*: value "gpt-4*": a value matching both this and "gpt-*" (a.yaml:3) gets this more specific rule here, but the earlier one under envoyproxy/ratelimit, which takes the first match in file order: put this descriptor first to mean the same under both`,
		`a.yaml:8:44: d > u: rate_limit.requests_per_unit: ignored with unlimited: true (envoyproxy/ratelimit ignores it too)`,
		`a.yaml:9:81: d > r: replaces: no rule named "nowhere" in domain d: it replaces nothing`,
		`b.yaml: d: domain d is also defined by a.yaml: ratelimitd merges the files of one domain, envoyproxy/ratelimit refuses them unless MERGE_DOMAIN_CONFIG is true`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Warnings() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if r := s.Lookup("d", e("u", "x")); r == nil || r.Kind != KindUnlimited {
		t.Errorf("unlimited with requests_per_unit = %+v, want an unlimited rule", r)
	}
}

func TestGlobsMeet(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"gpt-*", "gpt-4*", true},
		{"a*", "b*", false},
		{"*x", "y*", true},
		{"a*c", "ab*", true},
		{"a*c", "*d", false},
		{"abc", "a*", true},
		{"abc", "abd", false},
		{"*", "", true},
		{"a*b*c", "*bbb*", true},
		{"x*y", "x*z", false},
	}
	for _, tt := range tests {
		if got := globsMeet(tt.a, tt.b); got != tt.want {
			t.Errorf("globsMeet(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
		if got := globsMeet(tt.b, tt.a); got != tt.want {
			t.Errorf("globsMeet(%q, %q) = %v, want %v", tt.b, tt.a, got, tt.want)
		}
	}
}

// TestIncumbentDirs loads the incumbent's integration-test config directory
// and examples/ratelimit/config (our counterparts) as directories.
func TestIncumbentDirs(t *testing.T) {
	for _, dir := range []string{"testdata/incumbent/integration", "testdata/incumbent/examples"} {
		if _, err := Load(dir); err != nil {
			t.Errorf("Load(%s): %v", dir, err)
		}
	}
}

// TestWriteText pins the /rlconfig text of the incumbent's example.
func TestWriteText(t *testing.T) {
	s, err := Load("testdata/incumbent/examples")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := s.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	_ = s.WriteText(&again)
	if b.String() != again.String() {
		t.Error("WriteText is not deterministic")
	}
	if want, differ := goldentest.Compare(t, "testdata/rlconfig.golden", b.String()); differ {
		t.Errorf("WriteText =\n%s\nwant\n%s", b.String(), want)
	}
}
