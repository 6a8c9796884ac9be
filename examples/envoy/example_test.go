// Package envoy_test keeps the Envoy example honest: envoy.yaml must parse
// and validate against go-control-plane's generated types, and what its
// routes send must be what ratelimit/*.yaml configures.
package envoy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/servertest"

	// Extensions that envoy.yaml names only in typed_config "@type" URLs;
	// the import registers them so that protojson can resolve the Any.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/json_to_metadata/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
)

const (
	bootstrapFile = "envoy.yaml"
	descriptorDir = "ratelimit"

	// The names under which Envoy knows the pieces this project relies on.
	rateLimitFilter  = "envoy.filters.http.ratelimit"
	rateLimitCluster = "ratelimit"
	healthService    = "ratelimit"
	httpOptionsKey   = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// gateway is envoy.yaml, parsed two ways.
type gateway struct {
	tree      any // the decoded YAML, to ask "is this field written?"
	bootstrap *bootstrapv3.Bootstrap
}

func loadGateway(t *testing.T) *gateway {
	t.Helper()
	var tree any
	readYAML(t, bootstrapFile, &tree)
	tree, err := jsonable(tree, "")
	if err != nil {
		t.Fatalf("%s: %v", bootstrapFile, err)
	}
	j, err := json.Marshal(tree)
	if err != nil {
		t.Fatalf("%s: to JSON: %v", bootstrapFile, err)
	}
	bs := new(bootstrapv3.Bootstrap)
	// Unknown fields and unregistered Any types are errors, as in Envoy.
	if err := protojson.Unmarshal(j, bs); err != nil {
		t.Fatalf("%s: not a v3 Bootstrap: %v", bootstrapFile, err)
	}
	return &gateway{tree: tree, bootstrap: bs}
}

// readYAML decodes the YAML file at path into v.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// jsonable turns what yaml.v3 decodes into `any` into values encoding/json
// accepts: mappings with non-string keys (map[any]any) become
// map[string]any, and a key that is not a string is an error rather than
// something silently renamed.
func jsonable(v any, path string) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			c, err := jsonable(e, path+"."+k)
			if err != nil {
				return nil, err
			}
			v[k] = c
		}
		return v, nil
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			s, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("%s: key %v is a %T, not a string", path, k, k)
			}
			c, err := jsonable(e, path+"."+s)
			if err != nil {
				return nil, err
			}
			m[s] = c
		}
		return m, nil
	case []any:
		for i, e := range v {
			c, err := jsonable(e, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			v[i] = c
		}
		return v, nil
	}
	return v, nil
}

// TestBootstrapValid runs the protoc-gen-validate rules Envoy applies on
// load, on the bootstrap and on every message packed in an Any
// (typed_config, typed_extension_protocol_options), which the bootstrap's
// own ValidateAll does not open.
func TestBootstrapValid(t *testing.T) {
	g := loadGateway(t)
	var problems []string
	check := func(where string, m proto.Message) {
		v, ok := m.(interface{ ValidateAll() error })
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: %T has no ValidateAll", where, m))
			return
		}
		problems = append(problems, validationMessages(where, v.ValidateAll())...)
	}
	check("bootstrap", g.bootstrap)
	anys := 0
	walkAny(g.bootstrap.ProtoReflect(), "bootstrap", func(where string, m proto.Message) {
		anys++
		check(where, m)
	}, func(where string, err error) {
		problems = append(problems, fmt.Sprintf("%s: %v", where, err))
	})
	if anys == 0 {
		problems = append(problems, "no typed_config found: did the walk break?")
	}
	if len(problems) > 0 {
		t.Fatalf("%s does not validate:\n%s", bootstrapFile, strings.Join(problems, "\n"))
	}
}

// validationMessages flattens what a generated ValidateAll returns (a
// multi-error with AllErrors, possibly nesting more) into one line per
// violation.
func validationMessages(where string, err error) []string {
	if err == nil {
		return nil
	}
	var multi interface{ AllErrors() []error }
	if errors.As(err, &multi) {
		var out []string
		for _, e := range multi.AllErrors() {
			out = append(out, validationMessages(where, e)...)
		}
		return out
	}
	return []string{where + ": " + err.Error()}
}

// walkAny calls found for every Any under m, unpacked, outermost first,
// and descends into what it unpacked.
func walkAny(m protoreflect.Message, where string, found func(string, proto.Message), fail func(string, error)) {
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			fail(where, err)
			return
		}
		where += "(" + string(inner.ProtoReflect().Descriptor().FullName()) + ")"
		found(where, inner)
		walkAny(inner.ProtoReflect(), where, found, fail)
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := where + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				walkAny(v.Message(), fmt.Sprintf("%s[%v]", name, k.Interface()), found, fail)
				return true
			})
		case fd.IsList():
			if fd.Message() == nil {
				return true
			}
			for i := range v.List().Len() {
				walkAny(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", name, i), found, fail)
			}
		case fd.Message() != nil:
			walkAny(v.Message(), name, found, fail)
		}
		return true
	})
}

