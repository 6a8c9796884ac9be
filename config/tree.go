package config

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Set is a loaded, validated configuration: every domain's descriptor tree,
// compiled for Lookup. A Set is immutable and safe for concurrent use; the
// Rules and Domains it returns are shared and must not be modified. A nil
// *Set has no domains.
//
// # Matching
//
// Lookup walks the request's entries in order, one tree level per entry.
// At each level, among the descriptors whose key is the entry's key, it takes
//
//  1. the descriptor whose value equals the entry's value exactly, else
//  2. the most specific descriptor whose value is a wildcard pattern
//     matching the entry's value (see below), else
//  3. the key-only descriptor (no value, or value ""), which applies to every
//     value (each value still gets its own bucket: see Rule.AppendKey).
//
// A '*' in a descriptor's value matches any run of bytes, including none,
// anywhere in the value ("gpt-4*", "*-mini", "a*b*c", "*"); a request value
// is always literal. When several patterns match, the most specific wins:
// the one with more literal (non-'*') bytes, then the one with fewer '*',
// then the one first in file order. Patterns are tried one after another,
// so a level with thousands of them is slow to miss, but each costs at most
// its own length plus MaxScanBytes, however long the value: a pattern's
// literal prefix and suffix are checked against the whole value, the
// literals between its stars are sought (leftmost first, in order) within
// the first MaxScanBytes bytes after the prefix. (envoyproxy/ratelimit
// treats only a trailing '*' as a wildcard, reads "a*b" literally, and takes
// the first matching pattern in file order.)
//
// There is no backtracking: once an entry has chosen a descriptor, a later
// entry that finds nothing below it means no rule, even if a less specific
// choice would have led further. If any entry finds no descriptor, or the
// descriptor reached by the last entry has no rate_limit (it only groups
// nested descriptors), no rule applies.
type Set struct {
	domains  map[string]*domainTree
	list     []*Domain // sorted by name
	hash     string
	warnings []*Error
	// refused are the domains whose config its source refused, with why
	// (see WithRefused); nil for none.
	refused map[string]string
}

// Warnings lists what the set's files mean differently under
// envoyproxy/ratelimit, or hold only for its sake (a field it ignores),
// sorted by file and position: "ratelimitd validate" prints them. They do
// not stop the files loading. The slice and its Errors are shared and must
// not be modified.
func (s *Set) Warnings() []*Error {
	if s == nil {
		return nil
	}
	return s.warnings
}

type domainTree struct {
	domain *Domain
	root   *node
	// groups are the domain's quota groups, from all its files; grouped
	// are the descriptors whose rule names one, resolved by check.
	groups  map[string]*group
	grouped []*groupUse
}

// groupUse is a rule that names a quota group.
type groupUse struct {
	rule *Rule
	name string
	file string
	at   pos
	path string
}

// node is one descriptor of the compiled tree.
type node struct {
	value     string       // "" for a key-only descriptor
	glob      *globPattern // for a value with '*'
	path      string
	file      string
	line, col int
	rule      *Rule            // nil for a descriptor without rate_limit
	children  map[string]*kids // by key
	nameLine  int
	nameCol   int
	nameField string
	replaces  []pos
}

// kids are the children of a node that share one key.
type kids struct {
	exact   map[string]*node // by value
	wild    []*node          // values with '*', most specific first
	keyOnly *node
	pattern map[string]*node // wild by value, for building
}

// child finds the descriptor below n that the entry (key, value) selects.
// It must not allocate.
func (n *node) child(key, value string) (*node, matchKind) {
	k := n.children[key]
	if k == nil {
		return nil, noKey
	}
	if c := k.exact[value]; c != nil {
		return c, exactMatch
	}
	for _, c := range k.wild {
		if c.glob.match(value) {
			return c, wildMatch
		}
	}
	if k.keyOnly != nil {
		return k.keyOnly, keyOnlyMatch
	}
	return nil, noValue
}

type matchKind int

const (
	noKey matchKind = iota + 1
	noValue
	exactMatch
	wildMatch
	keyOnlyMatch
)

// Lookup returns the rule that applies to a request descriptor of domain, or
// nil if none does (unknown domain, an entry that matches no descriptor, a
// descriptor without rate_limit, or no entries). See Set for the matching
// rules. Lookup does not allocate.
func (s *Set) Lookup(domain string, entries []Entry) *Rule {
	if s == nil || len(entries) == 0 {
		return nil
	}
	t := s.domains[domain]
	if t == nil {
		return nil
	}
	n := t.root
	for i := range entries {
		if n, _ = n.child(entries[i].Key, entries[i].Value); n == nil {
			return nil
		}
	}
	return n.rule
}

