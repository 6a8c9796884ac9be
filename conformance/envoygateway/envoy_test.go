package envoygateway

import (
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// This file stands in for Envoy's HTTP ratelimit filter: given the route
// Envoy Gateway sent Envoy and one request, it builds the
// ShouldRateLimit calls Envoy would make. Each action follows its
// documented meaning in Envoy's API, config/route/v3/route_components.proto
// (RateLimit.Action and its messages, RateLimit.HitsAddend,
// RateLimit.Override), read in go-control-plane's envoy module:
//
//   - a RateLimit gives one descriptor, its actions' entries in order;
//     "if an action cannot append a descriptor entry, no descriptor is
//     generated for the configuration";
//   - entries are only appended for rate limits of the filter's stage (0,
//     which Envoy Gateway never changes), and those with
//     apply_on_stream_done are sent once the stream ends, not before;
//   - the filter sends nothing when no descriptor was generated.

// request is what the filter sees of one HTTP request.
type request struct {
	method string // default GET
	path   string // :path, with the query string; default "/"
	header map[string]string
	remote string // downstream remote address, no port; default 192.0.2.1
	// metadata is the request's dynamic metadata: namespace → fields, as
	// a filter before the ratelimit filter (ext_proc, Lua) would set it.
	metadata map[string]map[string]any
}

func (r request) headerValue(name string) (string, bool) {
	switch strings.ToLower(name) {
	case ":method":
		if r.method == "" {
			return "GET", true
		}
		return r.method, true
	case ":path":
		if r.path == "" {
			return "/", true
		}
		return r.path, true
	}
	for k, v := range r.header {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

func (r request) remoteAddr() netip.Addr {
	if r.remote == "" {
		return netip.MustParseAddr("192.0.2.1")
	}
	return netip.MustParseAddr(r.remote)
}

func (r request) query() url.Values {
	p, _ := r.headerValue(":path")
	if i := strings.IndexByte(p, '?'); i >= 0 {
		q, _ := url.ParseQuery(p[i+1:])
		return q
	}
	return url.Values{}
}

// call is one ShouldRateLimit call of one ratelimit filter.
type call struct {
	filter      string // the HTTP filter's name
	domain      string
	descriptors []*ratelimitv3.RateLimitDescriptor
}

// calls builds, in filter order, the calls Envoy makes for req on route:
// at request time (streamDone false) or at stream end. Envoy Gateway
// puts one ratelimit filter per domain on the listener, ordered by
// domain, and scopes each domain's rate limits to its filter with a
// RateLimitPerRoute in the route's typed_per_filter_config
// (internal/xds/translator/ratelimit.go, buildRateLimitFilter and
// patchRouteWithRateLimit, v1.9.1).
func calls(route *routev3.Route, req request, streamDone bool) ([]call, error) {
	var out []call
	for name, cfg := range route.GetTypedPerFilterConfig() {
		if name != "envoy.filters.http.ratelimit" && !strings.HasPrefix(name, "envoy.filters.http.ratelimit/") {
			continue
		}
		var per rlfilterv3.RateLimitPerRoute
		if err := cfg.UnmarshalTo(&per); err != nil {
			return nil, fmt.Errorf("route %s: filter %s: %v", route.GetName(), name, err)
		}
		c := call{filter: name, domain: per.GetDomain()}
		for i, rl := range per.GetRateLimits() {
			if rl.GetStage().GetValue() != 0 || rl.GetApplyOnStreamDone() != streamDone {
				continue
			}
			d, err := descriptor(route, rl, req)
			if err != nil {
				return nil, fmt.Errorf("route %s: %s: rate_limits[%d]: %v", route.GetName(), name, i, err)
			}
			if d != nil {
				c.descriptors = append(c.descriptors, d)
			}
		}
		if len(c.descriptors) > 0 {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].domain < out[j].domain })
	return out, nil
}

// descriptor is the descriptor rl generates for req, or nil when one of
// its actions cannot append an entry.
func descriptor(route *routev3.Route, rl *routev3.RateLimit, req request) (*ratelimitv3.RateLimitDescriptor, error) {
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, a := range rl.GetActions() {
		key, value, ok, err := entry(route, a, req)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, nil
		}
		if key == "" { // an action that is skipped (skip_if_absent)
			continue
		}
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: value})
	}
	if len(d.Entries) == 0 {
		return nil, nil
	}
	if h := rl.GetHitsAddend(); h != nil {
		n, ok, err := hitsAddend(h, req)
		if err != nil || !ok {
			// "treated as an error and the current descriptor will be ignored"
			return nil, err
		}
		d.HitsAddend = wrapperspb.UInt64(n)
	}
	if o := rl.GetLimit(); o != nil {
		l, err := limitOverride(o, req)
		if err != nil {
			return nil, err
		}
		d.Limit = l
	}
	return d, nil
}