// connectionManagers returns every HTTP connection manager of the static
// listeners, by listener name.
func (g *gateway) connectionManagers(t *testing.T) map[string]*hcmv3.HttpConnectionManager {
	t.Helper()
	out := make(map[string]*hcmv3.HttpConnectionManager)
	for _, l := range g.bootstrap.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := new(hcmv3.HttpConnectionManager)
				if f.GetTypedConfig().MessageIs(hcm) {
					if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
						t.Fatalf("listener %s: %v", l.GetName(), err)
					}
					out[l.GetName()] = hcm
				}
			}
		}
	}
	return out
}

// rateLimited is a connection manager that runs the ratelimit filter.
type rateLimited struct {
	listener string
	hcm      *hcmv3.HttpConnectionManager
	filter   *ratelimitv3.RateLimit
}

func (g *gateway) rateLimited(t *testing.T) []rateLimited {
	t.Helper()
	var out []rateLimited
	for name, hcm := range g.connectionManagers(t) {
		for _, f := range hcm.GetHttpFilters() {
			rl := new(ratelimitv3.RateLimit)
			if !f.GetTypedConfig().MessageIs(rl) {
				continue
			}
			if f.GetName() != rateLimitFilter {
				t.Errorf("listener %s: ratelimit filter named %q, want %q", name, f.GetName(), rateLimitFilter)
			}
			if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
				t.Fatalf("listener %s: %v", name, err)
			}
			out = append(out, rateLimited{listener: name, hcm: hcm, filter: rl})
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no listener runs the %s filter", bootstrapFile, rateLimitFilter)
	}
	return out
}

func TestRateLimitFilter(t *testing.T) {
	g := loadGateway(t)
	files := loadDescriptorFiles(t)
	for _, rl := range g.rateLimited(t) {
		f := rl.filter
		for _, p := range slices.Sorted(maps.Keys(files)) {
			if d := files[p].Domain; d != f.GetDomain() {
				t.Errorf("listener %s: filter domain is %q, but %s has domain: %q", rl.listener, f.GetDomain(), p, d)
			}
		}
		if got, want := f.GetEnableXRatelimitHeaders(), ratelimitv3.RateLimit_DRAFT_VERSION_03; got != want {
			t.Errorf("listener %s: enable_x_ratelimit_headers = %v, want %v", rl.listener, got, want)
		}
		if f.GetTimeout() == nil {
			t.Errorf("listener %s: no timeout: Envoy's 20ms default is implicit; write it down", rl.listener)
		}
		// The filter's own rate_limits would make Envoy ignore the routes'.
		if n := len(f.GetRateLimits()); n > 0 {
			t.Errorf("listener %s: filter has %d rate_limits, which override the routes' rate_limits", rl.listener, n)
		}
		svc := f.GetRateLimitService()
		if got, want := svc.GetTransportApiVersion(), corev3.ApiVersion_V3; got != want {
			t.Errorf("listener %s: rate_limit_service.transport_api_version = %v, want %v", rl.listener, got, want)
		}
		if got := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != rateLimitCluster {
			t.Errorf("listener %s: rate_limit_service calls cluster %q, want %q", rl.listener, got, rateLimitCluster)
		}
	}

	// proto3 cannot tell false from absent, so look at the YAML itself:
	// failure_mode_deny is a decision, and the file must show it was made.
	configs := typedConfigs(g.tree, "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit")
	if len(configs) == 0 {
		t.Fatalf("%s: no ratelimit typed_config in the YAML tree", bootstrapFile)
	}
	for _, c := range configs {
		if _, ok := c["failure_mode_deny"]; !ok {
			t.Errorf("%s: the ratelimit filter does not set failure_mode_deny explicitly", bootstrapFile)
		}
	}
}

// typedConfigs returns every mapping in the decoded YAML whose "@type" is
// typeURL.
func typedConfigs(v any, typeURL string) []map[string]any {
	var out []map[string]any
	switch v := v.(type) {
	case map[string]any:
		if v["@type"] == typeURL {
			out = append(out, v)
		}
		for _, e := range v {
			out = append(out, typedConfigs(e, typeURL)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, typedConfigs(e, typeURL)...)
		}
	}
	return out
}

