package envoy_test

import (
	"context"
	"slices"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// stores are the backends the reserve-then-settle flow runs on: the
// in-memory store, and a real redis-server started for the test (the
// refund ledger is a key of its own there, read and written by the Lua
// script). The Redis store takes the caller's now, the synthetic clock.
func stores() map[string]func(t *testing.T) limiter.Store {
	return map[string]func(t *testing.T) limiter.Store{
		"memory": func(t *testing.T) limiter.Store { return limiter.NewMemoryStore(limiter.MemoryOptions{}) },
		"redis": func(t *testing.T) limiter.Store {
			st, err := redisstore.New(redistest.Start(t).Client(), redisstore.Options{Prefix: "example:" + t.Name() + ":", Clock: redisstore.CallerClock})
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
	}
}

// budget reads a client's gpt-4o-mini token budget as ratelimitd holds it,
// with a check (hits_addend 0) that spends nothing: the tokens left, and,
// when the budget is in debt, how long until it is not.
func (s *gatewaySim) budget(client string) (left uint32, inDebt time.Duration) {
	s.t.Helper()
	d := &commonv3.RateLimitDescriptor{
		Entries: []*commonv3.RateLimitDescriptor_Entry{
			{Key: "model", Value: "gpt-4o-mini"}, {Key: "kind", Value: "budget"}, {Key: "client", Value: client},
		},
		HitsAddend: wrapperspb.UInt64(0),
	}
	resp, err := s.srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: s.domain, Descriptors: []*commonv3.RateLimitDescriptor{d}})
	if err != nil {
		s.t.Fatalf("budget check for %s: %v", client, err)
	}
	st := resp.GetStatuses()[0]
	if st.GetCurrentLimit().GetName() != "gpt-4o-mini-client-tokens" {
		s.t.Fatalf("budget check for %s: limit %v, want gpt-4o-mini-client-tokens", client, st.GetCurrentLimit())
	}
	if st.GetCode() == over {
		inDebt = st.GetDurationUntilReset().AsDuration()
	}
	return st.GetLimitRemaining(), inDebt
}

func mini(maxTokens string) call {
	c := post("/v1/chat/completions", "x-model", "gpt-4o-mini", "x-client-id", "team-a")
	if maxTokens != "" {
		c.headers["x-max-tokens"] = maxTokens
	}
	return c
}

func outputTokens(n uint64) map[string]uint64 {
	return map[string]uint64{"ai_gateway:output_tokens": n}
}

// TestReserveThenSettleFlow: README's gpt-4o-mini sequence, on both
// backends. A request reserves its x-max-tokens (1000) from team-a's
// budget (100,000 tokens a minute) at request time; when its stream is
// done Envoy sends one call that gives the 1000 back and charges the 300
// the model wrote, and the budget ends exactly 300 lower than it started.
func TestReserveThenSettleFlow(t *testing.T) {
	for name, store := range stores() {
		t.Run(name, func(t *testing.T) {
			s := newGatewaySimStore(t, clocktest.New(), store(t))
			start, _ := s.budget("team-a")
			if start != 100000 {
				t.Fatalf("team-a's budget starts at %d, want 100000 (full)", start)
			}
			o := s.do(mini("1000"), nil) // request time only
			if o.route != "gpt-4o-mini" || o.code() != ok || len(o.resp.GetStatuses()) != 2 {
				t.Fatalf("reserve: route %q, %v, %d statuses; want gpt-4o-mini, OK, 2 (requests, budget)", o.route, o.code(), len(o.resp.GetStatuses()))
			}
			if got, _ := s.budget("team-a"); got != start-1000 {
				t.Errorf("in flight: %d left, want %d (the estimate reserved)", got, start-1000)
			}
			ds := s.streamDone(mini("1000"), outputTokens(300))
			budget := []*commonv3.RateLimitDescriptor_Entry{
				{Key: "model", Value: "gpt-4o-mini"}, {Key: "kind", Value: "budget"}, {Key: "client", Value: "team-a"},
			}
			same := func(d *commonv3.RateLimitDescriptor) bool {
				return slices.EqualFunc(d.GetEntries(), budget, func(a, b *commonv3.RateLimitDescriptor_Entry) bool { return proto.Equal(a, b) })
			}
			if len(ds) != 2 || !same(ds[0]) || !same(ds[1]) ||
				!ds[0].GetIsNegativeHits() || ds[0].GetHitsAddend().GetValue() != 1000 ||
				ds[1].GetIsNegativeHits() || ds[1].GetHitsAddend().GetValue() != 300 {
				t.Fatalf("stream done sent %v; want one call: the budget descriptor refunding 1000, and charged 300", ds)
			}
			if got, _ := s.budget("team-a"); got != start-300 {
				t.Errorf("settled: %d left, want %d (exactly 300 lower than it started)", got, start-300)
			}
		})
	}
}

