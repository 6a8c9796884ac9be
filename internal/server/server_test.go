package server_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

const testConfig = `
domain: api
descriptors:
  - key: model
    value: gpt-4o
    rate_limit: {unit: minute, requests_per_unit: 5, name: gpt-4o}
  - key: model
    rate_limit: {unit: second, requests_per_unit: 10, burst: 20}
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-client}
  - key: internal
    rate_limit: {unlimited: true}
  - key: shadow
    rate_limit: {unit: minute, requests_per_unit: 1, name: shadowed}
    shadow_mode: true
  - key: plan
    value: free
    rate_limit: {unit: hour, requests_per_unit: 1, name: free-plan}
  - key: plan
    value: trial
    rate_limit: {unit: hour, requests_per_unit: 100, name: trial-plan, unit_multiplier: 2}
    replaces: [{name: free-plan}]
  - key: ip
    value: 10.0.0.66
    rate_limit: {unit: minute, requests_per_unit: 0, name: blocked}
  - key: usage
    rate_limit: {unit: minute, requests_per_unit: 100, overdraft: {max_debt: 1000}, name: post-paid}
`

// startServer runs a Server behind a real gRPC server on a loopback port
// and returns a client built from the go-control-plane types.
func startServer(t testing.TB, opts server.Options, set *config.Set) (rlsv3.RateLimitServiceClient, *server.Server) {
	t.Helper()
	if opts.Store == nil {
		opts.Store = limiter.NewMemoryStore(limiter.MemoryOptions{})
	}
	srv, err := server.New(opts)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	if set != nil {
		srv.SetConfig(set)
	}
	return servertest.Start(t, servertest.Options{RateLimit: srv, ServerOptions: []grpc.ServerOption{server.Codec()}}).Client(), srv
}

// backends are the stores the tests that hold both to one table run on:
// memory, and redisStore's.
func backends(t *testing.T) map[string]func(t *testing.T) limiter.Store {
	return map[string]func(t *testing.T) limiter.Store{
		"memory": func(t *testing.T) limiter.Store { return limiter.NewMemoryStore(limiter.MemoryOptions{}) },
		"redis":  func(t *testing.T) limiter.Store { return redisStore(t) },
	}
}

// redisStore is a store (and lease store) on a redis-server of the test's
// own, deciding at the test's clock (CallerClock), closed when the test
// ends.
func redisStore(t *testing.T) *redisstore.Store {
	t.Helper()
	st, err := redisstore.New(redistest.Start(t).Client(), redisstore.Options{Prefix: t.Name() + ":", Clock: redisstore.CallerClock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// startTestConfig runs startServer's server on the memory store, serving
// testConfig on a fake clock that stands still, and returns its client.
func startTestConfig(t testing.TB) rlsv3.RateLimitServiceClient {
	t.Helper()
	c, _ := startServer(t, server.Options{Now: clocktest.New().Now}, server.MustParse(t, testConfig))
	return c
}

// desc is servertest.Desc, short for the tables here.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor { return servertest.Desc(kv...) }

func withHits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// overridePerHour is d with Envoy's limit override of n requests an hour.
func overridePerHour(d *ratelimitv3.RateLimitDescriptor, n uint32) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_HOUR}
	return d
}

// request is servertest.Request, short for the tables here.
func request(domain string, descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return servertest.Request(domain, descs...)
}

func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == name {
			return h.GetValue()
		}
	}
	return ""
}

func call(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
		t.Fatalf("ShouldRateLimit gave %d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
	}
	return resp
}