func TestRateLimitCluster(t *testing.T) {
	g := loadGateway(t)
	var c *clusterv3.Cluster
	for _, cl := range g.bootstrap.GetStaticResources().GetClusters() {
		if cl.GetName() == rateLimitCluster {
			c = cl
		}
	}
	if c == nil {
		t.Fatalf("%s: no cluster %q", bootstrapFile, rateLimitCluster)
	}

	opts := new(httpv3.HttpProtocolOptions)
	a, ok := c.GetTypedExtensionProtocolOptions()[httpOptionsKey]
	switch {
	case !ok:
		t.Errorf("cluster %s: no typed_extension_protocol_options[%s]: Envoy would speak HTTP/1.1 to a gRPC server", c.GetName(), httpOptionsKey)
	case a.UnmarshalTo(opts) != nil:
		t.Errorf("cluster %s: typed_extension_protocol_options[%s] is a %s", c.GetName(), httpOptionsKey, a.GetTypeUrl())
	case opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil:
		t.Errorf("cluster %s: protocol options do not set explicit_http_config.http2_protocol_options", c.GetName())
	}

	grpcChecked := false
	for _, hc := range c.GetHealthChecks() {
		if hc.GetGrpcHealthCheck().GetServiceName() == healthService {
			grpcChecked = true
		}
	}
	if !grpcChecked {
		t.Errorf("cluster %s: no grpc_health_check with service_name %q", c.GetName(), healthService)
	}
}

// An entry is one descriptor entry as a route action produces it. Value is
// "" when it comes from the request (a header) and is not known here;
// header then names the request header.
type entry struct{ key, value, header string }

func (e entry) String() string {
	if e.value == "" {
		return e.key
	}
	return e.key + "=" + e.value
}

// sent is one descriptor a route makes Envoy send: one rate_limits entry.
type sent struct {
	where   string // "route claude-sonnet rate_limits[2]", for messages
	route   string // the route's name, "" for a virtual host's
	entries []entry
	// perFilter is true for the rate_limits of typed_per_filter_config
	// (RateLimitPerRoute), the only place where Envoy honours hits_addend.
	perFilter bool
	// hits is the rate limit's hits_addend, nil when absent.
	hits *routev3.RateLimit_HitsAddend
	// onStreamDone: sent in a second call once the stream is done.
	onStreamDone bool
}

// isCheck reports whether d spends nothing: hits_addend number 0.
func (d sent) isCheck() bool {
	return d.perFilter && d.hits.GetNumber() != nil && d.hits.GetNumber().GetValue() == 0 && d.hits.GetFormat() == ""
}

// isRelease reports whether d gives a concurrency lease back: a
// stream-done descriptor with hits_addend {number: 1, is_negative_hits}.
func (d sent) isRelease() bool {
	return d.perFilter && d.onStreamDone && d.hits.GetIsNegativeHits() && d.hits.GetNumber().GetValue() == 1
}

// isRefund reports whether d gives tokens back at stream done: a
// stream-done descriptor with is_negative_hits that is not a lease release.
func (d sent) isRefund() bool {
	return d.perFilter && d.onStreamDone && d.hits.GetIsNegativeHits() && !d.isRelease()
}

// isCharge reports whether d charges usage at stream done: a stream-done
// descriptor that takes (no is_negative_hits).
func (d sent) isCharge() bool {
	return d.onStreamDone && !d.hits.GetIsNegativeHits()
}

// isRefundOf reports whether refund d gives back what o takes: o is a
// request-time take (no check) of the same entries, with the same
// hits_addend but for is_negative_hits (the same number, or the same
// format, which Envoy evaluates on the same request headers and metadata).
func (d sent) isRefundOf(o sent) bool {
	if o.onStreamDone || o.isCheck() || o.hits.GetIsNegativeHits() || !o.sameEntries(d) {
		return false
	}
	dn, on := d.hits.GetNumber(), o.hits.GetNumber()
	return d.hits.GetFormat() == o.hits.GetFormat() && (dn == nil) == (on == nil) && dn.GetValue() == on.GetValue()
}

func (d sent) sameEntries(o sent) bool {
	return slices.Equal(d.entries, o.entries)
}

// perRouteRateLimits returns the RateLimitPerRoute that typed_per_filter_config
// gives the ratelimit filter, or nil.
func perRouteRateLimits(t *testing.T, where string, cfg map[string]*anypb.Any) *ratelimitv3.RateLimitPerRoute {
	t.Helper()
	a, ok := cfg[rateLimitFilter]
	if !ok {
		return nil
	}
	// typed_per_filter_config may wrap the message in a FilterConfig.
	if fc := new(routev3.FilterConfig); a.MessageIs(fc) {
		if err := a.UnmarshalTo(fc); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		a = fc.GetConfig()
	}
	pr := new(ratelimitv3.RateLimitPerRoute)
	if !a.MessageIs(pr) {
		t.Errorf("%s: typed_per_filter_config[%s] is a %s, want RateLimitPerRoute", where, rateLimitFilter, a.GetTypeUrl())
		return nil
	}
	if err := a.UnmarshalTo(pr); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return pr
}

