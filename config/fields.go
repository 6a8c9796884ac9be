package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// plain reports whether n is free of YAML anchors and aliases, which the
// format does not use: refusing them keeps an alias bomb from multiplying a
// small file into a huge tree.
func (p *parser) plain(n *yaml.Node, path string) bool {
	switch {
	case n.Kind == yaml.AliasNode:
		p.errorf(n, path, "YAML aliases (*%s) are not supported: write the value out", n.Value)
		return false
	case n.Anchor != "":
		p.errorf(n, path, "YAML anchors (&%s) are not supported: write the value out", n.Anchor)
		return false
	}
	return true
}

type field struct{ key, val *yaml.Node }

// peek returns the text of the first scalar field name of mapping n, if any,
// without checking anything: it names a descriptor before its fields are read.
func peek(n *yaml.Node, name string) (string, bool) {
	if n.Kind != yaml.MappingNode {
		return "", false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == name && v.Kind == yaml.ScalarNode {
			if v.ShortTag() == "!!null" {
				return "", true
			}
			return v.Value, true
		}
	}
	return "", false
}

// fields checks that n is a mapping of known, unrepeated fields, and returns
// them by name. It returns nil, having reported why, when n is no mapping.
func (p *parser) fields(n *yaml.Node, path, prefix string, valid []string) map[string]field {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "%swant a mapping (%s), got %s", colon(prefix), strings.Join(valid, ", "), kind(n))
		return nil
	}
	m := make(map[string]field, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !p.plain(k, path) {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, path, "%sfield names must be strings, got %s", colon(prefix), kind(k))
			continue
		}
		name := k.Value
		switch {
		case name == "<<":
			p.errorf(k, path, "%sYAML merge keys (<<) are not supported: write the fields out", colon(prefix))
			continue
		case !slices.Contains(valid, name):
			p.errorf(k, path, "%sunknown field %q (%svalid: %s)", colon(prefix), name, didYouMean(name, valid), strings.Join(valid, ", "))
			continue
		}
		if prev, dup := m[name]; dup {
			p.errorf(k, path, "%s%s: repeated (first at line %d)", colon(prefix), name, prev.key.Line)
			continue
		}
		if !p.plain(v, path) {
			continue
		}
		m[name] = field{k, v}
	}
	return m
}

func colon(prefix string) string {
	if prefix == "" {
		return ""
	}
	return prefix + ": "
}

func dot(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// kind names the shape of a node for error messages.
func kind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing (null)"
		case "!!int", "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		return strconv.Quote(n.Value)
	}
	return "nothing"
}

// str reads a scalar as text, as envoyproxy/ratelimit does (value: 123 is
// the string "123"). A null reads as "".
func (p *parser) str(n *yaml.Node, path, name string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, path, "%s: want a string, got %s", name, kind(n))
		return "", false
	}
	if n.ShortTag() == "!!null" {
		return "", true
	}
	return n.Value, true
}

// boolean reads true or false, and, as envoyproxy/ratelimit's YAML 1.1
// parser does, the unquoted words yes, no, on, off, y and n.
func (p *parser) boolean(n *yaml.Node, path, name string) (bool, bool) {
	if n.Kind == yaml.ScalarNode {
		var b bool
		if n.ShortTag() == "!!bool" && n.Decode(&b) == nil {
			return b, true
		}
		if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
			switch n.Value {
			case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON":
				return true, true
			case "n", "N", "no", "No", "NO", "off", "Off", "OFF":
				return false, true
			}
		}
	}
	p.errorf(n, path, "%s: want true or false, got %s", name, kind(n))
	return false, false
}

// requiredPositive reads field name of fields, a whole number from 1 to
// most, as positive does; a missing one is an error at at (the node that
// should have held it). pre is the path of the fields, as dot takes it.
func (p *parser) requiredPositive(fields map[string]field, name string, at *yaml.Node, path, pre string, most int64) (int64, bool) {
	g, has := fields[name]
	if !has {
		p.errorf(at, path, "%s: missing", dot(pre, name))
		return 0, false
	}
	return p.positive(g.val, path, dot(pre, name), most)
}

// positive reads a whole number from 1 to most.
func (p *parser) positive(n *yaml.Node, path, name string, most int64) (int64, bool) {
	var v int64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		switch {
		case !wholeNumber(n):
			p.errorf(n, path, "%s: want a whole number, got %s", name, kind(n))
		case strings.HasPrefix(n.Value, "-"):
			p.errorf(n, path, "%s: must be at least 1, got %s", name, n.Value)
		default:
			p.errorf(n, path, "%s: %s is too large (at most %d)", name, n.Value, most)
		}
		return 0, false
	}
	switch {
	case v < 1:
		p.errorf(n, path, "%s: must be at least 1, got %d", name, v)
		return 0, false
	case v > most:
		p.errorf(n, path, "%s: %d is too large (at most %d)", name, v, most)
		return 0, false
	}
	return v, true
}

// wholeNumber reports whether n is an integer as written, even one too large
// for an int64 (which YAML resolves to !!float when it does not fit a
// uint64 either).
func wholeNumber(n *yaml.Node) bool {
	if n.Kind != yaml.ScalarNode {
		return false
	}
	switch n.ShortTag() {
	case "!!int":
		return true
	case "!!float":
		digits := strings.TrimLeft(n.Value, "+-")
		return digits != "" && strings.Trim(digits, "0123456789") == ""
	}
	return false
}

// didYouMean suggests the valid name closest to a misspelt one, if any is
// close: "did you mean \"unit\"? ".
func didYouMean(name string, valid []string) string {
	best, bestDist := "", 3
	for _, v := range valid {
		if d := editDistance(name, v); d < bestDist {
			best, bestDist = v, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("did you mean %q? ", best)
}

// editDistance is the Levenshtein distance between short ASCII names.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

const unitChoices = "second, minute, hour, day, week, month or year"

// parseUnit reads a unit name in any ASCII case ("minute", "MINUTE"), as
// envoyproxy/ratelimit does. It returns 0 for an unknown name.
func parseUnit(s string) Unit {
	for u := Second; u <= Year; u++ {
		if asciiEqualFold(s, u.String()) {
			return u
		}
	}
	return 0
}

func asciiEqualFold(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}
