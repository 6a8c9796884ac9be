package config

import (
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxMetadataDepth bounds the nesting of a descriptor's metadata (protobuf's own
// limit; xdsconfig writes at most 65 levels), so that
// converting it (here, and to a protobuf Struct in the server) never
// recurses deeper than this.
const maxMetadataDepth = 100

// metadata reads a descriptor's metadata: any YAML mapping, held as
// google.protobuf.Struct would hold it (see Rule.Metadata). As in
// envoyproxy/ratelimit, whose YAML 1.1 parser reads them so, unquoted yes,
// no, on and off are booleans and scalar keys of any type are their text.
// A null or empty mapping gives nil.
func (p *parser) metadata(n *yaml.Node, path string) map[string]any {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "metadata: want a mapping, got %s", kind(n))
		return nil
	}
	v, ok := p.metaValue(n, path, "metadata", 1)
	if !ok {
		return nil
	}
	m := v.(map[string]any)
	if len(m) == 0 {
		return nil
	}
	return m
}

// metaValue converts one metadata node; name locates it for errors
// ("metadata.a.b[2]").
func (p *parser) metaValue(n *yaml.Node, path, name string, depth int) (any, bool) {
	if depth > maxMetadataDepth {
		p.errorf(n, path, "%s: nested deeper than %d levels", name, maxMetadataDepth)
		return nil, false
	}
	if !p.plain(n, path) {
		return nil, false
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		ok := true
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if !p.plain(k, path) {
				ok = false
				continue
			}
			if k.Kind != yaml.ScalarNode {
				p.errorf(k, path, "%s: keys must be scalars, got %s", name, kind(k))
				ok = false
				continue
			}
			if k.Value == "<<" && k.Style == 0 {
				p.errorf(k, path, "%s: YAML merge keys (<<) are not supported: write the fields out", name)
				ok = false
				continue
			}
			key := k.Value
			if k.ShortTag() == "!!null" {
				key = "<nil>" // envoyproxy/ratelimit prints a null key so
			}
			if _, dup := m[key]; dup {
				p.errorf(k, path, "%s: %s: repeated", name, strconv.Quote(key))
				ok = false
				continue
			}
			val, good := p.metaValue(v, path, name+"."+key, depth+1)
			ok = ok && good
			m[key] = val
		}
		return m, ok
	case yaml.SequenceNode:
		list := make([]any, len(n.Content))
		ok := true
		for i, c := range n.Content {
			val, good := p.metaValue(c, path, name+"["+strconv.Itoa(i)+"]", depth+1)
			ok = ok && good
			list[i] = val
		}
		return list, ok
	case yaml.ScalarNode:
		return p.metaScalar(n, path, name)
	}
	p.errorf(n, path, "%s: unsupported YAML node %s", name, kind(n))
	return nil, false
}

// metaScalar converts a scalar: null, a boolean, a number (a Struct holds
// every number as a float64) or a string.
func (p *parser) metaScalar(n *yaml.Node, path, name string) (any, bool) {
	quoted := n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0
	switch n.ShortTag() {
	case "!!null":
		return nil, true
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return b, true
		}
	case "!!int", "!!float":
		var f float64
		if err := n.Decode(&f); err != nil {
			// An integer too large for an int64: its value as a float.
			var perr error
			if f, perr = strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64); perr != nil {
				p.errorf(n, path, "%s: %s is no number a Struct can hold", name, n.Value)
				return nil, false
			}
		}
		if math.IsInf(f, 0) || math.IsNaN(f) {
			p.errorf(n, path, "%s: %s: a Struct holds only finite numbers (quote it for a string)", name, n.Value)
			return nil, false
		}
		return f, true
	}
	if !quoted {
		switch n.Value {
		case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON":
			return true, true
		case "n", "N", "no", "No", "NO", "off", "Off", "OFF":
			return false, true
		}
	}
	return n.Value, true
}

// cloneMetadata deep-copies a metadata value.
func cloneMetadata(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = cloneMetadata(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = cloneMetadata(e)
		}
		return l
	}
	return v
}

// MergeMetadata merges src into dst as envoyproxy/ratelimit merges the
// metadata of the descriptors that passed: a key dst lacks is added (a
// deep copy of src's value); where both hold a mapping under one key, the
// two are merged the same way, recursively; otherwise dst keeps its value
// (the first descriptor wins). It returns dst, or a new map when dst is nil
// and src has keys. src is not modified nor shared with the result.
func MergeMetadata(dst, src map[string]any) map[string]any {
	for k, v := range src {
		cur, has := dst[k]
		if !has {
			if dst == nil {
				dst = make(map[string]any, len(src))
			}
			dst[k] = cloneMetadata(v)
			continue
		}
		cm, ok1 := cur.(map[string]any)
		sm, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			dst[k] = MergeMetadata(cm, sm)
		}
	}
	return dst
}
