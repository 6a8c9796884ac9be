package envoygateway

import (
	"fmt"
	"strings"
)

// The Gateway API and Envoy Gateway resources, written as an operator
// would (api/v1alpha1/ratelimit_types.go and the rate-limit task of EG's
// docs, v1.9.1), and what each policy means for a run of requests.

// gatewayYAML is the standalone quickstart's Gateway
// (examples/standalone/quickstart.yaml, v1.9.1), in namespace default.
const gatewayYAML = `apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: eg
spec:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: eg
  namespace: default
spec:
  gatewayClassName: eg
  listeners:
    - name: http
      protocol: HTTP
      port: 8888
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: Backend
metadata:
  name: backend
  namespace: default
spec:
  endpoints:
    - ip:
        address: 127.0.0.1
        port: 3000
`

// listenerDomain is the domain of the rules that are not shared: the
// listener's IR name (buildRateLimitFilter).
const listenerDomain = "default/eg/http"

type verdict int

const (
	ok verdict = iota + 1
	over
)

func (v verdict) String() string {
	if v == ok {
		return "OK"
	}
	return "OVER_LIMIT"
}

// step is one request and what the policy says of it.
type step struct {
	route string // HTTPRoute name
	rule  int    // index of its rule
	req   request
	want  verdict
	// end, when set, is the dynamic metadata at the end of the stream:
	// the rate limits with apply_on_stream_done are then sent with it.
	end map[string]map[string]any
}

// shape is one thing EG can be asked for: its resources and its steps.
type shape struct {
	name  string
	yaml  string
	steps []step
}

type rule struct{ name, path string }

// httpRoute is HTTPRoute default/name on Gateway eg, one rule per path
// (PathPrefix), each to the Backend.
func httpRoute(name string, rules ...rule) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: %s
  namespace: default
spec:
  parentRefs:
    - name: eg
  rules:
`, name)
	for _, r := range rules {
		if r.name != "" {
			fmt.Fprintf(&b, "    - name: %s\n      matches:\n", r.name)
		} else {
			b.WriteString("    - matches:\n")
		}
		fmt.Fprintf(&b, `        - path:
            type: PathPrefix
            value: %s
      backendRefs:
        - group: gateway.envoyproxy.io
          kind: Backend
          name: backend
`, r.path)
	}
	return b.String()
}

// policy is BackendTrafficPolicy default/name on the routes (on their rule
// named section, when given), with the global rules given as YAML.
func policy(name, section, rules string, routes ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata:
  name: %s
  namespace: default
spec:
  targetRefs:
`, name)
	for _, r := range routes {
		fmt.Fprintf(&b, "    - group: gateway.networking.k8s.io\n      kind: HTTPRoute\n      name: %s\n", r)
		if section != "" {
			fmt.Fprintf(&b, "      sectionName: %s\n", section)
		}
	}
	b.WriteString("  rateLimit:\n    type: Global\n    global:\n      rules:\n")
	for _, l := range strings.Split(strings.TrimRight(rules, "\n"), "\n") {
		b.WriteString("        " + l + "\n")
	}
	return b.String()
}

// simple is one route with one rule and one policy of the same name.
func simple(name, rules string) string {
	return httpRoute(name, rule{path: "/" + name}) + "---\n" + policy(name, "", rules, name)
}

