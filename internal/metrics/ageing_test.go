package metrics_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/redact"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// TestDetailedValuesAgeOut walks a timeline of calls on a detailed_metric
// rule with two value slots and a 10-minute ValueIdle: values seen early
// and never again give their slots to later ones once idle for 10 minutes,
// the least recently seen first; until then new values count as _other.
func TestDetailedValuesAgeOut(t *testing.T) {
	const min = time.Minute
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	steps := []struct {
		at          time.Duration
		user        string
		wantValues  []string // labelled values of the rule after the call, sorted
		wantEvicted float64
	}{
		{0, "junk1", []string{"junk1"}, 0},
		{0, "junk2", []string{"junk1", "junk2"}, 0},
		{1 * min, "real1", []string{"_other", "junk1", "junk2"}, 0},
		{9 * min, "junk2", []string{"_other", "junk1", "junk2"}, 0},              // junk2 seen again
		{10 * min, "real1", []string{"_other", "junk2", "real1"}, 1},             // junk1 idle 10 min: evicted
		{11 * min, "real2", []string{"_other", "junk2", "real1"}, 1},             // junk2 idle 2 min only
		{19*min - time.Second, "real2", []string{"_other", "junk2", "real1"}, 1}, // not yet: 9 min 59 s is not 10
		{19 * min, "real2", []string{"_other", "real1", "real2"}, 2},
		{25 * min, "real2", []string{"_other", "real1", "real2"}, 2},
		// real1 (seen at 10 min) is the least recently seen, not real2.
		{30 * min, "junk3", []string{"_other", "junk3", "real2"}, 3},
		// A clock that went back evicts nothing and ages nothing.
		{5 * min, "junk4", []string{"_other", "junk3", "real2"}, 3},
	}
	m := newMetrics(t, metrics.Options{MaxValuesPerRule: 2, ValueIdle: 10 * min})
	now := t0
	srv := newServerClocked(t, m, func() time.Time { return now })
	srv.SetConfig(mustParse(t, testConfig))
	for i, s := range steps {
		now = t0.Add(s.at)
		if _, err := srv.ShouldRateLimit(context.Background(), request("api", []string{"user", s.user})); err != nil {
			t.Fatal(err)
		}
		got := values(t, m, "api > user")
		if !slices.Equal(got, s.wantValues) {
			t.Errorf("step %d (%v, %s): values %q, want %q", i, s.at, s.user, got, s.wantValues)
		}
		if n, _ := value(t, m.Registry(), "ratelimitd_metric_values_evicted_total", nil); n != s.wantEvicted {
			t.Errorf("step %d (%v, %s): %v values evicted, want %v", i, s.at, s.user, n, s.wantEvicted)
		}
	}
	// An evicted value's series are all gone, not only hits.
	for _, name := range []string{"ratelimitd_descriptor_hits_total", "ratelimitd_descriptor_requests_total", "ratelimitd_descriptor_within_limit_total"} {
		if _, ok := value(t, m.Registry(), name, map[string]string{"domain": "api", "rule": "api > user", "value": "junk1"}); ok {
			t.Errorf("%s{value=junk1} outlived its eviction", name)
		}
	}
	if n, _ := value(t, m.Registry(), "ratelimitd_descriptor_hits_total", map[string]string{"domain": "api", "rule": "api > user", "value": "real2"}); n != 2 {
		t.Errorf("hits{value=real2} = %v, want 2 (those since it got its slot)", n)
	}
}

// values returns the value labels of rule's hits series, sorted.
func values(t *testing.T, m *metrics.Metrics, rule string) []string {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var vs []string
	for _, mf := range mfs {
		if mf.GetName() != "ratelimitd_descriptor_hits_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			var r, v string
			for _, l := range s.GetLabel() {
				switch l.GetName() {
				case "rule":
					r = l.GetValue()
				case "value":
					v = l.GetValue()
				}
			}
			if r == rule {
				vs = append(vs, v)
			}
		}
	}
	slices.Sort(vs)
	return vs
}

// TestDetailedValuesRedacted: with Redact, value labels show the redacted
// values, one series per redacted value.
func TestDetailedValuesRedacted(t *testing.T) {
	tests := []struct {
		mode  redact.Mode
		users []string
		want  []string
	}{
		{redact.Off, []string{"sk-live-abc", "sk-test-xyz"}, []string{"sk-live-abc", "sk-test-xyz"}},
		{redact.Hash, []string{"user-1", "user-1"}, []string{"sha256:c6c289e4"}},
		{redact.Prefix, []string{"sk-live-abc", "sk-live-xyz", "tenant-b"}, []string{"sk-l…", "tena…"}},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			m := newMetrics(t, metrics.Options{Redact: tt.mode})
			srv := newServer(t, m)
			for _, u := range tt.users {
				if _, err := srv.ShouldRateLimit(context.Background(), request("api", []string{"user", u})); err != nil {
					t.Fatal(err)
				}
			}
			if got := values(t, m, "api > user"); !slices.Equal(got, tt.want) {
				t.Errorf("values %q, want %q", got, tt.want)
			}
		})
	}
}

// TestIncumbentValuesRedacted: envoyproxy/ratelimit's stat keys of a
// detailed_metric rule carry the redacted value too.
func TestIncumbentValuesRedacted(t *testing.T) {
	m, srv := incumbentKeysServer(t, metrics.Options{IncumbentNames: true, Redact: redact.Hash})
	if _, err := srv.ShouldRateLimit(context.Background(), request("api", []string{"ip", "user-1"})); err != nil {
		t.Fatal(err)
	}
	// ":" is "_" in a stat key, as the incumbent sanitizes it.
	want := map[string]string{"domain": "api", "key1": "ip_sha256_c6c289e4"}
	if got, ok := value(t, m.Registry(), "ratelimit_service_rate_limit_total_hits", want); !ok || got != 1 {
		t.Errorf("total_hits%v = %v (present %v), want 1", want, got, ok)
	}
	if _, ok := value(t, m.Registry(), "ratelimit_service_rate_limit_total_hits", map[string]string{"domain": "api", "key1": "ip_user-1"}); ok {
		t.Error("the value is in a stat key as it is")
	}
}

// TestPolicyCounted: calls a policy answered are counted by cause and
// action (the server sets Call.Guard; internal/server's tests pin when).
func TestPolicyCounted(t *testing.T) {
	m := newMetrics(t, metrics.Options{})
	for _, g := range []server.Guard{
		{Cause: server.CauseInvalidOverride, Action: "deny"},
		{Cause: server.CauseInvalidOverride, Action: "deny"},
		{Cause: server.CauseOversizedRequest, Action: "error"},
		{},
	} {
		m.ObserveCall(server.Call{Guard: g})
	}
	for _, tt := range []struct {
		cause, action string
		want          float64
	}{
		{"invalid_override", "deny", 2},
		{"oversized_request", "error", 1},
	} {
		if got, _ := value(t, m.Registry(), "ratelimitd_request_policy_total", map[string]string{"cause": tt.cause, "action": tt.action}); got != tt.want {
			t.Errorf("ratelimitd_request_policy_total{%s,%s} = %v, want %v", tt.cause, tt.action, got, tt.want)
		}
	}
}
