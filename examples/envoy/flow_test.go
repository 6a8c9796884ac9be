package envoy_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// The tests in this file play Envoy: they pick the route envoy.yaml gives
// a request, build the descriptors its rate limits produce (as Envoy's
// ratelimit filter does, at request time and when the stream is done),
// and send them to ratelimitd's server, in process, loaded with
// ratelimit/. They check the flows README.md walks through with curl. They
// do not run Envoy: what Envoy does is modelled here, from its docs.

// gatewaySim is envoy.yaml's gateway listener in front of an in-process
// ratelimitd.
type gatewaySim struct {
	t      *testing.T
	domain string
	routes []*routev3.Route
	srv    *server.Server
	clock  *clocktest.Clock
}

func newGatewaySim(t *testing.T) *gatewaySim {
	t.Helper()
	return newGatewaySimClock(t, clocktest.New())
}

// newGatewaySimClock runs ratelimitd on clk, or on time.Now if clk is nil
// (in a synctest bubble: ratelimitd's waits sleep on the clock it reads).
func newGatewaySimClock(t *testing.T, clk *clocktest.Clock) *gatewaySim {
	t.Helper()
	return newGatewaySimStore(t, clk, limiter.NewMemoryStore(limiter.MemoryOptions{}))
}

// newGatewaySimStore is newGatewaySimClock with ratelimitd on store.
func newGatewaySimStore(t *testing.T, clk *clocktest.Clock, store limiter.Store) *gatewaySim {
	t.Helper()
	g := loadGateway(t)
	rls := g.rateLimited(t)
	if len(rls) != 1 {
		t.Fatalf("%s: %d listeners run the ratelimit filter; this test models one", bootstrapFile, len(rls))
	}
	vhs := rls[0].hcm.GetRouteConfig().GetVirtualHosts()
	if len(vhs) != 1 {
		t.Fatalf("%s: %d virtual hosts; this test models one", bootstrapFile, len(vhs))
	}
	opts := server.Options{Store: store}
	if clk != nil {
		opts.Now = clk.Now
	}
	srv, err := server.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(loadSet(t))
	return &gatewaySim{t: t, domain: rls[0].filter.GetDomain(), routes: vhs[0].GetRoutes(), srv: srv, clock: clk}
}

// call is one client request through the gateway.
type call struct {
	path    string
	headers map[string]string
}

func post(path string, kv ...string) call {
	c := call{path: path, headers: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		c.headers[kv[i]] = kv[i+1]
	}
	return c
}

// route returns the first route that matches c, as Envoy picks it.
func (s *gatewaySim) route(c call) *routev3.Route {
	s.t.Helper()
	for _, r := range s.routes {
		m := r.GetMatch()
		switch p := m.GetPathSpecifier().(type) {
		case *routev3.RouteMatch_Path:
			if c.path != p.Path {
				continue
			}
		case *routev3.RouteMatch_Prefix:
			if !strings.HasPrefix(c.path, p.Prefix) {
				continue
			}
		default:
			s.t.Fatalf("route %s: path match %T is unknown to this test", r.GetName(), p)
		}
		ok := true
		for _, h := range m.GetHeaders() {
			v, present := c.headers[h.GetName()]
			sm := h.GetStringMatch()
			switch {
			case sm.GetExact() != "":
				ok = ok && present && v == sm.GetExact()
			case sm.GetPrefix() != "":
				ok = ok && present && strings.HasPrefix(v, sm.GetPrefix())
			case sm.GetSafeRegex().GetRegex() != "":
				// Envoy's safe_regex must match the whole value (RE2, as Go's).
				re, err := regexp.Compile(`^(?:` + sm.GetSafeRegex().GetRegex() + `)$`)
				if err != nil {
					s.t.Fatalf("route %s: header %s: %v", r.GetName(), h.GetName(), err)
				}
				ok = ok && present && re.MatchString(v)
			default:
				s.t.Fatalf("route %s: header match %v is unknown to this test", r.GetName(), h)
			}
		}
		if ok {
			return r
		}
	}
	return nil
}

