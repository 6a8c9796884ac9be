package xdstest

import (
	"fmt"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// The node ids and domain the two control planes use.
const (
	// EGNodeID is the node id Envoy Gateway sets its rate-limit snapshot
	// for (internal/globalratelimit/runner/runner.go@d32f282942).
	EGNodeID = "envoy-ratelimit"
	// AIGatewayNodeID and AIGatewayDomain are Envoy AI Gateway's
	// (internal/ratelimit/runner/runner.go@c217da8a5).
	AIGatewayNodeID = "envoy-ai-gateway-ratelimit"
	AIGatewayDomain = "ai-gateway-quota"
)

// EGConfig is a RateLimitConfig shaped like the output of Envoy Gateway's
// translator (internal/xds/translator/ratelimit.go) for one listener
// (the domain) with one route that has four global rules. Under the top
// descriptor key=value=route:
//
//	rule-0-match-0=rule-0-match-0                   10 per minute   (a header with an exact value)
//	rule-1-match-0 (key only)                        5 per second   (a "Distinct" header: one bucket per value)
//	rule-2-match--1=rule-2-match--1                  0 per hour     (match everything; requests: 0 blocks)
//	rule-3-match-0=rule-3-match-0 >
//	  rule-3-match-1=rule-3-match-1               1000 per week     (two matches chained)
//
// The limit is on the leaf only, and shadow_mode, when set, is on every
// level, as EG copies it down. Envoy sends, for rule 0, the entries
// [route=route, rule-0-match-0=rule-0-match-0].
func EGConfig(domain, route string, shadow bool) *rlsconfv3.RateLimitConfig {
	leaf := func(key, value string, n uint32, unit rlsconfv3.RateLimitUnit) *rlsconfv3.RateLimitDescriptor {
		return &rlsconfv3.RateLimitDescriptor{
			Key: key, Value: value, ShadowMode: shadow,
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n},
		}
	}
	return &rlsconfv3.RateLimitConfig{
		Name:   domain,
		Domain: domain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: route, Value: route, ShadowMode: shadow,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{
				leaf("rule-0-match-0", "rule-0-match-0", 10, rlsconfv3.RateLimitUnit_MINUTE),
				leaf("rule-1-match-0", "", 5, rlsconfv3.RateLimitUnit_SECOND),
				leaf("rule-2-match--1", "rule-2-match--1", 0, rlsconfv3.RateLimitUnit_HOUR),
				{
					Key: "rule-3-match-0", Value: "rule-3-match-0", ShadowMode: shadow,
					Descriptors: []*rlsconfv3.RateLimitDescriptor{
						leaf("rule-3-match-1", "rule-3-match-1", 1000, rlsconfv3.RateLimitUnit_WEEK),
					},
				},
			},
		}},
	}
}

// AIGatewayConfig is a RateLimitConfig shaped like Envoy AI Gateway's
// QuotaPolicy translation (internal/ratelimit/translator/translator.go@c217da8a5):
// domain AIGatewayDomain, quota_mode on every level, and
//
//	backend_name=default/openai > model_name_override=gpt-4o           1000 per minute
//	backend_name=default/openai > model_name_override=gpt-4o >
//	  rule-0-x-tenant|acme-match-0=rule-0-x-tenant|acme-match-0          100 per minute
//	backend_name=default/azure  > model_name_override=gpt-4o            500 per hour
//
// Each backend level carries metadata {"backend": <name>, "priority": n}
// so that converters can be tested with a Struct.
func AIGatewayConfig() *rlsconfv3.RateLimitConfig {
	backend := func(name string, priority float64, model string, n uint32, unit rlsconfv3.RateLimitUnit, client *rlsconfv3.RateLimitDescriptor) *rlsconfv3.RateLimitDescriptor {
		md := &structpb.Struct{Fields: map[string]*structpb.Value{
			"backend":  structpb.NewStringValue(name),
			"priority": structpb.NewNumberValue(priority),
		}}
		m := &rlsconfv3.RateLimitDescriptor{
			Key: "model_name_override", Value: model, QuotaMode: true,
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n},
		}
		if client != nil {
			m.Descriptors = []*rlsconfv3.RateLimitDescriptor{client}
		}
		return &rlsconfv3.RateLimitDescriptor{
			Key: "backend_name", Value: name, QuotaMode: true, Metadata: md,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{m},
		}
	}
	const bucket = "rule-0-x-tenant|acme-match-0"
	client := &rlsconfv3.RateLimitDescriptor{
		Key: bucket, Value: bucket, QuotaMode: true,
		RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 100},
	}
	return &rlsconfv3.RateLimitConfig{
		Name:   AIGatewayDomain,
		Domain: AIGatewayDomain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{
			backend("default/openai", 1, "gpt-4o", 1000, rlsconfv3.RateLimitUnit_MINUTE, client),
			backend("default/azure", 2, "gpt-4o", 500, rlsconfv3.RateLimitUnit_HOUR, nil),
		},
	}
}

