package metrics

import (
	"errors"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/redact"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// The incumbent's metrics: envoyproxy/ratelimit's statsd names as its
// default Prometheus mapper shapes them (src/stats/prom/default_mapper.yaml
// @f2fb157, identical to Envoy Gateway's statsd_conf.yaml), so that the
// dashboards and alerts written for it keep working. They are counted from
// the same server.Call events as ratelimitd's own, as the incumbent counts
// them (src/limiter/base_limiter.go@f2fb157):
//
//	ratelimit_service_rate_limit_total_hits{domain,key1[,key2]}    hits_addend of every limited descriptor
//	ratelimit_service_rate_limit_within_limit{domain,key1[,key2]}  hits of descriptors within their limit
//	ratelimit_service_rate_limit_near_limit{domain,key1[,key2]}    the part of the hits past NEAR_LIMIT_RATIO × limit
//	ratelimit_service_rate_limit_over_limit{domain,key1[,key2]}    the part of the hits past the limit (shadow rules too)
//	ratelimit_service_rate_limit_shadow_mode{domain,key1[,key2]}   over_limit hits of shadow_mode rules
//	ratelimit_service_should_rate_limit_error{err_type}            redis_error (backend failed), service_error (bad request)
//	ratelimit_service_total_requests{grpc_method}                  ShouldRateLimit calls
//	ratelimit_service_response_time_seconds{grpc_method}           their latency (histogram, Prometheus' default buckets)
//	ratelimit_service_config_load_success, _config_load_error       config loads
//
// The descriptor series are named by the incumbent's stat key of the rule:
// the domain, then each descriptor level of the rule as key or key_value,
// joined with dots (with detailed_metric: each request entry as
// key_value; for a limit override: each request entry as key or
// key_value), with ':' and '|' replaced by '_' and the dots of IPv4
// addresses by '_'. The mapper then labels its first dot-separated part
// domain, the second key1 and the third key2 (a one-level key has no key2;
// deeper levels are dropped, so rules that differ only there share a
// series, as they do behind the incumbent's mapper).
//
// Differences, by design: ratelimitd's buckets are token buckets, so the
// "limit" the split into within/near/over is measured against is the
// bucket's burst, and its use the tokens taken from it; a denied call
// counts all its hits over_limit (a token bucket takes nothing from it;
// the incumbent's fixed window counts them in and splits a call that
// crosses the limit into near_limit and over_limit parts); a descriptor
// within its limit on a request another denied counts within_limit (the
// incumbent's counter would have been incremented) though ratelimitd took
// nothing from it; response_time is measured in seconds, not truncated to
// whole milliseconds; gRPC health checks are not counted in
// total_requests.
const (
	incPrefix   = "ratelimit_service_"
	grpcMethod  = "ShouldRateLimit"
	maxIncKeys  = 10000 // bound on descriptor stat keys kept, whatever the config
	incOverflow = "_other"
)

// incumbent holds the incumbent's metrics. It is safe for concurrent use.
type incumbent struct {
	nearRatio float32
	maxValues int
	redact    redact.Mode // of the values in stat keys

	// mu guards keys and detailed.
	mu sync.RWMutex
	// keys are the descriptor series by stat key; at most maxIncKeys. They
	// are kept across reloads, as the incumbent's are.
	keys map[string]*incCounters
	// ruleKeys caches each loaded rule's stat key (*config.Rule → string),
	// and byRule the counters of each rule without detailed_metric
	// (*config.Rule → *incCounters); both are emptied by a reload.
	ruleKeys, byRule sync.Map
	// detailed counts the distinct detailed_metric (and override) stat keys
	// per rule stat key, bounded by maxValues: the ones past it count on
	// the rule's own key (an override's on domain._other).
	detailed map[string]int

	requests, serviceErrors, redisErrors, loadOK, loadFailed atomic.Uint64
	latency                                                  prometheus.Histogram
	// descs2 and descs3 are the descriptor series' of each label shape.
	descs2, descs3                     [5]*prometheus.Desc
	errDesc, reqDesc, okDesc, failDesc *prometheus.Desc
}

// incCounters are one stat key's counters: total_hits, within_limit,
// near_limit, over_limit, shadow_mode.
type incCounters struct {
	labels []string
	n      [5]atomic.Uint64
}

const (
	incTotal = iota
	incWithin
	incNear
	incOver
	incShadow
)

var incStats = [5]string{"total_hits", "within_limit", "near_limit", "over_limit", "shadow_mode"}

func newIncumbent(nearRatio float64, maxValues int, red redact.Mode) *incumbent {
	inc := &incumbent{
		redact:    red,
		nearRatio: float32(nearRatio),
		maxValues: maxValues,
		detailed:  make(map[string]int),
		keys:      make(map[string]*incCounters),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        incPrefix + "response_time_seconds",
			Help:        "Time to answer ShouldRateLimit (envoyproxy/ratelimit's name).",
			ConstLabels: prometheus.Labels{"grpc_method": grpcMethod},
			Buckets:     prometheus.DefBuckets,
		}),
		errDesc:  prometheus.NewDesc(incPrefix+"should_rate_limit_error", "ShouldRateLimit calls that failed, by err_type (envoyproxy/ratelimit's name).", []string{"err_type"}, nil),
		reqDesc:  prometheus.NewDesc(incPrefix+"total_requests", "ShouldRateLimit calls (envoyproxy/ratelimit's name).", []string{"grpc_method"}, nil),
		okDesc:   prometheus.NewDesc(incPrefix+"config_load_success", "Config loads that took effect (envoyproxy/ratelimit's name).", nil, nil),
		failDesc: prometheus.NewDesc(incPrefix+"config_load_error", "Config loads that failed, the config in force staying (envoyproxy/ratelimit's name).", nil, nil),
	}
	for i, s := range incStats {
		// A series has domain and key1, or domain, key1 and key2, as the
		// mapper gives them; the collector is unchecked (Describe sends
		// nothing) so that both shapes share one name, as they do there.
		name, help := incPrefix+"rate_limit_"+s, "Hits of descriptors counted as "+s+" by envoyproxy/ratelimit's rules, by its stat key (domain, key1, key2)."
		inc.descs2[i] = prometheus.NewDesc(name, help, []string{"domain", "key1"}, nil)
		inc.descs3[i] = prometheus.NewDesc(name, help, []string{"domain", "key1", "key2"}, nil)
	}
	return inc
}