// entry is the entry action a appends; ok false when it cannot append
// one (so no descriptor), and an empty key when it appends nothing but
// does not stop the descriptor.
func entry(route *routev3.Route, a *routev3.RateLimit_Action, req request) (key, value string, ok bool, err error) {
	switch s := a.GetActionSpecifier().(type) {
	case *routev3.RateLimit_Action_GenericKey_:
		return or(s.GenericKey.GetDescriptorKey(), "generic_key"), s.GenericKey.GetDescriptorValue(), true, nil
	case *routev3.RateLimit_Action_RequestHeaders_:
		v, has := req.headerValue(s.RequestHeaders.GetHeaderName())
		if !has {
			return "", "", s.RequestHeaders.GetSkipIfAbsent(), nil
		}
		return s.RequestHeaders.GetDescriptorKey(), v, true, nil
	case *routev3.RateLimit_Action_HeaderValueMatch_:
		m := s.HeaderValueMatch
		return valueMatch(req, m.GetHeaders(), headerMatches, m.GetExpectMatch(), or(m.GetDescriptorKey(), "header_match"), m.GetDescriptorValue())
	case *routev3.RateLimit_Action_QueryParameters_:
		q := req.query()
		if !q.Has(s.QueryParameters.GetQueryParameterName()) {
			return "", "", s.QueryParameters.GetSkipIfAbsent(), nil
		}
		return s.QueryParameters.GetDescriptorKey(), q.Get(s.QueryParameters.GetQueryParameterName()), true, nil
	case *routev3.RateLimit_Action_QueryParameterValueMatch_:
		m := s.QueryParameterValueMatch
		return valueMatch(req, m.GetQueryParameters(), queryMatches, m.GetExpectMatch(), or(m.GetDescriptorKey(), "query_match"), m.GetDescriptorValue())
	case *routev3.RateLimit_Action_RemoteAddress_:
		return "remote_address", req.remoteAddr().String(), true, nil
	case *routev3.RateLimit_Action_MaskedRemoteAddress_:
		ip := req.remoteAddr()
		bits := 32
		if m := s.MaskedRemoteAddress.GetV4PrefixMaskLen(); m != nil {
			bits = int(m.GetValue())
		}
		if ip.Is6() {
			bits = 128
			if m := s.MaskedRemoteAddress.GetV6PrefixMaskLen(); m != nil {
				bits = int(m.GetValue())
			}
		}
		p, err := ip.Prefix(bits)
		if err != nil {
			return "", "", false, err
		}
		return "masked_remote_address", p.String(), true, nil
	case *routev3.RateLimit_Action_RemoteAddressMatch_:
		m := s.RemoteAddressMatch
		in := false
		for _, r := range m.GetAddressMatcher().GetRanges() {
			p, err := netip.ParsePrefix(fmt.Sprintf("%s/%d", r.GetAddressPrefix(), r.GetPrefixLen().GetValue()))
			if err != nil {
				return "", "", false, fmt.Errorf("remote_address_match range %v: %v", r, err)
			}
			in = in || p.Contains(req.remoteAddr())
		}
		if in == m.GetAddressMatcher().GetInvertMatch() {
			return "", "", false, nil
		}
		v := strings.ReplaceAll(m.GetDescriptorValue(), "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%", req.remoteAddr().String())
		if strings.Contains(v, "%") {
			return "", "", false, fmt.Errorf("remote_address_match: a format this stand-in does not evaluate: %q", m.GetDescriptorValue())
		}
		if v == "" {
			v = m.GetDefaultValue()
		}
		return or(m.GetDescriptorKey(), "remote_address_match"), v, v != "", nil
	case *routev3.RateLimit_Action_DestinationCluster_:
		return "destination_cluster", route.GetRoute().GetCluster(), true, nil
	case *routev3.RateLimit_Action_Metadata:
		m := s.Metadata
		if m.GetSource() != routev3.RateLimit_Action_MetaData_DYNAMIC {
			return "", "", false, fmt.Errorf("metadata action from %v: only dynamic metadata is modelled", m.GetSource())
		}
		v, has := metadataValue(req, m.GetMetadataKey().GetKey(), m.GetMetadataKey().GetPath())
		if !has {
			if m.GetDefaultValue() == "" {
				return "", "", m.GetSkipIfAbsent(), nil
			}
			v = m.GetDefaultValue()
		}
		return m.GetDescriptorKey(), fmt.Sprint(v), true, nil
	default:
		// source_cluster, extensions, …: Envoy Gateway v1.9.1 generates none
		// of them; fail loudly rather than guess.
		return "", "", false, fmt.Errorf("rate limit action %T is not modelled", s)
	}
}

func expect(v, unset bool) bool { return unset || v }

// valueMatch is the entry of a header or query value match action whose
// matchers are ms: key and value when whether they all match req is what
// the action expects (expect_match, true when unset), no descriptor
// otherwise. Every matcher is tried; the first error is returned.
func valueMatch[M any](req request, ms []M, matches func(M, request) (bool, error), expectMatch *wrapperspb.BoolValue, key, value string) (string, string, bool, error) {
	all := true
	for _, m := range ms {
		ok, err := matches(m, req)
		if err != nil {
			return "", "", false, err
		}
		all = all && ok
	}
	if all != expect(expectMatch.GetValue(), expectMatch == nil) {
		return "", "", false, nil
	}
	return key, value, true, nil
}