// sentDescriptors returns, per route (or virtual host), the descriptors its
// rate limits make Envoy send, as Envoy picks them: a route's
// RateLimitPerRoute rate_limits when it has any, else its
// route.rate_limits. An action this test does not know is an error, so that
// a new kind of action cannot slip past the checks.
func sentDescriptors(t *testing.T, hcm *hcmv3.HttpConnectionManager) map[string][]sent {
	t.Helper()
	out := make(map[string][]sent)
	add := func(where, route string, perFilter bool, limits []*routev3.RateLimit) {
		for i, rl := range limits {
			d := sent{
				where:        fmt.Sprintf("%s rate_limits[%d]", where, i),
				route:        route,
				perFilter:    perFilter,
				hits:         rl.GetHitsAddend(),
				onStreamDone: rl.GetApplyOnStreamDone(),
			}
			for _, a := range rl.GetActions() {
				switch a := a.GetActionSpecifier().(type) {
				case *routev3.RateLimit_Action_RequestHeaders_:
					d.entries = append(d.entries, entry{key: a.RequestHeaders.GetDescriptorKey(), header: a.RequestHeaders.GetHeaderName()})
				case *routev3.RateLimit_Action_GenericKey_:
					k := a.GenericKey.GetDescriptorKey()
					if k == "" {
						k = "generic_key" // Envoy's default
					}
					d.entries = append(d.entries, entry{key: k, value: a.GenericKey.GetDescriptorValue()})
				case *routev3.RateLimit_Action_HeaderValueMatch_:
					k := a.HeaderValueMatch.GetDescriptorKey()
					if k == "" {
						k = "header_match" // Envoy's default
					}
					d.entries = append(d.entries, entry{key: k, value: a.HeaderValueMatch.GetDescriptorValue()})
				default:
					t.Errorf("%s: action %T is unknown to this test; teach sentDescriptors what it sends", d.where, a)
				}
			}
			out[where] = append(out[where], d)
		}
	}
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		where := "virtual host " + vh.GetName()
		if pr := perRouteRateLimits(t, where, vh.GetTypedPerFilterConfig()); len(pr.GetRateLimits()) > 0 {
			t.Errorf("%s: RateLimitPerRoute rate_limits on a virtual host: this test does not model how Envoy merges them; put them on routes", where)
		}
		add(where, "", false, vh.GetRateLimits())
		for _, r := range vh.GetRoutes() {
			where := "route " + r.GetName()
			pr := perRouteRateLimits(t, where, r.GetTypedPerFilterConfig())
			if d := pr.GetDomain(); d != "" {
				t.Errorf("%s: RateLimitPerRoute sets domain %q; this example keeps one domain, the filter's", where, d)
			}
			if len(pr.GetRateLimits()) > 0 {
				if len(r.GetRoute().GetRateLimits()) > 0 {
					t.Errorf("%s: has both route.rate_limits and RateLimitPerRoute rate_limits; Envoy ignores the former", where)
				}
				add(where, r.GetName(), true, pr.GetRateLimits())
				continue
			}
			add(where, r.GetName(), false, r.GetRoute().GetRateLimits())
		}
	}
	return out
}

// descriptorFile is the part of a ratelimit/*.yaml file these tests read;
// other fields are ignored.
type descriptorFile struct {
	Domain      string       `yaml:"domain"`
	Descriptors []descriptor `yaml:"descriptors"`
}

type descriptor struct {
	Key         string       `yaml:"key"`
	Value       string       `yaml:"value"`
	Descriptors []descriptor `yaml:"descriptors"`
}

func loadDescriptorFiles(t *testing.T) map[string]descriptorFile {
	t.Helper()
	var paths []string
	for _, pattern := range []string{"*.yaml", "*.yml"} { // as config.Load reads
		ps, err := filepath.Glob(filepath.Join(descriptorDir, pattern))
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, ps...)
	}
	if len(paths) == 0 {
		t.Fatalf("no %s/*.yaml or *.yml", descriptorDir)
	}
	out := make(map[string]descriptorFile)
	for _, p := range paths {
		var f descriptorFile
		readYAML(t, p, &f)
		if f.Domain == "" {
			t.Errorf("%s: no domain", p)
		}
		out[p] = f
	}
	return out
}

