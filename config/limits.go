package config

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"gopkg.in/yaml.v3"
)

// The fields of a limit: a rate_limit block, an item of rate_limits, or a
// quota group.
var (
	limitFields      = []string{"unit", "requests_per_unit", "burst", "unit_multiplier", "name", "counts", "overdraft", "max_wait", "max_waiters"}
	rateLimitFields  = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "burst", "unit_multiplier", "counts", "overdraft", "max_wait", "max_waiters"}
	groupFields      = append([]string{"shared", "concurrency"}, without(limitFields, "name")...)
	overdraftFields  = []string{"max_debt"}
	topFields        = []string{"domain", "descriptors", "quota_groups"}
	descriptorFields = []string{"key", "value", "rate_limit", "rate_limits", "quota_group", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "replaces", "concurrency"}
)

// DefaultMaxWaiters bounds the requests waiting on one bucket when a limit
// sets max_wait but not max_waiters.
const DefaultMaxWaiters = 64

func without(list []string, drop string) []string {
	var out []string
	for _, s := range list {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}

// limit reads the fields of one limit (already checked against its list of
// valid fields). zeroDenies allows requests_per_unit: 0, which returns
// denyAll. It reports every problem and returns ok false if there was one.
func (p *parser) limit(fields map[string]field, at *yaml.Node, path, pre string, zeroDenies bool) (rl RateLimit, denyAll, ok bool) {
	ok = true
	rl.UnitMultiplier, rl.Counts = 1, Requests
	if g, has := fields["name"]; has {
		if s, good := p.str(g.val, path, dot(pre, "name")); !good {
			ok = false
		} else if s == "" {
			p.errorf(g.val, path, "%s: must not be empty (leave it out instead)", dot(pre, "name"))
			ok = false
		} else {
			rl.Name = s
		}
	}
	if g, has := fields["unit"]; has {
		if s, good := p.str(g.val, path, dot(pre, "unit")); good {
			if rl.Unit = parseUnit(s); rl.Unit == 0 {
				p.errorf(g.val, path, "%s: unknown unit %q (want %s)", dot(pre, "unit"), s, unitChoices)
			}
		}
		ok = ok && rl.Unit != 0
	} else {
		p.errorf(at, path, "%s: missing (want %s)", dot(pre, "unit"), unitChoices)
		ok = false
	}
	var count, burst int64
	if g, has := fields["requests_per_unit"]; has {
		var good bool
		if count, good = p.requestsPerUnit(g.val, path, dot(pre, "requests_per_unit"), zeroDenies); !good {
			ok = false
		}
	} else {
		hint := ""
		if zeroDenies {
			hint = " (or set unlimited: true)"
		}
		p.errorf(at, path, "%s: missing%s", dot(pre, "requests_per_unit"), hint)
		ok = false
	}
	if g, has := fields["burst"]; has {
		var good bool
		if burst, good = p.positive(g.val, path, dot(pre, "burst"), limiter.MaxTokens); !good {
			ok = false
		}
	}
	if g, has := fields["unit_multiplier"]; has {
		var good bool
		if rl.UnitMultiplier, good = p.positive(g.val, path, dot(pre, "unit_multiplier"), math.MaxUint32); !good {
			ok = false
		}
	}
	if g, has := fields["counts"]; has {
		if s, good := p.str(g.val, path, dot(pre, "counts")); good {
			switch s {
			case "requests":
				rl.Counts = Requests
			case "tokens":
				rl.Counts = Tokens
			default:
				p.errorf(g.val, path, "%s: unknown %q (want requests or tokens)", dot(pre, "counts"), s)
				ok = false
			}
		} else {
			ok = false
		}
	}
	if g, has := fields["overdraft"]; has {
		if of := p.fields(g.val, path, dot(pre, "overdraft"), overdraftFields); of == nil {
			ok = false
		} else {
			var good bool
			if rl.Limit.MaxDebt, good = p.requiredPositive(of, "max_debt", g.val, path, dot(pre, "overdraft"), limiter.MaxTokens); !good {
				ok = false
			}
		}
	}
	if g, has := fields["max_wait"]; has {
		var good bool
		if rl.MaxWait, good = p.duration(g.val, path, dot(pre, "max_wait")); !good {
			ok = false
		}
	}
	var good bool
	if rl.MaxWaiters, good = p.maxWaiters(fields, path, pre, rl.MaxWait); !good {
		ok = false
	}
	if !ok {
		return rl, false, false
	}
	// The period must fit a time.Duration even when nothing refills (a
	// requests_per_unit: 0 rule), since Envoy is told to retry after it.
	unit := rl.Unit.Duration()
	if most := int64(math.MaxInt64 / unit); rl.UnitMultiplier > most {
		p.errorf(fields["unit_multiplier"].val, path, "%s: %d %ss is too long a period (at most %d %ss)",
			dot(pre, "unit_multiplier"), rl.UnitMultiplier, rl.Unit, most, rl.Unit)
		return rl, false, false
	}
	if count == 0 {
		for _, name := range []string{"burst", "counts", "overdraft", "max_wait"} {
			if g, has := fields[name]; has {
				p.errorf(g.key, path, "%s: not allowed with requests_per_unit: 0 (a rule that denies every request has no bucket)", dot(pre, name))
				ok = false
			}
		}
		return rl, ok, ok
	}
	if burst == 0 {
		burst = count
	}
	rl.Limit.Count, rl.Limit.Period, rl.Limit.Burst = count, time.Duration(rl.UnitMultiplier)*unit, burst
	if !p.bucketFits(rl, fields, at, path, pre) {
		return rl, false, false
	}
	return rl, false, true
}

// bucketFits reports whether the bucket of rl passes limiter.Limit.Validate.
// Each field is already within its bounds; this reports, in the file's
// terms and at the field to change, the bounds that tie fields together.
func (p *parser) bucketFits(rl RateLimit, fields map[string]field, at *yaml.Node, path, pre string) bool {
	l := rl.Limit
	// node is the field's value, or, for a field left out, at.
	node := func(name string) *yaml.Node {
		if f, has := fields[name]; has {
			return f.val
		}
		if name == "overdraft.max_debt" {
			if f, has := fields["overdraft"]; has {
				return f.val
			}
		}
		return at
	}
	_, burstGiven := fields["burst"]
	burst := fmt.Sprintf("burst %d", l.Burst)
	if !burstGiven {
		burst += " (the default, requests_per_unit)"
	}
	per := rl.Unit.String()
	if rl.UnitMultiplier > 1 {
		per = fmt.Sprintf("%d %ss", rl.UnitMultiplier, rl.Unit)
	}
	most := fmt.Sprintf("%g years", maxFillYears)
	err := l.Validate()
	if err == nil {
		return true
	}
	fill := limiter.Limit{Count: l.Count, Period: l.Period, Burst: l.Burst}
	switch {
	case fill.Validate() != nil:
		if burstGiven {
			p.errorf(node("burst"), path, "%s: %d at %d per %s takes %s to fill, more than %s",
				dot(pre, "burst"), l.Burst, l.Count, per, years(l.Burst, l), most)
			break
		}
		// Without a burst of its own, a bucket fills in one period.
		p.errorf(node("unit_multiplier"), path, "%s: %s is too long a period: the bucket (burst defaults to requests_per_unit) takes that long to fill, more than %s",
			dot(pre, "unit_multiplier"), per, most)
	case l.MaxDebt > 0:
		p.errorf(node("overdraft.max_debt"), path, "%s: paying a debt of %d and filling %s at %d per %s takes %s, more than %s",
			dot(pre, "overdraft.max_debt"), l.MaxDebt, burst, l.Count, per, years(l.Burst+l.MaxDebt, l), most)
	default:
		p.errorf(at, path, "%s: %v", pre, err)
	}
	return false
}

// maxFillYears is limiter.MaxFill in years of 365 days.
const maxFillYears = float64(limiter.MaxFill) / float64(365*24*time.Hour)

// years says how long n tokens take to arrive at l's rate, in years of 365
// days, for an error message about a span longer than limiter.MaxFill.
func years(n int64, l limiter.Limit) string {
	y := float64(n) * float64(l.Period) / float64(l.Count) / float64(365*24*time.Hour)
	s := strconv.FormatFloat(y, 'g', 4, 64)
	if y < maxFillYears*1.0005 {
		s = "just over " + strconv.FormatFloat(maxFillYears, 'g', -1, 64)
	}
	return s + " years"
}

// maxWaiters reads the max_waiters field of fields (a rate limit's or a
// concurrency block's, named pre): a count from 1 to MaxInt32 that only
// means something beside max_wait. Absent, it is DefaultMaxWaiters when
// maxWait (the max_wait already read) is positive, else 0. It reports any
// problem and returns false if there was one.
func (p *parser) maxWaiters(fields map[string]field, path, pre string, maxWait time.Duration) (int, bool) {
	g, has := fields["max_waiters"]
	if !has {
		if maxWait > 0 {
			return DefaultMaxWaiters, true
		}
		return 0, true
	}
	_, hasWait := fields["max_wait"] // an invalid max_wait is reported on its own
	n, good := p.positive(g.val, path, dot(pre, "max_waiters"), math.MaxInt32)
	switch {
	case !good:
		return 0, false
	case !hasWait:
		p.errorf(g.key, path, "%s: only means something with max_wait", dot(pre, "max_waiters"))
		return 0, false
	}
	return int(n), true
}

// duration reads a Go duration ("2s", "500ms").
func (p *parser) duration(n *yaml.Node, path, name string) (time.Duration, bool) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" {
		if d, err := time.ParseDuration(n.Value); err == nil && d > 0 {
			return d, true
		}
	}
	p.errorf(n, path, "%s: want a positive duration such as 500ms or 2s, got %s", name, kind(n))
	return 0, false
}