// HasDomain reports whether the set has descriptors for domain.
func (s *Set) HasDomain(domain string) bool {
	return s != nil && s.domains[domain] != nil
}

// Explain describes, one line per step, how Lookup walks the tree of domain
// for entries, and what it finds: for people (a future "ratelimitd explain"),
// not for parsing.
func (s *Set) Explain(domain string, entries []Entry) []string {
	var t *domainTree
	if s != nil {
		t = s.domains[domain]
	}
	if t == nil {
		return []string{fmt.Sprintf("unknown domain %s: no rule", quoteIfNeeded(domain))}
	}
	lines := []string{fmt.Sprintf("domain %s (%s)", quoteIfNeeded(domain), strings.Join(t.domain.Files, ", "))}
	if len(entries) == 0 {
		return append(lines, "no entries: no rule")
	}
	n := t.root
	for _, e := range entries {
		part := pathPart(e.Key, e.Value)
		c, how := n.child(e.Key, e.Value)
		switch how {
		case noKey:
			if len(n.children) == 0 {
				return append(lines, fmt.Sprintf("no rule for %s under %s: it has no nested descriptors", part, n.path))
			}
			return append(lines, fmt.Sprintf("no rule for %s under %s: no descriptor has key %s (keys here: %s)",
				part, n.path, quoteIfNeeded(e.Key), strings.Join(n.keys(), ", ")))
		case noValue:
			return append(lines, fmt.Sprintf("no rule for %s under %s: no descriptor with this value, no wildcard matches it, and no key-only descriptor for %s",
				part, n.path, quoteIfNeeded(e.Key)))
		case exactMatch:
			lines = append(lines, fmt.Sprintf("%s: exact value matched [%s]", part, c.where()))
		case wildMatch:
			lines = append(lines, fmt.Sprintf("%s: wildcard value %q matched [%s]", part, c.value, c.where()))
		case keyOnlyMatch:
			what := "key-only descriptor matched"
			if c.rule != nil {
				what = "key-only rule matched (own bucket per value)"
				if c.rule.Kind == KindConcurrency {
					what = "key-only concurrency level matched (its value names the lease)"
				}
			}
			lines = append(lines, fmt.Sprintf("%s: %s [%s]", part, what, c.where()))
		}
		n = c
	}
	if n.rule == nil {
		return append(lines, fmt.Sprintf("%s has no rate_limit (it only groups nested descriptors): no rule", n.path))
	}
	return append(lines, "rule "+n.rule.describe())
}

func (n *node) where() string {
	return fmt.Sprintf("%s:%d", n.file, n.line)
}

func (n *node) keys() []string {
	keys := make([]string, 0, len(n.children))
	for k := range n.children {
		keys = append(keys, quoteIfNeeded(k))
	}
	slices.Sort(keys)
	return keys
}

// describe sums a rule up in one line.
func (r *Rule) describe() string {
	var b strings.Builder
	b.WriteString(r.Path)
	if r.Name != "" {
		fmt.Fprintf(&b, " (name %q)", r.Name)
	}
	b.WriteString(": ")
	switch r.Kind {
	case KindUnlimited:
		b.WriteString("unlimited")
	case KindDenyAll:
		b.WriteString("denies every request (requests_per_unit: 0)")
	case KindConcurrency:
		r.describeConcurrency(&b)
	default:
		for i, l := range r.Limits {
			if i > 0 {
				b.WriteString("; and ")
			}
			l.describe(&b, len(r.Limits) > 1)
		}
	}
	writeOn(&b,
		onText{r.ShadowMode, ", shadow mode (never denies)"},
		onText{r.QuotaMode, ", quota mode (denies only when every quota-mode rule of the request is over)"},
		onText{r.DetailedMetric, ", detailed metric"},
		onText{r.ValueToMetric, ", value in metric"})
	if r.SharesBucket() {
		b.WriteString(", shared threshold (")
		first := true
		for _, l := range r.levels {
			if l.shareThreshold {
				if !first {
					b.WriteString(", ")
				}
				first = false
				fmt.Fprintf(&b, "every value of %s matching %q shares one bucket", quoteIfNeeded(l.key), l.value)
			}
		}
		b.WriteString(")")
	}
	if r.Metadata != nil {
		if m, err := json.Marshal(r.Metadata); err == nil {
			fmt.Fprintf(&b, ", metadata %s", m)
		}
	}
	if len(r.Replaces) > 0 {
		fmt.Fprintf(&b, ", replaces %s", strings.Join(r.Replaces, ", "))
	}
	return b.String()
}

// onText is what describe or WriteText writes for a rule's setting when
// it is on.
type onText struct {
	on   bool
	text string
}

// writeOn writes the text of each setting that is on, in order.
func writeOn(w io.StringWriter, texts ...onText) {
	for _, t := range texts {
		if t.on {
			w.WriteString(t.text)
		}
	}
}

