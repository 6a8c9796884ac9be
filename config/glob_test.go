package config

import (
	"fmt"
	"strings"
	"testing"
)

// globReference is the plain definition that globPattern implements: '*'
// matches any run of bytes (by recursion over the pattern, exponential in
// the number of '*': short inputs only), except that the literals between
// two '*' are sought only within the MaxScanBytes after the prefix.
func globReference(pattern, value string) bool {
	first, last := strings.IndexByte(pattern, '*'), strings.LastIndexByte(pattern, '*')
	prefix, suffix := pattern[:first], pattern[last+1:]
	if len(value) < len(prefix)+len(suffix) || !strings.HasPrefix(value, prefix) || !strings.HasSuffix(value, suffix) {
		return false
	}
	middle := pattern[first : last+1] // starts and ends with '*'
	region := value[len(prefix) : len(value)-len(suffix)]
	if len(region) > MaxScanBytes {
		region = region[:MaxScanBytes] // middle ends with '*': the rest is absorbed
	}
	var rec func(p, v string) bool
	rec = func(p, v string) bool {
		if p == "" {
			return v == ""
		}
		if p[0] == '*' {
			for i := 0; i <= len(v); i++ {
				if rec(p[1:], v[i:]) {
					return true
				}
			}
			return false
		}
		return v != "" && v[0] == p[0] && rec(p[1:], v[1:])
	}
	return rec(middle, region)
}

// FuzzGlob holds the compiled matcher to the reference definition, and to
// its bound on the bytes it examines.
func FuzzGlob(f *testing.F) {
	for _, s := range [][2]string{
		{"*", ""}, {"a*", "abc"}, {"*c", "abc"}, {"a*b*c", "aXbYc"}, {"*a*b*", "ba"},
		{"ab*ba", "aba"}, {"*aa*aa*", "aaa"}, {"**x**", "x"}, {"*ab*abc*", "ababc"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, value string) {
		if !strings.Contains(pattern, "*") || strings.Count(pattern, "*") > 6 || len(pattern) > 24 || len(value) > 48 {
			return // the reference is exponential in stars
		}
		g := compileGlob(pattern)
		got, steps := g.matchSteps(value)
		if want := globReference(pattern, value); got != want {
			t.Fatalf("compileGlob(%q).match(%q) = %v, want %v", pattern, value, got, want)
		}
		if steps > g.maxSteps() {
			t.Fatalf("compileGlob(%q).matchSteps(%q) examined %d bytes, more than its bound %d", pattern, value, steps, g.maxSteps())
		}
	})
}

// TestGlobWindow pins what the MaxScanBytes window means: the prefix and
// suffix are checked on the whole value, the inner literals are sought only
// within the window.
func TestGlobWindow(t *testing.T) {
	long := strings.Repeat("x", 2*MaxScanBytes)
	for _, tt := range []struct {
		pattern, value string
		want           bool
	}{
		{"*-mini", long + "-mini", true},
		{"gpt-*", "gpt-" + long, true},
		{"gpt-*-mini", "gpt-" + long + "-mini", true},
		{"*a*", strings.Repeat("x", MaxScanBytes-1) + "a" + long, true},
		{"*a*", strings.Repeat("x", MaxScanBytes) + "a" + long, false},
		{"p*a*", "p" + strings.Repeat("x", MaxScanBytes-1) + "a" + long, true},
	} {
		if got := compileGlob(tt.pattern).match(tt.value); got != tt.want {
			t.Errorf("compileGlob(%q).match(%d bytes) = %v, want %v", tt.pattern, len(tt.value), got, tt.want)
		}
		if got := globReference(tt.pattern, tt.value); got != tt.want && strings.Count(tt.pattern, "*") <= 2 {
			t.Errorf("globReference(%q, %d bytes) = %v, want %v", tt.pattern, len(tt.value), got, tt.want)
		}
	}
}

// hostileSets are the configs and values of issue 21: 400 leading-'*'
// rules, and one pathological pattern, each against a 60 KiB value.
func hostileSets(t testing.TB) []struct {
	name  string
	set   *Set
	value string
} {
	var many strings.Builder
	many.WriteString("domain: d\ndescriptors:\n")
	for i := range 200 {
		fmt.Fprintf(&many, "  - {key: k, value: \"*-mini%d\", rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
		fmt.Fprintf(&many, "  - {key: k, value: \"*a*b*c*d%d*\", rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	one := "domain: d\ndescriptors:\n  - {key: k, value: \"*" + strings.Repeat("a", 4000) + "b\", rate_limit: {unit: second, requests_per_unit: 1}}\n" +
		"  - {key: k, value: \"*" + strings.Repeat("a", 4000) + "b*\", rate_limit: {unit: second, requests_per_unit: 1}}\n"
	load := func(src string) *Set {
		s, err := Parse([]File{{Name: "d.yaml", Data: []byte(src)}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	abcd := strings.Repeat("abcd", 60<<10/4)
	return []struct {
		name  string
		set   *Set
		value string
	}{
		{"400-leading-star/abcd", load(many.String()), abcd},
		{"400-leading-star/a", load(many.String()), strings.Repeat("a", 60<<10)},
		{"one-pathological/a", load(one), strings.Repeat("a", 60<<10)},
		{"one-pathological/ab", load(one), strings.Repeat("a", 60<<10-1) + "c"},
	}
}

// lookupSteps is the bytes examined by the wildcards at the first level of
// domain d for key k and value, and the bound on them.
func lookupSteps(s *Set, value string) (steps, bound int) {
	k := s.domains["d"].root.children["k"]
	for _, c := range k.wild {
		_, n := c.glob.matchSteps(value)
		steps += n
		bound += len(c.value) + MaxScanBytes
	}
	return steps, bound
}

// TestHostileMatchingIsBounded: the configs of issue 21 examine at most
// len(pattern)+MaxScanBytes bytes of the 60 KiB value per pattern, and
// Lookup does not allocate.
func TestHostileMatchingIsBounded(t *testing.T) {
	for _, h := range hostileSets(t) {
		steps, bound := lookupSteps(h.set, h.value)
		if steps > bound {
			t.Errorf("%s: examined %d bytes, more than %d", h.name, steps, bound)
		}
		// 400 patterns × 4 KiB is the worst case: under 2 MiB, about 0.5 ms.
		if steps > 2<<20 {
			t.Errorf("%s: examined %d bytes, want at most 2 MiB", h.name, steps)
		}
		entries := []Entry{{Key: "k", Value: h.value}}
		if a := testing.AllocsPerRun(10, func() { h.set.Lookup("d", entries) }); a != 0 {
			t.Errorf("%s: Lookup allocates %v times, want 0", h.name, a)
		}
	}
}

// BenchmarkHostileLookup times the configs of issue 21 (each should decide
// in well under 1 ms; before the bounded matcher they took 116 ms and
// 0.93 s).
func BenchmarkHostileLookup(b *testing.B) {
	for _, h := range hostileSets(b) {
		b.Run(h.name, func(b *testing.B) {
			entries := []Entry{{Key: "k", Value: h.value}}
			b.ReportAllocs()
			for b.Loop() {
				h.set.Lookup("d", entries)
			}
		})
	}
}