// durationIn reads a duration (see duration) from least to most; with
// least 0, any positive duration up to most.
func (p *parser) durationIn(n *yaml.Node, path, name string, least, most time.Duration) (time.Duration, bool) {
	d, good := p.duration(n, path, name)
	switch {
	case !good:
		return 0, false
	case least > 0 && (d < least || d > most):
		p.errorf(n, path, "%s: %v is out of range [%v, %v]", name, d, least, most)
		return 0, false
	case d > most:
		p.errorf(n, path, "%s: %v is more than %v", name, d, most)
		return 0, false
	}
	return d, true
}

// rateLimits reads a descriptor's rate_limits list: several limits that a
// request must all pass. Each needs a distinct identity (its name, else what
// it counts and its period), which keeps its bucket.
func (p *parser) rateLimits(f field, d *desc) []RateLimit {
	const pre = "rate_limits"
	if f.val.Kind != yaml.SequenceNode {
		p.errorf(f.val, d.path, "%s: want a list of one or more limits, got %s", pre, kind(f.val))
		return nil
	}
	if len(f.val.Content) == 0 {
		p.errorf(f.val, d.path, "%s: empty: give one or more limits", pre)
		return nil
	}
	var out []RateLimit
	seen := map[string]int{}
	ok := true
	for i, item := range f.val.Content {
		at := pre + "[" + strconv.Itoa(i) + "]"
		fields := p.fields(item, d.path, at, limitFields)
		if fields == nil {
			ok = false
			continue
		}
		rl, _, good := p.limit(fields, item, d.path, at, false)
		if !good {
			ok = false
			continue
		}
		if g, has := fields["name"]; has && i == 0 {
			// The rule's name, as for rate_limit: checked across the domain.
			d.nameLine, d.nameCol, d.nameField = g.val.Line, g.val.Column, at+".name"
		}
		id := rl.identity()
		if j, dup := seen[id]; dup {
			p.errorf(item, d.path, "%s: same name, or same counts and period, as %s[%d]: give each limit a distinct name", at, pre, j)
			ok = false
			continue
		}
		seen[id] = i
		out = append(out, rl)
	}
	if !ok {
		return nil
	}
	return out
}