// queryMatches is QueryParameterMatcher on req, for the matchers Envoy
// Gateway writes (string_match, present_match; a parameter that is absent
// matches nothing).
func queryMatches(qm *routev3.QueryParameterMatcher, req request) (bool, error) {
	q := req.query()
	switch {
	case !q.Has(qm.GetName()):
		return false, nil
	case qm.GetPresentMatch():
		return true, nil
	}
	return stringMatches(qm.GetStringMatch(), q.Get(qm.GetName()))
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// headerMatches is HeaderMatcher on req, for the matchers Envoy Gateway
// writes (string_match, present_match; a header that is absent matches
// nothing).
func headerMatches(h *routev3.HeaderMatcher, req request) (bool, error) {
	v, has := req.headerValue(h.GetName())
	if !has {
		return false, nil
	}
	var m bool
	switch s := h.GetHeaderMatchSpecifier().(type) {
	case *routev3.HeaderMatcher_StringMatch:
		var err error
		if m, err = stringMatches(s.StringMatch, v); err != nil {
			return false, err
		}
	case *routev3.HeaderMatcher_PresentMatch:
		m = s.PresentMatch
	case nil:
		m = true
	default:
		return false, fmt.Errorf("header matcher %T is not modelled", s)
	}
	return m != h.GetInvertMatch(), nil
}

// stringMatches is envoy.type.matcher.v3.StringMatcher: safe_regex is
// RE2 matched against the whole value.
func stringMatches(m *matcherv3.StringMatcher, v string) (bool, error) {
	ic := m.GetIgnoreCase()
	fold := func(s string) string {
		if ic {
			return strings.ToLower(s)
		}
		return s
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return fold(v) == fold(p.Exact), nil
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(v), fold(p.Prefix)), nil
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(fold(v), fold(p.Suffix)), nil
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(fold(v), fold(p.Contains)), nil
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := regexp.Compile(`^(?:` + p.SafeRegex.GetRegex() + `)$`)
		if err != nil {
			return false, err
		}
		return re.MatchString(v), nil
	}
	return false, fmt.Errorf("string matcher %T is not modelled", m.GetMatchPattern())
}

func metadataValue(req request, ns string, path []*metadatav3.MetadataKey_PathSegment) (any, bool) {
	fields, has := req.metadata[ns]
	if !has {
		return nil, false
	}
	var cur any = fields
	for _, seg := range path {
		m, isMap := cur.(map[string]any)
		if !isMap {
			return nil, false
		}
		if cur, has = m[seg.GetKey()]; !has {
			return nil, false
		}
	}
	return cur, true
}

var dynMetadataFormat = regexp.MustCompile(`^%DYNAMIC_METADATA\(([^:)]+)((?::[^:)]+)*)\)%$`)

// hitsAddend evaluates RateLimit.HitsAddend: a number, or a format with
// one substitution field, here %DYNAMIC_METADATA(ns:key)% as Envoy
// Gateway writes for a cost from metadata. ok false: the value is absent
// or not a non-negative number up to 1e9, and the descriptor is ignored.
func hitsAddend(h *routev3.RateLimit_HitsAddend, req request) (n uint64, ok bool, err error) {
	if h.GetNumber() != nil {
		return h.GetNumber().GetValue(), true, nil
	}
	sub := dynMetadataFormat.FindStringSubmatch(h.GetFormat())
	if sub == nil {
		return 0, false, fmt.Errorf("hits_addend format %q is not modelled", h.GetFormat())
	}
	var path []*metadatav3.MetadataKey_PathSegment
	for _, k := range strings.Split(strings.TrimPrefix(sub[2], ":"), ":") {
		if k != "" {
			path = append(path, &metadatav3.MetadataKey_PathSegment{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: k}})
		}
	}
	v, has := metadataValue(req, sub[1], path)
	if !has {
		return 0, false, nil
	}
	u, err := strconv.ParseUint(fmt.Sprint(v), 10, 64)
	if err != nil || u > 1_000_000_000 {
		return 0, false, nil
	}
	return u, true, nil
}

// limitOverride evaluates RateLimit.Override: the dynamic metadata struct
// {requests_per_unit, unit} at the key, or no override when it is absent.
func limitOverride(o *routev3.RateLimit_Override, req request) (*ratelimitv3.RateLimitDescriptor_RateLimitOverride, error) {
	dm := o.GetDynamicMetadata()
	if dm == nil {
		return nil, fmt.Errorf("limit override %T is not modelled", o.GetOverrideSpecifier())
	}
	v, has := metadataValue(req, dm.GetMetadataKey().GetKey(), dm.GetMetadataKey().GetPath())
	if !has {
		return nil, nil
	}
	m, isMap := v.(map[string]any)
	if !isMap {
		return nil, nil
	}
	n, err := strconv.ParseUint(fmt.Sprint(m["requests_per_unit"]), 10, 32)
	if err != nil {
		return nil, nil
	}
	unit, known := typev3.RateLimitUnit_value[strings.ToUpper(fmt.Sprint(m["unit"]))]
	if !known {
		return nil, nil
	}
	return &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(n), Unit: typev3.RateLimitUnit(unit)}, nil
}
