package metrics

import (
	"container/list"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/redact"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// ruleID is a rule's domain and rule labels.
type ruleID struct{ domain, rule string }

// ruleCache is the counters of one loaded config's rules.
type ruleCache struct {
	// loaded is the config's rules, by domain and label; nil before the
	// first ConfigLoaded, when every rule is counted.
	loaded map[ruleID]bool
	// rules is the config's rules themselves: a rule of an older config
	// that a call decided before the reload counts on the counters of
	// the rule with its label, but its limits are not described.
	rules    map[*config.Rule]bool
	counters sync.Map // *config.Rule → *ruleCounters
}

// ruleCounters returns the cached counters of r, creating them on first
// use; nil for a rule of a replaced config that the loaded one lacks.
func (m *Metrics) ruleCounters(r *config.Rule, domain string) *ruleCounters {
	if r.File == "" {
		// Made for a limit override: one series per domain.
		if rc, ok := m.overrides.Load(domain); ok {
			return rc.(*ruleCounters)
		}
		rc, _ := m.overrides.LoadOrStore(domain, m.newRuleCounters(domain, OverrideRule, false))
		return rc.(*ruleCounters)
	}
	rules := m.rules.Load()
	if rc, ok := rules.counters.Load(r); ok {
		return rc.(*ruleCounters)
	}
	if rules.loaded != nil && !rules.loaded[ruleID{r.Domain, r.Label()}] {
		// A call decided under a config since replaced, by a rule the new
		// one lacks: its series were deleted with it and must not come
		// back.
		return nil
	}
	byID := m.countersByID(r)
	if byID == nil {
		return nil // removed by a reload since rules was loaded
	}
	rc, loaded := rules.counters.LoadOrStore(r, byID)
	if !loaded {
		m.describeRule(r)
	}
	return rc.(*ruleCounters)
}

// ruleCounters are one rule's resolved counters.
type ruleCounters struct {
	m            *Metrics
	domain, rule string
	detailed     bool
	all          valueCounters // value "" (every value, for rules without detailed_metric)

	mu      sync.Mutex
	values  map[string]*valueSlot // detailed_metric: at most MaxValuesPerRule + 1
	recent  list.List             // the labels of values but "_other", most recently seen first
	retired bool                  // its series are deleted: make no more
}

// valueSlot is a detailed_metric value's counters and when it was last
// seen, by the server's clock (server.Call.Start).
type valueSlot struct {
	vc   valueCounters
	seen time.Time
	at   *list.Element // in recent; nil for "_other"
}

// countersByID returns the counters kept for r's domain and label, or new
// ones (replacing those of a rule that was not detailed_metric and now is,
// or the reverse).
func (m *Metrics) countersByID(r *config.Rule) *ruleCounters {
	id := ruleID{r.Domain, r.Label()}
	m.byIDMu.Lock()
	defer m.byIDMu.Unlock()
	// ConfigLoaded deletes under this lock what the config it stored
	// lacks: checked here, a rule it removed cannot come back.
	if loaded := m.rules.Load().loaded; loaded != nil && !loaded[id] {
		return nil
	}
	rc := m.byID[id]
	if rc != nil && rc.detailed == r.DetailedMetric {
		return rc
	}
	if rc != nil {
		m.retire(id, rc)
	}
	if m.byID == nil {
		m.byID = make(map[ruleID]*ruleCounters)
	}
	rc = m.newRuleCounters(r.Domain, r.Label(), r.DetailedMetric)
	m.byID[id] = rc
	return rc
}

// retire deletes every series of the rule id, whose counters were rc, and
// keeps rc from making new ones (a call that fetched rc before may still
// count on it). m.byIDMu is held.
func (m *Metrics) retire(id ruleID, rc *ruleCounters) {
	rc.mu.Lock()
	rc.retired = true
	rc.mu.Unlock()
	labels := prometheus.Labels{"domain": id.domain, "rule": id.rule}
	for _, v := range []*prometheus.CounterVec{m.hits, m.within, m.near, m.over, m.shadow, m.requests} {
		v.DeletePartialMatch(labels)
	}
}

// describeRule sets ratelimitd_rule_limit_info for each limit of r, if r
// is a limited rule (a deny-all rule's one limit is no bucket) and belongs
// to the loaded config (or none is loaded yet): the limits of a rule a
// reload replaced, seen by a call decided before it, would leave a series
// that no reload deletes beside those of its successor.
func (m *Metrics) describeRule(r *config.Rule) {
	if r.Kind != config.KindLimited {
		return
	}
	m.byIDMu.Lock()
	defer m.byIDMu.Unlock()
	if rules := m.rules.Load(); rules.loaded != nil && !rules.rules[r] {
		return
	}
	for i, l := range r.Limits {
		name := l.Name
		if name == "" {
			name = strconv.Itoa(i)
		}
		per := l.Unit.String()
		if l.UnitMultiplier > 1 {
			per = strconv.FormatInt(l.UnitMultiplier, 10) + " " + per + "s"
		}
		rate := strconv.FormatInt(l.Limit.Count, 10) + " per " + per
		m.ruleInfo.WithLabelValues(r.Domain, r.Label(), name, l.Counts.String(), l.Group, rate).Set(1)
	}
}

// valueCounters are the counters of one (domain, rule, value).
type valueCounters struct {
	hits, within, near, over, shadow prometheus.Counter
	requests                         [server.FailureMode + 1]prometheus.Counter
}

func (m *Metrics) newRuleCounters(domain, rule string, detailed bool) *ruleCounters {
	rc := &ruleCounters{m: m, domain: domain, rule: rule, detailed: detailed}
	if detailed {
		rc.values = make(map[string]*valueSlot)
	} else {
		rc.all = m.newValueCounters(domain, rule, "")
	}
	return rc
}

func (m *Metrics) newValueCounters(domain, rule, value string) valueCounters {
	vc := valueCounters{
		hits:   m.hits.WithLabelValues(domain, rule, value),
		within: m.within.WithLabelValues(domain, rule, value),
		near:   m.near.WithLabelValues(domain, rule, value),
		over:   m.over.WithLabelValues(domain, rule, value),
		shadow: m.shadow.WithLabelValues(domain, rule, value),
	}
	for _, o := range []server.Outcome{server.WithinLimit, server.OverLimit, server.ShadowOverLimit, server.DeniedByOther, server.Unlimited, server.Replaced, server.FailureMode} {
		vc.requests[o] = m.requests.WithLabelValues(domain, rule, value, o.String())
	}
	return vc
}

// value returns the counters for a detailed_metric descriptor's values,
// seen at now; nil for a value new to a retired rule.
//
// A rule labels at most MaxValuesPerRule values. A new value past them
// takes the slot of the least recently seen one if that was last seen
// ValueIdle or more before now (its series are deleted: a value seen again
// later starts from zero, which Prometheus takes as a counter reset), and
// is counted as "_other" if not. So values seen once early on (a scan, a
// misconfigured client) give their slots to the values that keep coming,
// while a burst of new values cannot churn the series of active ones.
func (rc *ruleCounters) value(entries []*ratelimitv3.RateLimitDescriptor_Entry, now time.Time) *valueCounters {
	var buf [128]byte
	v := rc.m.appendLabel(buf[:0], entries)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if s := rc.values[string(v)]; s != nil {
		rc.touch(s, now)
		return &s.vc
	}
	if rc.retired {
		return nil
	}
	label := string(v)
	if rc.recent.Len() >= rc.m.opts.MaxValuesPerRule && !rc.evict(now) {
		label = OtherValue
		if s := rc.values[label]; s != nil {
			return &s.vc
		}
	}
	s := &valueSlot{vc: rc.m.newValueCounters(rc.domain, rc.rule, label), seen: now}
	if label != OtherValue {
		s.at = rc.recent.PushFront(label)
	}
	rc.values[label] = s
	return &s.vc
}

// touch marks s seen at now (a clock that went back leaves it as it was).
// rc.mu is held.
func (rc *ruleCounters) touch(s *valueSlot, now time.Time) {
	if s.at == nil {
		return
	}
	if now.After(s.seen) {
		s.seen = now
	}
	rc.recent.MoveToFront(s.at)
}

// evict deletes the least recently seen value, and its series, if it was
// last seen ValueIdle or more before now, and reports whether it did.
// rc.mu is held.
func (rc *ruleCounters) evict(now time.Time) bool {
	last := rc.recent.Back()
	if last == nil {
		return false
	}
	label := last.Value.(string)
	if now.Sub(rc.values[label].seen) < rc.m.opts.ValueIdle {
		return false
	}
	rc.recent.Remove(last)
	delete(rc.values, label)
	m := rc.m
	for _, v := range []*prometheus.CounterVec{m.hits, m.within, m.near, m.over, m.shadow} {
		v.DeleteLabelValues(rc.domain, rc.rule, label)
	}
	m.requests.DeletePartialMatch(prometheus.Labels{"domain": rc.domain, "rule": rc.rule, "value": label})
	m.valuesEvicted.Inc()
	return true
}

// appendLabel appends the value label of a detailed_metric descriptor:
// its entry values, each redacted per Options.Redact, joined by
// appendValues' rule.
func (m *Metrics) appendLabel(b []byte, entries []*ratelimitv3.RateLimitDescriptor_Entry) []byte {
	if m.opts.Redact == redact.Off {
		return appendValues(b, entries)
	}
	for i, e := range entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = server.AppendEscaped(b, m.opts.Redact.Value(e.GetValue()), ",")
	}
	return b
}

// appendValues appends a descriptor's entry values to b, separated by ","
// with "," and "%" in values percent-escaped, so that distinct descriptors
// give distinct labels.
func appendValues(b []byte, entries []*ratelimitv3.RateLimitDescriptor_Entry) []byte {
	for i, e := range entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = server.AppendEscaped(b, e.GetValue(), ",")
	}
	return b
}

// boundedSet maps the first max distinct strings to themselves and every
// later one to OtherValue.
type boundedSet struct {
	max  int
	seen sync.Map // string → struct{}
	n    atomic.Int64
	mu   sync.Mutex
}

func (s *boundedSet) get(v string) string {
	if _, ok := s.seen.Load(v); ok {
		return v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen.Load(v); ok {
		return v
	}
	if s.n.Load() >= int64(s.max) {
		return OtherValue
	}
	v = strings.Clone(v)
	s.seen.Store(v, struct{}{})
	s.n.Add(1)
	return v
}