var (
	dynamicMetadata = regexp.MustCompile(`^%DYNAMIC_METADATA\(([^:)]+):([^:)]+)\)%$`)
	requestHeader   = regexp.MustCompile(`^%REQ\(([^:)]+)\)%$`)
)

// maxHitsAddend is the largest hits_addend Envoy sends, from a number or a
// format; a format that yields more, or no number, drops the descriptor.
const maxHitsAddend = 1_000_000_000

// descriptors are what the ratelimit filter sends for c on route r: at
// request time, or (streamDone) after the response, when metadata holds
// the dynamic metadata the response left (namespace:key).
func (s *gatewaySim) descriptors(r *routev3.Route, c call, streamDone bool, metadata map[string]uint64) []*commonv3.RateLimitDescriptor {
	s.t.Helper()
	limits, perFilter := r.GetRoute().GetRateLimits(), false
	if pr := perRouteRateLimits(s.t, r.GetName(), r.GetTypedPerFilterConfig()); len(pr.GetRateLimits()) > 0 {
		limits, perFilter = pr.GetRateLimits(), true
	}
	var out []*commonv3.RateLimitDescriptor
next:
	for _, rl := range limits {
		if rl.GetApplyOnStreamDone() != streamDone {
			continue
		}
		d := new(commonv3.RateLimitDescriptor)
		for _, a := range rl.GetActions() {
			var k, v string
			switch a := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_RequestHeaders_:
				h, ok := c.headers[a.RequestHeaders.GetHeaderName()]
				if !ok {
					continue next // Envoy sends the descriptor only if every action produced an entry
				}
				k, v = a.RequestHeaders.GetDescriptorKey(), h
			case *routev3.RateLimit_Action_GenericKey_:
				k, v = a.GenericKey.GetDescriptorKey(), a.GenericKey.GetDescriptorValue()
			default:
				s.t.Fatalf("route %s: action %T is unknown to this test", r.GetName(), a)
			}
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		if h := rl.GetHitsAddend(); h != nil && perFilter {
			d.IsNegativeHits = h.GetIsNegativeHits()
			switch {
			case h.GetNumber() != nil:
				d.HitsAddend = wrapperspb.UInt64(h.GetNumber().GetValue())
			default:
				var n uint64
				var ok bool
				if m := dynamicMetadata.FindStringSubmatch(h.GetFormat()); m != nil {
					n, ok = metadata[m[1]+":"+m[2]]
				} else if m := requestHeader.FindStringSubmatch(h.GetFormat()); m != nil {
					// Header names are case-insensitive; c.headers has them in lower case.
					var v string
					if v, ok = c.headers[strings.ToLower(m[1])]; ok {
						n, ok = parseHits(v)
					}
				} else {
					s.t.Fatalf("route %s: hits_addend format %q is unknown to this test", r.GetName(), h.GetFormat())
				}
				if !ok || n > maxHitsAddend {
					continue // Envoy drops a descriptor whose hits_addend does not resolve to 0..1e9
				}
				d.HitsAddend = wrapperspb.UInt64(n)
			}
		}
		out = append(out, d)
	}
	return out
}

// parseHits reads a header value as Envoy reads a hits_addend format's
// output: a non-negative decimal number.
func parseHits(v string) (uint64, bool) {
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil
}

// outcome is what the gateway did with one request.
type outcome struct {
	route  string // "" when no route matched
	direct bool   // answered by the route itself (direct_response)
	resp   *rlsv3.RateLimitResponse
}

func (o outcome) code() rlsv3.RateLimitResponse_Code {
	if o.resp == nil {
		return rlsv3.RateLimitResponse_OK // no call: Envoy passes the request
	}
	return o.resp.GetOverallCode()
}

