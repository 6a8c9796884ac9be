package xdsconfig

import (
	"math"
	"reflect"
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

type m = map[string]any
type l = []any

func policy0(unit rlsconfv3.RateLimitUnit, n uint32) *rlsconfv3.RateLimitPolicy {
	return &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}
}

func one(d ...*rlsconfv3.RateLimitDescriptor) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: "api", Domain: "api", Descriptors: d}
}

// unknownUnit is domain api with a rule of an unknown unit, at
// api > route=r1 > user: refused by the loader.
func unknownUnit() []*rlsconfv3.RateLimitConfig {
	return []*rlsconfv3.RateLimitConfig{one(&rlsconfv3.RateLimitDescriptor{Key: "route", Value: "r1", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "user", RateLimit: policy0(rlsconfv3.RateLimitUnit_UNKNOWN, 5)},
	}})}
}

// conflict is domain api in two resources (api and api-2: a snapshot
// holds one resource a name) that both have a rule for k=v: the second
// (file xds:api#2) is refused by the loader.
func conflict() []*rlsconfv3.RateLimitConfig {
	second := one(&rlsconfv3.RateLimitDescriptor{Key: "k", Value: "v", RateLimit: policy0(rlsconfv3.RateLimitUnit_SECOND, 2)})
	second.Name = "api-2"
	return []*rlsconfv3.RateLimitConfig{
		one(&rlsconfv3.RateLimitDescriptor{Key: "k", Value: "v", RateLimit: policy0(rlsconfv3.RateLimitUnit_SECOND, 1)}),
		second,
	}
}

// decode reads the converter's YAML back into plain Go values.
func decode(t *testing.T, f config.File) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(f.Data, &v); err != nil {
		t.Fatalf("the YAML of %s does not decode: %v\n%s", f.Name, err, f.Data)
	}
	return v
}