// EGRouteKey is the descriptor key (and value) Envoy Gateway v1.9.1 gives
// the non-shared rules of one route match on one hostname: the IR route's
// name, "httproute/<ns>/<route>/rule/<r>/match/<m>/<hostname with '_' for
// '.'>" (internal/gatewayapi/helpers.go irRouteName and route.go, both at
// v1.9.1).
func EGRouteKey(namespace, route string, rule, match int, hostname string) string {
	return fmt.Sprintf("httproute/%s/%s/rule/%d/match/%d/%s", namespace, route, rule, match, strings.ReplaceAll(hostname, ".", "_"))
}

// EGRoutes is the RateLimitConfig Envoy Gateway's translator makes for a
// listener (the domain) with routes HTTPRoutes in namespace "default",
// named route-0, route-1, … (each padded with 'x' to nameLen bytes when
// longer), each with hosts hostnames and matches matches in its one rule,
// under one policy whose one rule matches all traffic, 10 per minute:
// routes × hosts × matches descriptors, each
//
//	<EGRouteKey>=<EGRouteKey> > rule-0-match--1=rule-0-match--1
//
// (internal/xds/translator/ratelimit.go@v1.9.1,
// buildRateLimitServiceDescriptors and addRateLimitDescriptor).
func EGRoutes(domain string, routes, hosts, matches, nameLen int) *rlsconfv3.RateLimitConfig {
	rc := &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain}
	for r := range routes {
		name := fmt.Sprintf("route-%d", r)
		if len(name) < nameLen {
			name += strings.Repeat("x", nameLen-len(name))
		}
		for h := range hosts {
			for m := range matches {
				key := EGRouteKey("default", name, 0, m, fmt.Sprintf("h%d.example.com", h))
				rc.Descriptors = append(rc.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: key, Value: key,
					Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "rule-0-match--1", Value: "rule-0-match--1",
						RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 10}}}})
			}
		}
	}
	return rc
}

// EGHeaderChain is the RateLimitConfig Envoy Gateway makes for one route
// key whose one rule has headers exact header matches: a chain of headers
// levels, rule-0-match-0 … rule-0-match-<headers-1>, under the route's,
// the last with 5 per second. Envoy sends the descriptor EGHeaderEntries.
func EGHeaderChain(domain, routeKey string, headers int) *rlsconfv3.RateLimitConfig {
	top := &rlsconfv3.RateLimitDescriptor{Key: routeKey, Value: routeKey}
	cur := top
	for i := range headers {
		k := fmt.Sprintf("rule-0-match-%d", i)
		d := &rlsconfv3.RateLimitDescriptor{Key: k, Value: k}
		cur.Descriptors = []*rlsconfv3.RateLimitDescriptor{d}
		cur = d
	}
	cur.RateLimit = &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 5}
	return &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{top}}
}

// EGHeaderEntries are the entries, as key and value pairs, of the
// descriptor Envoy sends for EGHeaderChain's rule when every header
// matches.
func EGHeaderEntries(routeKey string, headers int) []string {
	kv := []string{routeKey, routeKey}
	for i := range headers {
		k := fmt.Sprintf("rule-0-match-%d", i)
		kv = append(kv, k, k)
	}
	return kv
}