func (o outcome) header(name string) string {
	for _, h := range o.resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return h.GetValue()
		}
	}
	return ""
}

// do sends c through the gateway. When usage is not nil the stream is taken
// to end too, and the stream-done call is made, as Envoy does (it ignores
// the answer; so does do, beyond checking it is no error): an admitted
// request's response is taken to have left usage as dynamic metadata; a
// denied one was answered by Envoy's own 429, which leaves none, and Envoy
// still makes the stream-done call for it with whatever resolves without.
func (s *gatewaySim) do(c call, usage map[string]uint64) outcome {
	s.t.Helper()
	r := s.route(c)
	if r == nil {
		return outcome{}
	}
	o := outcome{route: r.GetName()}
	if r.GetDirectResponse() != nil {
		o.direct = true
		return o
	}
	ctx := context.Background()
	if ds := s.descriptors(r, c, false, nil); len(ds) > 0 {
		resp, err := s.srv.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: s.domain, Descriptors: ds})
		if err != nil {
			s.t.Fatalf("%v via route %s: ShouldRateLimit: %v", c, r.GetName(), err)
		}
		o.resp = resp
	}
	if usage == nil {
		return o
	}
	if o.code() == rlsv3.RateLimitResponse_OVER_LIMIT {
		usage = map[string]uint64{}
	}
	s.streamDone(c, usage)
	return o
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// TestAliasesFlow: README's alias sequence. One client rotating through
// the gpt-4o aliases has one per-client bucket (a burst of 10); the
// deployment has one bucket (a burst of 50) for every client and alias.
func TestAliasesFlow(t *testing.T) {
	s := newGatewaySim(t)
	for i := range 11 {
		alias := gpt4oAliases[i%len(gpt4oAliases)]
		o := s.do(post("/v1/chat/completions", "x-model", alias, "x-client-id", "team-a"), nil)
		want := ok
		if i == 10 {
			want = over
		}
		if o.route != "openai" || o.code() != want {
			t.Fatalf("team-a request %d (%s): route %q, %v; want route openai, %v (the 11th is over team-a's burst of 10, across aliases)", i+1, alias, o.route, o.code(), want)
		}
	}
	// 10 admitted so far. 40 more clients, one request each, fill the
	// deployment's burst of 50; the next is over, whatever its name.
	for i := range 40 {
		alias := gpt4oAliases[i%len(gpt4oAliases)]
		if o := s.do(post("/v1/chat/completions", "x-model", alias, "x-client-id", "client-"+string(rune('a'+i%26))+string(rune('a'+i/26))), nil); o.code() != ok {
			t.Fatalf("client %d (%s): %v, want OK (the deployment has 50)", i+1, alias, o.code())
		}
	}
	o := s.do(post("/v1/chat/completions", "x-model", "chat-default", "x-client-id", "a-fresh-client"), nil)
	if o.code() != over {
		t.Fatalf("51st request to the deployment: %v, want OVER_LIMIT (aliases must not multiply its 50)", o.code())
	}
	// A different model is not affected.
	if o := s.do(post("/v1/chat/completions", "x-model", "gpt-4o-mini", "x-client-id", "team-a"), nil); o.code() != ok {
		t.Errorf("gpt-4o-mini: %v, want OK (other-models, its own bucket)", o.code())
	}
	// Over a minute the deployment refills 500, 50 at most at once.
	s.clock.Advance(6 * time.Second)
	if o := s.do(post("/v1/chat/completions", "x-model", "gpt-4o-latest", "x-client-id", "team-a"), nil); o.code() != ok {
		t.Errorf("after 6s: %v, want OK", o.code())
	}
}

