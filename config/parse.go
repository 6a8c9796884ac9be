package config

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ratelimitd/ratelimitd/limiter"
	"gopkg.in/yaml.v3"
)

// Limits that protect the loader from hostile files. Each is derived from
// what the control planes that feed ratelimitd can generate, with room
// (docs/security.md#bounds-and-where-they-come-from has the table), so
// that no config they accept is refused here: Envoy Gateway (EG) v1.9.1's
// translator (internal/xds/translator/ratelimit.go, and the names of
// internal/gatewayapi/helpers.go), the Gateway API's and Kubernetes' name
// limits (253 bytes for most names, 63 for namespaces), and Istio and
// hand-written envoyproxy/ratelimit files, whose keys and domains are
// chosen by people. The size limits on domains, keys, values and depth are
// also the server's default bounds on a request (--max-domain-bytes,
// --max-key-bytes, --max-value-bytes, --max-entries): a descriptor beyond
// them could never be matched by a request those defaults admit. They do
// not follow the flags: raising one does not let a file use longer keys.
const (
	// MaxFileSize is the largest descriptor file accepted, in bytes: the
	// default cap on a whole config (DefaultMaxTotalBytes), since one file
	// may be all of it. EG writes every non-shared rule of a listener into
	// one domain, one xDS resource, one file: 8 HTTPRoutes × 16 hostnames ×
	// 127 matches under one policy are 16,256 descriptors, 5.3 MB of YAML
	// with short names, 13.3 MB with 253-byte route names.
	MaxFileSize = DefaultMaxTotalBytes
	// MaxDepth is the deepest nesting of descriptors accepted: a domain's
	// top-level descriptors are at depth 1, and a request descriptor of n
	// entries reaches depth n. EG chains one level per match of a rule
	// under the route's level: 1 + 8 clientSelectors × 128 header matches
	// + 1 method + 1 path + 2 sourceCIDR (masked and distinct) + 8 × 16
	// query parameters = 1,157 levels at most; 2,048 leaves room. Paths
	// grow with the square of the depth; MaxPathBytes bounds them.
	MaxDepth = 2048
	// MaxDomainBytes is the longest domain accepted, in bytes. EG's domain
	// is a listener's name, "<gateway ns>/<gateway>/<listener>" (63 + 1 +
	// 253 + 1 + 253 = 571 bytes), or for a ListenerSet's listener
	// "<ns>/<gateway>/<set ns>/<set>/<listener>" (889 bytes), or for a
	// shared rule its policy, "<ns>/<policy>" (317 bytes); 2,048 leaves
	// room.
	MaxDomainBytes = 2048
	// MaxKeyBytes is the longest descriptor key accepted, in bytes. EG's
	// longest key is a route's, "httproute/<ns>/<route>/rule/<0-15>/match/
	// <0-63>/<hostname with _ for .>" (10 + 63 + 1 + 253 + 6 + 2 + 7 + 2 +
	// 1 + 253 = 598 bytes); a shared rule's is "<ns>/<policy>/rule/<0-255>"
	// (326 bytes); 1,024 leaves room.
	MaxKeyBytes = 1024
	// MaxValueBytes is the longest descriptor value accepted, in bytes. A
	// key-only or wildcard descriptor still matches longer request values.
	// EG's longest value is a route key (598 bytes, above); header and path
	// values are matched by Envoy, not written into the config.
	MaxValueBytes = 4096
	// MaxPathBytes bounds the memory that one file's descriptor paths take:
	// every descriptor keeps its path ("domain > key=value > key", the
	// Rule.Path of a rule), so long keys and values above many nested
	// descriptors would otherwise multiply a small file into a large heap.
	// It is the sum of the lengths of the paths, in bytes. EG's widest
	// domain above (16,256 descriptors under 253-byte names) has 21 MB of
	// paths, and one rule nested MaxDepth's 1,157 levels deep 24 MB; 64
	// MiB admits either with room, and bounds a hostile file's paths.
	MaxPathBytes = 64 << 20
)

