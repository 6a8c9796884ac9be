package server

import "testing"

// TestOverdraftCovers: the default overdraft applies to the domains named
// (all when none is), and only when on.
func TestOverdraftCovers(t *testing.T) {
	for _, tt := range []struct {
		name   string
		o      Overdraft
		domain string
		want   bool
	}{
		{"off", Overdraft{}, "d", false},
		{"off with bursts", Overdraft{Bursts: 2}, "d", false},
		{"on", Overdraft{On: true}, "d", true},
		{"its domain", Overdraft{On: true, Domains: []string{"x", "d"}}, "d", true},
		{"another domain", Overdraft{On: true, Domains: []string{"x"}}, "d", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.o.covers(tt.domain); got != tt.want {
				t.Errorf("%+v.covers(%q) = %v, want %v", tt.o, tt.domain, got, tt.want)
			}
		})
	}
}
