package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/internal/server"
)

// newRefundCounter is ratelimitd_refund_tokens_total: the tokens that
// descriptors with is_negative_hits asked back, by domain and result:
// given (what the store was asked to give back) or refused (the rest: with
// server.RefundsTaken, more than the bucket's ledger held, or a limit that
// counts requests). A refused share that grows is a caller refunding what
// it never took, or a reserve-then-settle flow whose settles come later
// than server.RefundLedgerWindow allows.
func newRefundCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimitd_refund_tokens_total",
		Help: "Tokens asked back by is_negative_hits descriptors, by result: given, or refused (more than was taken: see the refund policy).",
	}, []string{"domain", "result"})
}

// observeRefunds counts c's refunds under domain (already bounded).
func (m *Metrics) observeRefunds(c *server.Call, domain string) {
	r := c.Refunds
	if r.Asked == 0 {
		return
	}
	if r.Given > 0 {
		m.refunds.WithLabelValues(domain, "given").Add(float64(r.Given))
	}
	if refused := r.Asked - r.Given; refused > 0 {
		m.refunds.WithLabelValues(domain, "refused").Add(float64(refused))
	}
}