// identity tells apart the limits of one rule, for their bucket keys: the
// name if any, else what the limit counts and its period. It does not
// contain the rate, so editing a rate keeps the bucket.
func (rl RateLimit) identity() string {
	if rl.Name != "" {
		return "name:" + rl.Name
	}
	return rl.Counts.String() + "/" + rl.Limit.Period.String()
}

// group is a quota group as written in one file.
type group struct {
	limit     RateLimit
	file      string
	line, col int
	// broken groups had problems, already reported: their name is
	// defined (rules may name it, another group may not take it), their
	// limit is not.
	broken bool
	// concurrency is a concurrency group's limit (limit is then unused).
	concurrency *Concurrency
}

// quotaGroups reads the top-level quota_groups mapping.
func (p *parser) quotaGroups(n *yaml.Node, path string) map[string]*group {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "quota_groups: want a mapping of group name to limit, got %s", kind(n))
		return nil
	}
	out := make(map[string]*group, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !p.plain(k, path) || !p.plain(v, path) {
			continue
		}
		name, good := p.str(k, path, "quota_groups")
		if !good {
			continue
		}
		if name == "" {
			p.errorf(k, path, "quota_groups: a group needs a non-empty name")
			continue
		}
		pre := "quota_groups." + name
		if prev, dup := out[name]; dup {
			p.errorf(k, path, "%s: repeated (first at line %d)", pre, prev.line)
			continue
		}
		g := &group{file: p.file, line: k.Line, col: k.Column, broken: true}
		out[name] = g
		fields := p.fields(v, path, pre, groupFields)
		if fields == nil {
			continue
		}
		if c, has := fields["concurrency"]; has {
			if p.groupConcurrency(fields, c, path, pre, g) {
				g.broken = false
			}
			continue
		}
		rl, _, good := p.limit(fields, k, path, pre, false)
		if g, has := fields["shared"]; has {
			var b bool
			if rl.Shared, b = p.boolean(g.val, path, dot(pre, "shared")); !b {
				good = false
			}
		}
		if !good {
			continue
		}
		rl.Name, rl.Group = name, name
		g.limit, g.broken = rl, false
	}
	return out
}
