package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"gopkg.in/yaml.v3"
)

// KindConcurrency rules (a key-only level with concurrency, or naming a
// quota group that has one) hold a lease per request value in a pool of
// at most max_in_flight; see Concurrency.
const KindConcurrency = KindDenyAll + 1

// concurrencyFields are the fields of a concurrency block.
var concurrencyFields = []string{"max_in_flight", "lease", "max_wait", "max_waiters", "name"}

// Concurrency is a concurrency limit: at most Pool.MaxInFlight requests at
// once per pool, across every replica sharing the store.
//
// It sits on a key-only level whose request values name leases (Envoy's
// x-request-id): a request descriptor reaching it with hits ≥ 1 takes (or
// renews) the lease named by its last entry's value; one with
// is_negative_hits gives it back. The pool is the path above the lease
// level (see Rule.AppendPool): a concurrency level below a per-client
// key-only level gives each client its own pool, and a quota group's
// concurrency gives every rule naming it one pool.
type Concurrency struct {
	// Name is the limit's name (concurrency.name, else the quota group's
	// name), or "": Envoy's current_limit and the RateLimit headers show
	// it, else the rule's.
	Name string
	// Pool is max_in_flight and lease: a lease not released within Lease
	// of its latest acquire is given back (a release Envoy never sent).
	Pool limiter.PoolLimit
	// MaxWait, when positive, lets a request wait up to this long for a
	// slot, first come first served on each replica, instead of being
	// denied; MaxWaiters bounds how many wait on one pool per replica
	// (default DefaultMaxWaiters).
	MaxWait    time.Duration
	MaxWaiters int
	// Group is the quota group the limit belongs to, or "".
	Group string

	// view is RateLimit's answer, set once the limit is complete.
	view RateLimit
}

// RateLimit is how the limit is shown where a rate is expected (Envoy's
// current_limit, the RateLimit headers): Name, Limit.Count =
// MaxInFlight and no Unit (0: a concurrency limit has no period, and
// Envoy's current_limit says UNKNOWN). The pointer is the same on every
// call, for caches keyed by it; it must not be modified.
func (c *Concurrency) RateLimit() *RateLimit {
	if c.view.Limit.Count != c.Pool.MaxInFlight || c.view.Name != c.Name {
		// A Concurrency made outside this package.
		return &RateLimit{Name: c.Name, Limit: limiter.Limit{Count: c.Pool.MaxInFlight}, UnitMultiplier: 1, Counts: Requests}
	}
	return &c.view
}

// finish sets what derives from the limit's fields.
func (c *Concurrency) finish() {
	c.view = RateLimit{Name: c.Name, Limit: limiter.Limit{Count: c.Pool.MaxInFlight}, UnitMultiplier: 1, Counts: Requests}
}

// String sums the limit up: "8 in flight, lease 10m0s, waits up to 2s (at
// most 100 waiting)".
func (c *Concurrency) String() string {
	s := c.Pool.String()
	if c.MaxWait > 0 {
		s += fmt.Sprintf(", waits up to %v (at most %d waiting)", c.MaxWait, c.MaxWaiters)
	}
	return s
}

// poolVersion starts every pool name, as keyVersion starts bucket keys.
const poolVersion = "p1"

// AppendPool appends to dst the name of the lease pool that request
// descriptor entries (which reached r, a KindConcurrency rule) hold their
// lease in, and returns it; the lease is the last entry's value. Parts are
// length-prefixed as in AppendKey. The name is: for a rule's own limit, the
// domain and every entry above the lease level (at a share_threshold
// level, its pattern); for a quota group, the domain, an empty part,
// "group", the group's name and the entries of the key-only levels above
// the lease level, so that aliases share one pool while each client of a
// per-client level keeps its own. It is the only place pool names are
// built.
func (r *Rule) AppendPool(dst []byte, entries []Entry) []byte {
	dst = append(dst, poolVersion...)
	dst = appendPart(dst, r.Domain)
	above := entries[:max(len(entries)-1, 0)]
	if r.Concurrency != nil && r.Concurrency.Group != "" {
		dst = appendPart(dst, "")
		dst = appendPart(dst, "group")
		dst = appendPart(dst, r.Concurrency.Group)
		for i, e := range above {
			if i < len(r.levels) && r.levels[i].keyOnly {
				dst = appendPart(dst, e.Key)
				dst = appendPart(dst, e.Value)
			}
		}
		return dst
	}
	return r.appendEntries(dst, above)
}