func loadSet(t *testing.T) *config.Set {
	t.Helper()
	set, err := config.Load(descriptorDir)
	if err != nil {
		t.Fatalf("config.Load(%q): %v", descriptorDir, err)
	}
	return set
}

// TestDescriptorsHaveRules checks that every descriptor the routes send
// has somewhere to go in the filter's domain: each key appears as a key: in
// the descriptor files, and some request makes the descriptor match a rule
// under config.Load's own matching. A descriptor that matches no rule is
// never limited, which is a silent mistake.
func TestDescriptorsHaveRules(t *testing.T) {
	g := loadGateway(t)
	files := loadDescriptorFiles(t)
	set := loadSet(t)
	for _, rl := range g.rateLimited(t) {
		domain := rl.filter.GetDomain()
		values := domainValues(files, domain)
		sent := sentDescriptors(t, rl.hcm)
		if len(sent) == 0 {
			t.Errorf("listener %s: no route sends a descriptor", rl.listener)
		}
		for _, where := range slices.Sorted(maps.Keys(sent)) {
			for _, d := range sent[where] {
				if len(d.entries) == 0 {
					t.Errorf("listener %s, %s: a rate_limits entry with no actions", rl.listener, d.where)
					continue
				}
				for _, e := range d.entries {
					if _, ok := values[e.key]; !ok {
						t.Errorf("listener %s, %s: descriptor key %q is not a key: in domain %q", rl.listener, d.where, e.key, domain)
					}
				}
				if len(rulesFor(set, domain, d.entries, values)) == 0 {
					t.Errorf("listener %s, %s: no request makes descriptor %v match a rule in domain %q", rl.listener, d.where, d.entries, domain)
				}
			}
		}
	}
}

// hitsFormat is what Envoy accepts in hits_addend.format: exactly one
// substitution command, such as %DYNAMIC_METADATA(ns:key)% or
// %RESP(x-usage)%, and nothing around it.
var hitsFormat = regexp.MustCompile(`^%[A-Z_]+(\([^%]*\))?(:[0-9]+)?%$`)

