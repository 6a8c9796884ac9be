package metrics

import (
	"slices"
	"testing"

	"github.com/ratelimitd/ratelimitd/config"
)

// TestMaybeIPv4: the fast check never misses what the incumbent's regexp
// sanitizes.
func TestMaybeIPv4(t *testing.T) {
	for _, s := range []string{"", "a", "1.2.3", "1.2.3.4", "x_10.0.0.1/32", "1234.5.6.7", "1.2.3.", "1..2.3.4", "v1.2.3.4.5", "a1.b2.c3.d4", "999.999.999.999x"} {
		if ipv4.MatchString(s) && !maybeIPv4([]byte(s)) {
			t.Errorf("maybeIPv4(%q) = false, but the regexp matches", s)
		}
	}
	for _, s := range []string{"api.route_r1.user", "a.1.b", "1.2.3"} {
		if maybeIPv4([]byte(s)) {
			t.Errorf("maybeIPv4(%q) = true, want false (no address)", s)
		}
	}
}

// TestPathLevels: the parser reads back the paths config writes, quoted
// parts included, and refuses what it does not write.
func TestPathLevels(t *testing.T) {
	tests := []struct {
		path string
		want []config.Entry
		ok   bool
	}{
		{"api > client", []config.Entry{{Key: "client"}}, true},
		{"api > route=r1 > user", []config.Entry{{Key: "route", Value: "r1"}, {Key: "user"}}, true},
		{`"a b" > "x y"="a=b" > k="v > w"`, []config.Entry{{Key: "x y", Value: "a=b"}, {Key: "k", Value: "v > w"}}, true},
		{"api", nil, true},
		{"api >client", nil, false},
		{`api > "unterminated`, nil, false},
	}
	for _, tt := range tests {
		got, ok := pathLevels(tt.path)
		if ok != tt.ok || !slices.Equal(got, tt.want) {
			t.Errorf("pathLevels(%q) = %v, %v; want %v, %v", tt.path, got, ok, tt.want, tt.ok)
		}
	}
}