// The fields of replaces items; the other lists are in limits.go.
var replacesFields = []string{"name"}

// fileTree is one file, parsed and checked on its own.
type fileTree struct {
	name   string
	domain string // "" when the file has none (an error was reported)
	descs  []*desc
	groups map[string]*group
}

// desc is one descriptor of a file, with its positions.
type desc struct {
	key, value string
	path       string
	line, col  int // of the descriptor's "key:" (or of the mapping when key is missing)
	rule       *Rule
	// Positions for the checks that span a domain.
	nameLine, nameCol int
	nameField         string // "rate_limit.name" or "rate_limits[0].name"
	replacesPos       []pos  // one per rule.Replaces
	children          []*desc
	// group names the quota group of a quota_group rule, resolved per
	// domain; groupAt is where it is named.
	group   string
	groupAt pos
	// valueToMetric and shareThreshold are the level's flags (see level).
	valueToMetric, shareThreshold bool
}

type pos struct{ line, col int }

// parser reads one file.
type parser struct {
	file   string
	domain string
	probs  *problems
	// pathBytes sums the lengths of the descriptor paths made so far;
	// pathsFull is set once they would exceed MaxPathBytes, which stops
	// the reading of descriptors.
	pathBytes int
	pathsFull bool
}

// warnf records something the file means differently under
// envoyproxy/ratelimit, or that it accepts only for compatibility.
func (p *parser) warnf(n *yaml.Node, path, format string, args ...any) {
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	p.probs.warn(p.file, line, col, path, format, args...)
}

func (p *parser) errorf(n *yaml.Node, path, format string, args ...any) {
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	p.probs.add(p.file, line, col, path, format, args...)
}

// parseFile checks one file and returns its tree; problems go to probs.
func parseFile(f File, probs *problems) *fileTree {
	p := &parser{file: f.Name, probs: probs}
	ft := &fileTree{name: f.Name}
	if len(f.Data) > MaxFileSize {
		// Load reads one byte past the limit, so len(f.Data) is no size.
		p.errorf(nil, "", "file is more than %s (%d bytes), the largest size accepted", mib(MaxFileSize), MaxFileSize)
		return ft
	}
	dec := yaml.NewDecoder(bytes.NewReader(f.Data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errorf(nil, "", "file is empty or holds only comments: want a mapping with domain and descriptors")
		} else {
			p.yamlError(err)
		}
		return ft
	}
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		p.errorf(&next, "", "file holds more than one YAML document: want one domain per file")
	} else if !errors.Is(err, io.EOF) {
		p.yamlError(err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			p.errorf(nil, "", "file is empty or holds only comments: want a mapping with domain and descriptors")
			return ft
		}
		root = root.Content[0]
	}
	if !p.plain(root, "") {
		return ft
	}
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		p.errorf(root, "", "file is empty or holds only comments: want a mapping with domain and descriptors")
		return ft
	}
	fields := p.fields(root, "", "", topFields)
	if fields == nil {
		return ft
	}
	path := "(no domain)"
	if d, ok := fields["domain"]; ok {
		if s, ok := p.str(d.val, "", "domain"); ok && s != "" && len(s) <= MaxDomainBytes {
			ft.domain = s
			path = quoteIfNeeded(s)
		} else if ok && s != "" {
			p.errorf(d.val, "", "domain: too long: %d bytes, at most %d", len(s), MaxDomainBytes)
			path = "(domain too long)"
		} else if ok {
			p.errorf(d.val, "", "domain: must not be empty")
		}
	} else {
		p.errorf(root, "", "domain: missing (every file names its domain)")
	}
	p.domain = ft.domain
	if g, ok := fields["quota_groups"]; ok {
		ft.groups = p.quotaGroups(g.val, path)
	}
	if d, ok := fields["descriptors"]; ok {
		ft.descs = p.descriptors(d.val, path, "descriptors", 1)
	}
	return ft
}

// yamlError reports a syntax error from yaml.v3, whose messages look like
// "yaml: line 3: did not find expected key".
func (p *parser) yamlError(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok {
			if l, err := strconv.Atoi(n); err == nil {
				line, msg = l, after
			}
		}
	}
	p.probs.add(p.file, line, 0, "", "invalid YAML: %s", msg)
}