// TestPostpaidCharges checks the descriptors that carry a hits_addend or
// are sent when the stream is done (the claude-sonnet tokens, the
// gpt-4o-mini budget, the qwen leases):
//   - hits_addend is only in RateLimitPerRoute rate_limits, where Envoy
//     reads it (it ignores it in route.rate_limits);
//   - every apply_on_stream_done rate limit has a hits_addend (else it
//     charges 1 after the fact, which is not what anyone means), with a
//     format of one substitution or a number;
//   - is_negative_hits is only sent when the stream is done: a refund at
//     request time would give back before anything was taken;
//   - every stream-done refund (is_negative_hits, not a lease release) has
//     its reservation: a request-time descriptor on the same route with the
//     same entries and the same hits_addend, so that it gives back exactly
//     what was taken; and every rule it reaches counts tokens (ratelimitd
//     gives nothing back on a limit that counts requests);
//   - every stream-done charge has a request-time gate of the same
//     descriptor on the same route: a check (hits_addend 0) or a
//     reservation, and every check a charge: a charge nobody checks never
//     denies, a check nobody charges never fills; a descriptor taken at
//     request time and charged at stream done has its refund, or the
//     request pays for its estimate and its usage;
//   - every rule a charge can reach counts tokens with an overdraft,
//     because Envoy ignores the stream-done answer and nothing in it says
//     "post-paid": without overdraft, usage that does not fit would be
//     lost.
func TestPostpaidCharges(t *testing.T) {
	g := loadGateway(t)
	files := loadDescriptorFiles(t)
	set := loadSet(t)
	charges, refunds := 0, 0
	for _, rl := range g.rateLimited(t) {
		domain := rl.filter.GetDomain()
		values := domainValues(files, domain)
		all := sentDescriptors(t, rl.hcm)
		// reach checks that d, a what, reaches a rule, and only rules
		// that fit; why says what one that does not fit is or lacks.
		reach := func(d sent, what string, fits func(*config.Rule) bool, why string) {
			t.Helper()
			rules := rulesFor(set, domain, d.entries, values)
			if len(rules) == 0 {
				t.Errorf("%s: the %s %v reaches no rule", d.where, what, d.entries)
			}
			for _, r := range rules {
				if !fits(r) {
					t.Errorf("%s: the %s %v reaches rule %s (%s:%d), which %s", d.where, what, d.entries, r.Path, r.File, r.Line, why)
				}
			}
		}
		for _, where := range slices.Sorted(maps.Keys(all)) {
			ds := all[where]
			for _, d := range ds {
				if d.hits != nil && !d.perFilter {
					t.Errorf("%s: hits_addend in route.rate_limits, where Envoy ignores it: move the route's rate limits to typed_per_filter_config.%s (RateLimitPerRoute)", d.where, rateLimitFilter)
				}
				if d.onStreamDone && d.hits == nil {
					t.Errorf("%s: apply_on_stream_done without hits_addend: the stream-done call would charge 1, not the usage", d.where)
				}
				if d.hits != nil {
					num, format := d.hits.GetNumber(), d.hits.GetFormat()
					switch {
					case (num == nil) == (format == ""):
						t.Errorf("%s: hits_addend needs exactly one of number and format", d.where)
					case format != "" && !hitsFormat.MatchString(format):
						t.Errorf("%s: hits_addend.format %q: Envoy wants exactly one substitution command, nothing else", d.where, format)
					}
				}
				if d.hits.GetIsNegativeHits() && !d.onStreamDone {
					t.Errorf("%s: is_negative_hits at request time gives back before anything is taken; send it with apply_on_stream_done", d.where)
					continue
				}
				if d.isRelease() {
					// A concurrency lease given back, not a charge: its
					// request-time twin took it.
					twin := slices.ContainsFunc(ds, func(o sent) bool {
						return o.sameEntries(d) && !o.onStreamDone && !o.isCheck()
					})
					if !twin {
						t.Errorf("%s: the release %v has no request-time descriptor on the same route that takes the lease", d.where, d.entries)
					}
					reach(d, "release", func(r *config.Rule) bool { return r.Kind == config.KindConcurrency },
						"is no concurrency limit: is_negative_hits would give tokens back")
					continue
				}
				if d.isRefund() {
					refunds++
					if !slices.ContainsFunc(ds, d.isRefundOf) {
						t.Errorf("%s: the refund %v (hits_addend %v) has no reservation: no request-time descriptor on the same route with the same entries and hits_addend, so it would not give back what was taken", d.where, d.entries, d.hits)
					}
					reach(d, "refund", func(r *config.Rule) bool {
						return slices.ContainsFunc(r.Limits, func(l config.RateLimit) bool { return l.Counts == config.Tokens })
					}, "has no limit with counts: tokens: ratelimitd gives nothing back there")
					continue
				}
				if d.isCheck() {
					if !slices.ContainsFunc(ds, func(o sent) bool { return o.isCharge() && o.sameEntries(d) }) {
						t.Errorf("%s: descriptor %v has no matching stream-done charge on the same route", d.where, d.entries)
					}
					continue
				}
				if !d.isCharge() {
					continue
				}
				charges++
				// The gate: a check, or a reservation that a refund gives
				// back. A request-time take that nothing gives back is
				// paid for twice, estimate and usage.
				var gated bool
				for _, o := range ds {
					if o.onStreamDone || !o.sameEntries(d) {
						continue
					}
					switch {
					case o.isCheck():
						gated = true
					case slices.ContainsFunc(ds, func(r sent) bool { return r.isRefund() && r.isRefundOf(o) }):
						gated = true
					default:
						t.Errorf("%s: descriptor %v is taken at request time (%s) and charged at stream done, with no refund of the former: the request pays for its estimate and for its usage", d.where, d.entries, o.where)
					}
				}
				if !gated {
					t.Errorf("%s: descriptor %v has no matching check (hits_addend: {number: 0}) or refunded reservation on the same route", d.where, d.entries)
				}
				reach(d, "stream-done charge", func(r *config.Rule) bool {
					return slices.ContainsFunc(r.Limits, func(l config.RateLimit) bool {
						return l.Counts == config.Tokens && l.Limit.MaxDebt > 0
					})
				}, "has no limit with counts: tokens and an overdraft")
			}
		}
	}
	if charges == 0 {
		t.Errorf("%s: no route charges usage when the stream is done (apply_on_stream_done)", bootstrapFile)
	}
	if refunds == 0 {
		t.Errorf("%s: no route gives a reservation back when the stream is done (reserve-then-settle); the example is meant to show one", bootstrapFile)
	}
}

// TestTimeoutExceedsMaxWait: a request that waits for its turn is held by
// ratelimitd up to max_wait; Envoy's filter timeout must outlast that, or
// it gives up first and failure_mode_deny lets the request through
// unmetered (or answers 500).
func TestTimeoutExceedsMaxWait(t *testing.T) {
	g := loadGateway(t)
	set := loadSet(t)
	waits := 0
	for _, rl := range g.rateLimited(t) {
		timeout := rl.filter.GetTimeout().AsDuration()
		for _, d := range set.Domains() {
			if d.Name != rl.filter.GetDomain() {
				continue
			}
			for _, r := range d.Rules {
				for _, l := range r.Limits {
					if l.MaxWait <= 0 {
						continue
					}
					waits++
					if timeout <= l.MaxWait {
						t.Errorf("listener %s: ratelimit filter timeout %v does not exceed max_wait %v of %s (%s:%d)", rl.listener, timeout, l.MaxWait, r.Path, r.File, r.Line)
					}
				}
			}
		}
	}
	if waits == 0 {
		t.Errorf("%s: no limit with max_wait; the example is meant to show one", descriptorDir)
	}
}