func (l RateLimit) describe(b *strings.Builder, named bool) {
	if l.Group != "" {
		fmt.Fprintf(b, "quota group %q", l.Group)
		if l.Shared {
			b.WriteString(" (one bucket for all values)")
		}
		b.WriteString(": ")
	} else if l.Name != "" && named {
		fmt.Fprintf(b, "%q: ", l.Name)
	}
	if l.Counts == Tokens {
		fmt.Fprintf(b, "%d tokens per ", l.Limit.Count)
	} else {
		fmt.Fprintf(b, "%d per ", l.Limit.Count)
	}
	if l.UnitMultiplier > 1 {
		fmt.Fprintf(b, "%d %ss", l.UnitMultiplier, l.Unit)
	} else {
		b.WriteString(l.Unit.String())
	}
	fmt.Fprintf(b, ", burst %d", l.Limit.Burst)
	if l.Limit.MaxDebt > 0 {
		fmt.Fprintf(b, ", overdraft up to %d", l.Limit.MaxDebt)
	}
	if l.MaxWait > 0 {
		fmt.Fprintf(b, ", waits up to %v (at most %d waiting)", l.MaxWait, l.MaxWaiters)
	}
}

// Domains returns every domain of the set, sorted by name. The slice is the
// caller's; the Domains are shared.
func (s *Set) Domains() []*Domain {
	if s == nil {
		return nil
	}
	return slices.Clone(s.list)
}

// Hash identifies the files the set was loaded from: the hex SHA-256 of their
// names and contents, sorted by name. Equal files give equal hashes whatever
// order they were given in.
func (s *Set) Hash() string {
	if s == nil {
		return ""
	}
	return s.hash
}

// moreSpecific orders wildcard patterns: more literal bytes first, then
// fewer stars; equal patterns keep file order (the sort is stable).
func moreSpecific(a, b *node) int {
	sa, sb := strings.Count(a.value, "*"), strings.Count(b.value, "*")
	return cmp.Or(cmp.Compare(len(b.value)-sb, len(a.value)-sa), cmp.Compare(sa, sb))
}

// builder assembles the domains of a Set from parsed files.
type builder struct {
	probs   *problems
	domains map[string]*domainTree
}

// add merges one file's descriptors into its domain. Files of one domain may
// share descriptors (the same key and value at the same place) as long as
// at most one of them gives a shared descriptor a rate_limit.
func (b *builder) add(ft *fileTree) {
	t := b.domains[ft.domain]
	if t == nil {
		t = &domainTree{
			domain: &Domain{Name: ft.domain},
			root:   &node{path: quoteIfNeeded(ft.domain), file: ft.name},
		}
		b.domains[ft.domain] = t
	}
	t.domain.Files = append(t.domain.Files, ft.name)
	for name, g := range ft.groups {
		if prev, dup := t.groups[name]; dup {
			b.probs.add(g.file, g.line, g.col, quoteIfNeeded(ft.domain),
				"quota_groups.%s: already defined at %s:%d:%d", name, prev.file, prev.line, prev.col)
			continue
		}
		if t.groups == nil {
			t.groups = make(map[string]*group)
		}
		t.groups[name] = g
	}
	for _, d := range ft.descs {
		b.insert(t, t.root, d, ft.name, nil)
	}
}

// insert adds d below parent; levels are the levels above d (see
// Rule.levels).
func (b *builder) insert(t *domainTree, parent *node, d *desc, file string, levels []level) {
	levels = append(levels[:len(levels):len(levels)], level{
		key: d.key, value: d.value,
		keyOnly: d.value == "", wild: strings.Contains(d.value, "*"),
		shareThreshold: d.shareThreshold, valueToMetric: d.valueToMetric,
	})
	if parent.children == nil {
		parent.children = make(map[string]*kids)
	}
	k := parent.children[d.key]
	if k == nil {
		k = &kids{}
		parent.children[d.key] = k
	}
	var n *node
	switch {
	case d.value == "":
		n = k.keyOnly
	case strings.Contains(d.value, "*"):
		n = k.pattern[d.value]
	default:
		n = k.exact[d.value]
	}
	if n == nil {
		n = &node{value: d.value, path: d.path, file: file, line: d.line, col: d.col}
		if strings.Contains(d.value, "*") {
			n.glob = compileGlob(d.value)
		}
		switch {
		case d.value == "":
			k.keyOnly = n
		case strings.Contains(d.value, "*"):
			if k.pattern == nil {
				k.pattern = make(map[string]*node)
			}
			k.pattern[d.value] = n
			k.wild = append(k.wild, n)
		default:
			if k.exact == nil {
				k.exact = make(map[string]*node)
			}
			k.exact[d.value] = n
		}
	} else if n.rule != nil && d.rule != nil {
		b.probs.add(file, d.line, d.col, d.path,
			"rate_limit: this descriptor already has one at %s:%d:%d (files of one domain may share a descriptor only if at most one gives it a rate_limit)",
			n.rule.File, n.line, n.col)
		d.rule = nil
	}
	if d.rule != nil {
		d.rule.levels = levels
		for _, l := range levels {
			if l.valueToMetric && (l.keyOnly || l.wild && !l.shareThreshold) {
				d.rule.ValueToMetric = true
			}
		}
		if d.group != "" {
			t.grouped = append(t.grouped, &groupUse{rule: d.rule, name: d.group, file: file, at: d.groupAt, path: d.path})
		}
		n.rule = d.rule
		n.file, n.line, n.col = file, d.line, d.col
		n.nameLine, n.nameCol, n.nameField, n.replaces = d.nameLine, d.nameCol, d.nameField, d.replacesPos
		t.domain.Rules = append(t.domain.Rules, d.rule)
	}
	for _, c := range d.children {
		b.insert(t, n, c, file, levels)
	}
}

