// Package metrics exports what ratelimitd decides as Prometheus metrics. A
// Metrics is a server.Observer: the server hands it every ShouldRateLimit
// call, and it counts per domain and rule (and per value for rules with
// detailed_metric, bounded) on its own prometheus.Registry, never the
// global one.
//
// The descriptor counters count tokens (hits_addend), as envoyproxy/ratelimit's
// statsd counters do, so ratios between them are shares of traffic; the
// requests counter counts descriptors, whatever their hits_addend. Per
// descriptor: hits counts the tokens asked by every descriptor whose rule
// applied (limited, requests_per_unit: 0, or unlimited); over_limit those
// of the descriptors that denied their request; shadow_mode those a
// shadow-mode rule would have denied; within_limit those of descriptors
// within their limit (or unlimited) on a request that was admitted, and
// near_limit the part of these that left their bucket nearly empty. A
// descriptor within its limit on a request another one denied took
// nothing (requests are all or nothing; a post-paid charge is the
// exception, recorded all the same): its tokens count in hits only, and
// it counts as outcome="denied_by_other". The names and the incumbent
// stats they replace:
//
//	ratelimitd_descriptor_hits_total           ratelimit.service.rate_limit.<domain>.<key>.total_hits
//	ratelimitd_descriptor_within_limit_total   ratelimit.service.rate_limit.<domain>.<key>.within_limit
//	ratelimitd_descriptor_near_limit_total     ratelimit.service.rate_limit.<domain>.<key>.near_limit
//	ratelimitd_descriptor_over_limit_total     ratelimit.service.rate_limit.<domain>.<key>.over_limit
//	ratelimitd_descriptor_shadow_mode_total    ratelimit.service.rate_limit.<domain>.<key>.shadow_mode
//	ratelimitd_descriptor_requests_total       (none: descriptors by outcome)
//	ratelimitd_descriptor_unmatched_total      (none: descriptors no rule matched)
//	ratelimitd_requests_total                  (none: Envoy's own ratelimit.ok / over_limit / error)
//	ratelimitd_request_duration_seconds        ratelimit_server.ShouldRateLimit.response_time
//	ratelimitd_backend_errors_total            ratelimit.service.call.should_rate_limit.redis_error
//	ratelimitd_config_reloads_total            ratelimit.service.config_load_success / config_load_error
//	ratelimitd_build_info                      (none: the build's version, revision and Go version)
//	ratelimitd_config_info                     (none: the loaded config's hash)
//	ratelimitd_failure_mode_activations_total  (none)
//	ratelimitd_failure_mode_answers_total      (none: calls answered per the failure mode, by cause)
//	ratelimitd_rule_limit_info                 (none: each rule's limits, as loaded)
//	ratelimitd_refund_tokens_total             (none: tokens refunds asked back, given or refused)
//	ratelimitd_request_policy_total            (none: invalid overrides and oversized requests, per policy)
//	ratelimitd_metric_values_evicted_total     (none: detailed_metric values aged out of their slot)
//
// With Options.IncumbentNames the registry also carries envoyproxy/ratelimit's
// names (ratelimit_service_*, see incumbent.go), counted from the same calls.
//
// The Redis backend's own counters (ratelimitd_redis_*,
// ratelimitd_denial_cache_*) are registered on the same registry by
// cmd/ratelimitd, read from the store and the cache when scraped.
package metrics