func TestFivePerMinuteCountsDownThenDenies(t *testing.T) {
	clk := clocktest.New()
	c, _ := startServer(t, server.Options{Now: clk.Now}, server.MustParse(t, testConfig))
	req := request("api", desc("model", "gpt-4o"))
	for i, want := range []uint32{4, 3, 2, 1, 0} {
		resp := call(t, c, req)
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != want {
			t.Fatalf("call %d: overall %v, remaining %d; want OK, %d", i+1, resp.GetOverallCode(), st.GetLimitRemaining(), want)
		}
		cl := st.GetCurrentLimit()
		if cl.GetName() != "gpt-4o" || cl.GetRequestsPerUnit() != 5 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Errorf("call %d: current_limit = %v, want gpt-4o 5/MINUTE", i+1, cl)
		}
		if got, want := st.GetDurationUntilReset().AsDuration(), time.Duration(i+1)*12*time.Second; got != want {
			t.Errorf("call %d: duration_until_reset = %v, want %v (until full)", i+1, got, want)
		}
		if header(resp, "retry-after") != "" {
			t.Errorf("call %d: OK answer carries Retry-After", i+1)
		}
	}
	resp := call(t, c, req)
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("6th call: %v / %v, want OVER_LIMIT", resp.GetOverallCode(), st.GetCode())
	}
	if st.GetLimitRemaining() != 0 || st.GetDurationUntilReset().AsDuration() != 12*time.Second {
		t.Errorf("6th call: remaining %d, reset %v; want 0, 12s", st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
	}
	if got := header(resp, "retry-after"); got != "12" {
		t.Errorf("Retry-After = %q, want 12", got)
	}
	if got := header(resp, "cache-control"); got != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", got)
	}
	denied := resp.GetDynamicMetadata().GetFields()["ratelimitd.denied_by"].GetListValue().GetValues()
	if len(denied) != 1 || denied[0].GetStringValue() != "gpt-4o" {
		t.Errorf("dynamic metadata denied_by = %v, want [gpt-4o]", denied)
	}
	clk.Advance(11*time.Second + 500*time.Millisecond)
	resp = call(t, c, req)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || header(resp, "retry-after") != "1" {
		t.Errorf("at +11.5s: %v Retry-After %q, want OVER_LIMIT and 1 (rounded up)", resp.GetOverallCode(), header(resp, "retry-after"))
	}
	clk.Advance(500 * time.Millisecond)
	if resp := call(t, c, req); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("at +12s: %v, want OK", resp.GetOverallCode())
	}
}

func TestHitsAddend(t *testing.T) {
	// per-client: 2 per minute, burst 2.
	tests := []struct {
		name          string
		requestHits   uint32
		descHits      *uint64
		wantRemaining []uint32 // remaining after each of three calls
		wantCodes     []rlsv3.RateLimitResponse_Code
	}{
		{"request 0 means 1", 0, nil, []uint32{1, 0, 0}, codes3(ok, ok, over)},
		{"request 2 takes both", 2, nil, []uint32{0, 0, 0}, codes3(ok, over, over)},
		{"request 3 exceeds the burst", 3, nil, []uint32{0, 0, 0}, codes3(over, over, over)},
		{"descriptor 0 only checks", 5, ptr(uint64(0)), []uint32{2, 2, 2}, codes3(ok, ok, ok)},
		{"descriptor wins over request", 2, ptr(uint64(1)), []uint32{1, 0, 0}, codes3(ok, ok, over)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startTestConfig(t)
			for i := range 3 {
				d := desc("client", "bob")
				if tt.descHits != nil {
					d = withHits(d, *tt.descHits)
				}
				req := request("api", d)
				req.HitsAddend = tt.requestHits
				resp := call(t, c, req)
				st := resp.GetStatuses()[0]
				if st.GetCode() != tt.wantCodes[i] || st.GetLimitRemaining() != tt.wantRemaining[i] {
					t.Errorf("call %d: %v remaining %d, want %v remaining %d", i+1, st.GetCode(), st.GetLimitRemaining(), tt.wantCodes[i], tt.wantRemaining[i])
				}
			}
		})
	}
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func codes3(a, b, c rlsv3.RateLimitResponse_Code) []rlsv3.RateLimitResponse_Code {
	return []rlsv3.RateLimitResponse_Code{a, b, c}
}

func ptr[T any](v T) *T { return &v }

func TestDeniedRequestSpendsFromNoDescriptor(t *testing.T) {
	c := startTestConfig(t)
	// per-client allows 2; free-plan allows 1.
	both := request("api", desc("client", "ann"), desc("plan", "free"))
	if resp := call(t, c, both); resp.GetOverallCode() != ok {
		t.Fatalf("first call: %v, want OK", resp.GetOverallCode())
	}
	resp := call(t, c, both)
	if resp.GetOverallCode() != over || resp.GetStatuses()[0].GetCode() != ok || resp.GetStatuses()[1].GetCode() != over {
		t.Fatalf("second call: %v %v, want OVER_LIMIT with [OK, OVER_LIMIT]", resp.GetOverallCode(), resp.GetStatuses())
	}
	if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 1 {
		t.Errorf("second call: the admitted descriptor reports %d remaining, want 1 (not charged)", got)
	}
	// The client's bucket still has one token: the denied call took nothing.
	if resp := call(t, c, request("api", desc("client", "ann"))); resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Errorf("client alone: %v remaining %d, want OK remaining 0", resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining())
	}
}

