package daemon

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// TestRedisCollectors: each counter reads its own field of the store's and
// the cache's Stats (every field a different value, so that no two can be
// swapped unseen), and without a cache there are no cache counters.
func TestRedisCollectors(t *testing.T) {
	store := func() redisstore.Stats {
		return redisstore.Stats{Takes: 1, Calls: 2, Scripts: 3, RoundTrips: 4, Direct: 5, GiveBackFailures: 8, DeniedWithFailures: 9,
			Pending: 10, Late: 11, LateGiveBacks: 12, LateGiveBackFailures: 13}
	}
	cache := func() denialcache.Stats { return denialcache.Stats{LocalDenials: 6, Learned: 7} }
	want := map[string]float64{
		"ratelimitd_redis_takes_total":          1,
		"ratelimitd_redis_script_calls_total":   2,
		"ratelimitd_redis_scripts_total":        3,
		"ratelimitd_redis_round_trips_total":    4,
		"ratelimitd_redis_direct_calls_total":   5,
		"ratelimitd_denial_cache_denials_total": 6,
		"ratelimitd_denial_cache_learned_total": 7,

		"ratelimitd_redis_give_back_failures_total":   8,
		"ratelimitd_redis_denied_with_failures_total": 9,

		"ratelimitd_redis_pending_calls":                 10,
		"ratelimitd_redis_late_answers_total":            11,
		"ratelimitd_redis_late_give_backs_total":         12,
		"ratelimitd_redis_late_give_back_failures_total": 13,
	}
	got := gatherCounters(t, redisCollectors(store, cache))
	if len(got) != len(want) {
		t.Errorf("counters %v, want %v", got, want)
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
	if got := gatherCounters(t, redisCollectors(store, nil)); len(got) != 11 {
		t.Errorf("without a denial cache: counters %v, want the 11 of the store", got)
	}
}

func gatherCounters(t *testing.T, cs []prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		got[mf.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return got
}