import (
	"errors"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
	"github.com/ratelimitd/ratelimitd/internal/redact"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// Label values that stand for more than one thing.
const (
	// OtherValue replaces a detailed_metric value, or a domain, past the
	// per-rule (or per-server) bound: everything beyond the first N
	// distinct ones is counted under it.
	OtherValue = "_other"
	// OverrideRule labels descriptors that no configured rule matched but a
	// limit override (from Envoy's route metadata) limited: their paths
	// contain request values, so they are not labelled one by one.
	OverrideRule = "_override"
	// InvalidDomain labels the calls of requests that failed the server's
	// checks (server.Call.Checked): their domain may be empty or of any
	// length, so it is neither a label nor one of the MaxDomains.
	InvalidDomain = "_invalid"
)

// DefaultValueIdle is the default of Options.ValueIdle: ten minutes, many
// scrape intervals, so that a value's last counts are scraped before its
// series go.
const DefaultValueIdle = 10 * time.Minute

// Options configures Metrics. The zero value of each field means its
// documented default.
type Options struct {
	// NearLimitRatio is the share of a bucket's burst in use above which an
	// admitted descriptor also counts as near_limit: remaining tokens below
	// (1 − NearLimitRatio) × burst, compared exactly with the ratio rounded
	// to the nearest millionth (so 0.7 of a burst of 10 is 7, and 3 tokens
	// left are not near). Default 0.8, as envoyproxy/ratelimit's
	// NEAR_LIMIT_RATIO. Must be in (0, 1]; 1 counts nothing as near_limit
	// (no bucket has fewer than 0 tokens left), which turns the counter off.
	NearLimitRatio float64
	// MaxValuesPerRule bounds the distinct values labelled per
	// detailed_metric rule; a value past them takes the slot of the least
	// recently seen one if that has been idle for ValueIdle, and is counted
	// as "_other" if not. Default 100.
	MaxValuesPerRule int
	// ValueIdle is how long a detailed_metric value must go unseen before
	// a new value may take its slot (and its series are deleted); default
	// DefaultValueIdle. Keep it well above the scrape interval.
	ValueIdle time.Duration
	// Redact is how detailed_metric value labels show descriptor values;
	// default redact.Off (as they are).
	Redact redact.Mode
	// MaxDomains bounds the distinct domain label values taken from
	// requests (unmatched descriptors, limit overrides, request counts);
	// later ones are counted as "_other". Default 100.
	MaxDomains int
	// Backend labels the latency histogram and backend errors ("memory",
	// "redis"); default "unknown".
	Backend string
	// ProcessMetrics adds the Go runtime and process collectors.
	ProcessMetrics bool
	// IncumbentNames also exports envoyproxy/ratelimit's metrics
	// (ratelimit_service_*, see incumbent.go) beside ratelimitd's own.
	IncumbentNames bool
}

// Metrics counts calls, descriptors, backend errors and config reloads.
// It is safe for concurrent use. Create it with New.
type Metrics struct {
	reg     *prometheus.Registry
	opts    Options
	backend string
	// nearFree is 1 − NearLimitRatio in millionths: a descriptor is near
	// its limit when remaining·10⁶ < nearFree·burst.
	nearFree uint64

	hits, within, near, over, shadow *prometheus.CounterVec
	requests                         *prometheus.CounterVec
	unmatched                        *prometheus.CounterVec
	calls                            *prometheus.CounterVec
	latency                          *prometheus.HistogramVec
	backendErrors                    *prometheus.CounterVec
	nodeUp                           *prometheus.GaugeVec
	fallbacks                        *prometheus.CounterVec
	reloads                          *prometheus.CounterVec
	configInfo                       *prometheus.GaugeVec
	configSource                     *prometheus.GaugeVec
	sourceMu                         sync.Mutex
	sourceLabels                     [2]string // the configSource series set, if any
	failureMode                      *prometheus.CounterVec
	valuesEvicted                    prometheus.Counter
	guards                           *prometheus.CounterVec
	ruleInfo                         *prometheus.GaugeVec
	refunds                          *prometheus.CounterVec // refunds.go
	// inc is envoyproxy/ratelimit's metrics; nil without IncumbentNames.
	inc *incumbent

	// byCode holds the latency histogram's children, by gRPC code.
	byCode [codes.Unauthenticated + 1]prometheus.Observer
	// rules caches the counters of the loaded config's rules; it is
	// replaced by ConfigLoaded so that old rules do not pile up.
	rules atomic.Pointer[ruleCache]
	// overrides caches the counters of limit-override descriptors, by
	// (bounded) domain.
	overrides sync.Map
	domains   boundedSet
	hash      atomic.Pointer[string]

	// byID holds every rule's counters by domain and rule label, across
	// reloads: a rule a reload keeps keeps its counters, and with them the
	// values its detailed_metric series are bounded by; ConfigLoaded drops
	// (and deletes the series of) those the new config lacks. rules above
	// is the fast path to them by *config.Rule. byIDMu also orders
	// ConfigLoaded's swap of rules and reset of ruleInfo against
	// describeRule.
	byIDMu sync.Mutex
	byID   map[ruleID]*ruleCounters
}

// New returns Metrics registered on a new registry.
func New(opts Options) (*Metrics, error) {
	if opts.NearLimitRatio == 0 {
		opts.NearLimitRatio = 0.8
	}
	if opts.NearLimitRatio <= 0 || opts.NearLimitRatio > 1 {
		return nil, errors.New("metrics: NearLimitRatio must be in (0, 1]")
	}
	if opts.MaxValuesPerRule <= 0 {
		opts.MaxValuesPerRule = 100
	}
	if opts.MaxDomains <= 0 {
		opts.MaxDomains = 100
	}
	if opts.ValueIdle <= 0 {
		opts.ValueIdle = DefaultValueIdle
	}
	if opts.Redact == 0 {
		opts.Redact = redact.Off
	}
	if opts.Backend == "" {
		opts.Backend = "unknown"
	}
	descLabels := []string{"domain", "rule", "value"}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &Metrics{
		reg:      prometheus.NewRegistry(),
		opts:     opts,
		backend:  opts.Backend,
		nearFree: million - uint64(math.Round(opts.NearLimitRatio*million)),
		hits: counter("ratelimitd_descriptor_hits_total",
			"Tokens asked for (hits_addend) by descriptors whose rule applied (limited, requests_per_unit 0, or unlimited), whatever the answer (incumbent: total_hits).", descLabels...),
		within: counter("ratelimitd_descriptor_within_limit_total",
			"Tokens asked for by descriptors within their limit (or unlimited) on admitted requests, near_limit included (incumbent: within_limit).", descLabels...),
		near: counter("ratelimitd_descriptor_near_limit_total",
			"Tokens asked for by admitted descriptors that left their bucket below (1 - near-limit ratio) of its burst (incumbent: near_limit).", descLabels...),
		over: counter("ratelimitd_descriptor_over_limit_total",
			"Tokens asked for by descriptors that denied their request (incumbent: over_limit).", descLabels...),
		shadow: counter("ratelimitd_descriptor_shadow_mode_total",
			"Tokens asked for by descriptors that a shadow-mode rule would have denied (incumbent: shadow_mode).", descLabels...),
		requests: counter("ratelimitd_descriptor_requests_total",
			"Descriptors that matched a rule, by outcome (within_limit, over_limit, shadow_over_limit, denied_by_other, unlimited, replaced, failure_mode: answered per --on-backend-failure, by no bucket).",
			"domain", "rule", "value", "outcome"),
		unmatched: counter("ratelimitd_descriptor_unmatched_total",
			"Descriptors that matched no rule and were answered OK without a limit.", "domain"),
		calls: counter("ratelimitd_requests_total",
			"ShouldRateLimit calls by domain, gRPC code and overall_code (empty unless the code is OK).",
			"domain", "code", "overall_code"),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimitd_request_duration_seconds",
			Help:    "Time to answer ShouldRateLimit, by backend and gRPC code (Envoy's default timeout is 20 ms).",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1},
		}, []string{"backend", "code"}),
		backendErrors: counter("ratelimitd_backend_errors_total",
			"Backend calls that failed, by kind (timeout: no answer within --backend-timeout of being sent; unavailable: an error), in every failure mode; no_config: calls answered UNAVAILABLE before a config was loaded.",
			"backend", "kind"),
		nodeUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimitd_redis_node_up",
			Help: "1 while the circuit breaker of a Redis Cluster master (node: its address) lets calls through, 0 while it is open and that node's slots are answered per --on-backend-failure; a node is listed from its first failure until it has served no call for a while.",
		}, []string{"node"}),
		fallbacks: counter("ratelimitd_failure_mode_answers_total",
			"Calls answered per --on-backend-failure (mode) rather than by a bucket, by cause: backend_failed, breaker_open, overloaded (the call's deadline came while it waited in this process, Redis not to blame), try_again (a Redis Cluster slot mid-move, or the cluster reporting itself down, kept the call from running in time).",
			"mode", "cause"),
		reloads: counter("ratelimitd_config_reloads_total",
			"Config loads by result (ok, failed); a failed reload keeps the config in force.", "result"),
		configInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimitd_config_info",
			Help: "1, labelled with the SHA-256 of the config files in force.",
		}, []string{"hash"}),
		configSource: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimitd_config_source_info",
			Help: "1, labelled with where the config in force came from (source: file or xds) and, for xds, the version the management server gave it.",
		}, []string{"source", "version"}),
		failureMode: counter("ratelimitd_failure_mode_activations_total",
			"Times a failure mode took over from normal decisions, by mode.", "mode"),
		valuesEvicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_metric_values_evicted_total",
			Help: "detailed_metric values whose series were deleted to give their slot, idle for --metric-value-idle, to a new value.",
		}),
		guards: counter("ratelimitd_request_policy_total",
			"Calls Envoy would have let through on an error, answered per --on-invalid-override or --on-oversized-request instead, by cause (invalid_override, oversized_request) and action (deny, ignore, error).",
			"cause", "action"),
		ruleInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimitd_rule_limit_info",
			Help: "1 for each limit of each rule that has seen traffic: what its tokens count (requests or tokens), its quota group, and its rate.",
		}, []string{"domain", "rule", "limit", "counts", "group", "rate"}),
		refunds: newRefundCounter(),
	}
	m.domains.max = opts.MaxDomains
	m.rules.Store(&ruleCache{})
	cs := []prometheus.Collector{m.hits, m.within, m.near, m.over, m.shadow, m.requests, m.unmatched,
		m.calls, m.latency, m.backendErrors, m.nodeUp, m.fallbacks, m.reloads, m.configInfo, m.configSource, m.failureMode, m.valuesEvicted, m.guards, m.ruleInfo, m.refunds,
		newBuildInfo(buildinfo.Get())}
	if opts.IncumbentNames {
		m.inc = newIncumbent(opts.NearLimitRatio, opts.MaxValuesPerRule, opts.Redact)
		cs = append(cs, m.inc)
	}
	if opts.ProcessMetrics {
		cs = append(cs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	for _, c := range cs {
		if err := m.reg.Register(c); err != nil {
			return nil, err
		}
	}
	for c := range m.byCode {
		m.byCode[c] = m.latency.WithLabelValues(m.backend, codes.Code(c).String())
	}
	for _, r := range []string{"ok", "failed"} {
		m.reloads.WithLabelValues(r)
	}
	return m, nil
}

// Registry returns the registry the metrics are on, for promhttp.HandlerFor
// and for tests.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ConfigLoaded records a config (re)load that took effect, and labels
// ratelimitd_config_info with its hash (config.Set.Hash). The per-rule
// series of rules that set no longer has (same domain and rule label) are
// deleted, so that a reload leaves no series behind that can never move
// again; those of the rules it keeps go on counting.
func (m *Metrics) ConfigLoaded(set *config.Set) {
	hash := set.Hash()
	m.reloads.WithLabelValues("ok").Inc()
	if m.inc != nil {
		m.inc.configLoaded()
	}
	if old := m.hash.Swap(&hash); old != nil && *old != hash {
		m.configInfo.DeleteLabelValues(*old)
	}
	m.configInfo.WithLabelValues(hash).Set(1)
	// The new config has new *config.Rules: drop the fast path to the
	// counters, and what the old rules' limits were.
	kept := make(map[ruleID]bool)
	rules := make(map[*config.Rule]bool)
	for _, d := range set.Domains() {
		for _, r := range d.Rules {
			kept[ruleID{d.Name, r.Label()}] = true
			rules[r] = true
		}
	}

	m.byIDMu.Lock()
	defer m.byIDMu.Unlock()
	// Under the lock, so that no describeRule that judged a rule by the old
	// cache sets its limits after the reset.
	m.rules.Store(&ruleCache{loaded: kept, rules: rules})
	m.ruleInfo.Reset()
	for id, rc := range m.byID {
		if !kept[id] {
			m.retire(id, rc)
			delete(m.byID, id)
		}
	}
}

// maxVersionBytes bounds the version label of ratelimitd_config_source_info:
// a management server chooses it.
const maxVersionBytes = 128

// ConfigSource records where the config in force came from: source is
// "file" or "xds", version the xDS version_info ("" for files).
func (m *Metrics) ConfigSource(source, version string) {
	if len(version) > maxVersionBytes {
		version = version[:maxVersionBytes]
	}
	m.sourceMu.Lock()
	defer m.sourceMu.Unlock()
	if old := m.sourceLabels; old != [2]string{} && old != [2]string{source, version} {
		m.configSource.DeleteLabelValues(old[0], old[1])
	}
	m.sourceLabels = [2]string{source, version}
	m.configSource.WithLabelValues(source, version).Set(1)
}

// ConfigRejected records a reload that failed (the config in force stays).
func (m *Metrics) ConfigRejected(error) {
	m.reloads.WithLabelValues("failed").Inc()
	if m.inc != nil {
		m.inc.configRejected()
	}
}

// FailureModeActivated records that a failure mode (for example a fallback
// to the in-memory backend) took over. mode must come from a small fixed
// set.
func (m *Metrics) FailureModeActivated(mode string) {
	m.failureMode.WithLabelValues(mode).Inc()
}

// BackendError records a backend failure of the given kind ("timeout",
// "unavailable", "no_config"), which must come from a small fixed set.
// ObserveCall calls it for calls answered UNAVAILABLE for want of a config.
func (m *Metrics) BackendError(kind string) {
	m.backendErrors.WithLabelValues(m.backend, kind).Inc()
}

// NodeHealth records whether the breaker of the Redis Cluster node at
// addr lets calls through (failover.Options.OnShardChange).
func (m *Metrics) NodeHealth(addr string, up bool) {
	v := 0.0
	if up {
		v = 1
	}
	m.nodeUp.WithLabelValues(addr).Set(v)
}

// NodeGone deletes the series of a Redis Cluster node that no longer
// serves calls (failover.Options.OnShardDropped).
func (m *Metrics) NodeGone(addr string) { m.nodeUp.DeleteLabelValues(addr) }

// BackendFailure records a failed backend call, by the kind of err
// (timeout or unavailable): for failover.Options.OnBackendFailure, which
// reports every one, whatever the failure mode.
func (m *Metrics) BackendFailure(err error) {
	m.BackendError(errorKind(err))
}

// FailureModeAnswer records a call answered per the failure mode (mode)
// because of cause: for failover.Options.OnFallback.
func (m *Metrics) FailureModeAnswer(mode string, cause limiter.Fallback) {
	m.fallbacks.WithLabelValues(mode, cause.String()).Inc()
}

// ObserveCall implements server.Observer.
func (m *Metrics) ObserveCall(c server.Call) {
	if int(c.Code) < len(m.byCode) {
		m.byCode[c.Code].Observe(c.Duration.Seconds())
	} else {
		m.latency.WithLabelValues(m.backend, c.Code.String()).Observe(c.Duration.Seconds())
	}
	overall := ""
	if c.Code == codes.OK {
		overall = c.Overall.String()
	}
	// Only a checked request's domain is short enough to be a label, and
	// only those take one of the MaxDomains.
	domain := InvalidDomain
	if c.Checked {
		domain = m.domains.get(c.Domain)
	}
	m.calls.WithLabelValues(domain, c.Code.String(), overall).Inc()
	if c.Guard.Cause != "" {
		m.guards.WithLabelValues(c.Guard.Cause, c.Guard.Action).Inc()
	}
	if c.Code == codes.Unavailable && errors.Is(c.Err, server.ErrNoConfig) {
		m.BackendError("no_config")
	}
	if m.inc != nil {
		m.inc.observe(&c, domain)
	}
	m.observeRefunds(&c, domain)
	admitted := c.Code == codes.OK && c.Overall == rlsv3.RateLimitResponse_OK
	for i := range c.Descriptors {
		m.observeDescriptor(domain, &c.Descriptors[i], admitted, c.Start)
	}
}

// errorKind classifies the error of an UNAVAILABLE answer by its cause
// (server.Call.Err wraps it): no config yet, a deadline (the backend
// timeout, or a network timeout), or anything else.
func errorKind(err error) string {
	var netErr net.Error                // context.DeadlineExceeded and os.ErrDeadlineExceeded are too
	var deadline *limiter.DeadlineError // one judged the backend's failure: no answer in time
	switch {
	case errors.Is(err, server.ErrNoConfig):
		return "no_config"
	case errors.As(err, &deadline), errors.As(err, &netErr) && netErr.Timeout():
		return "timeout"
	}
	return "unavailable"
}

// observeDescriptor counts one descriptor of a call that began at start;
// admitted tells whether the call was answered OK.
func (m *Metrics) observeDescriptor(domain string, d *server.DescriptorOutcome, admitted bool, start time.Time) {
	if d.Rule == nil {
		m.unmatched.WithLabelValues(domain).Inc()
		return
	}
	rc := m.ruleCounters(d.Rule, domain)
	if rc == nil {
		return // a rule a reload removed
	}
	vc := &rc.all
	if rc.detailed {
		if vc = rc.value(d.Descriptor.GetEntries(), start); vc == nil {
			return // a rule a reload removed, after this call fetched it
		}
	}
	if int(d.Outcome) < len(vc.requests) && vc.requests[d.Outcome] != nil {
		vc.requests[d.Outcome].Inc()
	}
	// Refunds (negative hits) give tokens back: counters only go up, so
	// they count as a request without tokens.
	hits := float64(max(d.Hits, 0))
	switch d.Outcome {
	case server.WithinLimit:
		vc.hits.Add(hits)
		vc.within.Add(hits)
		if m.nearLimit(d.Decision.Remaining, d.Limit.Burst) {
			vc.near.Add(hits)
		}
	case server.OverLimit:
		vc.hits.Add(hits)
		vc.over.Add(hits)
	case server.ShadowOverLimit:
		vc.hits.Add(hits)
		vc.shadow.Add(hits)
	case server.DeniedByOther, server.FailureMode:
		vc.hits.Add(hits)
	case server.Unlimited:
		vc.hits.Add(hits)
		if admitted {
			vc.within.Add(hits)
		}
	}
}

// million is the denominator of Metrics.nearFree.
const million = 1_000_000

// nearLimit reports whether remaining tokens of a bucket of the given burst
// are fewer than (1 − NearLimitRatio) × burst, in exact integer arithmetic:
// both are at most limiter.MaxTokens (2^40), so neither product reaches
// 2^60.
func (m *Metrics) nearLimit(remaining, burst int64) bool {
	return burst > 0 && uint64(remaining)*million < m.nearFree*uint64(burst)
}