func TestDescriptorsWithoutLimit(t *testing.T) {
	c := startTestConfig(t)
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"unknown domain", request("nope", desc("model", "gpt-4o"))},
		{"no rule", request("api", desc("color", "red"))},
		{"deeper than the tree", request("api", desc("model", "gpt-4o", "user", "x"))},
		{"unlimited", request("api", desc("internal", "batch"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 30 {
				resp := call(t, c, tt.req)
				st := resp.GetStatuses()[0]
				if resp.GetOverallCode() != ok || st.GetCode() != ok || st.GetCurrentLimit() != nil {
					t.Fatalf("%v: %v, status %v; want OK with no current_limit", tt.req, resp.GetOverallCode(), st)
				}
			}
		})
	}
}

func TestShadowModeNeverDenies(t *testing.T) {
	c := startTestConfig(t)
	req := request("api", desc("shadow", "x"))
	call(t, c, req)
	resp := call(t, c, req)
	if resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetCode() != ok {
		t.Fatalf("shadow rule over its limit: %v, want OK", resp.GetOverallCode())
	}
	if header(resp, "retry-after") != "" {
		t.Errorf("shadow denial carries Retry-After")
	}
	sd := resp.GetDynamicMetadata().GetFields()["ratelimitd.shadow_denied"].GetListValue().GetValues()
	if len(sd) != 1 || sd[0].GetStringValue() != "shadowed" {
		t.Errorf("shadow_denied metadata = %v, want [shadowed]", sd)
	}
}

func TestReplaces(t *testing.T) {
	c := startTestConfig(t)
	// trial-plan replaces free-plan: with both, free-plan's 1/hour is not applied.
	req := request("api", desc("plan", "free"), desc("plan", "trial"))
	for i := range 3 {
		resp := call(t, c, req)
		if resp.GetOverallCode() != ok {
			t.Fatalf("call %d: %v, want OK (free-plan is replaced)", i+1, resp.GetOverallCode())
		}
		if resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Errorf("replaced descriptor has current_limit %v", resp.GetStatuses()[0].GetCurrentLimit())
		}
		cl := resp.GetStatuses()[1].GetCurrentLimit()
		if cl.GetName() != "trial-plan" || cl.GetUnitMultiplier().GetValue() != 2 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Errorf("trial current_limit = %v, want trial-plan 100 per 2 HOUR", cl)
		}
	}
}

func TestZeroRateDeniesEverything(t *testing.T) {
	c := startTestConfig(t)
	req := request("api", desc("client", "eve"), desc("ip", "10.0.0.66"))
	for i := range 3 {
		resp := call(t, c, req)
		st := resp.GetStatuses()[1]
		if resp.GetOverallCode() != over || st.GetCode() != over || st.GetCurrentLimit().GetRequestsPerUnit() != 0 {
			t.Fatalf("call %d: %v, status %v; want OVER_LIMIT by a 0-per-minute limit", i+1, resp.GetOverallCode(), st)
		}
		if got := header(resp, "retry-after"); got != "60" {
			t.Errorf("call %d: Retry-After = %q, want 60 (one unit)", i+1, got)
		}
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 2 {
			t.Errorf("call %d: the client's descriptor reports %d remaining, want 2 (never charged)", i+1, got)
		}
	}
}

func TestLimitOverride(t *testing.T) {
	c := startTestConfig(t)
	// gpt-4o is configured at 5/minute; the override says 2/hour.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
		resp := call(t, c, request("api", overridePerHour(desc("model", "gpt-4o"), 2)))
		st := resp.GetStatuses()[0]
		if st.GetCode() != want || st.GetCurrentLimit().GetRequestsPerUnit() != 2 || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Errorf("overridden call %d: %v %v, want %v at 2/HOUR", i+1, st.GetCode(), st.GetCurrentLimit(), want)
		}
	}
	// An override applies where no rule matches.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, over} {
		resp := call(t, c, request("api", overridePerHour(desc("color", "red"), 1)))
		if got := resp.GetStatuses()[0].GetCode(); got != want {
			t.Errorf("override without rule, call %d: %v, want %v", i+1, got, want)
		}
	}
}