// check runs what needs a whole domain: it resolves each quota_group to
// its group's limit, and checks that rule names are unique and that
// replaces names an existing rule. It also orders wildcards.
func (b *builder) check(t *domainTree) {
	for _, u := range t.grouped {
		g, ok := t.groups[u.name]
		if !ok {
			b.probs.add(u.file, u.at.line, u.at.col, u.path, "quota_group: no group %q in domain %s%s",
				u.name, quoteIfNeeded(t.domain.Name), groupChoices(t.groups))
			continue
		}
		if g.broken {
			continue // its problems are reported where it is defined
		}
		b.resolveGroup(u, g)
	}
	named := make(map[string]*node)
	var rules []*node
	walk(t.root, func(n *node) {
		if n.rule != nil {
			rules = append(rules, n)
		}
	})
	// rules are in tree order; report against file order.
	slices.SortStableFunc(rules, func(x, y *node) int {
		return cmp.Or(strings.Compare(x.file, y.file), cmp.Compare(x.line, y.line), cmp.Compare(x.col, y.col))
	})
	for _, n := range rules {
		name := n.rule.Name
		if name == "" {
			continue
		}
		if first, dup := named[name]; dup {
			b.probs.add(n.file, n.nameLine, n.nameCol, n.path,
				"%s: %q already names the rule %s at %s:%d:%d", n.nameField, name, first.path, first.file, first.line, first.col)
			continue
		}
		named[name] = n
	}
	for _, n := range rules {
		for i, name := range n.rule.Replaces {
			at := pos{n.line, n.col}
			if i < len(n.replaces) {
				at = n.replaces[i]
			}
			switch {
			case name == n.rule.Name:
				b.probs.add(n.file, at.line, at.col, n.path, "replaces: %q is this rule's own name", name)
			case named[name] == nil:
				// envoyproxy/ratelimit loads it: a warning, so that its files load.
				b.probs.warn(n.file, at.line, at.col, n.path, "replaces: no rule named %q in domain %s: it replaces nothing", name, quoteIfNeeded(t.domain.Name))
			}
		}
	}
	walk(t.root, func(n *node) {
		for _, k := range n.children {
			b.warnWildcardOrder(k.wild)
			slices.SortStableFunc(k.wild, moreSpecific)
			k.pattern = nil
		}
	})
	if len(t.domain.Files) > 1 {
		for _, f := range t.domain.Files[1:] {
			b.probs.warn(f, 0, 0, quoteIfNeeded(t.domain.Name),
				"domain %s is also defined by %s: ratelimitd merges the files of one domain, envoyproxy/ratelimit refuses them unless MERGE_DOMAIN_CONFIG is true",
				quoteIfNeeded(t.domain.Name), t.domain.Files[0])
		}
	}
}

// groupChoices lists the defined groups for an error message.
func groupChoices(groups map[string]*group) string {
	if len(groups) == 0 {
		return " (it defines no quota_groups)"
	}
	names := make([]string, 0, len(groups))
	for name := range groups {
		names = append(names, name)
	}
	slices.Sort(names)
	return " (defined: " + strings.Join(names, ", ") + ")"
}

// walk visits n and every node below it, depth first. Map order does not
// matter to its callers.
func walk(n *node, visit func(*node)) {
	visit(n)
	for _, k := range n.children {
		for _, c := range k.exact {
			walk(c, visit)
		}
		for _, c := range k.wild {
			walk(c, visit)
		}
		if k.keyOnly != nil {
			walk(k.keyOnly, visit)
		}
	}
}
