package config

import (
	"fmt"
	"strings"
	"testing"
)

// TestIncumbentSizedLimitsLoad: every requests_per_unit the incumbent
// accepts (a uint32) loads with every unit and the default burst, as the
// exact limit it says; the bounds that remain are errors at their field.
func TestIncumbentSizedLimitsLoad(t *testing.T) {
	rule := func(rl string) string {
		return "domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + rl + "\n"
	}
	for _, unit := range []Unit{Second, Minute, Hour, Day, Week, Month, Year} {
		for _, n := range []int64{1_000_000_000, 2_147_483_648, 4_294_967_295} {
			t.Run(fmt.Sprintf("%d per %v", n, unit), func(t *testing.T) {
				s, err := Parse([]File{{"f.yaml", []byte(rule(fmt.Sprintf("{unit: %v, requests_per_unit: %d}", unit, n)))}})
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				l := s.Domains()[0].Rules[0].Limits[0].Limit
				if l.Count != n || l.Burst != n || l.Period != unit.Duration() || l.MaxDebt != 0 {
					t.Errorf("limit %+v, want %d per %v, burst %d", l, n, unit.Duration(), n)
				}
				if got := l.FillTime(); got != unit.Duration() {
					t.Errorf("FillTime = %v, want %v", got, unit.Duration())
				}
			})
		}
	}
	for _, tt := range []struct {
		name, file, want string // want: a part of the error, "" for none
	}{
		{"a burst far above the rate", rule("{unit: second, requests_per_unit: 1000000000, burst: 1000000000000}"), ""},
		{"an overdraft of 2^40 on a uint32 rate", rule("{unit: second, requests_per_unit: 4294967295, overdraft: {max_debt: 1099511627776}}"), ""},
		{"a uint32 rate over 100 years", rule("{unit: year, requests_per_unit: 4294967295, unit_multiplier: 100}"), ""},
		{"over 101 years", rule("{unit: year, requests_per_unit: 4294967295, unit_multiplier: 101}"),
			"rate_limit.unit_multiplier: 101 years is too long a period: the bucket (burst defaults to requests_per_unit) takes that long to fill, more than 100 years"},
		{"a debt past 100 years", rule("{unit: year, requests_per_unit: 4294967295, unit_multiplier: 50, overdraft: {max_debt: 4294967296}}"),
			"rate_limit.overdraft.max_debt: paying a debt of 4294967296 and filling burst 4294967295 (the default, requests_per_unit) at 4294967295 per 50 years takes just over 100 years, more than 100 years"},
		{"past 2^40", rule("{unit: second, requests_per_unit: 1099511627777}"), "rate_limit.requests_per_unit: 1099511627777 is too large (at most 1099511627776)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]File{{"f.yaml", []byte(tt.file)}})
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Parse = %v, want a Set", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Parse = %v; want an error with %q", err, tt.want)
			}
		})
	}
}