func TestHitsAboveBurstAreDeniedForGood(t *testing.T) {
	c := startTestConfig(t)
	resp := call(t, c, request("api", withHits(desc("model", "gpt-4o"), 6)))
	if resp.GetOverallCode() != over {
		t.Fatalf("6 hits on a burst of 5: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	eb := resp.GetDynamicMetadata().GetFields()["ratelimitd.exceeds_burst"].GetListValue().GetValues()
	if len(eb) != 1 || eb[0].GetStringValue() != "gpt-4o" {
		t.Errorf("exceeds_burst metadata = %v, want [gpt-4o]", eb)
	}
	if got := header(resp, "retry-after"); got != "60" {
		t.Errorf("Retry-After = %q, want 60 (a full bucket's fill time)", got)
	}
	// Nothing was spent.
	if resp := call(t, c, request("api", desc("model", "gpt-4o"))); resp.GetStatuses()[0].GetLimitRemaining() != 4 {
		t.Errorf("after the denied call, remaining %d, want 4", resp.GetStatuses()[0].GetLimitRemaining())
	}
}

// TestRateLimitHeadersIgnoreShadowRules: a shadow rule, even one past its
// limit, does not change the headers clients see; with only shadow rules
// matched, there are none.
func TestRateLimitHeadersIgnoreShadowRules(t *testing.T) {
	c, _ := startServer(t, server.Options{Now: clocktest.New().Now, RateLimitHeaders: server.RateLimitHeadersDraft03},
		server.MustParse(t, testConfig))
	req := request("api", desc("model", "gpt-4o"), desc("shadow", "s"))
	call(t, c, req)
	resp := call(t, c, req) // the shadow rule (1/min) would deny now
	if resp.GetOverallCode() != ok {
		t.Fatalf("second call: %v, want OK", resp.GetOverallCode())
	}
	want := map[string]string{
		"x-ratelimit-limit":     `5, 5;w=60;name="gpt-4o"`,
		"x-ratelimit-remaining": "3",
	}
	for k, v := range want {
		if got := header(resp, k); got != v {
			t.Errorf("%s = %q, want %q (from the enforced rule)", k, got, v)
		}
	}
	if resp := call(t, c, request("api", desc("shadow", "s"))); len(resp.GetResponseHeadersToAdd()) != 0 {
		t.Errorf("only a shadow rule matched: headers %v, want none", resp.GetResponseHeadersToAdd())
	}
}

// TestIncumbentRateLimitHeaders: --ratelimit-headers incumbent sends
// envoyproxy/ratelimit's three headers under the names given, on
// admissions and denials, and New refuses a name that is no header name.
func TestIncumbentRateLimitHeaders(t *testing.T) {
	names := server.HeaderNames{Limit: "A-Ratelimit-Limit", Remaining: "A-Ratelimit-Remaining", Reset: "A-Ratelimit-Reset"}
	c, _ := startServer(t, server.Options{Now: clocktest.New().Now, RateLimitHeaders: server.RateLimitHeadersIncumbent, RateLimitHeaderNames: names},
		server.MustParse(t, testConfig))
	req := request("api", desc("model", "llama"), desc("client", "cid")) // per-client: 2 a minute
	steps := []struct {
		code                    rlsv3.RateLimitResponse_Code
		limit, remaining, reset string
	}{
		{ok, "2", "1", "30"},
		{ok, "2", "0", "60"},
		{over, "2", "0", "30"},
	}
	for i, s := range steps {
		resp := call(t, c, req)
		if resp.GetOverallCode() != s.code {
			t.Fatalf("call %d: %v, want %v", i+1, resp.GetOverallCode(), s.code)
		}
		for k, v := range map[string]string{names.Limit: s.limit, names.Remaining: s.remaining, names.Reset: s.reset, "RateLimit-Limit": ""} {
			if got := header(resp, k); got != v {
				t.Errorf("call %d: %s = %q, want %q", i+1, k, got, v)
			}
		}
	}
	_, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), RateLimitHeaders: server.RateLimitHeadersIncumbent,
		RateLimitHeaderNames: server.HeaderNames{Limit: "a", Remaining: "b:c", Reset: "d"}})
	if err == nil || !strings.Contains(err.Error(), `"b:c" is not an HTTP header name`) {
		t.Errorf("New with the header name %q: %v, want an error naming it", "b:c", err)
	}
	// Other modes do not read the names.
	if _, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), RateLimitHeaders: server.RateLimitHeadersDraft03,
		RateLimitHeaderNames: server.HeaderNames{Remaining: "b:c"}}); err != nil {
		t.Errorf("New with draft 03 and a bad incumbent header name: %v, want no error", err)
	}
	// An empty name is the default's.
	c2, _ := startServer(t, server.Options{Now: clocktest.New().Now, RateLimitHeaders: server.RateLimitHeadersIncumbent,
		RateLimitHeaderNames: server.HeaderNames{Remaining: "A-Remaining"}}, server.MustParse(t, testConfig))
	resp := call(t, c2, req)
	for k, v := range map[string]string{"RateLimit-Limit": "2", "A-Remaining": "1", "RateLimit-Reset": "30"} {
		if got := header(resp, k); got != v {
			t.Errorf("names {Remaining: A-Remaining}: %s = %q, want %q", k, got, v)
		}
	}
}

