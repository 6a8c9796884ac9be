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

	// Extensions that envoy.yaml names only in typed_config "@type" URLs;
	// the import registers them so that protojson can resolve the Any.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
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
	b, err := os.ReadFile(bootstrapFile)
	if err != nil {
		t.Fatal(err)
	}
	var tree any
	if err := yaml.Unmarshal(b, &tree); err != nil {
		t.Fatalf("%s: %v", bootstrapFile, err)
	}
	tree, err = jsonable(tree, "")
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
// "" when it comes from the request (a header) and is not known here.
type entry struct{ key, value string }

func (e entry) String() string {
	if e.value == "" {
		return e.key
	}
	return e.key + "=" + e.value
}

// sentDescriptors returns, per route, the descriptors its rate_limits (and
// its virtual host's) make Envoy send. An action this test does not know is
// an error, so that a new kind of action cannot slip past the checks.
func sentDescriptors(t *testing.T, hcm *hcmv3.HttpConnectionManager) map[string][][]entry {
	t.Helper()
	out := make(map[string][][]entry)
	add := func(where string, limits []*routev3.RateLimit) {
		for i, rl := range limits {
			var d []entry
			for _, a := range rl.GetActions() {
				switch a := a.GetActionSpecifier().(type) {
				case *routev3.RateLimit_Action_RequestHeaders_:
					d = append(d, entry{key: a.RequestHeaders.GetDescriptorKey()})
				case *routev3.RateLimit_Action_GenericKey_:
					k := a.GenericKey.GetDescriptorKey()
					if k == "" {
						k = "generic_key" // Envoy's default
					}
					d = append(d, entry{key: k, value: a.GenericKey.GetDescriptorValue()})
				case *routev3.RateLimit_Action_HeaderValueMatch_:
					k := a.HeaderValueMatch.GetDescriptorKey()
					if k == "" {
						k = "header_match" // Envoy's default
					}
					d = append(d, entry{key: k, value: a.HeaderValueMatch.GetDescriptorValue()})
				default:
					t.Errorf("%s rate_limits[%d]: action %T is unknown to this test; teach sentDescriptors what it sends", where, i, a)
				}
			}
			out[where] = append(out[where], d)
		}
	}
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		add("virtual host "+vh.GetName(), vh.GetRateLimits())
		for _, r := range vh.GetRoutes() {
			add("route "+r.GetName(), r.GetRoute().GetRateLimits())
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
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var f descriptorFile
		if err := yaml.Unmarshal(b, &f); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if f.Domain == "" {
			t.Errorf("%s: no domain", p)
		}
		out[p] = f
	}
	return out
}

// TestDescriptorsHaveRules checks that every descriptor the routes send
// has somewhere to go in the filter's domain: each key appears as a key: in
// the descriptor files, and some request makes the descriptor match a rule
// under config.Load's own matching. A descriptor that matches no rule is
// never limited, which is a silent mistake.
func TestDescriptorsHaveRules(t *testing.T) {
	g := loadGateway(t)
	files := loadDescriptorFiles(t)
	set, err := config.Load(descriptorDir)
	if err != nil {
		t.Fatalf("config.Load(%q): %v", descriptorDir, err)
	}
	for _, rl := range g.rateLimited(t) {
		domain := rl.filter.GetDomain()
		values := make(map[string][]string) // key: the values the files list for it
		for _, f := range files {
			if f.Domain == domain {
				collectValues(f.Descriptors, values)
			}
		}
		sent := sentDescriptors(t, rl.hcm)
		if len(sent) == 0 {
			t.Errorf("listener %s: no route sends a descriptor", rl.listener)
		}
		for _, where := range slices.Sorted(maps.Keys(sent)) {
			for _, d := range sent[where] {
				if len(d) == 0 {
					t.Errorf("listener %s, %s: a rate_limits entry with no actions", rl.listener, where)
					continue
				}
				for _, e := range d {
					if _, ok := values[e.key]; !ok {
						t.Errorf("listener %s, %s: descriptor key %q is not a key: in domain %q", rl.listener, where, e.key, domain)
					}
				}
				if !matchesSomeRule(set, domain, d, values) {
					t.Errorf("listener %s, %s: no request makes descriptor %v match a rule in domain %q", rl.listener, where, d, domain)
				}
			}
		}
	}
}

// collectValues records, for every key in ds and below, the values the
// descriptors give it ("" for a key-only descriptor).
func collectValues(ds []descriptor, into map[string][]string) {
	for _, d := range ds {
		into[d.Key] = append(into[d.Key], d.Value)
		collectValues(d.Descriptors, into)
	}
}

// matchesSomeRule reports whether some request makes descriptor d match a
// rule. Entries whose value comes from the request are tried with every
// value the files list for their key (a wildcard with its '*'s filled in)
// and with a value the files do not list.
func matchesSomeRule(set *config.Set, domain string, d []entry, values map[string][]string) bool {
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
	entries := make([]config.Entry, len(d))
	var try func(i int) bool
	try = func(i int) bool {
		if i == len(d) {
			return set.Lookup(domain, entries) != nil
		}
		for _, v := range candidates[i] {
			entries[i] = config.Entry{Key: d[i].key, Value: v}
			if try(i + 1) {
				return true
			}
		}
		return false
	}
	return try(0)
}

// TestDescriptorFilesLoad loads ratelimit/ as ratelimitd does (make run)
// and checks that the descriptors Envoy sends get the rules the comments in
// ai-gateway.yaml promise.
func TestDescriptorFilesLoad(t *testing.T) {
	set, err := config.Load(descriptorDir)
	if err != nil {
		t.Fatalf("config.Load(%q): %v", descriptorDir, err)
	}
	const domain = "ai-gateway"
	if r := set.Lookup(domain, []config.Entry{{Key: "model", Value: "gpt-4o"}}); r == nil {
		t.Fatalf("Lookup(%q, model=gpt-4o) = nil, want a rule", domain)
	}
	tests := []struct {
		entries   []config.Entry
		name      string // "" for no rule
		unlimited bool
	}{
		{entries("model", "gpt-4o"), "gpt-4o", false},
		{entries("model", "gpt-4o", "client", "team-a"), "gpt-4o-per-client", false},
		{entries("model", "claude-sonnet"), "claude-sonnet", false},
		{entries("model", "claude-sonnet", "client", "team-a"), "", false},
		{entries("model", "some-new-model"), "other-models", false},
		{entries("model", "some-new-model", "client", "team-a"), "", false},
		{entries("caller", "internal"), "internal", true},
		{entries("caller", "someone-else"), "", false},
	}
	for _, tt := range tests {
		r := set.Lookup(domain, tt.entries)
		switch {
		case tt.name == "" && r != nil:
			t.Errorf("Lookup(%q, %v) = rule %q (%s), want none", domain, tt.entries, r.Name, r.Path)
		case tt.name != "" && r == nil:
			t.Errorf("Lookup(%q, %v) = nil, want rule %q", domain, tt.entries, tt.name)
		case r != nil && (r.Name != tt.name || r.Unlimited != tt.unlimited):
			t.Errorf("Lookup(%q, %v) = rule %q (unlimited %v), want %q (unlimited %v)", domain, tt.entries, r.Name, r.Unlimited, tt.name, tt.unlimited)
		}
	}
}

// entries builds a descriptor from key, value pairs.
func entries(kv ...string) []config.Entry {
	var out []config.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}