func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func hdr(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// header is a request with these headers (name, value, name, value, …).
func header(kv ...string) request { return request{header: hdr(kv...)} }

// at is a step on rule 0 of route.
func at(route string, want verdict, req request) step {
	return step{route: route, req: req, want: want}
}

func steps(route string, want ...verdict) []step {
	var out []step
	for _, w := range want {
		out = append(out, at(route, w, request{}))
	}
	return out
}

// longName is a DNS-1123 subdomain of n characters (Kubernetes allows 253).
func longName(prefix string, n int) string {
	return prefix + strings.Repeat("x", n-len(prefix))
}

var (
	longRoute  = longName("long-route-", 245) // its descriptor key, httproute/default/<name>/rule/0, is 270 bytes
	longPolicy = longName("long-policy-", 250)
)

// shapes is every shape of issue 42, with its steps.
func shapes() []shape {
	cidr := func(ip string) request { return request{remote: ip} }
	md := func(ns, key string, v any) map[string]map[string]any { return map[string]map[string]any{ns: {key: v}} }
	var big32 []string
	var big32req []string
	for i := range 32 {
		big32 = append(big32, fmt.Sprintf("      - name: x-h%02d\n        value: v", i))
		big32req = append(big32req, fmt.Sprintf("x-h%02d", i), "v")
	}
	var rules70 strings.Builder
	for i := range 70 {
		n := 1000
		if i == 0 {
			n = 2
		}
		fmt.Fprintf(&rules70, "- limit: {requests: %d, unit: Hour}\n", n)
	}
	return []shape{
		{name: "per-route limit", yaml: simple("per-route", "- limit: {requests: 3, unit: Hour}"),
			steps: steps("per-route", ok, ok, ok, over)},
		{name: "header exact match", yaml: simple("header-exact", `- clientSelectors:
    - headers:
      - name: x-user-id
        value: alice
  limit: {requests: 2, unit: Hour}`),
			steps: []step{at("header-exact", ok, header("x-user-id", "alice")), at("header-exact", ok, header("x-user-id", "alice")),
				at("header-exact", over, header("x-user-id", "alice")), at("header-exact", ok, header("x-user-id", "bob")), at("header-exact", ok, request{})}},
		{name: "header Distinct", yaml: simple("header-distinct", `- clientSelectors:
    - headers:
      - type: Distinct
        name: x-tenant
  limit: {requests: 2, unit: Hour}`),
			steps: []step{at("header-distinct", ok, header("x-tenant", "a")), at("header-distinct", ok, header("x-tenant", "a")),
				at("header-distinct", over, header("x-tenant", "a")), at("header-distinct", ok, header("x-tenant", "b")),
				at("header-distinct", ok, header("x-tenant", "b")), at("header-distinct", over, header("x-tenant", "b")), at("header-distinct", ok, request{})}},
		{name: "header RegularExpression", yaml: simple("header-regex", `- clientSelectors:
    - headers:
      - type: RegularExpression
        name: x-model
        value: "gpt-.*"
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("header-regex", ok, header("x-model", "gpt-4")), at("header-regex", over, header("x-model", "gpt-5")), at("header-regex", ok, header("x-model", "llama"))}},
		{name: "header inverted", yaml: simple("header-invert", `- clientSelectors:
    - headers:
      - name: x-internal
        value: "true"
        invert: true
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("header-invert", ok, header("x-internal", "false")), at("header-invert", over, request{}), at("header-invert", ok, header("x-internal", "true"))}},
		{name: "sourceCIDR Exact IPv4", yaml: simple("cidr-exact", `- clientSelectors:
    - sourceCIDR: {type: Exact, value: 10.0.0.0/8}
  limit: {requests: 2, unit: Hour}`),
			steps: []step{at("cidr-exact", ok, cidr("10.1.1.1")), at("cidr-exact", ok, cidr("10.2.2.2")), at("cidr-exact", over, cidr("10.3.3.3")), at("cidr-exact", ok, cidr("192.168.1.1"))}},
		{name: "sourceCIDR Exact inverted", yaml: simple("cidr-invert", `- clientSelectors:
    - sourceCIDR: {type: Exact, value: 10.0.0.0/8, invert: true}
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("cidr-invert", ok, cidr("192.168.1.1")), at("cidr-invert", over, cidr("172.16.0.1")), at("cidr-invert", ok, cidr("10.1.1.1"))}},
		{name: "sourceCIDR Distinct IPv4", yaml: simple("cidr-distinct", `- clientSelectors:
    - sourceCIDR: {type: Distinct, value: 10.0.0.0/8}
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("cidr-distinct", ok, cidr("10.0.0.1")), at("cidr-distinct", over, cidr("10.0.0.1")), at("cidr-distinct", ok, cidr("10.0.0.2")), at("cidr-distinct", ok, cidr("192.168.0.1"))}},
		{name: "sourceCIDR Distinct inverted", yaml: simple("cidr-distinct-invert", `- clientSelectors:
    - sourceCIDR: {type: Distinct, value: 10.0.0.0/8, invert: true}
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("cidr-distinct-invert", ok, cidr("192.168.0.1")), at("cidr-distinct-invert", over, cidr("192.168.0.1")),
				at("cidr-distinct-invert", ok, cidr("192.168.0.2")), at("cidr-distinct-invert", ok, cidr("10.0.0.1")), at("cidr-distinct-invert", ok, cidr("10.0.0.1"))}},
		{name: "sourceCIDR Exact IPv6", yaml: simple("cidr6-exact", `- clientSelectors:
    - sourceCIDR: {type: Exact, value: "2001:db8::/32"}
  limit: {requests: 2, unit: Hour}`),
			steps: []step{at("cidr6-exact", ok, cidr("2001:db8::1")), at("cidr6-exact", ok, cidr("2001:db8:1::1")), at("cidr6-exact", over, cidr("2001:db8::2")), at("cidr6-exact", ok, cidr("2001:db9::1"))}},
		{name: "sourceCIDR Distinct IPv6", yaml: simple("cidr6-distinct", `- clientSelectors:
    - sourceCIDR: {type: Distinct, value: "2001:db8::/32"}
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("cidr6-distinct", ok, cidr("2001:db8::1")), at("cidr6-distinct", over, cidr("2001:db8::1")), at("cidr6-distinct", ok, cidr("2001:db8::2"))}},
		{name: "shared: true across two routes",
			yaml: httpRoute("shared-a", rule{path: "/shared-a"}) + "---\n" + httpRoute("shared-b", rule{path: "/shared-b"}) + "---\n" +
				policy("shared", "", "- limit: {requests: 3, unit: Hour}\n  shared: true", "shared-a", "shared-b"),
			steps: []step{at("shared-a", ok, request{}), at("shared-b", ok, request{}), at("shared-a", ok, request{}), at("shared-b", over, request{}), at("shared-a", over, request{})}},
		{name: "cost from metadata at request", yaml: simple("cost-request", `- limit: {requests: 10, unit: Hour}
  cost:
    request:
      from: Metadata
      metadata: {namespace: io.example.cost, key: units}`),
			steps: []step{at("cost-request", ok, request{metadata: md("io.example.cost", "units", 4)}), at("cost-request", ok, request{metadata: md("io.example.cost", "units", 4)}),
				at("cost-request", over, request{metadata: md("io.example.cost", "units", 4)})}},
		// Each request costs 1, and its usage at stream end more. (No
		// cost.request.number: EG v1.9.1's file provider panics on that
		// uint64 field, "unsupported type: uint64", structured-merge-diff.)
		{name: "cost from metadata at stream end (hits_addend)", yaml: simple("cost-response", `- limit: {requests: 10, unit: Hour}
  cost:
    response:
      from: Metadata
      metadata: {namespace: io.example.usage, key: tokens}`),
			steps: []step{{route: "cost-response", want: ok, end: md("io.example.usage", "tokens", 7)}, {route: "cost-response", want: ok, end: md("io.example.usage", "tokens", 7)},
				{route: "cost-response", want: over}}},
		{name: "requests: 0", yaml: simple("zero", "- limit: {requests: 0, unit: Hour}"), steps: steps("zero", over, over)},
		{name: "methods", yaml: simple("methods", `- clientSelectors:
    - methods: [{value: GET}, {value: DELETE}]
  limit: {requests: 2, unit: Hour}`),
			steps: []step{at("methods", ok, request{method: "GET"}), at("methods", ok, request{method: "DELETE"}), at("methods", over, request{method: "GET"}), at("methods", ok, request{method: "POST"})}},
		{name: "method inverted", yaml: simple("method-invert", `- clientSelectors:
    - methods: [{value: GET, invert: true}]
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("method-invert", ok, request{method: "POST"}), at("method-invert", over, request{method: "PUT"}), at("method-invert", ok, request{method: "GET"})}},
		{name: "path prefix", yaml: simple("paths", `- clientSelectors:
    - path: {type: PathPrefix, value: /paths/api}
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("paths", ok, request{path: "/paths/api/x"}), at("paths", over, request{path: "/paths/api/y?q=1"}), at("paths", ok, request{path: "/paths/other"})}},
		{name: "path inverted", yaml: simple("path-invert", `- clientSelectors:
    - path: {value: /path-invert/health, invert: true}
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("path-invert", ok, request{path: "/path-invert/a"}), at("path-invert", over, request{path: "/path-invert/b"}), at("path-invert", ok, request{path: "/path-invert/health"})}},
		{name: "query parameter exact", yaml: simple("query-exact", `- clientSelectors:
    - queryParams: [{name: tier, value: free}]
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("query-exact", ok, request{path: "/query-exact?tier=free"}), at("query-exact", over, request{path: "/query-exact?a=b&tier=free"}), at("query-exact", ok, request{path: "/query-exact?tier=paid"})}},
		{name: "query parameter Distinct", yaml: simple("query-distinct", `- clientSelectors:
    - queryParams: [{type: Distinct, name: user}]
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("query-distinct", ok, request{path: "/query-distinct?user=a"}), at("query-distinct", over, request{path: "/query-distinct?user=a"}),
				at("query-distinct", ok, request{path: "/query-distinct?user=b"}), at("query-distinct", ok, request{path: "/query-distinct"})}},
		{name: "query parameter regex inverted", yaml: simple("query-regex-invert", `- clientSelectors:
    - queryParams: [{type: RegularExpression, name: v, value: "beta-.*", invert: true}]
  limit: {requests: 1, unit: Hour}`),
			steps: []step{at("query-regex-invert", ok, request{path: "/query-regex-invert?v=stable"}), at("query-regex-invert", over, request{path: "/query-regex-invert?v=old"}),
				at("query-regex-invert", ok, request{path: "/query-regex-invert?v=beta-2"})}},
		{name: "Week unit", yaml: simple("week", "- limit: {requests: 2, unit: Week}"), steps: steps("week", ok, ok, over)},
		{name: "route-level policy (sectionName)",
			yaml: httpRoute("section", rule{name: "limited", path: "/section/limited"}, rule{name: "free", path: "/section/free"}) + "---\n" +
				policy("section", "limited", "- limit: {requests: 1, unit: Hour}", "section"),
			steps: []step{at("section", ok, request{}), at("section", over, request{}), {route: "section", rule: 1, want: ok}, {route: "section", rule: 1, want: ok}}},
		{name: "two rules on one route", yaml: simple("two-rules", `- clientSelectors:
    - headers: [{name: x-a, value: "1"}]
  limit: {requests: 1, unit: Hour}
- limit: {requests: 3, unit: Hour}`),
			steps: []step{at("two-rules", ok, request{}), at("two-rules", ok, request{}), at("two-rules", ok, header("x-a", "1")), at("two-rules", over, request{}), at("two-rules", over, header("x-a", "1"))}},
		{name: "shadow mode", yaml: simple("shadow", "- limit: {requests: 1, unit: Hour}\n  shadowMode: true"), steps: steps("shadow", ok, ok, ok)},
		{name: "limit.fromMetadata", yaml: simple("from-metadata", `- limit:
    requests: 100
    unit: Hour
    fromMetadata: {namespace: io.example.limits, key: tier}`),
			steps: []step{
				at("from-metadata", ok, request{metadata: md("io.example.limits", "tier", map[string]any{"requests_per_unit": 2, "unit": "HOUR"})}),
				at("from-metadata", ok, request{metadata: md("io.example.limits", "tier", map[string]any{"requests_per_unit": 2, "unit": "HOUR"})}),
				at("from-metadata", over, request{metadata: md("io.example.limits", "tier", map[string]any{"requests_per_unit": 2, "unit": "HOUR"})}),
				at("from-metadata", ok, request{})}},
		{name: "70 rules on one route (70 descriptors in one request)", yaml: simple("rules70", rules70.String()), steps: steps("rules70", ok, ok, over)},
		{name: "HTTPRoute name of 245 characters (descriptor key of 270 bytes)", yaml: simple(longRoute, "- limit: {requests: 1, unit: Hour}"), steps: steps(longRoute, ok, over)},
		{name: "32 header matches in one rule (33 levels)", yaml: simple("headers32", "- clientSelectors:\n    - headers:\n"+strings.Join(big32, "\n")+"\n  limit: {requests: 1, unit: Hour}"),
			steps: []step{at("headers32", ok, header(big32req...)), at("headers32", over, header(big32req...)), at("headers32", ok, header(big32req[:62]...))}},
		{name: "shared policy named with 250 characters (long domain)",
			yaml:  httpRoute("long-domain", rule{path: "/long-domain"}) + "---\n" + policy(longPolicy, "", "- limit: {requests: 1, unit: Hour}\n  shared: true", "long-domain"),
			steps: steps("long-domain", ok, over)},
	}
}

// badPolicy is a policy EG cannot translate (a sourceCIDR that is no
// CIDR) on a route of its own: it must not hold up any other.
var badPolicy = simple("bad", `- clientSelectors:
    - sourceCIDR: {type: Exact, value: not-a-cidr}
  limit: {requests: 1, unit: Hour}`)
