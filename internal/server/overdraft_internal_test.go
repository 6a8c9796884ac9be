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
		want   []int64          // MaxDebt of plain, declared
		count  limiter.Counting // of plain (declared keeps CountAlways)
	}{
		{"off", Overdraft{}, "d", []int64{0, 3}, limiter.CountAlways},
		{"off with bursts", Overdraft{Bursts: 2}, "d", []int64{0, 3}, limiter.CountAlways},
		{"on: one burst by default", Overdraft{On: true}, "d", []int64{20, 3}, limiter.CountAlways},
		{"two bursts", Overdraft{On: true, Bursts: 2}, "d", []int64{40, 3}, limiter.CountAlways},
		{"its domain", Overdraft{On: true, Domains: []string{"x", "d"}}, "d", []int64{20, 3}, limiter.CountAlways},
		{"another domain", Overdraft{On: true, Domains: []string{"x"}}, "d", []int64{0, 3}, limiter.CountAlways},
		{"where denied", Overdraft{On: true, Counting: limiter.CountWhereDenied}, "d", []int64{20, 3}, limiter.CountWhereDenied},
	} {
		t.Run(tt.name, func(t *testing.T) {
			takes := []limiter.Request{{Limit: plain, Hits: 1}, {Limit: declared, Hits: 1}}
			tt.o.apply(tt.domain, takes)
			for i, r := range takes {
				if r.Limit.MaxDebt != tt.want[i] {
					t.Errorf("%+v.apply(%q): takes[%d].MaxDebt = %d, want %d", tt.o, tt.domain, i, r.Limit.MaxDebt, tt.want[i])
				}
			}
			if takes[0].Counting != tt.count || takes[1].Counting != limiter.CountAlways {
				t.Errorf("%+v.apply(%q): counting %v, %v; want %v, always", tt.o, tt.domain, takes[0].Counting, takes[1].Counting, tt.count)
			}
		})
	}
}