// descriptors reads a list of descriptors at the given depth.
func (p *parser) descriptors(n *yaml.Node, parent, name string, depth int) []*desc {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, parent, "%s: want a list of descriptors, got %s", name, kind(n))
		return nil
	}
	if depth > MaxDepth {
		p.errorf(n, parent, "%s: nested deeper than %d levels", name, MaxDepth)
		return nil
	}
	type level struct{ key, value string }
	seen := make(map[level]*desc, len(n.Content))
	var out []*desc
	for _, item := range n.Content {
		if p.pathsFull {
			break
		}
		if !p.plain(item, parent) {
			continue
		}
		d := p.descriptor(item, parent, depth)
		if d == nil {
			continue
		}
		l := level{d.key, d.value}
		if first, dup := seen[l]; dup {
			p.probs.add(p.file, d.line, d.col, d.path, "duplicate descriptor: same key and value as line %d", first.line)
			continue
		}
		seen[l] = d
		out = append(out, d)
	}
	return out
}

// descriptor reads one descriptor. It returns nil when the descriptor cannot
// take part in the tree (no usable key); its other problems are reported and
// it is returned.
func (p *parser) descriptor(n *yaml.Node, parent string, depth int) *desc {
	d := &desc{line: n.Line, col: n.Column}
	// Name the descriptor in every message, even about the fields before key.
	key, hasKey := peek(n, "key")
	value, _ := peek(n, "value")
	part := "(no key)"
	if hasKey && key != "" {
		part = pathPart(abbrev(key, MaxKeyBytes), abbrev(value, MaxValueBytes))
	}
	var fits bool
	if d.path, fits = p.newPath(n, parent, part); !fits {
		return nil
	}
	fields := p.fields(n, d.path, "", descriptorFields)
	if fields == nil {
		return nil
	}
	ok := true
	if f, has := fields["key"]; has {
		d.line, d.col = f.key.Line, f.key.Column
		if s, good := p.str(f.val, d.path, "key"); !good {
			ok = false
		} else if s == "" {
			p.errorf(f.val, d.path, "key: must not be empty")
			ok = false
		} else if len(s) > MaxKeyBytes {
			p.errorf(f.val, d.path, "key: too long: %d bytes, at most %d", len(s), MaxKeyBytes)
			ok = false
		} else {
			d.key = s
		}
	} else {
		p.errorf(n, d.path, "key: missing (every descriptor has a key)")
		ok = false
	}
	if f, has := fields["value"]; has {
		if s, good := p.str(f.val, d.path, "value"); good && len(s) > MaxValueBytes {
			p.errorf(f.val, d.path, "value: too long: %d bytes, at most %d", len(s), MaxValueBytes)
			ok = false
		} else if good {
			d.value = s
		}
	}

	var shadow, detailed, quota bool
	if f, has := fields["shadow_mode"]; has {
		shadow, _ = p.boolean(f.val, d.path, "shadow_mode")
	}
	if f, has := fields["quota_mode"]; has {
		quota, _ = p.boolean(f.val, d.path, "quota_mode")
	}
	if f, has := fields["detailed_metric"]; has {
		detailed, _ = p.boolean(f.val, d.path, "detailed_metric")
	}
	if f, has := fields["value_to_metric"]; has {
		d.valueToMetric, _ = p.boolean(f.val, d.path, "value_to_metric")
	}
	if f, has := fields["share_threshold"]; has {
		d.shareThreshold, _ = p.boolean(f.val, d.path, "share_threshold")
		if d.shareThreshold && !strings.Contains(d.value, "*") {
			// As envoyproxy/ratelimit refuses it: there is nothing to share.
			p.errorf(f.key, d.path, "share_threshold: only a wildcard value (one with '*') can share its bucket among the values it matches")
		}
	}
	var metadata map[string]any
	if f, has := fields["metadata"]; has {
		metadata = p.metadata(f.val, d.path)
	}
	rl, hasRule := fields["rate_limit"]
	rls, hasList := fields["rate_limits"]
	qg, hasGroup := fields["quota_group"]
	switch {
	case hasRule && hasList:
		p.errorf(rls.key, d.path, "rate_limits: not allowed beside rate_limit (put every limit in rate_limits)")
	case (hasRule || hasList) && hasGroup:
		p.errorf(qg.key, d.path, "quota_group: not allowed beside rate_limit or rate_limits (the group is the limit)")
	case hasRule:
		d.rule = p.rateLimit(rl, d)
	case hasList:
		if limits := p.rateLimits(rls, d); limits != nil {
			d.rule = newRule(p, d, KindLimited, limits)
		}
	case hasGroup:
		if name, good := p.str(qg.val, d.path, "quota_group"); good && name != "" {
			// The limit comes from the domain's quota_groups, resolved once
			// every file of the domain is read.
			d.rule = newRule(p, d, KindLimited, nil)
			d.group, d.groupAt = name, pos{qg.val.Line, qg.val.Column}
		} else if good {
			p.errorf(qg.val, d.path, "quota_group: must not be empty")
		}
	}
	p.descConcurrency(fields, d)
	hasRule = hasRule || hasList || hasGroup
	if f, has := fields["replaces"]; has {
		switch {
		case !hasRule:
			p.errorf(f.key, d.path, "replaces: only a descriptor with a rate_limit can replace another rule")
		case d.rule != nil && d.replacesPos != nil:
			p.errorf(f.key, d.path, "replaces: given both here and in rate_limit; keep one")
		case d.rule != nil:
			d.rule.Replaces, d.replacesPos = p.replaces(f.val, d.path, "replaces")
		}
	}
	if d.rule != nil {
		d.rule.ShadowMode = shadow
		d.rule.DetailedMetric = detailed
		d.rule.QuotaMode = quota
		d.rule.Metadata = metadata
	}
	if f, has := fields["descriptors"]; has {
		d.children = p.descriptors(f.val, d.path, "descriptors", depth+1)
	}
	if !ok {
		return nil
	}
	return d
}

