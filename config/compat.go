package config

// Bounds of the wildcard-order check, which compares every pair of
// patterns of one level: levels with more patterns, or longer patterns,
// are not checked (the check is only a warning).
const (
	maxOrderCheckPatterns = 64
	maxOrderCheckBytes    = 128
)

// warnWildcardOrder warns about the patterns of one level, in file order,
// that envoyproxy/ratelimit and ratelimitd choose between differently: it
// takes the first pattern in file order that matches, ratelimitd the most
// specific (see Set). A pair is reported when some value matches both and
// the later one is more specific.
func (b *builder) warnWildcardOrder(wild []*node) {
	if len(wild) < 2 || len(wild) > maxOrderCheckPatterns {
		return
	}
	for j, later := range wild {
		for _, first := range wild[:j] {
			if moreSpecific(later, first) >= 0 || !globsMeet(first.value, later.value) {
				continue
			}
			b.probs.warn(later.file, later.line, later.col, later.path,
				"value %q: a value matching both this and %q (%s:%d) gets this more specific rule here, but the earlier one under envoyproxy/ratelimit, which takes the first match in file order: put this descriptor first to mean the same under both",
				later.value, first.value, first.file, first.line)
		}
	}
}

// globsMeet reports whether some value matches both patterns, in which '*'
// matches any run of bytes. Patterns longer than maxOrderCheckBytes are
// taken to meet.
func globsMeet(a, b string) bool {
	if len(a) > maxOrderCheckBytes || len(b) > maxOrderCheckBytes {
		return true
	}
	// seen[i][j]: the suffixes a[i:] and b[j:] were already explored.
	w := len(b) + 1
	seen := make([]bool, (len(a)+1)*w)
	var meet func(i, j int) bool
	meet = func(i, j int) bool {
		if seen[i*w+j] {
			return false
		}
		seen[i*w+j] = true
		switch {
		case i == len(a) && j == len(b):
			return true
		case i < len(a) && a[i] == '*':
			// The star matches nothing, or takes one more byte (or star) of b.
			return meet(i+1, j) || j < len(b) && meet(i, j+1)
		case j < len(b) && b[j] == '*':
			return meet(i, j+1) || i < len(a) && meet(i+1, j)
		case i < len(a) && j < len(b):
			return a[i] == b[j] && meet(i+1, j+1)
		}
		return false
	}
	return meet(0, 0)
}

// StatKey is envoyproxy/ratelimit's stats key for a request descriptor
// that matched r: "domain.key_value.key…", the key its per-rule counters
// (ratelimit.service.rate_limit.<key>.total_hits and the others) carry.
// By default each level is written as in the file: key_value for an exact
// value, key_pattern for a wildcard, key for a key-only level.
// value_to_metric writes the request's value instead at a key-only or
// wildcard level (share_threshold keeps the pattern); detailed_metric
// writes every request value (key_value, but the pattern where a level
// shares its bucket). Entries beyond the rule's levels (a limit override)
// are written key_value, or key when the value is empty.
//
// Unless StatKeyVaries, the key is the same for every request of r, so a
// bounded number of them exist; otherwise it holds request values and
// metrics must bound their number themselves.
func (r *Rule) StatKey(entries []Entry) string {
	return string(r.AppendStatKey(nil, entries))
}

// AppendStatKey is StatKey appending to dst.
func (r *Rule) AppendStatKey(dst []byte, entries []Entry) []byte {
	dst = append(dst, r.Domain...)
	shares := false
	for _, l := range r.levels {
		shares = shares || l.shareThreshold
	}
	for i, e := range entries {
		dst = append(dst, '.')
		dst = append(dst, e.Key...)
		if i >= len(r.levels) {
			if e.Value != "" {
				dst = append(append(dst, '_'), e.Value...)
			}
			continue
		}
		l := r.levels[i]
		var v string
		switch {
		case r.DetailedMetric && l.shareThreshold:
			v = l.value
		case r.DetailedMetric && shares:
			v = e.Value
		case r.DetailedMetric:
			dst = append(append(dst, '_'), e.Value...) // "key_" even for ""
			continue
		case l.wild && l.shareThreshold:
			v = l.value
		case l.wild && l.valueToMetric, l.keyOnly && l.valueToMetric:
			v = e.Value
		default:
			v = l.value
		}
		if v != "" {
			dst = append(append(dst, '_'), v...)
		}
	}
	return dst
}

// OverrideStatKey is envoyproxy/ratelimit's stats key for a descriptor
// that carries a limit override (which replaces whatever rule matched):
// "domain.key_value.key…", each entry key_value, or key when its value is
// empty. It holds request values: metrics must bound their number.
func OverrideStatKey(domain string, entries []Entry) string {
	r := Rule{Domain: domain}
	return string(r.AppendStatKey(nil, entries))
}

// StatKeyVaries reports whether StatKey holds request values
// (detailed_metric, or value_to_metric at a level matching many values).
func (r *Rule) StatKeyVaries() bool {
	return r.DetailedMetric || r.ValueToMetric
}

// SharesBucket reports whether a level of r's path sets share_threshold:
// every value its wildcard matches draws from one bucket.
func (r *Rule) SharesBucket() bool {
	for _, l := range r.levels {
		if l.shareThreshold {
			return true
		}
	}
	return false
}
