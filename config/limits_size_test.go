package config

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// nested returns a file whose descriptors nest depth levels deep, each
// level with the given key and value, the deepest with a rate_limit.
func nested(depth int, key, value string) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors: ")
	for i := range depth {
		fmt.Fprintf(&b, "[{key: %q, value: %q", key, value)
		if i == depth-1 {
			b.WriteString(", rate_limit: {unit: second, requests_per_unit: 1}")
		} else {
			b.WriteString(", descriptors: ")
		}
	}
	b.WriteString(strings.Repeat("}]", depth) + "\n")
	return b.String()
}

// rateLimitFile is a file of one rule, key k in domain d, whose rate_limit
// is rl.
func rateLimitFile(rl string) string {
	return "domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + rl + "\n"
}

// TestSizeLimits checks each bound on a file at and just past it: what a
// request within the server's default limits could match is accepted, what
// it could not, or what would overflow, is an error in the file's terms.
func TestSizeLimits(t *testing.T) {
	for _, tt := range []struct {
		name, file string
		want       string // a part of the error, "" for none
	}{
		{"key of MaxKeyBytes", nested(1, strings.Repeat("k", MaxKeyBytes), "v"), ""},
		{"key past MaxKeyBytes", nested(1, strings.Repeat("k", MaxKeyBytes+1), "v"), fmt.Sprintf("key: too long: %d bytes, at most %d", MaxKeyBytes+1, MaxKeyBytes)},
		{"value of MaxValueBytes", nested(1, "k", strings.Repeat("v", MaxValueBytes)), ""},
		{"value past MaxValueBytes", nested(1, "k", strings.Repeat("v", MaxValueBytes+1)), "value: too long: 4097 bytes, at most 4096"},
		{"domain of MaxDomainBytes", strings.Replace(nested(1, "k", "v"), "domain: d", "domain: "+strings.Repeat("d", MaxDomainBytes), 1), ""},
		{"domain past MaxDomainBytes", strings.Replace(nested(1, "k", "v"), "domain: d", "domain: "+strings.Repeat("d", MaxDomainBytes+1), 1), fmt.Sprintf("domain: too long: %d bytes, at most %d", MaxDomainBytes+1, MaxDomainBytes)},
		{"MaxDepth levels", nested(MaxDepth, "k", "v"), ""},
		{"past MaxDepth", nested(MaxDepth+1, "k", "v"), fmt.Sprintf("nested deeper than %d levels", MaxDepth)},
		{"unit_multiplier of 2^32-1", rateLimitFile("{unit: second, requests_per_unit: 2, burst: 1, unit_multiplier: 4294967295}"), ""},
		{"unit_multiplier of 2^32", rateLimitFile("{unit: second, requests_per_unit: 1, unit_multiplier: 4294967296}"), "rate_limit.unit_multiplier: 4294967296 is too large (at most 4294967295)"},
		{"deny-all for 292 years", rateLimitFile("{unit: year, requests_per_unit: 0, unit_multiplier: 292}"), ""},
		{"deny-all for 293 years", rateLimitFile("{unit: year, requests_per_unit: 0, unit_multiplier: 293}"), ":4:69: d > k: rate_limit.unit_multiplier: 293 years is too long a period (at most 292 years)"},
		{"requests_per_unit of 2^64-1", rateLimitFile("{unit: second, requests_per_unit: 18446744073709551615}"), "rate_limit.requests_per_unit: 18446744073709551615 is too large (at most 1099511627776)"},
		{"count bound at its field", rateLimitFile("\n      unit: second\n      requests_per_unit: 2000000000000"), ":6:26: d > k: rate_limit.requests_per_unit: 2000000000000 is too large"},
		{"burst bound at its field", rateLimitFile("\n      unit: second\n      requests_per_unit: 1\n      burst: 2000000000000"), ":7:14: d > k: rate_limit.burst: 2000000000000 is too large (at most 1099511627776)"},
		// Bounds left beside the rates the incumbent accepts (uint32).
		{"a burst far above the rate", rateLimitFile("{unit: second, requests_per_unit: 1000000000, burst: 1000000000000}"), ""},
		{"an overdraft of 2^40 on a uint32 rate", rateLimitFile("{unit: second, requests_per_unit: 4294967295, overdraft: {max_debt: 1099511627776}}"), ""},
		{"a uint32 rate over 100 years", rateLimitFile("{unit: year, requests_per_unit: 4294967295, unit_multiplier: 100}"), ""},
		{"over 101 years", rateLimitFile("{unit: year, requests_per_unit: 4294967295, unit_multiplier: 101}"),
			"rate_limit.unit_multiplier: 101 years is too long a period: the bucket (burst defaults to requests_per_unit) takes that long to fill, more than 100 years"},
		{"a debt past 100 years", rateLimitFile("{unit: year, requests_per_unit: 4294967295, unit_multiplier: 50, overdraft: {max_debt: 4294967296}}"),
			"rate_limit.overdraft.max_debt: paying a debt of 4294967296 and filling burst 4294967295 (the default, requests_per_unit) at 4294967295 per 50 years takes just over 100 years, more than 100 years"},
		{"past 2^40", rateLimitFile("{unit: second, requests_per_unit: 1099511627777}"), "rate_limit.requests_per_unit: 1099511627777 is too large (at most 1099511627776)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse([]File{{"f.yaml", []byte(tt.file)}})
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Parse = %v, want a Set", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Parse = %v, %v; want an error with %q", s, err, tt.want)
			case tt.want != "" && strings.Count(err.Error(), "\n") > 0:
				t.Errorf("Parse errors:\n%v\nwant one", err)
			}
			if s == nil {
				return
			}
			for _, r := range s.Domains()[0].Rules {
				if r.Kind != KindDenyAll {
					continue
				}
				if l := r.Limits[0]; time.Duration(l.UnitMultiplier)*l.Unit.Duration() <= 0 {
					t.Errorf("rule %s: deny-all period %d × %v overflows", r.Path, l.UnitMultiplier, l.Unit)
				}
			}
		})
	}
}

