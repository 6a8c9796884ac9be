package xdsconfig

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/config"
)

// FileName is the name a resource's descriptor file has in config errors:
// "xds:" and the resource's domain (its name when the domain is empty), so
// that a NACK reads "xds:api:7:5: api > key=value: rate_limit.unit: …".
func FileName(rc *rlsconfv3.RateLimitConfig) string {
	if rc.GetDomain() != "" {
		return "xds:" + rc.GetDomain()
	}
	return "xds:(resource " + strconv.Quote(rc.GetName()) + ")"
}

// File converts one RateLimitConfig resource to the descriptor file that
// config.Parse reads, field for field as envoyproxy/ratelimit maps the
// proto onto its YAML (src/config/config_xds.go@f2fb157):
//
//   - domain, and per descriptor key, value (left out when empty: a
//     key-only descriptor), rate_limit, nested descriptors, shadow_mode and
//     detailed_metric (left out when false);
//   - quota_mode when true and metadata when set (a Struct becomes a YAML
//     mapping of its JSON values);
//   - rate_limit: unit as its lower-case name ("week"; UNKNOWN becomes
//     "unknown", which the parser refuses with the list of valid units),
//     requests_per_unit (0 is a rule that denies every request), unlimited,
//     name, replaces. For an unlimited policy, a unit of UNKNOWN and a
//     requests_per_unit of 0 are the proto's zero values and are left out;
//     any other unit or count is written, so that the parser reports the
//     contradiction as the incumbent does.
//
// The text is produced by yaml.v3 from a node tree, so keys and values
// holding any bytes are quoted correctly. Down to BlockDepth levels of
// descriptors every field is on its own line; deeper levels are written
// in flow style, {key: …, value: …, descriptors: [{…}]}, one line for
// each descriptor at BlockDepth and all below it: block style indents each
// level further, which makes the text of a chain of n levels grow as n²
// (Envoy Gateway nests one level per header match, up to 1,157; see
// config.MaxDepth), and flow style keeps it in proportion to the
// resource. Either way the line and column of a config error point at
// the field.
// Resources with the same domain become separate files of that domain
// (config.Parse merges them; conflicting descriptors are errors), so
// name several files of one domain apart with index (see Files).
func File(rc *rlsconfv3.RateLimitConfig) (config.File, error) {
	root := mapping()
	add(root, "domain", str(rc.GetDomain()))
	if ds := rc.GetDescriptors(); len(ds) > 0 {
		seq, err := descriptors(ds, 1)
		if err != nil {
			return config.File{}, err
		}
		add(root, "descriptors", seq)
	}
	data, err := yaml.Marshal(root)
	if err != nil {
		return config.File{}, fmt.Errorf("%s: render as YAML: %w", FileName(rc), err)
	}
	return config.File{Name: FileName(rc), Data: data}, nil
}

// Files converts the resources of one push, in order. Resources that share
// a file name (the same domain) get a suffix "#2", "#3", … after the
// first (skipping names another resource already has), so that
// config.Parse sees them as separate files of one domain.
func Files(rcs []*rlsconfv3.RateLimitConfig) ([]config.File, error) {
	names := fileNames(rcs)
	files := make([]config.File, 0, len(rcs))
	for i, rc := range rcs {
		f, err := File(rc)
		if err != nil {
			return nil, err
		}
		f.Name = names[i]
		files = append(files, f)
	}
	return files, nil
}

// fileNames are the names Files gives the files of rcs.
func fileNames(rcs []*rlsconfv3.RateLimitConfig) []string {
	names := make([]string, 0, len(rcs))
	reserved := make(map[string]bool, len(rcs)) // every resource's own name
	for _, rc := range rcs {
		reserved[FileName(rc)] = true
	}
	taken := make(map[string]bool, len(rcs))
	for _, rc := range rcs {
		base := FileName(rc)
		name := base
		for n := 2; taken[name]; n++ {
			if name = base + "#" + strconv.Itoa(n); reserved[name] {
				name = base // taken by that resource: try the next n
			}
		}
		taken[name] = true
		names = append(names, name)
	}
	return names
}

// BlockDepth is the deepest level of descriptors that File writes in
// block style, one field a line; the levels below are in flow style.
const BlockDepth = 8

