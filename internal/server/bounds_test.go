package server_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/xdsconfig"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

// egSet loads resources as the xDS client does: converted to descriptor
// files, then parsed.
func egSet(t testing.TB, rcs ...*rlsconfv3.RateLimitConfig) *config.Set {
	t.Helper()
	files, err := xdsconfig.Files(rcs)
	if err != nil {
		t.Fatalf("convert: %v", err)
	}
	set, err := config.Parse(files)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return set
}

// enforced calls req until it is denied and returns how many calls were
// admitted first; every admitted answer must name a limit per descriptor.
func enforced(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, most int) int {
	t.Helper()
	for i := range most + 1 {
		resp, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			return i
		}
		for j, st := range resp.GetStatuses() {
			if st.GetCurrentLimit() == nil {
				t.Fatalf("call %d: status %d has no current_limit: no rule matched", i+1, j)
			}
		}
	}
	return most + 1
}

// TestEnvoyGatewayShapesAreEnforced: requests Envoy sends for configs
// Envoy Gateway v1.9.1 accepts, beyond the bounds of before (64
// descriptors, 256-byte keys and domains, 32 levels), are answered and
// limited as the config says under the default RequestLimits; one past
// each default is INVALID_ARGUMENT.
func TestEnvoyGatewayShapesAreEnforced(t *testing.T) {
	const domain = "default/eg/http"
	// A route with 70 rules (EG allows 256 a policy): 70 descriptors.
	route := xdstest.EGRouteKey("default", "backend", 0, 0, "www.example.com")
	many := &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: route, Value: route}}}
	var manyReq []*ratelimitv3.RateLimitDescriptor
	for i := range 70 {
		k := fmt.Sprintf("rule-%d-match--1", i)
		many.Descriptors[0].Descriptors = append(many.Descriptors[0].Descriptors, &rlsconfv3.RateLimitDescriptor{Key: k, Value: k,
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 3}})
		manyReq = append(manyReq, desc(route, route, k, k))
	}
	// An HTTPRoute named with 253 bytes: a 300-byte key and more.
	longRoute := xdstest.EGRouteKey("default", strings.Repeat("r", 253), 0, 0, "www.example.com")
	// A shared policy named with 292 bytes: a 300-byte domain.
	longDomain := "default/" + strings.Repeat("p", 292)
	// 32 header matches in one rule: 33 levels.
	deepRoute := xdstest.EGRouteKey("default", "deep", 0, 0, "www.example.com")
	set := egSet(t, many,
		xdstest.EGHeaderChain("keys", longRoute, 1),
		xdstest.EGHeaderChain(longDomain, route, 1),
		xdstest.EGHeaderChain("deep", deepRoute, 32))
	c, _ := startServer(t, server.Options{}, set)

	for _, tt := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want int // calls admitted before the first denial
	}{
		{"70 descriptors", request(domain, manyReq...), 3},
		{fmt.Sprintf("a %d-byte key", len(longRoute)), request("keys", desc(xdstest.EGHeaderEntries(longRoute, 1)...)), 5},
		{fmt.Sprintf("a %d-byte domain", len(longDomain)), request(longDomain, desc(xdstest.EGHeaderEntries(route, 1)...)), 5},
		{"33 levels", request("deep", desc(xdstest.EGHeaderEntries(deepRoute, 32)...)), 5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := enforced(t, c, tt.req, 10); got != tt.want {
				t.Errorf("admitted %d calls before the first denial, want %d", got, tt.want)
			}
		})
	}
	if len(longRoute) <= 300 || len(longDomain) != 300 {
		t.Fatalf("key of %d bytes, domain of %d: want more than 300 and 300", len(longRoute), len(longDomain))
	}

	def := server.DefaultRequestLimits()
	tooMany := make([]*ratelimitv3.RateLimitDescriptor, def.MaxDescriptors+1)
	for i := range tooMany {
		tooMany[i] = desc("k", "v")
	}
	deep := make([]string, 0, 2*(def.MaxEntries+1))
	for range def.MaxEntries + 1 {
		deep = append(deep, "k", "v")
	}
	for _, tt := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"descriptors", request(domain, tooMany...), fmt.Sprintf("%d descriptors, more than the %d allowed", def.MaxDescriptors+1, def.MaxDescriptors)},
		{"key", request(domain, desc(strings.Repeat("k", def.MaxKeyBytes+1), "v")), fmt.Sprintf("is %d bytes, more than the %d allowed", def.MaxKeyBytes+1, def.MaxKeyBytes)},
		{"domain", request(strings.Repeat("d", def.MaxDomainBytes+1), desc("k", "v")), fmt.Sprintf("domain is %d bytes, more than the %d allowed", def.MaxDomainBytes+1, def.MaxDomainBytes)},
		{"entries", request(domain, desc(deep...)), fmt.Sprintf("has %d entries, more than the %d allowed", def.MaxEntries+1, def.MaxEntries)},
	} {
		t.Run("one past the "+tt.name, func(t *testing.T) {
			_, err := c.ShouldRateLimit(context.Background(), tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Errorf("ShouldRateLimit = %v, want InvalidArgument containing %q", err, tt.want)
			}
		})
	}
}

