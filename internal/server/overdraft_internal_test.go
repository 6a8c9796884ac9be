package server

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestOverdraftApply: the default debt reaches every limit without one, in
// the domains named (all when none is), and keeps a declared overdraft.
func TestOverdraftApply(t *testing.T) {
	plain := limiter.Limit{Count: 10, Period: time.Second, Burst: 20}
	declared := limiter.Limit{Count: 10, Period: time.Second, Burst: 20, MaxDebt: 3}
	for _, tt := range []struct {
		name   string
		o      Overdraft
		domain string
		want   []int64 // MaxDebt of plain, declared
	}{
		{"off", Overdraft{}, "d", []int64{0, 3}},
		{"off with bursts", Overdraft{Bursts: 2}, "d", []int64{0, 3}},
		{"on: one burst by default", Overdraft{On: true}, "d", []int64{20, 3}},
		{"two bursts", Overdraft{On: true, Bursts: 2}, "d", []int64{40, 3}},
		{"its domain", Overdraft{On: true, Domains: []string{"x", "d"}}, "d", []int64{20, 3}},
		{"another domain", Overdraft{On: true, Domains: []string{"x"}}, "d", []int64{0, 3}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			takes := []limiter.Request{{Limit: plain, Hits: 1}, {Limit: declared, Hits: 1}}
			tt.o.apply(tt.domain, takes)
			for i, r := range takes {
				if r.Limit.MaxDebt != tt.want[i] {
					t.Errorf("%+v.apply(%q): takes[%d].MaxDebt = %d, want %d", tt.o, tt.domain, i, r.Limit.MaxDebt, tt.want[i])
				}
			}
		})
	}
}
