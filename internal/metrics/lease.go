package metrics

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// SweptRule labels the leases found expired by a sweep of the memory
// store, which does not know their rule.
const SweptRule = "_swept"

// Leases counts what concurrency limits do, per domain and rule (a rule's
// Label: its name, else its path; never a request value, so the
// cardinality is the config's):
//
//	ratelimitd_leases_in_flight        gauge: leases held in the pools this replica saw lately (server.LeasePools)
//	ratelimitd_leases_taken_total      acquires that took a new slot
//	ratelimitd_leases_denied_total     acquires that found the pool full
//	ratelimitd_leases_released_total   releases (Envoy's stream-done call) that freed a slot
//	ratelimitd_leases_given_back_total leases the server released again: the request was denied by another limit, a call failed or the caller gave up
//	ratelimitd_leases_expired_total    leases that expired unreleased: a release Envoy never sent, or sent after the lease
//	ratelimitd_lease_waits_total       requests admitted after waiting for a slot
//	ratelimitd_lease_sheds_total       requests denied at once because max_waiters already waited
//
// It is a server.LeaseObserver, safe for concurrent use.
type Leases struct {
	taken, denied, released, givenBack, expired, waits, sheds *prometheus.CounterVec

	mu     sync.Mutex
	byRule map[*config.Rule][7]prometheus.Counter

	pools atomic.Pointer[func(int) []server.PoolInFlight]
	desc  *prometheus.Desc
}

// NewLeases returns lease metrics registered on reg.
func NewLeases(reg prometheus.Registerer) (*Leases, error) {
	labels := []string{"domain", "rule"}
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	l := &Leases{
		taken:     vec("ratelimitd_leases_taken_total", "Concurrency leases taken (an acquire that took a new slot)."),
		denied:    vec("ratelimitd_leases_denied_total", "Acquires of a concurrency lease that found the pool full."),
		released:  vec("ratelimitd_leases_released_total", "Concurrency leases released by their stream-done call."),
		givenBack: vec("ratelimitd_leases_given_back_total", "Concurrency leases released by the server: another limit denied the request, a call failed or the caller gave up."),
		expired:   vec("ratelimitd_leases_expired_total", "Concurrency leases that expired unreleased (a release Envoy never sent)."),
		waits:     vec("ratelimitd_lease_waits_total", "Requests admitted after waiting for a concurrency slot."),
		sheds:     vec("ratelimitd_lease_sheds_total", "Requests denied at once because max_waiters requests already waited for a slot."),
		byRule:    make(map[*config.Rule][7]prometheus.Counter),
		desc:      prometheus.NewDesc("ratelimitd_leases_in_flight", "Concurrency leases held, in the pools this replica saw lately.", labels, nil),
	}
	for _, c := range []prometheus.Collector{l.taken, l.denied, l.released, l.givenBack, l.expired, l.waits, l.sheds, l} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// SetPools sets where the in-flight gauge reads pools from (the server's
// LeasePools); until then it reports none.
func (l *Leases) SetPools(pools func(n int) []server.PoolInFlight) { l.pools.Store(&pools) }

// ObserveLease implements server.LeaseObserver.
func (l *Leases) ObserveLease(e server.LeaseEvent) {
	c := l.counters(e.Rule) // taken, denied, released, given back, expired, waits, sheds
	// Renewals, checks and missed releases count nothing; expiries come
	// with any op, as LeaseEvent.Expired.
	switch e.Op {
	case server.LeaseTaken:
		c[0].Inc()
	case server.LeaseDenied:
		c[1].Inc()
	case server.LeaseReleased:
		c[2].Inc()
	case server.LeaseGivenBack:
		c[3].Inc()
	case server.LeaseWaited:
		c[5].Inc()
	case server.LeaseShed:
		c[6].Inc()
	}
	if e.Expired > 0 {
		c[4].Add(float64(e.Expired))
	}
}

// SweptExpired counts leases a sweep found expired, of no known rule.
func (l *Leases) SweptExpired(n int64) {
	if n > 0 {
		l.expired.WithLabelValues("", SweptRule).Add(float64(n))
	}
}

// counters are r's counters, in ObserveLease's order. Rules are few (the
// config's), and a reload's new rules replace the old ones' entries as
// they come; the labels stay with the counters.
func (l *Leases) counters(r *config.Rule) [7]prometheus.Counter {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.byRule[r]; ok {
		return c
	}
	if len(l.byRule) >= 4*maxRulesRemembered {
		clear(l.byRule) // old configs' rules; the labelled counters stay
	}
	domain, rule := r.Domain, r.Label()
	var c [7]prometheus.Counter
	for i, v := range []*prometheus.CounterVec{l.taken, l.denied, l.released, l.givenBack, l.expired, l.waits, l.sheds} {
		c[i] = v.WithLabelValues(domain, rule)
	}
	l.byRule[r] = c
	return c
}

// maxRulesRemembered bounds the rule → counters cache between clears.
const maxRulesRemembered = 4096

// Describe implements prometheus.Collector (the in-flight gauge).
func (l *Leases) Describe(ch chan<- *prometheus.Desc) { ch <- l.desc }

// Collect implements prometheus.Collector: the leases in flight per rule,
// summed over the pools the server remembers.
func (l *Leases) Collect(ch chan<- prometheus.Metric) {
	f := l.pools.Load()
	if f == nil {
		return
	}
	type key struct{ domain, rule string }
	sums := map[key]int64{}
	l.mu.Lock()
	for r := range l.byRule {
		sums[key{r.Domain, r.Label()}] += 0 // a rule seen, now with none held
	}
	l.mu.Unlock()
	for _, p := range (*f)(1 << 16) {
		sums[key{p.Rule.Domain, p.Rule.Label()}] += p.InFlight
	}
	for k, n := range sums {
		ch <- prometheus.MustNewConstMetric(l.desc, prometheus.GaugeValue, float64(n), k.domain, k.rule)
	}
}