// Describe implements prometheus.Collector: nothing, which makes it an
// unchecked collector (its descriptor series have two label shapes).
func (inc *incumbent) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (inc *incumbent) Collect(ch chan<- prometheus.Metric) {
	inc.latency.Collect(ch)
	ch <- prometheus.MustNewConstMetric(inc.reqDesc, prometheus.CounterValue, float64(inc.requests.Load()), grpcMethod)
	ch <- prometheus.MustNewConstMetric(inc.errDesc, prometheus.CounterValue, float64(inc.redisErrors.Load()), "redis_error")
	ch <- prometheus.MustNewConstMetric(inc.errDesc, prometheus.CounterValue, float64(inc.serviceErrors.Load()), "service_error")
	ch <- prometheus.MustNewConstMetric(inc.okDesc, prometheus.CounterValue, float64(inc.loadOK.Load()))
	ch <- prometheus.MustNewConstMetric(inc.failDesc, prometheus.CounterValue, float64(inc.loadFailed.Load()))
	inc.mu.RLock()
	series := make([]*incCounters, 0, len(inc.keys))
	for _, c := range inc.keys {
		series = append(series, c)
	}
	inc.mu.RUnlock()
	// Stat keys that map to one label set (deeper levels dropped) are one
	// series, summed, as the mapper sums them.
	sums := make(map[string]*[5]uint64)
	labels := make(map[string][]string)
	for _, c := range series {
		id := strings.Join(c.labels, "\x00")
		s := sums[id]
		if s == nil {
			s = new([5]uint64)
			sums[id], labels[id] = s, c.labels
		}
		for i := range c.n {
			s[i] += c.n[i].Load()
		}
	}
	for id, s := range sums {
		lv := labels[id]
		descs := &inc.descs2
		if len(lv) == 3 {
			descs = &inc.descs3
		}
		for i, d := range descs {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(s[i]), lv...)
		}
	}
}

// configLoaded records a config load that took effect.
func (inc *incumbent) configLoaded() {
	inc.loadOK.Add(1)
	inc.ruleKeys.Clear()
	inc.byRule.Clear()
}

// configRejected records one that failed.
func (inc *incumbent) configRejected() { inc.loadFailed.Add(1) }

// observe counts one call; domain is its bounded domain label.
func (inc *incumbent) observe(c *server.Call, domain string) {
	inc.requests.Add(1)
	inc.latency.Observe(c.Duration.Seconds())
	switch {
	case c.Code == codes.InvalidArgument:
		inc.serviceErrors.Add(1)
	case c.Code == codes.Unavailable && !errors.Is(c.Err, server.ErrNoConfig):
		// Before its first config the incumbent answers every domain as
		// unknown: OK, no error.
		inc.redisErrors.Add(1)
	}
	failed := false
	for i := range c.Descriptors {
		d := &c.Descriptors[i]
		failed = failed || d.Outcome == server.FailureMode
		inc.observeDescriptor(domain, d)
	}
	if failed {
		// The incumbent, which has no failure modes, would have failed the
		// call on its Redis error.
		inc.redisErrors.Add(1)
	}
}

