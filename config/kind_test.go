package config

import (
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// validKind reports whether r's Kind and Limits agree: a limited rule has
// one valid bucket or more, a deny-all rule one limit without a bucket (a
// unit that fits a Duration), an unlimited rule none.
func validKind(r *Rule) bool {
	switch r.Kind {
	case KindLimited:
		return len(r.Limits) > 0 && !slices.ContainsFunc(r.Limits, func(l RateLimit) bool { return l.Limit.Validate() != nil })
	case KindDenyAll:
		return len(r.Limits) == 1 && r.Limits[0].Limit == (limiter.Limit{}) &&
			time.Duration(r.Limits[0].UnitMultiplier)*r.Limits[0].Unit.Duration() > 0
	case KindUnlimited:
		return len(r.Limits) == 0
	}
	return false
}

// sameLimit compares two limits but for the identity Parse computes.
func sameLimit(a, b RateLimit) bool {
	a.id, b.id = "", ""
	return a == b
}

// TestRuleKind: every way of writing a rule gives it its Kind, and Limits
// hold its rates, as written: a deny-all rule's unit and name too.
func TestRuleKind(t *testing.T) {
	s := mustParse(t, File{"k.yaml", []byte(`
domain: k
quota_groups:
  pool: {unit: hour, requests_per_unit: 7}
descriptors:
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 5, burst: 9, name: five}
  - key: list
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: day, requests_per_unit: 100, counts: tokens}
  - key: group
    quota_group: pool
  - key: free
    rate_limit: {unlimited: true, name: free}
  - key: blocked
    rate_limit: {unit: minute, unit_multiplier: 3, requests_per_unit: 0, name: blocked}
`)})
	tests := []struct {
		key    string
		kind   Kind
		name   string
		limits []RateLimit
	}{
		{"one", KindLimited, "five", []RateLimit{{Name: "five", Limit: limiter.Limit{Count: 5, Period: time.Minute, Burst: 9},
			Unit: Minute, UnitMultiplier: 1, Counts: Requests}}},
		{"list", KindLimited, "", []RateLimit{
			{Limit: limiter.Limit{Count: 2, Period: time.Second, Burst: 2}, Unit: Second, UnitMultiplier: 1, Counts: Requests},
			{Limit: limiter.Limit{Count: 100, Period: 24 * time.Hour, Burst: 100}, Unit: Day, UnitMultiplier: 1, Counts: Tokens},
		}},
		{"group", KindLimited, "", []RateLimit{{Name: "pool", Limit: limiter.Limit{Count: 7, Period: time.Hour, Burst: 7},
			Unit: Hour, UnitMultiplier: 1, Counts: Requests, Group: "pool"}}},
		{"free", KindUnlimited, "free", nil},
		{"blocked", KindDenyAll, "blocked", []RateLimit{{Name: "blocked", Unit: Minute, UnitMultiplier: 3, Counts: Requests}}},
	}
	for _, tt := range tests {
		r := s.Lookup("k", e(tt.key, "x"))
		if r == nil {
			t.Errorf("Lookup(%s=x) = nil, want a %v rule", tt.key, tt.kind)
			continue
		}
		if r.Kind != tt.kind || r.Name != tt.name || !validKind(r) {
			t.Errorf("Lookup(%s=x) = kind %v, name %q, limits %+v; want kind %v, name %q", tt.key, r.Kind, r.Name, r.Limits, tt.kind, tt.name)
		}
		if !slices.EqualFunc(r.Limits, tt.limits, sameLimit) {
			t.Errorf("Lookup(%s=x).Limits = %+v, want %+v", tt.key, r.Limits, tt.limits)
		}
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{0: "invalid", KindLimited: "limited", KindUnlimited: "unlimited", KindDenyAll: "deny-all", KindConcurrency: "concurrency", KindConcurrency + 1: "invalid"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}
