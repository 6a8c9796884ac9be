package metrics_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// TestRefundTokensCounted: the tokens refunds asked back count as given or
// refused, per domain; a call without refunds counts nothing.
func TestRefundTokensCounted(t *testing.T) {
	m := newMetrics(t, metrics.Options{})
	for _, r := range []server.RefundOutcome{{Asked: 1000, Given: 1000}, {Asked: 1e9, Given: 4}, {Asked: 7}, {}} {
		m.ObserveCall(server.Call{Domain: "ai", Checked: true, Code: codes.OK, Refunds: r})
	}
	for result, want := range map[string]float64{"given": 1004, "refused": 1e9 - 4 + 7} {
		got, ok := value(t, m.Registry(), "ratelimitd_refund_tokens_total", map[string]string{"domain": "ai", "result": result})
		if !ok || got != want {
			t.Errorf("ratelimitd_refund_tokens_total{result=%q} = %v (present %v), want %v", result, got, ok, want)
		}
	}
}