func TestRateLimitHeadersNameTheDenyingLimit(t *testing.T) {
	c, _ := startServer(t, server.Options{Now: clocktest.New().Now, RateLimitHeaders: server.RateLimitHeadersDraft03, RetryAfter: server.RetryAfterOmit},
		server.MustParse(t, testConfig))
	// The key-only model rule (10/s burst 20) has plenty left; per-client (2/min) runs out.
	req := request("api", desc("model", "llama"), desc("client", "cid"))
	resp := call(t, c, req)
	if got := header(resp, "x-ratelimit-remaining"); got != "1" {
		t.Errorf("admitted: X-RateLimit-Remaining = %q, want 1 (the least remaining)", got)
	}
	call(t, c, req)
	resp = call(t, c, req)
	if resp.GetOverallCode() != over {
		t.Fatalf("third call: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	want := map[string]string{
		"x-ratelimit-limit":     `2, 2;w=60;name="per-client"`,
		"x-ratelimit-remaining": "0",
		"x-ratelimit-reset":     "30",
		"retry-after":           "",
	}
	for k, v := range want {
		if got := header(resp, k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}

func TestInvalidArgument(t *testing.T) {
	// Invalid overrides answer INVALID_ARGUMENT under the error policy
	// only; policy_test.go pins the others.
	c, _ := startServer(t, server.Options{Limits: server.RequestLimits{MaxDescriptors: 3, MaxEntries: 2, MaxValueBytes: 8, MaxHits: 1000},
		OnInvalidOverride: server.InvalidOverrideError},
		server.MustParse(t, testConfig))
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"empty domain", request("", desc("a", "b")), "domain is empty"},
		{"no descriptors", request("api"), "no descriptors"},
		{"empty key", request("api", desc("a", "b"), desc("", "v")), "descriptors[1].entries[0] has an empty key"},
		{"too many descriptors", request("api", desc("a", "b"), desc("a", "b"), desc("a", "b"), desc("a", "b")), "4 descriptors, more than the 3"},
		{"too many entries", request("api", desc("a", "b", "c", "d", "e", "f")), "3 entries, more than the 2"},
		{"absurd descriptor hits", request("api", withHits(desc("a", "b"), 1<<40)), "hits_addend 1099511627776 is more than the 1000"},
		{"absurd request hits", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}, HitsAddend: 5000}, "hits_addend 5000"},
		{"override without unit", request("api", &ratelimitv3.RateLimitDescriptor{Entries: desc("a", "b").Entries,
			Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}}), "descriptors[0].limit: unit UNKNOWN"},
		{"override too long", request("api", &ratelimitv3.RateLimitDescriptor{Entries: desc("a", "b").Entries,
			Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(585)}}),
			"unit_multiplier 585"},
		{"override of zero", request("api", &ratelimitv3.RateLimitDescriptor{Entries: desc("a", "b").Entries,
			Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{Unit: typev3.RateLimitUnit_SECOND}}), "descriptors[0].limit: requests_per_unit must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.ShouldRateLimit(context.Background(), tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Errorf("ShouldRateLimit = %v, want InvalidArgument containing %q", err, tt.want)
			}
		})
	}
}