// TestPathMemory parses files that made a small file fill the heap with
// descriptor paths (every descriptor keeps "domain > key=value > …"): they
// are errors now, found without allocating more than a bounded amount.
func TestPathMemory(t *testing.T) {
	long := func(parentKey string, depth, leaves int, value string) string {
		var b strings.Builder
		b.WriteString("domain: d\ndescriptors: ")
		for range depth {
			fmt.Fprintf(&b, "[{key: %s, value: %q, descriptors: ", parentKey, value)
		}
		b.WriteString("[")
		for i := range leaves {
			fmt.Fprintf(&b, "{key: c%d, rate_limit: {unit: second, requests_per_unit: 1}},", i)
		}
		b.WriteString("]" + strings.Repeat("}]", depth) + "\n")
		return b.String()
	}
	for _, tt := range []struct {
		name, file string
		want       string
	}{
		// 230 KB: took 204 MB when keys had no limit.
		{"long parent key", long(strings.Repeat("p", 100_000), 1, 2000, ""), fmt.Sprintf("key: too long: 100000 bytes, at most %d", MaxKeyBytes)},
		// 185 KB: keys and values within their limits, 31 levels deep,
		// then 2000 rules whose paths are 136 KB each (269 MB in all).
		{"long deep paths", long(strings.Repeat("k", 256), 31, 2000, strings.Repeat("v", MaxValueBytes-100)), "add up to more than 64 MiB"},
		// 144 KB: 2,040 levels of short keys and values (as Envoy
		// Gateway's header matches nest, past its 1,157), each level's
		// path longer by 38 bytes: 79 MB of paths.
		{"deep short paths", long("rule-0-match-1023", 2040, 1, "rule-0-match-1023"), "add up to more than 64 MiB"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Parse([]File{{"f.yaml", []byte(tt.file)}})
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%d bytes) = %v, want an error with %q", len(tt.file), err, tt.want)
			}
			const most = 3 * MaxPathBytes
			if got := after.TotalAlloc - before.TotalAlloc; got > most {
				t.Errorf("Parse(%d bytes) allocated %d MB, want at most %d MB", len(tt.file), got>>20, most>>20)
			}
		})
	}
}
