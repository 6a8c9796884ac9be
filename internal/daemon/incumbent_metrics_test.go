package daemon_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// incumbentConfig has a rule of each shape whose incumbent stat key
// differs: one level, two levels, shadow, block, detailed_metric, a key
// with ':' and one only denied by another descriptor.
const incumbentConfig = `domain: api
descriptors:
  - {key: client, rate_limit: {unit: hour, requests_per_unit: 5}}
  - key: route
    value: r1
    descriptors:
      - {key: user, rate_limit: {unit: hour, requests_per_unit: 2}}
  - {key: shadow, shadow_mode: true, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: blocked, rate_limit: {unit: hour, requests_per_unit: 0}}
  - {key: ip, detailed_metric: true, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: "a:b", rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: other, rate_limit: {unit: hour, requests_per_unit: 5}}
`

// scrape returns every sample of the text exposition at url, by its name
// and labels as written ("name{a=\"1\"}").
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	code, body := servertest.Get(t, url)
	if code != 200 {
		t.Fatalf("GET %s = %d", url, code)
	}
	samples := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		samples[line[:i]] = v
	}
	return samples
}

// TestIncumbentMetrics: a known sequence of ShouldRateLimit calls through
// the daemon's gRPC server gives envoyproxy/ratelimit's metric names, label
// sets and values (each computed by its base_limiter.go's rules, in the
// comments) on MetricsAddr, beside ratelimitd's own; without
// IncumbentMetrics there are none.
func TestIncumbentMetrics(t *testing.T) {
	r := run(t, daemon.Config{IncumbentMetrics: true, MetricsAddr: "127.0.0.1:0"}, incumbentConfig)
	rls := rlsv3.NewRateLimitServiceClient(r.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := func(hits uint64, kv ...string) *ratelimitv3.RateLimitDescriptor {
		desc := servertest.Desc(kv...)
		if hits > 0 {
			desc.HitsAddend = wrapperspb.UInt64(hits)
		}
		return desc
	}
	calls := []*rlsv3.RateLimitRequest{
		// client, limit 5, near threshold floor(5 × 0.8) = 4: four within,
		// the fifth within and near, the sixth over.
		servertest.Request("api", d(0, "client", "x")),
		servertest.Request("api", d(0, "client", "x")),
		servertest.Request("api", d(0, "client", "x")),
		servertest.Request("api", d(0, "client", "x")),
		servertest.Request("api", d(0, "client", "x")),
		servertest.Request("api", d(0, "client", "x")),
		// route_r1.user, limit 2, threshold 1: 3 hits at once are all over
		// (a token bucket takes none of them); then 2 hits within, near
		// by 2 − max(0, 1) = 1.
		servertest.Request("api", d(3, "route", "r1", "user", "u")),
		servertest.Request("api", d(2, "route", "r1", "user", "u")),
		// shadow, limit 1, threshold 0: within and near, then over and
		// shadow_mode (admitted).
		servertest.Request("api", d(0, "shadow", "x")),
		servertest.Request("api", d(0, "shadow", "x")),
		// ip, detailed_metric: the request's value, IPv4 dots sanitized.
		servertest.Request("api", d(0, "ip", "10.0.0.1")),
		servertest.Request("api", d(4, "a:b", "v")),
		// blocked denies; other, within its limit, was denied by it: the
		// incumbent counts it within_limit all the same.
		servertest.Request("api", d(0, "other", "y"), d(0, "blocked", "x")),
		// No rule: nothing.
		servertest.Request("api", d(0, "nothing", "x")),
		// No domain: a service_error.
		servertest.Request("", d(0, "client", "x")),
	}
	for i, c := range calls {
		_, err := rls.ShouldRateLimit(ctx, c)
		if (err != nil) != (c.GetDomain() == "") {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	got := scrape(t, "http://"+r.d.MetricsAddr().String()+"/metrics")
	type stats struct{ total, within, near, over, shadow float64 }
	want := map[string]stats{
		`domain="api",key1="client"`:               {6, 5, 1, 1, 0},
		`domain="api",key1="route_r1",key2="user"`: {5, 2, 1, 3, 0},
		`domain="api",key1="shadow"`:               {2, 1, 1, 1, 1},
		`domain="api",key1="ip_10_0_0_1"`:          {1, 1, 0, 0, 0},
		`domain="api",key1="a_b"`:                  {4, 4, 0, 0, 0},
		`domain="api",key1="blocked"`:              {1, 0, 0, 1, 0},
		`domain="api",key1="other"`:                {1, 1, 0, 0, 0},
	}
	series := 0
	for name := range got {
		if strings.HasPrefix(name, "ratelimit_service_rate_limit_total_hits{") {
			series++
		}
	}
	if series != len(want) {
		t.Errorf("%d total_hits series, want %d", series, len(want))
	}
	for labels, w := range want {
		for stat, v := range map[string]float64{"total_hits": w.total, "within_limit": w.within, "near_limit": w.near, "over_limit": w.over, "shadow_mode": w.shadow} {
			name := "ratelimit_service_rate_limit_" + stat + "{" + labels + "}"
			if g, ok := got[name]; !ok || g != v {
				t.Errorf("%s = %v (present %v), want %v", name, g, ok, v)
			}
		}
	}
	n := float64(len(calls))
	for name, v := range map[string]float64{
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`:                   n,
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}`:      n,
		`ratelimit_service_should_rate_limit_error{err_type="service_error"}`:               1,
		`ratelimit_service_should_rate_limit_error{err_type="redis_error"}`:                 0,
		`ratelimit_service_config_load_success`:                                             1,
		`ratelimit_service_config_load_error`:                                               0,
		`ratelimitd_descriptor_hits_total{domain="api",rule="api > client",value=""}`:       6,
		`ratelimitd_descriptor_over_limit_total{domain="api",rule="api > client",value=""}`: 1,
	} {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, v)
		}
	}

	off := run(t, daemon.Config{}, incumbentConfig)
	if _, err := rlsv3.NewRateLimitServiceClient(off.conn).ShouldRateLimit(ctx, calls[0]); err != nil {
		t.Fatal(err)
	}
	for name := range scrape(t, "http://"+off.d.HTTPAddr().String()+"/metrics") {
		if strings.HasPrefix(name, "ratelimit_service_") {
			t.Errorf("without IncumbentMetrics: %s is exported", name)
			break
		}
	}
}