// observeDescriptor counts one descriptor as the incumbent's limiter does
// (base_limiter.go GetResponseDescriptorStatus@f2fb157), the limit being
// the bucket's burst and its use the tokens taken from it: near_limit is
// the part of an admitted call's hits that took the use past
// floor(limit × NearLimitRatio), over_limit all the hits of a denied one.
func (inc *incumbent) observeDescriptor(domain string, d *server.DescriptorOutcome) {
	switch d.Outcome {
	case server.WithinLimit, server.DeniedByOther, server.OverLimit, server.ShadowOverLimit, server.FailureMode:
	default:
		return // no rule, unlimited, replaced: the incumbent counts nothing
	}
	c := inc.counters(domain, d)
	if c == nil {
		return
	}
	hits := uint64(max(d.Hits, 0))
	c.n[incTotal].Add(hits)
	limit := max(d.Limit.Burst, 0)
	used := max(limit-d.Decision.Remaining, 0)
	near := int64(math.Floor(float64(float32(limit) * inc.nearRatio)))
	switch d.Outcome {
	case server.WithinLimit, server.DeniedByOther:
		after := used // the tokens are taken
		if d.Outcome == server.DeniedByOther {
			after = used + int64(hits) // as checked: the incumbent would have counted them
		}
		before := after - int64(hits)
		c.n[incWithin].Add(hits)
		if after > near {
			c.n[incNear].Add(uint64(after - max(before, near)))
		}
	case server.OverLimit, server.ShadowOverLimit:
		// A denied request takes nothing from a token bucket: all of its
		// hits are over the limit (the incumbent's fixed window, which
		// counts them in, splits a call that crosses the limit into near
		// and over parts).
		c.n[incOver].Add(hits)
		if d.Rule.ShadowMode {
			// A global SHADOW_MODE counts over_limit only, as there.
			c.n[incShadow].Add(hits)
		}
	}
}

// counters returns the counters of d's stat key, creating them; nil past
// maxIncKeys.
func (inc *incumbent) counters(domain string, d *server.DescriptorOutcome) *incCounters {
	r := d.Rule
	if r.File != "" && !r.StatKeyVaries() {
		if c, ok := inc.byRule.Load(r); ok {
			return c.(*incCounters)
		}
		c := inc.lookup(nil, inc.ruleKey(r), "")
		if c != nil {
			inc.byRule.Store(r, c)
		}
		return c
	}
	// The request's entries: per the rule's detailed_metric and
	// value_to_metric, or, for a limit override (config_impl.go descriptorKey@f2fb157) as key or
	// key_value; built in place, looked up without an allocation.
	var kb [256]byte
	var key []byte
	var parent string
	if r.File == "" {
		key = append(append(kb[:0], domain...), '.')
		key = appendEntries(key, d.Descriptor.GetEntries(), false, inc.redact)
		parent = domain + "." + incOverflow
	} else {
		// detailed_metric or value_to_metric: the rule's own key with the
		// request's values where those say (config.Rule.StatKey), as
		// Options.Redact shows them.
		var eb [32]config.Entry
		entries := eb[:0]
		for _, e := range d.Descriptor.GetEntries() {
			v := e.GetValue()
			if inc.redact != redact.Off {
				v = inc.redact.Value(v)
			}
			entries = append(entries, config.Entry{Key: e.GetKey(), Value: v})
		}
		key = r.AppendStatKey(kb[:0], entries)
		parent = inc.ruleKey(r)
	}
	for i, c := range key {
		if c == ':' || c == '|' {
			key[i] = '_'
		}
	}
	if maybeIPv4(key) {
		key = []byte(sanitizeStatName(string(key)))
	}
	return inc.lookup(key, "", parent)
}

// lookup returns the counters of the stat key key (or, when key is nil,
// keyStr), creating them; parent, when set, is the key that counts past
// the maxValues keys created under it.
func (inc *incumbent) lookup(key []byte, keyStr, parent string) *incCounters {
	inc.mu.RLock()
	c, ok := inc.keys[string(key)]
	if key == nil {
		c, ok = inc.keys[keyStr]
	}
	inc.mu.RUnlock()
	if ok {
		return c
	}
	if key != nil {
		keyStr = string(key)
	}
	inc.mu.Lock()
	defer inc.mu.Unlock()
	if c, ok := inc.keys[keyStr]; ok {
		return c
	}
	if parent != "" {
		if inc.detailed[parent] >= inc.maxValues {
			keyStr = parent
			if c, ok := inc.keys[keyStr]; ok {
				return c
			}
		} else {
			inc.detailed[parent]++
		}
	}
	if len(inc.keys) >= maxIncKeys {
		return nil
	}
	labels := statLabels(keyStr)
	if labels == nil {
		return nil
	}
	c = &incCounters{labels: labels}
	inc.keys[keyStr] = c
	return c
}