// PoolLabel names the pool of entries for people (the /limits page): the
// rule's path with the values above the lease level filled in, "ai-gateway
// > model=llama > client=acme > request_id".
func (r *Rule) PoolLabel(entries []Entry) string {
	var b strings.Builder
	if r.Concurrency != nil && r.Concurrency.Group != "" {
		fmt.Fprintf(&b, "%s > quota group %s", quoteIfNeeded(r.Domain), r.Concurrency.Group)
		for i, e := range entries[:max(len(entries)-1, 0)] {
			if i < len(r.levels) && r.levels[i].keyOnly {
				b.WriteString(" > " + pathPart(e.Key, e.Value))
			}
		}
		return b.String()
	}
	b.WriteString(quoteIfNeeded(r.Domain))
	for _, e := range entries[:max(len(entries)-1, 0)] {
		b.WriteString(" > " + pathPart(e.Key, e.Value))
	}
	if len(entries) > 0 {
		b.WriteString(" > " + quoteIfNeeded(entries[len(entries)-1].Key))
	}
	return b.String()
}

// concurrency reads a concurrency block (of a descriptor or of a quota
// group). It reports every problem and returns nil if there was one.
func (p *parser) concurrency(f field, path, pre string) *Concurrency {
	if f.val.Kind == yaml.ScalarNode && f.val.ShortTag() == "!!null" {
		p.errorf(f.val, path, "%s: empty: give max_in_flight and lease", pre)
		return nil
	}
	fields := p.fields(f.val, path, pre, concurrencyFields)
	if fields == nil {
		return nil
	}
	c := &Concurrency{}
	ok := true
	var good bool
	if c.Pool.MaxInFlight, good = p.requiredPositive(fields, "max_in_flight", f.key, path, pre, limiter.MaxPoolSize); !good {
		ok = false
	}
	if g, has := fields["lease"]; has {
		if c.Pool.Lease, good = p.durationIn(g.val, path, dot(pre, "lease"), limiter.MinLease, limiter.MaxLease); !good {
			ok = false
		}
	} else {
		p.errorf(f.key, path, "%s: missing (how long a lease is held when Envoy never sends its release, such as 10m)", dot(pre, "lease"))
		ok = false
	}
	if g, has := fields["max_wait"]; has {
		if c.MaxWait, good = p.durationIn(g.val, path, dot(pre, "max_wait"), 0, limiter.MaxLease); !good {
			ok = false
		}
	}
	if c.MaxWaiters, good = p.maxWaiters(fields, path, pre, c.MaxWait); !good {
		ok = false
	}
	if g, has := fields["name"]; has {
		s, good := p.str(g.val, path, dot(pre, "name"))
		switch {
		case !good:
			ok = false
		case s == "":
			p.errorf(g.val, path, "%s: must not be empty (leave it out instead)", dot(pre, "name"))
			ok = false
		default:
			c.Name = s
		}
	}
	if !ok {
		return nil
	}
	if err := c.Pool.Validate(); err != nil { // bounds checked above; be safe
		p.errorf(f.key, path, "%s: %v", pre, err)
		return nil
	}
	return c
}

