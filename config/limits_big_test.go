package config

import (
	"fmt"
	"testing"
)

// TestIncumbentSizedLimitsLoad: every requests_per_unit the incumbent
// accepts (a uint32) loads with every unit and the default burst, as the
// exact limit it says (TestSizeLimits checks the bounds that remain).
func TestIncumbentSizedLimitsLoad(t *testing.T) {
	for _, unit := range []Unit{Second, Minute, Hour, Day, Week, Month, Year} {
		for _, n := range []int64{1_000_000_000, 2_147_483_648, 4_294_967_295} {
			t.Run(fmt.Sprintf("%d per %v", n, unit), func(t *testing.T) {
				s, err := Parse([]File{{"f.yaml", []byte(rateLimitFile(fmt.Sprintf("{unit: %v, requests_per_unit: %d}", unit, n)))}})
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
}