// newPath returns the path of a descriptor n below parent, counting its
// length against MaxPathBytes. Once the file's paths would exceed it, it
// reports that (once) and returns false, and the file's descriptors are
// read no further.
func (p *parser) newPath(n *yaml.Node, parent, part string) (string, bool) {
	if p.pathsFull {
		return "", false
	}
	size := len(parent) + len(" > ") + len(part)
	if size > MaxPathBytes-p.pathBytes {
		p.pathsFull = true
		p.errorf(n, parent, "descriptors: the paths of this file's descriptors (\"domain > key=value > key\", kept for every descriptor) add up to more than %s: use shorter keys and values on descriptors that have many nested descriptors", mib(MaxPathBytes))
		return "", false
	}
	p.pathBytes += size
	return joinPath(parent, part), true
}

// abbrev shortens a key or value longer than most for a descriptor path:
// its problem is reported, and the path need not repeat it in full.
func abbrev(s string, most int) string {
	if len(s) <= most {
		return s
	}
	cut := 32
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// rateLimit reads a descriptor's rate_limit block into a Rule. It returns nil
// when the block has problems (all reported).
func (p *parser) rateLimit(f field, d *desc) *Rule {
	const pre = "rate_limit"
	if f.val.Kind == yaml.ScalarNode && f.val.ShortTag() == "!!null" {
		p.errorf(f.val, d.path, "%s: empty: give unit and requests_per_unit, or unlimited: true", pre)
		return nil
	}
	fields := p.fields(f.val, d.path, pre, rateLimitFields)
	if fields == nil {
		return nil
	}
	ok := true
	var replaces []string
	if g, has := fields["replaces"]; has {
		replaces, d.replacesPos = p.replaces(g.val, d.path, dot(pre, "replaces"))
		if d.replacesPos == nil {
			d.replacesPos = []pos{} // present, for the check against a descriptor-level replaces
		}
	}
	var unlimited bool
	if g, has := fields["unlimited"]; has {
		var good bool
		if unlimited, good = p.boolean(g.val, d.path, dot(pre, "unlimited")); !good {
			ok = false
		}
	}
	if unlimited {
		if g, has := fields["requests_per_unit"]; has {
			// envoyproxy/ratelimit accepts it and ignores it.
			p.warnf(g.key, d.path, "%s: ignored with unlimited: true (envoyproxy/ratelimit ignores it too)", dot(pre, "requests_per_unit"))
		}
		for _, name := range limitFields {
			if g, has := fields[name]; has && name != "name" && name != "requests_per_unit" {
				p.errorf(g.key, d.path, "%s: not allowed with unlimited: true (an unlimited rule has no bucket)", dot(pre, name))
				ok = false
			}
		}
		if !ok {
			return nil
		}
		r := newRule(p, d, KindUnlimited, nil)
		r.Replaces = replaces
		if g, has := fields["name"]; has {
			s, good := p.str(g.val, d.path, dot(pre, "name"))
			if good && s == "" {
				p.errorf(g.val, d.path, "%s: must not be empty (leave it out instead)", dot(pre, "name"))
				return nil
			} else if !good {
				return nil
			}
			r.Name = s
			d.nameLine, d.nameCol, d.nameField = g.val.Line, g.val.Column, dot(pre, "name")
		}
		return r
	}
	rl, denyAll, good := p.limit(fields, f.key, d.path, pre, true)
	if !good || !ok {
		return nil
	}
	if g, has := fields["name"]; has {
		d.nameLine, d.nameCol, d.nameField = g.val.Line, g.val.Column, dot(pre, "name")
	}
	kind := KindLimited
	if denyAll {
		kind = KindDenyAll
	}
	r := newRule(p, d, kind, []RateLimit{rl})
	r.Replaces = replaces
	return r
}

// newRule returns the rule of descriptor d of the given kind, with the
// given limits (a quota group's are set once the domain is read).
func newRule(p *parser, d *desc, kind Kind, limits []RateLimit) *Rule {
	r := &Rule{Domain: p.domain, Path: d.path, Kind: kind, File: p.file, Line: d.line}
	r.setLimits(limits)
	return r
}

// setLimits sets the rule's limits; an unnamed rule takes the name of its
// first limit, unless that is a quota group's.
func (r *Rule) setLimits(limits []RateLimit) {
	for i := range limits {
		limits[i].id = limits[i].identity()
	}
	r.Limits = limits
	if len(limits) > 0 && r.Name == "" && limits[0].Group == "" {
		r.Name = limits[0].Name
	}
}

// requestsPerUnit reads requests_per_unit: a count from 1 to
// limiter.MaxTokens, or, where zeroDenies, 0, which (as in
// envoyproxy/ratelimit) denies every request.
func (p *parser) requestsPerUnit(n *yaml.Node, path, name string, zeroDenies bool) (int64, bool) {
	var v int64
	if zeroDenies && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int" && n.Decode(&v) == nil && v == 0 {
		return 0, true
	}
	return p.positive(n, path, name, limiter.MaxTokens)
}

// replaces reads a list of {name: …} entries.
func (p *parser) replaces(n *yaml.Node, path, name string) ([]string, []pos) {
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, path, "%s: want a list of {name: …}, got %s", name, kind(n))
		return nil, nil
	}
	var names []string
	var at []pos
	for _, item := range n.Content {
		if !p.plain(item, path) {
			continue
		}
		fields := p.fields(item, path, name, replacesFields)
		if fields == nil {
			continue
		}
		f, has := fields["name"]
		if !has {
			p.errorf(item, path, "%s: entry without a name", name)
			continue
		}
		s, good := p.str(f.val, path, name+".name")
		if !good {
			continue
		}
		if s == "" {
			p.errorf(f.val, path, "%s.name: must not be empty", name)
			continue
		}
		names = append(names, s)
		at = append(at, pos{f.val.Line, f.val.Column})
	}
	return names, at
}
