package metrics

import (
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// TestRemovedRuleStaysRemoved: a call that fetched a rule's counters, or
// its config's cache, before a reload removed the rule counts after it
// without bringing back any series: neither a new value of a
// detailed_metric rule, nor the rule itself.
func TestRemovedRuleStaysRemoved(t *testing.T) {
	parse := func(yaml string) *config.Set {
		return servertest.ParseConfig(t, "api.yaml", yaml)
	}
	old := parse("domain: api\ndescriptors:\n  - {key: user, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 9}}\n  - {key: team, rate_limit: {unit: minute, requests_per_unit: 9}}\n")
	m, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	m.ConfigLoaded(old)
	user, team := old.Domains()[0].Rules[0], old.Domains()[0].Rules[1]
	rc := m.ruleCounters(user, "api") // fetched before the reload
	if rc == nil || rc.value([]*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}}, time.Time{}) == nil {
		t.Fatal("no counters for a loaded rule")
	}

	m.ConfigLoaded(parse("domain: api\n"))
	if vc := rc.value([]*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u2"}}, time.Time{}); vc != nil {
		t.Error("a removed detailed_metric rule made counters for a new value")
	}
	// The lookup a call holding the old cache makes for a rule it had not
	// used yet.
	if got := m.countersByID(team); got != nil {
		t.Error("countersByID made counters for a rule the loaded config lacks")
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "domain" && l.GetValue() == "api" {
					t.Errorf("series %s %v outlived the reload", mf.GetName(), s.GetLabel())
				}
			}
		}
	}
}

// TestAppendValuesEscapes: a detailed_metric label joins values with ","
// and escapes "," and "%" in them, so distinct descriptors get distinct
// labels; keys are not in it.
func TestAppendValuesEscapes(t *testing.T) {
	label := func(values ...string) string {
		var entries []*ratelimitv3.RateLimitDescriptor_Entry
		for i, v := range values {
			entries = append(entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: fmt.Sprint("k", i), Value: v})
		}
		b := appendValues([]byte("x"), entries)
		if b[0] != 'x' {
			t.Fatalf("appendValues(x, %q) = %q: lost what b held", values, b)
		}
		return string(b[1:])
	}
	for _, tt := range []struct{ got, want string }{
		{label("gpt-4o"), "gpt-4o"},
		{label("gpt-4o", "acme"), "gpt-4o,acme"},
		{label("b,c"), "b%2Cc"},
		{label("b", "c"), "b,c"},
		{label("100%", "x=y"), "100%25,x=y"},
		{label("%2C"), "%252C"},
		{label(""), ""},
	} {
		if tt.got != tt.want {
			t.Errorf("appendValues label %q, want %q", tt.got, tt.want)
		}
	}
}