// ruleKey returns the incumbent's stat key of a rule of the config:
// domain.key_value.key..., sanitized (config_impl.go loadDescriptors@f2fb157).
func (inc *incumbent) ruleKey(r *config.Rule) string {
	if k, ok := inc.ruleKeys.Load(r); ok {
		return k.(string)
	}
	var b strings.Builder
	b.WriteString(r.Domain)
	levels, ok := pathLevels(r.Path)
	if !ok {
		levels = []config.Entry{{Key: r.Label()}} // not a path the parser writes: name it by its label
	}
	for _, l := range levels {
		b.WriteByte('.')
		b.WriteString(l.Key)
		if l.Value != "" {
			b.WriteByte('_')
			b.WriteString(l.Value)
		}
	}
	k := sanitizeStatName(b.String())
	inc.ruleKeys.Store(r, k)
	return k
}

// appendEntries appends a request's entries as the incumbent's stat keys
// join them: key_value, or, unless always, key alone for an empty value;
// values as red shows them.
func appendEntries(b []byte, entries []*ratelimitv3.RateLimitDescriptor_Entry, always bool, red redact.Mode) []byte {
	for i, e := range entries {
		if i > 0 {
			b = append(b, '.')
		}
		b = append(b, e.GetKey()...)
		if always || e.GetValue() != "" {
			b = append(b, '_')
			if red == redact.Off {
				b = append(b, e.GetValue()...)
			} else {
				b = append(b, red.Value(e.GetValue())...)
			}
		}
	}
	return b
}

// ipv4 is an IPv4 address, whose dots the incumbent's stat names lose.
var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// maybeIPv4 reports whether b may hold an IPv4 address: four runs of
// digits joined by single dots (a superset of what ipv4 matches), so that
// the regexp runs only on keys that may need it.
func maybeIPv4(b []byte) bool {
	digit := func(c byte) bool { return '0' <= c && c <= '9' }
	runs := 0
	for i := 0; i < len(b); {
		if !digit(b[i]) {
			runs, i = 0, i+1
			continue
		}
		j := i
		for j < len(b) && digit(b[j]) {
			j++
		}
		if runs++; runs == 4 {
			return true
		}
		if j+1 < len(b) && b[j] == '.' && digit(b[j+1]) {
			i = j + 1
			continue
		}
		runs, i = 0, j
	}
	return false
}

var statReplacer = strings.NewReplacer(":", "_", "|", "_")

// sanitizeStatName is utils.SanitizeStatName@f2fb157: ':' and '|' become
// '_', and so do the dots of IPv4 addresses.
func sanitizeStatName(s string) string {
	s = statReplacer.Replace(s)
	return ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}

// statLabels are the labels the default mapper gives a stat key: two
// dot-separated parts are domain and key1 (its glob rules), three or more
// domain, key1 and key2 (its regex rules, the rest dropped); nil for fewer.
// Values are made valid UTF-8.
func statLabels(key string) []string {
	parts := strings.SplitN(key, ".", 4)
	if len(parts) < 2 {
		return nil
	}
	parts = parts[:min(len(parts), 3)]
	for i, p := range parts {
		parts[i] = strings.ToValidUTF8(p, "\uFFFD")
	}
	return parts
}

// pathLevels parses a Rule.Path ("domain > key=value > key", each part
// quoted by strconv.Quote when it could be misread) into its levels below
// the domain.
func pathLevels(path string) ([]config.Entry, bool) {
	var out []config.Entry
	for first := true; ; first = false {
		key, rest, ok := pathToken(path)
		if !ok {
			return nil, false
		}
		var value string
		if strings.HasPrefix(rest, "=") {
			if value, rest, ok = pathToken(rest[1:]); !ok {
				return nil, false
			}
		}
		if !first {
			out = append(out, config.Entry{Key: key, Value: value})
		}
		if rest == "" {
			return out, true
		}
		if !strings.HasPrefix(rest, " > ") {
			return nil, false
		}
		path = rest[len(" > "):]
	}
}

// pathToken reads one key or value of a path: quoted, or up to the next
// space or '=' (an unquoted one has neither).
func pathToken(s string) (tok, rest string, ok bool) {
	if strings.HasPrefix(s, `"`) {
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			return "", "", false
		}
		tok, err = strconv.Unquote(q)
		return tok, s[len(q):], err == nil
	}
	if i := strings.IndexAny(s, " ="); i >= 0 {
		return s[:i], s[i:], true
	}
	return s, "", true
}