// failingStore is a Store whose backend is down.
type failingStore struct{ err error }

func (f failingStore) Take(context.Context, time.Time, []limiter.Request) ([]limiter.Decision, error) {
	return nil, f.err
}

func TestBackendFailureIsUnavailable(t *testing.T) {
	down := fmt.Errorf("redis take: %w: connection refused", limiter.ErrUnavailable)
	c, _ := startServer(t, server.Options{Store: failingStore{down}}, server.MustParse(t, testConfig))
	_, err := c.ShouldRateLimit(context.Background(), request("api", desc("model", "gpt-4o")))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("backend down: %v, want Unavailable (never an UNKNOWN overall code)", err)
	}
	// A request that matches no rule does not need the backend.
	if _, err := c.ShouldRateLimit(context.Background(), request("api", desc("color", "red"))); err != nil {
		t.Errorf("no rule, backend down: %v, want OK", err)
	}
}

func TestNoConfigIsUnavailable(t *testing.T) {
	c, srv := startServer(t, server.Options{}, nil)
	_, err := c.ShouldRateLimit(context.Background(), request("api", desc("model", "gpt-4o")))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("before config: %v, want Unavailable", err)
	}
	srv.SetConfig(server.MustParse(t, testConfig))
	if _, err := c.ShouldRateLimit(context.Background(), request("api", desc("model", "gpt-4o"))); err != nil {
		t.Errorf("after SetConfig: %v", err)
	}
}