// TestFile: each field of the proto becomes the YAML field config.Parse
// reads (decoded again and compared as values), with the optional ones
// left out when unset.
func TestFile(t *testing.T) {
	tricky := []string{"true", "1", "null", "~", "a: b", "#x", "- x", "*", " lead", "trail ", "line\nbreak",
		"tab\tquote\"back\\slash", "nul\x00byte", "emoji 🚦", "'single'", "{flow}", "[x]", "&anchor", "!tag", "%directive", ""}
	tests := []struct {
		name string
		in   *rlsconfv3.RateLimitConfig
		want any
	}{
		{
			name: "domain only",
			in:   &rlsconfv3.RateLimitConfig{Name: "n", Domain: "d"},
			want: m{"domain": "d"},
		},
		{
			name: "key and value, limit, every unit name",
			in: one(
				&rlsconfv3.RateLimitDescriptor{Key: "a", Value: "1", RateLimit: policy0(rlsconfv3.RateLimitUnit_SECOND, 1)},
				&rlsconfv3.RateLimitDescriptor{Key: "b", RateLimit: policy0(rlsconfv3.RateLimitUnit_MINUTE, 2)},
				&rlsconfv3.RateLimitDescriptor{Key: "c", RateLimit: policy0(rlsconfv3.RateLimitUnit_HOUR, 3)},
				&rlsconfv3.RateLimitDescriptor{Key: "d", RateLimit: policy0(rlsconfv3.RateLimitUnit_DAY, 4)},
				&rlsconfv3.RateLimitDescriptor{Key: "e", RateLimit: policy0(rlsconfv3.RateLimitUnit_WEEK, 5)},
				&rlsconfv3.RateLimitDescriptor{Key: "f", RateLimit: policy0(rlsconfv3.RateLimitUnit_MONTH, 6)},
				&rlsconfv3.RateLimitDescriptor{Key: "g", RateLimit: policy0(rlsconfv3.RateLimitUnit_YEAR, math.MaxUint32)},
				&rlsconfv3.RateLimitDescriptor{Key: "h", RateLimit: policy0(rlsconfv3.RateLimitUnit_UNKNOWN, 7)},
				&rlsconfv3.RateLimitDescriptor{Key: "i", RateLimit: policy0(rlsconfv3.RateLimitUnit(99), 8)},
			),
			want: m{"domain": "api", "descriptors": l{
				m{"key": "a", "value": "1", "rate_limit": m{"unit": "second", "requests_per_unit": 1}},
				m{"key": "b", "rate_limit": m{"unit": "minute", "requests_per_unit": 2}},
				m{"key": "c", "rate_limit": m{"unit": "hour", "requests_per_unit": 3}},
				m{"key": "d", "rate_limit": m{"unit": "day", "requests_per_unit": 4}},
				m{"key": "e", "rate_limit": m{"unit": "week", "requests_per_unit": 5}},
				m{"key": "f", "rate_limit": m{"unit": "month", "requests_per_unit": 6}},
				m{"key": "g", "rate_limit": m{"unit": "year", "requests_per_unit": math.MaxUint32}},
				m{"key": "h", "rate_limit": m{"unit": "unknown", "requests_per_unit": 7}},
				m{"key": "i", "rate_limit": m{"unit": "99", "requests_per_unit": 8}},
			}},
		},
		{
			name: "block rule, unlimited, name and replaces",
			in: one(
				&rlsconfv3.RateLimitDescriptor{Key: "blocked", RateLimit: policy0(rlsconfv3.RateLimitUnit_HOUR, 0)},
				&rlsconfv3.RateLimitDescriptor{Key: "free", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, Name: "free"}},
				&rlsconfv3.RateLimitDescriptor{Key: "odd", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 3}},
				&rlsconfv3.RateLimitDescriptor{Key: "vip", RateLimit: &rlsconfv3.RateLimitPolicy{
					Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 100, Name: "vip",
					Replaces: []*rlsconfv3.RateLimitReplace{{Name: "base"}, {Name: "other"}},
				}},
			),
			want: m{"domain": "api", "descriptors": l{
				m{"key": "blocked", "rate_limit": m{"unit": "hour", "requests_per_unit": 0}},
				m{"key": "free", "rate_limit": m{"unlimited": true, "name": "free"}},
				m{"key": "odd", "rate_limit": m{"unlimited": true, "unit": "day", "requests_per_unit": 3}},
				m{"key": "vip", "rate_limit": m{"unit": "minute", "requests_per_unit": 100, "name": "vip",
					"replaces": l{m{"name": "base"}, m{"name": "other"}}}},
			}},
		},
		{
			name: "flags, quota_mode and metadata only when set",
			in: one(
				&rlsconfv3.RateLimitDescriptor{Key: "plain"},
				&rlsconfv3.RateLimitDescriptor{Key: "all", ShadowMode: true, DetailedMetric: true, QuotaMode: true,
					Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
						"s":     structpb.NewStringValue("true"),
						"n":     structpb.NewNumberValue(3),
						"f":     structpb.NewNumberValue(0.25),
						"big":   structpb.NewNumberValue(1e300),
						"b":     structpb.NewBoolValue(false),
						"null":  structpb.NewNullValue(),
						"list":  structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("x"), structpb.NewNumberValue(-1)}}),
						"inner": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"k: y": structpb.NewStringValue("")}}),
					}}},
				&rlsconfv3.RateLimitDescriptor{Key: "empty metadata", Metadata: &structpb.Struct{}},
			),
			want: m{"domain": "api", "descriptors": l{
				m{"key": "plain"},
				m{"key": "all", "shadow_mode": true, "detailed_metric": true, "quota_mode": true, "metadata": m{
					"s": "true", "n": 3, "f": 0.25, "big": 1e300, "b": false, "null": nil,
					"list": l{"x", -1}, "inner": m{"k: y": ""},
				}},
				m{"key": "empty metadata", "metadata": m{}},
			}},
		},
		{
			name: "nested descriptors",
			in: one(&rlsconfv3.RateLimitDescriptor{Key: "a", Value: "x", Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "b", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "c", Value: "z", RateLimit: policy0(rlsconfv3.RateLimitUnit_SECOND, 9)}}},
			}}),
			want: m{"domain": "api", "descriptors": l{
				m{"key": "a", "value": "x", "descriptors": l{
					m{"key": "b", "descriptors": l{m{"key": "c", "value": "z", "rate_limit": m{"unit": "second", "requests_per_unit": 9}}}},
				}},
			}},
		},
		{
			name: "strings that need quoting stay strings",
			in: func() *rlsconfv3.RateLimitConfig {
				rc := &rlsconfv3.RateLimitConfig{Domain: "yes"}
				for _, s := range tricky {
					rc.Descriptors = append(rc.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: "k" + s, Value: s})
				}
				return rc
			}(),
			want: func() any {
				var ds l
				for _, s := range tricky {
					d := m{"key": "k" + s}
					if s != "" {
						d["value"] = s
					}
					ds = append(ds, d)
				}
				return m{"domain": "yes", "descriptors": ds}
			}(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := File(tt.in)
			if err != nil {
				t.Fatalf("File: %v", err)
			}
			if got := decode(t, f); !reflect.DeepEqual(normalize(got), normalize(tt.want)) {
				t.Errorf("File(%s) decodes to\n%#v\nwant\n%#v\nYAML:\n%s", tt.name, got, tt.want, f.Data)
			}
		})
	}
}

// normalize makes the numbers of decoded YAML and of the tables compare
// equal (yaml.v3 decodes integers as int, uint64 when large).
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	case int:
		return float64(x)
	case uint64:
		return float64(x)
	case int64:
		return float64(x)
	}
	return v
}