// TestTokensFlow: README's tokens sequence. Each claude-sonnet request is
// checked against the token bucket (8000 a minute) before it is sent, and
// charged its usage (the stub's 2000 output tokens) after; the 5th charge
// overdraws the bucket and the 6th request is denied until the debt is paid.
func TestTokensFlow(t *testing.T) {
	s := newGatewaySim(t)
	req := post("/v1/messages", "x-model", "claude-sonnet", "x-client-id", "team-a")
	usage := map[string]uint64{"ai_gateway:output_tokens": 2000}
	for i := range 5 {
		o := s.do(req, usage)
		if o.route != "claude-sonnet" || o.code() != ok {
			t.Fatalf("request %d: route %q, %v; want route claude-sonnet, OK", i+1, o.route, o.code())
		}
		if n := len(o.resp.GetStatuses()); n != 2 {
			t.Fatalf("request %d: %d statuses, want 2 (requests, tokens check)", i+1, n)
		}
	}
	o := s.do(req, usage)
	if o.code() != over {
		t.Fatalf("6th request, 2000 tokens in debt: %v, want OVER_LIMIT", o.code())
	}
	// 2000 tokens at 8000 a minute: 15 s.
	if got := o.header("retry-after"); got != "15" {
		t.Errorf("Retry-After in debt = %q, want 15", got)
	}
	if got := o.resp.GetStatuses()[0].GetLimitRemaining(); got != 45 {
		t.Errorf("requests left = %d, want 45 (5 admitted of 50; the denied one spent nothing)", got)
	}
	s.clock.Advance(15 * time.Second)
	if o := s.do(req, nil); o.code() != ok {
		t.Errorf("after 15s: %v, want OK (debt paid)", o.code())
	}

	// A response without usage metadata charges nothing: Envoy drops the
	// stream-done descriptor. And other Claude models take the public route.
	if o := s.do(post("/v1/messages", "x-model", "claude-haiku", "x-client-id", "team-a"), usage); o.route != "anthropic" || o.code() != ok {
		t.Errorf("claude-haiku: route %q, %v; want anthropic, OK", o.route, o.code())
	}
}

// TestRoutingFlow: internal callers go unlimited to every provider, and a
// Claude model outside /v1/messages never reaches OpenAI unlimited.
func TestRoutingFlow(t *testing.T) {
	s := newGatewaySim(t)
	for _, tt := range []struct {
		c     call
		route string
	}{
		{post("/v1/messages", "x-caller", "internal", "x-model", "claude-sonnet"), "anthropic-internal"},
		{post("/v1/chat/completions", "x-caller", "internal", "x-model", "llama-3.1-70b"), "vllm-internal"},
		{post("/v1/chat/completions", "x-caller", "internal", "x-model", "gpt-4o"), "openai-internal"},
	} {
		for i := range 100 {
			o := s.do(tt.c, nil)
			if o.route != tt.route || o.code() != ok || len(o.resp.GetStatuses()) != 1 {
				t.Fatalf("%v #%d: route %q, %v, %d statuses; want route %s, OK, 1 status", tt.c, i+1, o.route, o.code(), len(o.resp.GetStatuses()), tt.route)
			}
		}
	}
	if o := s.do(post("/v1/chat/completions", "x-model", "claude-sonnet"), nil); !o.direct || o.route != "claude-elsewhere" {
		t.Errorf("claude-sonnet at /v1/chat/completions: route %q (direct %v), want the claude-elsewhere direct response", o.route, o.direct)
	}
	if o := s.do(post("/v1/chat/completions", "x-model", "llama-3.1-70b"), nil); o.route != "vllm" {
		t.Errorf("llama-3.1-70b: route %q, want vllm", o.route)
	}
}