func TestConcurrentCallsAdmitExactlyTheBurst(t *testing.T) {
	set := server.MustParse(t, `
domain: api
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 1, burst: 100}
`)
	c, _ := startServer(t, server.Options{}, set) // real clock: 1/hour adds nothing meanwhile
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for range 20 {
				resp, err := c.ShouldRateLimit(context.Background(), request("api", desc("hot", "k")))
				if err != nil {
					errs <- err
					return
				}
				if resp.GetOverallCode() == ok {
					admitted.Add(1)
				} else {
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if admitted.Load() != 100 || denied.Load() != 540 {
		t.Errorf("640 concurrent calls: %d admitted, %d denied; want 100 and 540", admitted.Load(), denied.Load())
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	store := limiter.NewMemoryStore(limiter.MemoryOptions{})
	for _, opts := range []server.Options{
		{},
		{Store: store, RetryAfter: 9},
		{Store: store, RateLimitHeaders: 9},
		{Store: store, DynamicMetadata: server.DynamicMetadataOff + 1},
	} {
		if _, err := server.New(opts); err == nil {
			t.Errorf("New(%+v) = nil error", opts)
		}
	}
	if _, err := server.New(server.Options{Store: store}); err != nil {
		t.Errorf("New with defaults: %v", err)
	}
}

// recorder is an Observer that keeps, in the order observed, what keep
// makes of each call. keep runs inside ObserveCall and must copy what it
// keeps: a Call's strings and slices are the server's only until then.
// Readers of calls hold mu while the server may still be observing.
type recorder[T any] struct {
	keep  func(server.Call) T
	mu    sync.Mutex
	calls []T
}

func (r *recorder[T]) ObserveCall(c server.Call) {
	kept := r.keep(c)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, kept)
}

// outcomes summarizes a call: its domain and codes, and each descriptor's
// outcome with the tokens it was charged.
func outcomes(c server.Call) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %v %v:", c.Domain, c.Code, c.Overall)
	for _, d := range c.Descriptors {
		fmt.Fprintf(&b, " %v", d.Outcome)
		if d.Charged {
			fmt.Fprintf(&b, "(charged %d)", d.Hits)
		}
	}
	return b.String()
}

func TestObserverSeesEveryOutcome(t *testing.T) {
	rec := &recorder[string]{keep: outcomes}
	c, _ := startServer(t, server.Options{Now: clocktest.New().Now, Observer: rec}, server.MustParse(t, testConfig))
	ctx := context.Background()
	calls := []*rlsv3.RateLimitRequest{
		request("api", desc("client", "a"), desc("color", "red"), desc("internal", "x")),
		request("api", desc("client", "a"), desc("shadow", "s")),
		request("api", desc("client", "a"), desc("shadow", "s")),
		request("api", desc("plan", "free"), desc("plan", "trial")),
		request("api", desc("client", "a"), desc("usage", "u")), // the charge is recorded all the same
		request(""),
	}
	for _, req := range calls {
		c.ShouldRateLimit(ctx, req)
	}
	want := []string{
		"api OK OK: within_limit(charged 1) no_rule unlimited",
		"api OK OK: within_limit(charged 1) within_limit(charged 1)",
		"api OK OVER_LIMIT: over_limit shadow_over_limit",
		"api OK OK: replaced within_limit(charged 1)",
		"api OK OVER_LIMIT: over_limit denied_by_other(charged 1)",
		" InvalidArgument UNKNOWN:",
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if strings.Join(rec.calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("observed:\n%s\nwant:\n%s", strings.Join(rec.calls, "\n"), strings.Join(want, "\n"))
	}
}

// fallbackStore answers every request as a failure mode does: allowed, by
// no bucket, because of cause.
type fallbackStore struct{ cause limiter.Fallback }

func (f fallbackStore) Take(_ context.Context, _ time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	d := make([]limiter.Decision, len(reqs))
	for i := range d {
		d[i] = limiter.Decision{Allowed: true, Fallback: f.cause}
	}
	return d, nil
}

// TestFailuresAndFallbacksAreLoggedOnceASecond: backend failures, and
// answers a store made per its failure mode (in the modes that answer),
// are logged at most once a second, each line with what it did not log.
func TestFailuresAndFallbacksAreLoggedOnceASecond(t *testing.T) {
	down := fmt.Errorf("redis take: %w: connection refused", limiter.ErrUnavailable)
	for _, tt := range []struct {
		name  string
		store limiter.Store
		want  string // in every line
	}{
		{"backend failed", failingStore{down}, `msg="backend failed"`},
		{"answered per the failure mode", fallbackStore{limiter.FallbackOverloaded}, `msg="answered per the failure mode" domain=api cause=overloaded`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			clk := clocktest.New()
			c, _ := startServer(t, server.Options{Store: tt.store, Now: clk.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
				server.MustParse(t, testConfig))
			for range 3 {
				for range 10 {
					c.ShouldRateLimit(context.Background(), request("api", desc("model", "gpt-4o")))
				}
				clk.Advance(time.Second)
			}
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			if len(lines) != 3 {
				t.Fatalf("30 calls over 3 s logged %d lines, want 3:\n%s", len(lines), logs.String())
			}
			for _, l := range lines {
				if !strings.Contains(l, tt.want) {
					t.Errorf("line %q lacks %q", l, tt.want)
				}
			}
			if !strings.Contains(lines[1], "unlogged_since_last=9") {
				t.Errorf("second line %q does not count the 9 it did not log", lines[1])
			}
		})
	}
}

// descriptorHits is each descriptor's observed Hits in c.
func descriptorHits(c server.Call) []int64 {
	var h []int64
	for _, d := range c.Descriptors {
		h = append(h, d.Hits)
	}
	return h
}

// TestObservedHitsAreThoseOfTheReportedLimit: when a descriptor denied
// outright makes the others checks, a post-paid limit still charges its
// hits; the observer reports the hits of the limit it reports (the one
// with the least left), not those of the rule's first limit.
func TestObservedHitsAreThoseOfTheReportedLimit(t *testing.T) {
	obs := &recorder[[]int64]{keep: descriptorHits}
	c, _ := startServer(t, server.Options{Now: clocktest.New().Now, Observer: obs}, server.MustParse(t, `
domain: obs
descriptors:
  - key: ip
    value: bad
    rate_limit: {unit: minute, requests_per_unit: 0, name: blocked}
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 1000, name: rpm}
      - {unit: minute, requests_per_unit: 100, counts: tokens, overdraft: {max_debt: 1000}, name: tpm}
`))
	resp := call(t, c, request("obs", desc("ip", "bad"), withHits(desc("user", "u"), 50)))
	if resp.GetOverallCode() != over || resp.GetStatuses()[1].GetCurrentLimit().GetName() != "tpm" {
		t.Fatalf("answer %v, status %v; want OVER_LIMIT reporting tpm for the user", resp.GetOverallCode(), resp.GetStatuses()[1])
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.calls) != 1 || len(obs.calls[0]) != 2 || obs.calls[0][1] != 50 {
		t.Errorf("observed hits %v, want the user's 50 (tpm's charge)", obs.calls)
	}
}