// TestSixteenThousandDescriptors: Envoy Gateway's listener domain for 8
// HTTPRoutes × 16 hostnames × 127 matches under one policy (16,256
// descriptors, which the bounds of before refused) loads from its xDS
// resource and every route is answered and limited.
func TestSixteenThousandDescriptors(t *testing.T) {
	const domain = "default/eg/http"
	rc := xdstest.EGRoutes(domain, 8, 16, 127, 0)
	if n := len(rc.GetDescriptors()); n != 16256 {
		t.Fatalf("%d descriptors, want 16,256", n)
	}
	set := egSet(t, rc)
	if n := len(set.Domains()[0].Rules); n != 16256 {
		t.Fatalf("%d rules loaded, want 16,256", n)
	}
	c, _ := startServer(t, server.Options{}, set)
	for _, key := range []string{
		xdstest.EGRouteKey("default", "route-0", 0, 0, "h0.example.com"),
		xdstest.EGRouteKey("default", "route-7", 0, 126, "h15.example.com"),
	} {
		req := request(domain, desc(key, key, "rule-0-match--1", "rule-0-match--1"))
		if got := enforced(t, c, req, 20); got != 10 {
			t.Errorf("%s: admitted %d calls before the first denial, want 10", key, got)
		}
	}
}

// codeAndError is c's domain, code and error.
func codeAndError(c server.Call) server.Call {
	return server.Call{Domain: strings.Clone(c.Domain), Code: c.Code, Err: c.Err}
}

// TestRefusedDomainIsUnavailable: a call for a domain whose config its
// source refused, with no older version of it in force, is answered
// UNAVAILABLE (Envoy's failure_mode_deny decides), counted as a call
// without config; a domain nobody configured still passes.
func TestRefusedDomainIsUnavailable(t *testing.T) {
	obs := &recorder[server.Call]{keep: codeAndError}
	set := server.MustParse(t, testConfig).WithRefused(map[string]string{"bad": "xds:bad:4:15: bad > k: rate_limit.unit: unknown unit"})
	c, _ := startServer(t, server.Options{Observer: obs}, set)
	_, err := c.ShouldRateLimit(context.Background(), request("bad", desc("k", "v")))
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), `domain "bad": its rate limit configuration was refused: xds:bad:4:15`) {
		t.Errorf("call for the refused domain = %v, want Unavailable naming the refusal", err)
	}
	if resp, err := c.ShouldRateLimit(context.Background(), request("nobody", desc("k", "v"))); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("call for an unknown domain = %v, %v; want OK", resp.GetOverallCode(), err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	var refused *server.RefusedDomainError
	if len(obs.calls) != 2 || !errors.Is(obs.calls[0].Err, server.ErrNoConfig) || !errors.As(obs.calls[0].Err, &refused) || refused.Domain != "bad" {
		t.Errorf("observed %+v, want the first call's error to be a RefusedDomainError and ErrNoConfig", obs.calls)
	}
}
