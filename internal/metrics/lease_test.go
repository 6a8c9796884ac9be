package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

func TestLeaseMetrics(t *testing.T) {
	set := servertest.ParseConfig(t, "c.yaml", `domain: ai
descriptors:
  - key: model
    value: vllm
    descriptors:
      - key: request_id
        concurrency: {max_in_flight: 4, lease: 1m, max_wait: 1s, name: vllm-slots}
  - key: client
    descriptors:
      - key: request_id
        concurrency: {max_in_flight: 2, lease: 1m}
`)
	vllm := set.Lookup("ai", []config.Entry{{Key: "model", Value: "vllm"}, {Key: "request_id", Value: "1"}})
	perClient := set.Lookup("ai", []config.Entry{{Key: "client", Value: "a"}, {Key: "request_id", Value: "1"}})
	reg := prometheus.NewRegistry()
	l, err := metrics.NewLeases(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []server.LeaseEvent{
		{Rule: vllm, Op: server.LeaseTaken, InFlight: 1},
		{Rule: vllm, Op: server.LeaseTaken, InFlight: 2, Expired: 3},
		{Rule: vllm, Op: server.LeaseDenied, InFlight: 4},
		{Rule: vllm, Op: server.LeaseReleased, InFlight: 3},
		{Rule: vllm, Op: server.LeaseReleaseMissed, InFlight: 3},
		{Rule: vllm, Op: server.LeaseGivenBack, InFlight: 2},
		{Rule: vllm, Op: server.LeaseWaited, InFlight: 3},
		{Rule: vllm, Op: server.LeaseShed, InFlight: 4},
		{Rule: vllm, Op: server.LeaseChecked, InFlight: 1, Expired: 2},
		{Rule: perClient, Op: server.LeaseTaken, InFlight: 1},
	} {
		l.ObserveLease(e)
	}
	l.SweptExpired(5)
	now := time.Unix(1000, 0)
	l.SetPools(func(n int) []server.PoolInFlight {
		return []server.PoolInFlight{
			{Rule: vllm, Label: "ai > model=vllm > request_id", InFlight: 3, MaxInFlight: 4, Seen: now},
			{Rule: perClient, Label: "ai > client=a > request_id", InFlight: 1, MaxInFlight: 2, Seen: now},
			{Rule: perClient, Label: "ai > client=b > request_id", InFlight: 2, MaxInFlight: 2, Seen: now},
		}
	})
	want := `
# HELP ratelimitd_leases_expired_total Concurrency leases that expired unreleased (a release Envoy never sent).
# TYPE ratelimitd_leases_expired_total counter
ratelimitd_leases_expired_total{domain="",rule="_swept"} 5
ratelimitd_leases_expired_total{domain="ai",rule="ai > client > request_id"} 0
ratelimitd_leases_expired_total{domain="ai",rule="vllm-slots"} 5
# HELP ratelimitd_leases_in_flight Concurrency leases held, in the pools this replica saw lately.
# TYPE ratelimitd_leases_in_flight gauge
ratelimitd_leases_in_flight{domain="ai",rule="ai > client > request_id"} 3
ratelimitd_leases_in_flight{domain="ai",rule="vllm-slots"} 3
# HELP ratelimitd_leases_taken_total Concurrency leases taken (an acquire that took a new slot).
# TYPE ratelimitd_leases_taken_total counter
ratelimitd_leases_taken_total{domain="ai",rule="ai > client > request_id"} 1
ratelimitd_leases_taken_total{domain="ai",rule="vllm-slots"} 2
# HELP ratelimitd_lease_sheds_total Requests denied at once because max_waiters requests already waited for a slot.
# TYPE ratelimitd_lease_sheds_total counter
ratelimitd_lease_sheds_total{domain="ai",rule="ai > client > request_id"} 0
ratelimitd_lease_sheds_total{domain="ai",rule="vllm-slots"} 1
# HELP ratelimitd_lease_waits_total Requests admitted after waiting for a concurrency slot.
# TYPE ratelimitd_lease_waits_total counter
ratelimitd_lease_waits_total{domain="ai",rule="ai > client > request_id"} 0
ratelimitd_lease_waits_total{domain="ai",rule="vllm-slots"} 1
`
	names := []string{"ratelimitd_leases_expired_total", "ratelimitd_leases_in_flight", "ratelimitd_leases_taken_total", "ratelimitd_lease_sheds_total", "ratelimitd_lease_waits_total"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	for name, want := range map[string]float64{"ratelimitd_leases_denied_total": 1, "ratelimitd_leases_released_total": 1, "ratelimitd_leases_given_back_total": 1} {
		mfs, _ := reg.Gather()
		got := -1.0
		for _, mf := range mfs {
			if mf.GetName() == name {
				for _, m := range mf.GetMetric() {
					for _, lp := range m.GetLabel() {
						if lp.GetName() == "rule" && lp.GetValue() == "vllm-slots" {
							got = m.GetCounter().GetValue()
						}
					}
				}
			}
		}
		if got != want {
			t.Errorf("%s{rule=vllm-slots} = %v, want %v", name, got, want)
		}
	}
}