// TestWaitFlow: llama-3.1-70b allows 10 a second, bursts of 10, with
// max_wait 1s. Ten requests at once pass at once; the next ten are each
// held until their token is due (100 ms apart) and then admitted instead
// of denied; one more would have to wait 1.1 s and is denied at once.
func TestWaitFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newGatewaySimClock(t, nil)
		req := post("/v1/chat/completions", "x-model", "llama-3.1-70b", "x-client-id", "agent-7")
		for i := range 10 {
			if o := s.do(req, nil); o.code() != ok {
				t.Fatalf("request %d: %v, want OK at once", i+1, o.code())
			}
		}
		start := time.Now()
		type result struct {
			code   rlsv3.RateLimitResponse_Code
			waited time.Duration
		}
		results := make([]chan result, 10)
		for i := range results {
			results[i] = make(chan result, 1)
			go func() {
				o := s.do(req, nil)
				results[i] <- result{o.code(), time.Since(start)}
			}()
			synctest.Wait() // queued in this order
		}
		if o := s.do(req, nil); o.code() != over || time.Since(start) != 0 {
			t.Errorf("21st request: %v after %v; want OVER_LIMIT at once (its turn is 1.1s away, beyond max_wait)", o.code(), time.Since(start))
		}
		for i, ch := range results {
			r := <-ch
			if want := time.Duration(i+1) * 100 * time.Millisecond; r.code != ok || r.waited != want {
				t.Errorf("request %d: %v after %v; want OK after %v", i+11, r.code, r.waited, want)
			}
		}
	})
}

// TestConcurrencyFlow: README's vLLM sequence on the vllm-qwen route. 16
// requests in flight fill the slots; the 17th waits, and is admitted when
// a stream is done (the release Envoy sends then); with every slot taken
// and nothing released, a request waits its max_wait (1s) and is denied.
func TestConcurrencyFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newGatewaySimClock(t, nil)
		req := func(i int) call {
			return post("/v1/chat/completions", "x-model", "qwen-2.5-72b", "x-request-id", fmt.Sprintf("req-%d", i))
		}
		for i := range 16 {
			o := s.do(req(i), nil)
			if o.route != "vllm-qwen" || o.code() != ok {
				t.Fatalf("request %d: route %q, %v; want vllm-qwen, OK", i, o.route, o.code())
			}
			if got := o.resp.GetStatuses()[0].GetLimitRemaining(); got != uint32(15-i) {
				t.Errorf("request %d: %d slots left, want %d", i, got, 15-i)
			}
		}
		start := time.Now()
		waiting := make(chan outcome, 1)
		go func() { waiting <- s.do(req(16), nil) }()
		synctest.Wait()
		time.Sleep(200 * time.Millisecond)
		if ds := s.streamDone(req(3), nil); len(ds) != 1 { // request 3's response is over
			t.Fatalf("request 3's stream done: %d descriptors sent, want 1 (the release)", len(ds))
		}
		if o := <-waiting; o.code() != ok || time.Since(start) != 200*time.Millisecond {
			t.Errorf("request 16: %v after %v, want OK at request 3's release (200ms)", o.code(), time.Since(start))
		}
		start = time.Now()
		if o := s.do(req(17), nil); o.code() != over || time.Since(start) != time.Second || o.header("retry-after") != "599" {
			t.Errorf("request 17: %v after %v, Retry-After %q; want OVER_LIMIT after max_wait, 1s, Retry-After 599 (request 0's 10m lease, taken 1.2s ago)",
				o.code(), time.Since(start), o.header("retry-after"))
		}
		// Envoy retries request 5 (same x-request-id): still one slot.
		if o := s.do(req(5), nil); o.code() != ok {
			t.Errorf("a retry of request 5: %v, want OK (its lease renewed)", o.code())
		}
	})
}

// streamDone sends what Envoy sends for c once its stream is done, with
// metadata the dynamic metadata the response left, and returns the
// descriptors of that call (none: no call).
func (s *gatewaySim) streamDone(c call, metadata map[string]uint64) []*commonv3.RateLimitDescriptor {
	s.t.Helper()
	r := s.route(c)
	ds := s.descriptors(r, c, true, metadata)
	if len(ds) == 0 {
		return nil
	}
	if _, err := s.srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: s.domain, Descriptors: ds}); err != nil {
		s.t.Fatalf("%v: stream-done ShouldRateLimit: %v", c, err)
	}
	return ds
}