// domainValues records, for every key in the domain's files, the values
// the descriptors give it ("" for a key-only descriptor).
func domainValues(files map[string]descriptorFile, domain string) map[string][]string {
	values := make(map[string][]string)
	for _, f := range files {
		if f.Domain == domain {
			collectValues(f.Descriptors, values)
		}
	}
	return values
}

func collectValues(ds []descriptor, into map[string][]string) {
	for _, d := range ds {
		into[d.Key] = append(into[d.Key], d.Value)
		collectValues(d.Descriptors, into)
	}
}

// rulesFor returns the distinct rules descriptor d matches over the
// requests this test can think of: entries whose value comes from the
// request are tried with every value the files list for their key (a
// wildcard with its '*'s filled in) and with a value the files do not list.
func rulesFor(set *config.Set, domain string, d []entry, values map[string][]string) []*config.Rule {
	candidates := make([][]string, len(d))
	for i, e := range d {
		if e.value != "" {
			candidates[i] = []string{e.value}
			continue
		}
		candidates[i] = []string{"value-not-in-any-file"}
		for _, v := range values[e.key] {
			if v != "" {
				candidates[i] = append(candidates[i], strings.ReplaceAll(v, "*", "x"))
			}
		}
	}
	var out []*config.Rule
	entries := make([]config.Entry, len(d))
	var try func(i int)
	try = func(i int) {
		if i == len(d) {
			if r := set.Lookup(domain, entries); r != nil && !slices.Contains(out, r) {
				out = append(out, r)
			}
			return
		}
		for _, v := range candidates[i] {
			entries[i] = config.Entry{Key: d[i].key, Value: v}
			try(i + 1)
		}
	}
	try(0)
	return out
}