// TestReserveThenSettleDebt: on both backends, the rest of README's
// gpt-4o-mini sequence. Usage above what is left after the refund is
// recorded (the rule's overdraft) and puts the budget in debt; a request
// in debt is denied, and its estimate stays charged, since Envoy's
// stream-done call after the 429 carries only the refund and a denied
// reservation earned no refund credit; the largest estimate the route
// lets through (99999) is given back exactly, never more; other clients'
// budgets are untouched.
func TestReserveThenSettleDebt(t *testing.T) {
	for name, store := range stores() {
		t.Run(name, func(t *testing.T) {
			clk := clocktest.New()
			s := newGatewaySimStore(t, clk, store(t))
			for _, st := range []struct {
				name      string
				maxTokens string
				used      uint64 // output tokens, when the model answers
				advance   time.Duration
				code      rlsv3.RateLimitResponse_Code
				left      uint32
				inDebt    time.Duration // Retry-After of a check, whole seconds
			}{
				{name: "the budget nearly spent: reserve 99999, use 99800", maxTokens: "99999", used: 99800, code: ok, left: 200},
				// 200 left: admitted (not in debt), the estimate overdraws;
				// refunded to 200, charged 2000: 1800 in debt, 1.08 s.
				{name: "use more than is left", maxTokens: "1000", used: 2000, code: ok, inDebt: 2 * time.Second},
				// Denied; the 5000 reserved stays: 6800 in debt, 4.08 s.
				{name: "a request in debt", maxTokens: "5000", used: 300, code: over, inDebt: 5 * time.Second},
				// 5 s refill 8333: 1533 left.
				{name: "5 s later", advance: 5 * time.Second, left: 1533},
				// Recorded down to 98466 in debt, within max_debt, and given
				// back exactly: 1533 again, not a full bucket.
				{name: "the largest estimate, nothing used", maxTokens: "99999", used: 0, code: ok, left: 1533},
			} {
				clk.Advance(st.advance)
				if st.maxTokens != "" {
					if o := s.do(mini(st.maxTokens), outputTokens(st.used)); o.route != "gpt-4o-mini" || o.code() != st.code {
						t.Fatalf("%s: route %q, %v; want gpt-4o-mini, %v", st.name, o.route, o.code(), st.code)
					}
				}
				if left, inDebt := s.budget("team-a"); left != st.left || inDebt.Round(time.Second) != st.inDebt {
					t.Errorf("%s: %d left, in debt for %v; want %d, %v", st.name, left, inDebt, st.left, st.inDebt)
				}
			}
			if left, _ := s.budget("team-b"); left != 100000 {
				t.Errorf("team-b: %d left, want 100000 (a budget of its own)", left)
			}
		})
	}
}

// TestReserveThenSettleRouting: gpt-4o-mini is served only with an
// estimate Envoy can reserve and ratelimitd can give back exactly: 0 to
// 99999. Without one, Envoy would drop the descriptors that read
// x-max-tokens, and the request would spend no budget.
func TestReserveThenSettleRouting(t *testing.T) {
	s := newGatewaySim(t)
	for _, tt := range []struct {
		maxTokens string
		route     string
	}{
		{"1000", "gpt-4o-mini"},
		{"0", "gpt-4o-mini"}, // reserves nothing: checked, and charged after
		{"99999", "gpt-4o-mini"},
		{"100000", "gpt-4o-mini-no-estimate"},
		{"", "gpt-4o-mini-no-estimate"},
		{"many", "gpt-4o-mini-no-estimate"},
		{"-1", "gpt-4o-mini-no-estimate"},
		{"1e3", "gpt-4o-mini-no-estimate"},
	} {
		o := s.do(mini(tt.maxTokens), nil)
		if o.route != tt.route || o.direct != (tt.route == "gpt-4o-mini-no-estimate") {
			t.Errorf("x-max-tokens %q: route %q (direct %v), want %s", tt.maxTokens, o.route, o.direct, tt.route)
		}
	}
	// The largest estimate the route admits is one the budget's overdraft
	// can record in full; else its refund would give back more than was
	// taken.
	r := s.route(mini("99999"))
	if r == nil || r.GetName() != "gpt-4o-mini" {
		t.Fatal("x-max-tokens 99999: not the gpt-4o-mini route")
	}
	rule := loadSet(t).Lookup(s.domain, servertest.Entries("model", "gpt-4o-mini", "kind", "budget", "client", "team-a"))
	if rule == nil || rule.Limits[0].Limit.MaxDebt < 99999 {
		t.Fatalf("gpt-4o-mini budget rule %v: max_debt below 99999, the largest estimate the route admits", rule)
	}
}