// descriptors writes ds, the descriptors at depth (1 for a domain's own).
func descriptors(ds []*rlsconfv3.RateLimitDescriptor, depth int) (*yaml.Node, error) {
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	if depth > BlockDepth {
		seq.Style = yaml.FlowStyle // and so is everything inside it
	}
	for _, d := range ds {
		m := mapping()
		add(m, "key", str(d.GetKey()))
		if d.GetValue() != "" {
			add(m, "value", str(d.GetValue()))
		}
		if p := d.GetRateLimit(); p != nil {
			add(m, "rate_limit", policy(p))
		}
		if d.GetShadowMode() {
			add(m, "shadow_mode", boolean(true))
		}
		if d.GetDetailedMetric() {
			add(m, "detailed_metric", boolean(true))
		}
		if d.GetQuotaMode() {
			add(m, "quota_mode", boolean(true))
		}
		if md := d.GetMetadata(); md != nil {
			n, err := structNode(md)
			if err != nil {
				return nil, fmt.Errorf("descriptor %q metadata: %w", d.GetKey(), err)
			}
			add(m, "metadata", n)
		}
		if sub := d.GetDescriptors(); len(sub) > 0 {
			n, err := descriptors(sub, depth+1)
			if err != nil {
				return nil, err
			}
			add(m, "descriptors", n)
		}
		seq.Content = append(seq.Content, m)
	}
	return seq, nil
}

func policy(p *rlsconfv3.RateLimitPolicy) *yaml.Node {
	m := mapping()
	if !p.GetUnlimited() || p.GetUnit() != rlsconfv3.RateLimitUnit_UNKNOWN {
		add(m, "unit", str(strings.ToLower(p.GetUnit().String())))
	}
	if !p.GetUnlimited() || p.GetRequestsPerUnit() != 0 {
		add(m, "requests_per_unit", integer(strconv.FormatUint(uint64(p.GetRequestsPerUnit()), 10)))
	}
	if p.GetUnlimited() {
		add(m, "unlimited", boolean(true))
	}
	if p.GetName() != "" {
		add(m, "name", str(p.GetName()))
	}
	if rs := p.GetReplaces(); len(rs) > 0 {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, r := range rs {
			item := mapping()
			add(item, "name", str(r.GetName()))
			seq.Content = append(seq.Content, item)
		}
		add(m, "replaces", seq)
	}
	return m
}

// maxStructDepth bounds the nesting of metadata values, so that a hostile
// Struct cannot exhaust the stack (protobuf itself allows 100 levels).
const maxStructDepth = 64

// structNode writes a Struct as a YAML mapping with its keys sorted.
func structNode(s *structpb.Struct) (*yaml.Node, error) {
	return valueNode(structpb.NewStructValue(s), 0)
}

func valueNode(v *structpb.Value, depth int) (*yaml.Node, error) {
	if depth > maxStructDepth {
		return nil, fmt.Errorf("nested more than %d levels deep", maxStructDepth)
	}
	switch k := v.GetKind().(type) {
	case nil, *structpb.Value_NullValue:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
	case *structpb.Value_BoolValue:
		return boolean(k.BoolValue), nil
	case *structpb.Value_NumberValue:
		f := k.NumberValue
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("number %v is not a JSON value", f)
		}
		if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return integer(strconv.FormatInt(int64(f), 10)), nil
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(f, 'g', -1, 64)}, nil
	case *structpb.Value_StringValue:
		return str(k.StringValue), nil
	case *structpb.Value_ListValue:
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, item := range k.ListValue.GetValues() {
			n, err := valueNode(item, depth+1)
			if err != nil {
				return nil, err
			}
			seq.Content = append(seq.Content, n)
		}
		return seq, nil
	case *structpb.Value_StructValue:
		m := mapping()
		fields := k.StructValue.GetFields()
		keys := make([]string, 0, len(fields))
		for key := range fields {
			keys = append(keys, key)
		}
		slices.Sort(keys)
		for _, key := range keys {
			n, err := valueNode(fields[key], depth+1)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", key, err)
			}
			add(m, key, n)
		}
		return m, nil
	}
	return nil, fmt.Errorf("unknown kind of value %T", v.GetKind())
}

func mapping() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"} }

func add(m *yaml.Node, key string, val *yaml.Node) {
	m.Content = append(m.Content, str(key), val)
}

// str is a string scalar, double-quoted: config reads metadata as
// envoyproxy/ratelimit's YAML 1.1 parser does, where a plain yes, on or
// off is a boolean, so no string may be left plain.
func str(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Style: yaml.DoubleQuotedStyle}
}

func boolean(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

func integer(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: s}
}
