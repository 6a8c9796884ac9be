package metrics_test

import (
	"context"
	"strconv"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// incumbentKeysConfig has rules whose incumbent stat keys need each rule
// of their making: nested levels, key-only levels, wildcard values kept,
// quoted path parts, ':' and '|' replaced, IPv4 dots replaced, a domain
// with a dot, and a detailed_metric rule.
const incumbentKeysConfig = `domain: api
descriptors:
  - key: route
    value: r1
    descriptors:
      - key: user
        descriptors:
          - {key: plan, value: free, rate_limit: {unit: hour, requests_per_unit: 100}}
  - {key: path, value: "/v1/*", rate_limit: {unit: hour, requests_per_unit: 100}}
  - {key: "x y", value: "a=b", rate_limit: {unit: hour, requests_per_unit: 100}}
  - {key: "k|1", value: "c:d", rate_limit: {unit: hour, requests_per_unit: 100}}
  - {key: masked_remote_address, value: 10.1.2.3/32, rate_limit: {unit: hour, requests_per_unit: 100}}
  - {key: ip, detailed_metric: true, rate_limit: {unit: hour, requests_per_unit: 100}}
  - {key: model, value_to_metric: true, rate_limit: {unit: hour, requests_per_unit: 100}}
  - {key: tier, value: "pro*", value_to_metric: true, rate_limit: {unit: hour, requests_per_unit: 100}}
`

// incumbentKeysServer returns metrics of opts and a server observed by
// them, both with incumbentKeysConfig loaded.
func incumbentKeysServer(t *testing.T, opts metrics.Options) (*metrics.Metrics, *server.Server) {
	t.Helper()
	m := newMetrics(t, opts)
	srv := newServerWithoutConfig(t, m)
	set := mustParse(t, incumbentKeysConfig)
	m.ConfigLoaded(set)
	srv.SetConfig(set)
	return m, srv
}

// TestIncumbentStatKeys: each rule's series has the labels the incumbent's
// mapper gives its stat key.
func TestIncumbentStatKeys(t *testing.T) {
	m, srv := incumbentKeysServer(t, metrics.Options{IncumbentNames: true, MaxValuesPerRule: 2})
	tests := []struct {
		req    *rlsv3.RateLimitRequest
		labels map[string]string
	}{
		// Three levels: the third is dropped, as the mapper's regex does.
		{request("api", []string{"route", "r1", "user", "u1", "plan", "free"}), map[string]string{"domain": "api", "key1": "route_r1", "key2": "user"}},
		{request("api", []string{"path", "/v1/users"}), map[string]string{"domain": "api", "key1": "path_/v1/*"}},
		{request("api", []string{"x y", "a=b"}), map[string]string{"domain": "api", "key1": "x y_a=b"}},
		{request("api", []string{"k|1", "c:d"}), map[string]string{"domain": "api", "key1": "k_1_c_d"}},
		{request("api", []string{"masked_remote_address", "10.1.2.3/32"}), map[string]string{"domain": "api", "key1": "masked_remote_address_10_1_2_3/32"}},
		// detailed_metric: the request's value, up to MaxValuesPerRule
		// values; the third counts on the rule's own key.
		{request("api", []string{"ip", "a"}), map[string]string{"domain": "api", "key1": "ip_a"}},
		{request("api", []string{"ip", "b"}), map[string]string{"domain": "api", "key1": "ip_b"}},
		{request("api", []string{"ip", "c"}), map[string]string{"domain": "api", "key1": "ip"}},
		// value_to_metric: the request's value at a key-only or wildcard
		// level (config.Rule.StatKey).
		{request("api", []string{"model", "gpt-4o"}), map[string]string{"domain": "api", "key1": "model_gpt-4o"}},
		{request("api", []string{"tier", "pro-x"}), map[string]string{"domain": "api", "key1": "tier_pro-x"}},
	}
	for _, tt := range tests {
		if _, err := srv.ShouldRateLimit(context.Background(), tt.req); err != nil {
			t.Fatal(err)
		}
		if got, ok := value(t, m.Registry(), "ratelimit_service_rate_limit_total_hits", tt.labels); !ok || got != 1 {
			t.Errorf("%v: total_hits%v = %v (present %v), want 1", tt.req.GetDescriptors()[0].GetEntries(), tt.labels, got, ok)
		}
	}
}

// TestIncumbentOverrideAndDottedDomain: a limit override is named by the
// request's entries (key alone for an empty value); a domain with a dot
// shifts the labels, as the mapper splits the stat key at every dot.
func TestIncumbentOverrideAndDottedDomain(t *testing.T) {
	m := newMetrics(t, metrics.Options{IncumbentNames: true})
	srv := newServerWithoutConfig(t, m)
	// An override applies only in a domain the config has (as in the
	// incumbent): api has a file, with no rule for tenant.
	set, err := config.Parse([]config.File{
		{Name: "eg.yaml", Data: []byte("domain: eg.listener\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 1}}\n")},
		{Name: "api.yaml", Data: []byte("domain: api\ndescriptors:\n  - {key: other, rate_limit: {unit: hour, requests_per_unit: 1}}\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	m.ConfigLoaded(set)
	srv.SetConfig(set)
	over := request("api", []string{"tenant", "t1", "plain", ""})
	over.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	for _, req := range []*rlsv3.RateLimitRequest{over, over, request("eg.listener", []string{"k", "v"})} {
		if _, err := srv.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ratelimit_service_rate_limit_total_hits", map[string]string{"domain": "api", "key1": "tenant_t1", "key2": "plain"}, 2},
		{"ratelimit_service_rate_limit_over_limit", map[string]string{"domain": "api", "key1": "tenant_t1", "key2": "plain"}, 1},
		{"ratelimit_service_rate_limit_total_hits", map[string]string{"domain": "eg", "key1": "listener", "key2": "k"}, 1},
		{"ratelimit_service_config_load_success", nil, 1},
	} {
		if got, ok := value(t, m.Registry(), tt.name, tt.labels); !ok || got != tt.want {
			t.Errorf("%s%v = %v (present %v), want %v", tt.name, tt.labels, got, ok, tt.want)
		}
	}
	m.ConfigRejected(nil)
	if got, _ := value(t, m.Registry(), "ratelimit_service_config_load_error", nil); got != 1 {
		t.Errorf("config_load_error = %v after a rejected reload, want 1", got)
	}
}

// TestIncumbentNearLimit: near_limit counts the hits of admitted calls
// past floor(limit × ratio), computed in float32 as the incumbent does.
func TestIncumbentNearLimit(t *testing.T) {
	tests := []struct {
		ratio    float64
		limit    int
		calls    int
		wantNear float64
	}{
		{0.8, 10, 10, 2}, // floor(8.0000001) = 8: calls 9 and 10
		{0.8, 5, 5, 1},   // floor(4.0000001) = 4: call 5
		{0.5, 3, 3, 2},   // floor(1.5) = 1: calls 2 and 3
		{1, 4, 4, 0},     // no near threshold below the limit
	}
	for _, tt := range tests {
		m := newMetrics(t, metrics.Options{IncumbentNames: true, NearLimitRatio: tt.ratio})
		srv := newServerWithoutConfig(t, m)
		set := mustParse(t, "domain: api\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: "+strconv.Itoa(tt.limit)+"}}\n")
		m.ConfigLoaded(set)
		srv.SetConfig(set)
		for range tt.calls {
			if _, err := srv.ShouldRateLimit(context.Background(), request("api", []string{"k", "v"})); err != nil {
				t.Fatal(err)
			}
		}
		labels := map[string]string{"domain": "api", "key1": "k"}
		if got, _ := value(t, m.Registry(), "ratelimit_service_rate_limit_near_limit", labels); got != tt.wantNear {
			t.Errorf("ratio %v, limit %d, %d calls: near_limit = %v, want %v", tt.ratio, tt.limit, tt.calls, got, tt.wantNear)
		}
		if got, _ := value(t, m.Registry(), "ratelimit_service_rate_limit_within_limit", labels); got != float64(tt.calls) {
			t.Errorf("ratio %v: within_limit = %v, want %d", tt.ratio, got, tt.calls)
		}
	}
}