// descConcurrency reads a descriptor's concurrency field, checking its
// place: a key-only level, with no rate limit of its own.
func (p *parser) descConcurrency(fields map[string]field, d *desc) {
	f, has := fields["concurrency"]
	if !has {
		return
	}
	for _, other := range []string{"rate_limit", "rate_limits", "quota_group"} {
		if g, has := fields[other]; has {
			p.errorf(g.key, d.path, "%s: not allowed beside concurrency (a concurrency level holds leases; put rate limits on the level above or beside it)", other)
			return
		}
	}
	if d.value != "" {
		p.errorf(f.key, d.path, "concurrency: only on a key-only level (no value): its request values name the leases, such as Envoy's x-request-id")
		return
	}
	c := p.concurrency(f, d.path, "concurrency")
	if c == nil {
		return
	}
	r := newRule(p, d, KindConcurrency, nil)
	c.finish()
	r.Concurrency = c
	r.Name = c.Name
	if g, has := fields["concurrency"]; has && c.Name != "" {
		if n, ok := g.val.Content, g.val.Kind == yaml.MappingNode; ok {
			for i := 0; i+1 < len(n); i += 2 {
				if n[i].Value == "name" {
					d.nameLine, d.nameCol, d.nameField = n[i+1].Line, n[i+1].Column, "concurrency.name"
				}
			}
		}
	}
	d.rule = r
}

// resolveGroup gives the rule of u the limit of group g: its rate or its
// concurrency. A concurrency group may be named only on a key-only level
// (its values name leases), and a rate group only where no concurrency
// is.
func (b *builder) resolveGroup(u *groupUse, g *group) {
	if g.concurrency == nil {
		u.rule.setLimits([]RateLimit{g.limit})
		return
	}
	lv := u.rule.levels
	if len(lv) == 0 || !lv[len(lv)-1].keyOnly {
		b.probs.add(u.file, u.at.line, u.at.col, u.path,
			"quota_group: %q is a concurrency group: name it on a key-only level (no value), whose request values name the leases", u.name)
		return
	}
	c := *g.concurrency
	c.Group = u.name
	if c.Name == "" {
		c.Name = u.name
	}
	c.finish()
	u.rule.Kind = KindConcurrency
	u.rule.Concurrency = &c
}

// describeConcurrency is describe's part for a concurrency rule.
func (r *Rule) describeConcurrency(b *strings.Builder) {
	c := r.Concurrency
	if c == nil {
		b.WriteString("concurrency (invalid)")
		return
	}
	if c.Group != "" {
		fmt.Fprintf(b, "quota group %q: ", c.Group)
	}
	fmt.Fprintf(b, "at most %d in flight per pool (", c.Pool.MaxInFlight)
	if len(r.levels) == 0 {
		fmt.Fprintf(b, "lease %v)", c.Pool.Lease)
		return
	}
	perValue := false
	for _, l := range r.levels[:len(r.levels)-1] {
		perValue = perValue || l.keyOnly || l.wild && !l.shareThreshold && c.Group == ""
	}
	switch {
	case c.Group != "" && perValue:
		b.WriteString("one pool for every rule naming the group, per value of the key-only levels above")
	case c.Group != "":
		b.WriteString("one pool for every rule naming the group")
	case perValue:
		b.WriteString("one pool per value of the levels above")
	default:
		b.WriteString("one pool")
	}
	fmt.Fprintf(b, "; each value of %s names a lease, held until released or for %v)", quoteIfNeeded(r.levels[len(r.levels)-1].key), c.Pool.Lease)
	if c.MaxWait > 0 {
		fmt.Fprintf(b, ", waits up to %v for a slot (at most %d waiting)", c.MaxWait, c.MaxWaiters)
	}
}

// groupConcurrency reads the concurrency of quota group g, which then has
// no rate fields; it reports whether it is valid.
func (p *parser) groupConcurrency(fields map[string]field, c field, path, pre string, g *group) bool {
	ok := true
	for name, f := range fields {
		if name != "concurrency" {
			p.errorf(f.key, path, "%s: not allowed beside concurrency (a group is a rate or a concurrency limit; make two groups)", dot(pre, name))
			ok = false
		}
	}
	cc := p.concurrency(c, path, dot(pre, "concurrency"))
	if cc == nil || !ok {
		return false
	}
	g.concurrency = cc
	return true
}