// TestDescriptorFilesLoad loads ratelimit/ as ratelimitd does (make run)
// and checks that the descriptors Envoy sends get the rules the comments in
// ai-gateway.yaml promise.
func TestDescriptorFilesLoad(t *testing.T) {
	set := loadSet(t)
	const domain = "ai-gateway"
	tests := []struct {
		entries   []config.Entry
		name      string // the rule's name; "" with group or for no rule
		group     string // Limits[0].Group
		unlimited bool
	}{
		{entries: servertest.Entries("model", "gpt-4o"), group: "openai-gpt-4o"},
		{entries: servertest.Entries("model", "gpt-4o", "client", "team-a"), group: "openai-gpt-4o-per-client"},
		{entries: servertest.Entries("model", "chat-default", "client", "team-a"), group: "openai-gpt-4o-per-client"},
		{entries: servertest.Entries("model", "claude-sonnet", "kind", "requests"), name: "claude-sonnet-rpm"},
		{entries: servertest.Entries("model", "claude-sonnet", "kind", "tokens"), name: "claude-sonnet-otpm"},
		{entries: servertest.Entries("model", "claude-sonnet")},                        // only its kinds are limited
		{entries: servertest.Entries("model", "claude-sonnet", "client", "team-a")},    // no per-client level
		{entries: servertest.Entries("model", "llama-3.1-70b"), name: "llama-3.1-70b"}, // waits
		{entries: servertest.Entries("model", "gpt-4o-mini"), name: "gpt-4o-mini-rpm"}, // not a gpt-4o alias
		{entries: servertest.Entries("model", "gpt-4o-mini", "kind", "budget", "client", "team-a"), name: "gpt-4o-mini-client-tokens"},
		{entries: servertest.Entries("model", "gpt-4o-mini", "kind", "budget")},   // only per client
		{entries: servertest.Entries("model", "gpt-4o-mini", "client", "team-a")}, // no per-client request limit
		{entries: servertest.Entries("model", "some-new-model"), name: "other-models"},
		{entries: servertest.Entries("model", "some-new-model", "client", "team-a")},
		{entries: servertest.Entries("caller", "internal"), name: "internal", unlimited: true},
		{entries: servertest.Entries("caller", "someone-else")},
	}
	for _, tt := range tests {
		r := set.Lookup(domain, tt.entries)
		want := tt.name != "" || tt.group != ""
		switch {
		case !want && r != nil:
			t.Errorf("Lookup(%q, %v) = rule %s, want none", domain, tt.entries, r.Path)
		case want && r == nil:
			t.Errorf("Lookup(%q, %v) = nil, want rule %q (group %q)", domain, tt.entries, tt.name, tt.group)
		case r == nil:
		case r.Name != tt.name || (r.Kind == config.KindUnlimited) != tt.unlimited:
			t.Errorf("Lookup(%q, %v) = rule %q (%v), want %q (unlimited %v)", domain, tt.entries, r.Name, r.Kind, tt.name, tt.unlimited)
		case tt.group != "" && (len(r.Limits) == 0 || r.Limits[0].Group != tt.group):
			t.Errorf("Lookup(%q, %v) = rule %s with limits %+v, want quota group %q", domain, tt.entries, r.Path, r.Limits, tt.group)
		}
	}

	// The tokens rule is post-paid and counts tokens; the llama rule waits.
	if r := set.Lookup(domain, servertest.Entries("model", "claude-sonnet", "kind", "tokens")); r != nil {
		if l := r.Limits[0]; l.Counts != config.Tokens || l.Limit.MaxDebt <= 0 {
			t.Errorf("claude-sonnet tokens: counts %v, max_debt %d; want tokens with an overdraft", l.Counts, l.Limit.MaxDebt)
		}
	}
	// The gpt-4o-mini budget is refunded and post-paid: it counts tokens
	// and has an overdraft, one bucket per client.
	a := set.Lookup(domain, servertest.Entries("model", "gpt-4o-mini", "kind", "budget", "client", "team-a"))
	b := set.Lookup(domain, servertest.Entries("model", "gpt-4o-mini", "kind", "budget", "client", "team-b"))
	if a != nil {
		if l := a.Limits[0]; l.Counts != config.Tokens || l.Limit.MaxDebt <= 0 {
			t.Errorf("gpt-4o-mini budget: counts %v, max_debt %d; want tokens with an overdraft", l.Counts, l.Limit.MaxDebt)
		}
		ea, eb := servertest.Entries("model", "gpt-4o-mini", "kind", "budget", "client", "team-a"), servertest.Entries("model", "gpt-4o-mini", "kind", "budget", "client", "team-b")
		if b == nil || string(a.AppendKey(nil, 0, ea)) == string(b.AppendKey(nil, 0, eb)) {
			t.Errorf("gpt-4o-mini budget: team-a and team-b share a bucket; want one per client (refunds reach only their own)")
		}
	}
	if r := set.Lookup(domain, servertest.Entries("model", "llama-3.1-70b")); r != nil && r.Limits[0].MaxWait <= 0 {
		t.Errorf("llama-3.1-70b: no max_wait")
	}
}

// gpt4oAliases are the names of the one OpenAI gpt-4o deployment; the last
// is matched by the wildcard gpt-4o-20*.
var gpt4oAliases = []string{"gpt-4o", "gpt-4o-latest", "chat-default", "gpt-4o-2024-08-06"}

// TestAliasesShareOneBucket: whatever alias a request names, it spends from
// the deployment's one bucket, and a client's per-client bucket is the same
// under every alias. A different client has its own.
func TestAliasesShareOneBucket(t *testing.T) {
	set := loadSet(t)
	const domain = "ai-gateway"
	key := func(e []config.Entry) (string, string) {
		t.Helper()
		r := set.Lookup(domain, e)
		if r == nil || r.Kind != config.KindLimited {
			t.Fatalf("Lookup(%v): no limited rule", e)
		}
		return r.Limits[0].Group, string(r.AppendKey(nil, 0, e))
	}
	group, bucket := key(servertest.Entries("model", gpt4oAliases[0]))
	clientGroup, clientBucket := key(servertest.Entries("model", gpt4oAliases[0], "client", "team-a"))
	if group == "" || clientGroup == "" || group == clientGroup {
		t.Fatalf("gpt-4o: groups %q and per-client %q; want two distinct groups", group, clientGroup)
	}
	for _, alias := range gpt4oAliases[1:] {
		if g, b := key(servertest.Entries("model", alias)); g != group || b != bucket {
			t.Errorf("model=%s: group %q, bucket %q; want %q's group %q and its bucket", alias, g, b, gpt4oAliases[0], group)
		}
		if g, b := key(servertest.Entries("model", alias, "client", "team-a")); g != clientGroup || b != clientBucket {
			t.Errorf("model=%s, client=team-a: group %q, bucket %q; want group %q and the same bucket as under %s", alias, g, b, clientGroup, gpt4oAliases[0])
		}
	}
	if _, b := key(servertest.Entries("model", "chat-default", "client", "team-b")); b == clientBucket {
		t.Errorf("team-b shares team-a's per-client bucket; want one bucket per client")
	}
}