// TestFileErrors: values the YAML cannot carry are refused with the field.
func TestFileErrors(t *testing.T) {
	deep := structpb.NewStringValue("leaf")
	for range maxStructDepth + 2 {
		deep = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{deep}})
	}
	tests := []struct {
		name string
		md   *structpb.Struct
		want string
	}{
		{"NaN", &structpb.Struct{Fields: map[string]*structpb.Value{"x": structpb.NewNumberValue(math.NaN())}}, `"x": number NaN is not a JSON value`},
		{"too deep", &structpb.Struct{Fields: map[string]*structpb.Value{"x": deep}}, "nested more than 64 levels deep"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := File(one(&rlsconfv3.RateLimitDescriptor{Key: "k", Metadata: tt.md}))
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), `descriptor "k" metadata`) {
				t.Fatalf("File = %v, want an error about descriptor \"k\" metadata containing %q", err, tt.want)
			}
		})
	}
}

// TestParseConverted: converted files load with config.Parse, the EG
// fixture's rules have their limits, and the loader's errors name the
// pseudo-file, the domain and the descriptor path.
func TestParseConverted(t *testing.T) {
	files, err := Files([]*rlsconfv3.RateLimitConfig{xdstest.EGConfig("default/eg/http", "httproute/default/backend/rule/0", true)})
	if err != nil {
		t.Fatal(err)
	}
	set, err := config.Parse(files)
	if err != nil {
		t.Fatalf("Parse(EG fixture): %v\n%s", err, files[0].Data)
	}
	route := config.Entry{Key: "httproute/default/backend/rule/0", Value: "httproute/default/backend/rule/0"}
	lookups := []struct {
		entries []config.Entry
		kind    config.Kind
		count   int64
		unit    config.Unit
	}{
		{[]config.Entry{route, {Key: "rule-0-match-0", Value: "rule-0-match-0"}}, config.KindLimited, 10, config.Minute},
		{[]config.Entry{route, {Key: "rule-1-match-0", Value: "anyone"}}, config.KindLimited, 5, config.Second},
		{[]config.Entry{route, {Key: "rule-2-match--1", Value: "rule-2-match--1"}}, config.KindDenyAll, 0, config.Hour},
		{[]config.Entry{route, {Key: "rule-3-match-0", Value: "rule-3-match-0"}, {Key: "rule-3-match-1", Value: "rule-3-match-1"}}, config.KindLimited, 1000, config.Week},
	}
	for _, lk := range lookups {
		r := set.Lookup("default/eg/http", lk.entries)
		if r == nil {
			t.Errorf("Lookup(%v) = nil, want a %v rule", lk.entries, lk.kind)
			continue
		}
		if r.Kind != lk.kind || len(r.Limits) != 1 || r.Limits[0].Limit.Count != lk.count || r.Limits[0].Unit != lk.unit || !r.ShadowMode {
			t.Errorf("Lookup(%v) = %v %+v shadow %v, want %v %d per %v in shadow mode", lk.entries, r.Kind, r.Limits, r.ShadowMode, lk.kind, lk.count, lk.unit)
		}
		if r.File != "xds:default/eg/http" {
			t.Errorf("rule file %q, want xds:default/eg/http", r.File)
		}
	}

	bad := []struct {
		name string
		in   []*rlsconfv3.RateLimitConfig
		want []string
	}{
		{
			name: "unknown unit",
			in:   unknownUnit(),
			want: []string{"xds:api:", ": api > route=r1 > user: rate_limit.unit: unknown unit \"unknown\" (want second"},
		},
		{
			name: "unlimited with a unit",
			in: []*rlsconfv3.RateLimitConfig{one(&rlsconfv3.RateLimitDescriptor{Key: "k",
				RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, Unit: rlsconfv3.RateLimitUnit_DAY}})},
			want: []string{"xds:api:", "api > k: rate_limit.unit: not allowed with unlimited: true"},
		},
		{
			name: "the same descriptor twice in two resources of one domain",
			in:   conflict(),
			want: []string{"xds:api", "api > k=v"},
		},
		{
			name: "no domain",
			in:   []*rlsconfv3.RateLimitConfig{{Name: "nameless"}},
			want: []string{`xds:(resource "nameless")`, "domain"},
		},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			files, err := Files(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			_, err = config.Parse(files)
			if err == nil {
				t.Fatalf("Parse = nil error, want one containing %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Parse error\n%v\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

// TestFilesSameDomain: resources that share a domain are separate files of
// it, merged by config.Parse as files on disk are.
func TestFilesSameDomain(t *testing.T) {
	a := one(&rlsconfv3.RateLimitDescriptor{Key: "a", RateLimit: policy0(rlsconfv3.RateLimitUnit_SECOND, 1)})
	b := one(&rlsconfv3.RateLimitDescriptor{Key: "b", RateLimit: policy0(rlsconfv3.RateLimitUnit_SECOND, 2)})
	files, err := Files([]*rlsconfv3.RateLimitConfig{a, b, a})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	if want := []string{"xds:api", "xds:api#2", "xds:api#3"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("file names %q, want %q", names, want)
	}
	// A domain that looks like a suffixed name keeps its name.
	odd := &rlsconfv3.RateLimitConfig{Domain: "api#2"}
	files2, err := Files([]*rlsconfv3.RateLimitConfig{a, a, odd, a})
	if err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, f := range files2 {
		names = append(names, f.Name)
	}
	if want := []string{"xds:api", "xds:api#3", "xds:api#2", "xds:api#4"}; !reflect.DeepEqual(names, want) {
		t.Errorf("file names %q, want %q", names, want)
	}
	set, err := config.Parse(files[:2])
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int64{"a": 1, "b": 2} {
		r := set.Lookup("api", []config.Entry{{Key: key, Value: "x"}})
		if r == nil || r.Limits[0].Limit.Count != want {
			t.Errorf("Lookup(api, %s) = %v, want %d per second", key, r, want)
		}
	}
}

// TestFileLines: every field of a converted file is on its own line, so
// config errors point at it.
func TestFileLines(t *testing.T) {
	f, err := File(xdstest.EGConfig("d", "r", false))
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(strings.TrimSpace(string(f.Data)), "\n") {
		if strings.Count(line, ": ") > 1 || strings.Contains(line, "{") {
			t.Errorf("line %d %q holds more than one field", i+1, line)
		}
	}
	if t.Failed() {
		t.Logf("YAML:\n%s", f.Data)
	}
}

// TestFileAIGateway: the AI Gateway fixture keeps quota_mode on every
// level and the backends' metadata (checked on the YAML, as config does
// not read these two fields yet).
func TestFileAIGateway(t *testing.T) {
	f, err := File(xdstest.AIGatewayConfig())
	if err != nil {
		t.Fatal(err)
	}
	if f.Name != "xds:"+xdstest.AIGatewayDomain {
		t.Errorf("file name %q", f.Name)
	}
	var doc struct {
		Domain      string
		Descriptors []yamlDesc
	}
	if err := yaml.Unmarshal(f.Data, &doc); err != nil {
		t.Fatal(err)
	}
	levels := 0
	var walk func(path string, ds []yamlDesc)
	walk = func(path string, ds []yamlDesc) {
		for _, d := range ds {
			p := path + " > " + d.Key + "=" + d.Value
			levels++
			if d.QuotaMode == nil || !*d.QuotaMode {
				t.Errorf("%s: quota_mode %v, want true", p, d.QuotaMode)
			}
			if d.Key == "backend_name" && (d.Metadata["backend"] != d.Value || d.Metadata["priority"] == nil) {
				t.Errorf("%s: metadata %v, want backend %q and a priority", p, d.Metadata, d.Value)
			}
			if d.Key != "backend_name" && d.Metadata != nil {
				t.Errorf("%s: metadata %v, want none", p, d.Metadata)
			}
			walk(p, d.Descriptors)
		}
	}
	walk(doc.Domain, doc.Descriptors)
	if doc.Domain != xdstest.AIGatewayDomain || levels != 5 {
		t.Errorf("domain %q with %d descriptors, want %s with 5", doc.Domain, levels, xdstest.AIGatewayDomain)
	}
}

type yamlDesc struct {
	Key, Value  string
	QuotaMode   *bool          `yaml:"quota_mode"`
	Metadata    map[string]any `yaml:"metadata"`
	Descriptors []yamlDesc
}

// TestMetadataRoundTrip: a push's metadata reaches the rule as the Struct
// held it: strings that a YAML 1.1 parser reads as booleans (yes, on, off)
// stay strings, numbers become float64, nesting and lists are kept.
func TestMetadataRoundTrip(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{
		"yes": "yes", "on": "on", "off": "off", "null": "null", "n": 3.0, "f": 1.5, "b": true,
		"nested": map[string]any{"list": []any{"x", 2.0, false}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rc := &rlsconfv3.RateLimitConfig{Name: "api", Domain: "api", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "k", Value: "on", Metadata: md,
		RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}}}}
	f, err := File(rc)
	if err != nil {
		t.Fatal(err)
	}
	set, err := config.Parse([]config.File{f})
	if err != nil {
		t.Fatalf("Parse:\n%s\n%v", f.Data, err)
	}
	r := set.Lookup("api", []config.Entry{{Key: "k", Value: "on"}})
	if r == nil {
		t.Fatalf("no rule for k=on in\n%s", f.Data)
	}
	want := md.AsMap()
	if !reflect.DeepEqual(r.Metadata, want) {
		t.Errorf("Rule.Metadata = %#v, want %#v\n%s", r.Metadata, want, f.Data)
	}
}
