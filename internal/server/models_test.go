package server_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// modelsConfig is an AI gateway's limits: aliases in one quota group,
// two limits on one model, requests and post-paid tokens, and waiting.
const modelsConfig = `
domain: ai
quota_groups:
  gpt4o-deployment: {unit: minute, requests_per_unit: 10}
descriptors:
  - key: model
    value: gpt-4o
    quota_group: gpt4o-deployment
  - key: model
    value: gpt-4o-latest
    quota_group: gpt4o-deployment
  - key: model
    value: chat-default
    quota_group: gpt4o-deployment
  - key: model
    value: o3
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: o3-per-second}
      - {unit: minute, requests_per_unit: 5, name: o3-per-minute}
  - key: model
    value: claude
    descriptors:
      - key: kind
        value: requests
        rate_limit: {unit: minute, requests_per_unit: 5, name: claude-rpm}
      - key: kind
        value: tokens
        rate_limit:
          unit: minute
          requests_per_unit: 1000
          counts: tokens
          overdraft: {max_debt: 5000}
          name: claude-tpm
  - key: agent
    rate_limit: {unit: second, requests_per_unit: 1, max_wait: 2s, name: agent}
  - key: small-queue
    rate_limit: {unit: second, requests_per_unit: 1, max_wait: 5s, max_waiters: 1, name: small-queue}
  - key: shadow-agent
    rate_limit: {unit: second, requests_per_unit: 1, max_wait: 2s, name: shadow-agent}
    shadow_mode: true
`

func TestAliasesShareTheirQuotaGroup(t *testing.T) {
	c, _ := startServer(t, server.Options{Now: clocktest.New().Now}, server.MustParse(t, modelsConfig))
	aliases := []string{"gpt-4o", "gpt-4o-latest", "chat-default"}
	for i := range 11 {
		resp := call(t, c, request("ai", desc("model", aliases[i%3])))
		want := ok
		if i == 10 {
			want = over
		}
		if resp.GetOverallCode() != want {
			t.Fatalf("call %d (%s): %v, want %v: three aliases of a 10/min group", i+1, aliases[i%3], resp.GetOverallCode(), want)
		}
	}
}

func TestSeveralLimitsOnOneRule(t *testing.T) {
	clk := clocktest.New()
	c, _ := startServer(t, server.Options{Now: clk.Now}, server.MustParse(t, modelsConfig))
	req := request("ai", desc("model", "o3"))
	expect := func(step string, want rlsv3.RateLimitResponse_Code, wantLimit string) {
		t.Helper()
		resp := call(t, c, req)
		if resp.GetOverallCode() != want || resp.GetStatuses()[0].GetCurrentLimit().GetName() != wantLimit {
			t.Errorf("%s: %v reported by %q, want %v by %q", step, resp.GetOverallCode(),
				resp.GetStatuses()[0].GetCurrentLimit().GetName(), want, wantLimit)
		}
	}
	expect("1st call", ok, "o3-per-second") // 1 left this second, 4 this minute: the least left
	expect("2nd call", ok, "o3-per-second")
	expect("3rd call in one second", over, "o3-per-second")
	clk.Advance(time.Second)
	expect("4th call", ok, "o3-per-second")
	clk.Advance(time.Second)
	expect("5th call", ok, "o3-per-second") // 1 left of each: the first listed
	clk.Advance(time.Second)
	expect("6th call", ok, "o3-per-minute") // the 5th admitted this minute: 0 left
	expect("7th call", over, "o3-per-minute")
	// The denied calls spent nothing: at 12 s the per-minute limit has
	// refilled exactly one token (one every 12 s).
	clk.Advance(9 * time.Second)
	expect("at 12s", ok, "o3-per-minute")
	expect("right after", over, "o3-per-minute")
}

func TestPostpaidTokens(t *testing.T) {
	c, _ := startServer(t, server.Options{Now: clocktest.New().Now}, server.MustParse(t, modelsConfig))
	// At request time Envoy sends the request descriptor (one request) and
	// the tokens descriptor with hits_addend 0 (a check); when the stream
	// is done it sends the tokens descriptor with the usage.
	check := func() *rlsv3.RateLimitResponse {
		return call(t, c, request("ai", desc("model", "claude", "kind", "requests"), withHits(desc("model", "claude", "kind", "tokens"), 0)))
	}
	charge := func(n uint64) *rlsv3.RateLimitResponse {
		return call(t, c, request("ai", withHits(desc("model", "claude", "kind", "tokens"), n)))
	}
	steps := []struct {
		name      string
		do        func() *rlsv3.RateLimitResponse
		want      rlsv3.RateLimitResponse_Code
		remaining uint32 // of the tokens status
	}{
		{"check", check, ok, 1000},
		{"charge 900", func() *rlsv3.RateLimitResponse { return charge(900) }, ok, 100},
		{"check", check, ok, 100},
		{"charge 600 (overdraws)", func() *rlsv3.RateLimitResponse { return charge(600) }, ok, 0},
		{"check in debt", check, over, 0},
	}
	var last *rlsv3.RateLimitResponse
	for _, st := range steps {
		last = st.do()
		tokens := last.GetStatuses()[len(last.GetStatuses())-1]
		if last.GetOverallCode() != st.want || tokens.GetLimitRemaining() != st.remaining {
			t.Errorf("%s: %v with %d tokens left, want %v with %d", st.name, last.GetOverallCode(), tokens.GetLimitRemaining(), st.want, st.remaining)
		}
	}
	// 500 tokens of debt at 1000/min: 30 s.
	if got := header(last, "retry-after"); got != "30" {
		t.Errorf("Retry-After in debt = %q, want 30 (the time to pay the debt)", got)
	}
	// Two checks were admitted: the request limit (5/min) has 3 left, so
	// the denied check took nothing from it.
	resp := call(t, c, request("ai", withHits(desc("model", "claude", "kind", "requests"), 0)))
	if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 3 {
		t.Errorf("request limit has %d left, want 3 (charged only for admitted requests)", got)
	}
}

// TestNegativeHitsGiveTokensBack: with RefundsUnbounded (the incumbent's
// behaviour) a refund gives back to any limit; refund_test.go has the
// default, RefundsTaken.
func TestNegativeHitsGiveTokensBack(t *testing.T) {
	c, _ := startServer(t, server.Options{Now: clocktest.New().Now, Refunds: server.RefundsUnbounded}, server.MustParse(t, testConfig))
	call(t, c, request("api", withHits(desc("client", "zed"), 2)))
	refund := withHits(desc("client", "zed"), 1)
	refund.IsNegativeHits = true
	if resp := call(t, c, request("api", refund)); resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetLimitRemaining() != 1 {
		t.Errorf("refund of 1: %v with %d left, want OK with 1", resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining())
	}
	if resp := call(t, c, request("api", desc("client", "zed"))); resp.GetOverallCode() != ok {
		t.Errorf("after the refund: %v, want OK", resp.GetOverallCode())
	}
}

// waitServer is a Server on the memory store for synctest bubbles, where
// time.Now is the bubble's clock.
func waitServer(t *testing.T) (*server.Server, *limiter.MemoryStore) {
	store := limiter.NewMemoryStore(limiter.MemoryOptions{})
	srv, err := server.New(server.Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(server.MustParse(t, modelsConfig))
	return srv, store
}

// answer is when a call returned and what it said.
type answer struct {
	after time.Duration
	code  rlsv3.RateLimitResponse_Code
	err   error
	resp  *rlsv3.RateLimitResponse
}

func startCall(ctx context.Context, srv *server.Server, start time.Time, out chan<- answer) {
	go func() {
		resp, err := srv.ShouldRateLimit(ctx, request("ai", desc("agent", "a1")))
		out <- answer{after: time.Since(start), code: resp.GetOverallCode(), err: err, resp: resp}
	}()
}

func TestWaitInsteadOfShedding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, _ := waitServer(t)
		start := time.Now()
		ctx := context.Background()
		answers := make(chan answer, 3)
		startCall(ctx, srv, start, answers) // the bucket's one token: at once
		synctest.Wait()
		startCall(ctx, srv, start, answers) // waits 1s
		synctest.Wait()
		startCall(ctx, srv, start, answers) // waits 2s
		synctest.Wait()
		resp, err := srv.ShouldRateLimit(ctx, request("ai", desc("agent", "a1")))
		if err != nil || resp.GetOverallCode() != over || header(resp, "retry-after") != "3" {
			t.Errorf("4th call: %v %v Retry-After %q, want OVER_LIMIT at once with Retry-After 3", resp.GetOverallCode(), err, header(resp, "retry-after"))
		}
		for i, want := range []time.Duration{0, time.Second, 2 * time.Second} {
			a := <-answers
			if a.err != nil || a.code != ok || a.after != want {
				t.Errorf("call %d: %v %v after %v, want OK after %v", i+1, a.code, a.err, a.after, want)
			}
		}
	})
}

func TestCancelledWaiterGivesItsTokenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, _ := waitServer(t)
		start := time.Now()
		first, second, third := make(chan answer, 1), make(chan answer, 1), make(chan answer, 1)
		startCall(context.Background(), srv, start, first)
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		startCall(ctx, srv, start, second)
		synctest.Wait()
		startCall(context.Background(), srv, start, third)
		synctest.Wait()
		time.Sleep(500 * time.Millisecond)
		cancel()
		if a := <-second; status.Code(a.err) != codes.Canceled || a.after != 500*time.Millisecond {
			t.Errorf("cancelled waiter: %v after %v, want Canceled after 500ms", a.err, a.after)
		}
		if a := <-third; a.err != nil || a.code != ok || a.after != time.Second {
			t.Errorf("third waiter: %v %v after %v, want OK after 1s (moved up)", a.code, a.err, a.after)
		}
		<-first
		// No token lost: at 1s the bucket owes nothing (the third's token
		// is due now), so a check passes with 0 left, not in debt.
		resp, err := srv.ShouldRateLimit(context.Background(), request("ai", withHits(desc("agent", "a1"), 0)))
		if err != nil || resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
			t.Errorf("check at 1s: %v %v, %d left; want OK with 0 left", resp.GetOverallCode(), err, resp.GetStatuses()[0].GetLimitRemaining())
		}
		time.Sleep(time.Second)
		resp, _ = srv.ShouldRateLimit(context.Background(), request("ai", withHits(desc("agent", "a1"), 0)))
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 1 {
			t.Errorf("check at 2s: %d left, want 1 (full again)", got)
		}
	})
}

func TestFullQueueShedsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, _ := waitServer(t)
		ctx := context.Background()
		req := request("ai", desc("small-queue", "q"))
		if resp, err := srv.ShouldRateLimit(ctx, req); err != nil || resp.GetOverallCode() != ok {
			t.Fatalf("1st call: %v %v, want OK", resp.GetOverallCode(), err)
		}
		waiting := make(chan error, 1)
		go func() {
			_, err := srv.ShouldRateLimit(ctx, req)
			waiting <- err
		}()
		synctest.Wait()
		// max_waiters is 1: the third would wait 2s (max_wait is 5s) but the
		// queue is full, so it is shed at once.
		resp, err := srv.ShouldRateLimit(ctx, req)
		if err != nil || resp.GetOverallCode() != over {
			t.Fatalf("3rd call: %v %v, want OVER_LIMIT", resp.GetOverallCode(), err)
		}
		full := resp.GetDynamicMetadata().GetFields()["ratelimitd.queue_full"].GetListValue().GetValues()
		if len(full) != 1 || full[0].GetStringValue() != "small-queue" {
			t.Errorf("queue_full metadata = %v, want [small-queue]", full)
		}
		if err := <-waiting; err != nil {
			t.Errorf("the waiter: %v", err)
		}
		// Its slot is free again.
		if resp, err := srv.ShouldRateLimit(ctx, req); err != nil || resp.GetOverallCode() != ok {
			t.Errorf("after the waiter left: %v %v, want OK (it waits)", resp.GetOverallCode(), err)
		}
	})
}

func TestWaitsStopShortOfTheCallersDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, _ := waitServer(t)
		req := request("ai", desc("agent", "d1"))
		srv.ShouldRateLimit(context.Background(), req) // takes the one token
		// The next token is 1s away; a caller that gives up in 500ms is told
		// OVER_LIMIT at once instead of being held past its deadline.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		resp, err := srv.ShouldRateLimit(ctx, req)
		if err != nil || resp.GetOverallCode() != over || time.Since(start) != 0 {
			t.Errorf("deadline 500ms, token in 1s: %v %v after %v, want OVER_LIMIT at once", resp.GetOverallCode(), err, time.Since(start))
		}
		ctx2, cancel2 := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel2()
		resp, err = srv.ShouldRateLimit(ctx2, req)
		if err != nil || resp.GetOverallCode() != ok || time.Since(start) != time.Second {
			t.Errorf("deadline 1.5s, token in 1s: %v %v after %v, want OK after 1s", resp.GetOverallCode(), err, time.Since(start))
		}
	})
}

// TestShadowRuleNeverHolds: a shadow rule with max_wait reports what it
// would have done; it neither holds the request nor reserves tokens.
func TestShadowRuleNeverHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, _ := waitServer(t)
		req := request("ai", desc("shadow-agent", "s"))
		srv.ShouldRateLimit(context.Background(), req) // takes the one token
		start := time.Now()
		resp, err := srv.ShouldRateLimit(context.Background(), req)
		if err != nil || resp.GetOverallCode() != ok || time.Since(start) != 0 {
			t.Fatalf("2nd call: %v %v after %v, want OK at once", resp.GetOverallCode(), err, time.Since(start))
		}
		fields := resp.GetDynamicMetadata().GetFields()
		if got := fields["ratelimitd.shadow_denied"].GetListValue().GetValues(); len(got) != 1 || got[0].GetStringValue() != "shadow-agent" {
			t.Errorf("shadow_denied = %v, want [shadow-agent]", got)
		}
		if w := fields["ratelimitd.waited"]; w != nil {
			t.Errorf("waited = %v, want none", w)
		}
		// Nothing was reserved: a second later the bucket is full again.
		time.Sleep(time.Second)
		resp, _ = srv.ShouldRateLimit(context.Background(), request("ai", withHits(desc("shadow-agent", "s"), 0)))
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 1 {
			t.Errorf("check at 1s: %d left, want 1 (no debt)", got)
		}
	})
}

// delayedStore delays the return of its delay-th Take (1-based), as
// goroutine scheduling, or the Redis batcher waking the callers of one
// round trip in any order, can; its refunds fail when refundErr is set.
type delayedStore struct {
	*limiter.MemoryStore
	delay     int
	refundErr error

	mu sync.Mutex
	n  int
}

func (s *delayedStore) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	d, err := s.MemoryStore.Take(ctx, now, reqs)
	s.mu.Lock()
	s.n++
	n := s.n
	s.mu.Unlock()
	if n == s.delay {
		time.Sleep(100 * time.Millisecond)
	}
	return d, err
}

func (s *delayedStore) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	if s.refundErr != nil {
		return s.refundErr
	}
	return s.MemoryStore.Refund(ctx, now, reqs)
}

// TestWaiterGivingUpMovesUpOnlyThoseReservedAfterIt: A reserves the token
// due at 1s, B the one due at 2s, and one of their Takes returns 100ms late
// (so that caller reaches its wait after the other, and, counting its wait
// from when the store answered, is released 100ms late: late, never
// early). When B gives up, A is not moved up; when A gives up, B is, by one
// token; when the refund of A's token fails, nobody is moved up.
func TestWaiterGivingUpMovesUpOnlyThoseReservedAfterIt(t *testing.T) {
	for _, tc := range []struct {
		name      string
		delay     int // which Take returns 100ms late
		refundErr error
		giver     string        // who gives up at 200ms: "A" or "B"
		want      time.Duration // when the other is answered
	}{
		{"later reservation gives up", 2, nil, "B", 1100 * time.Millisecond},
		{"earlier reservation gives up", 3, nil, "A", 1100 * time.Millisecond},
		{"earlier reservation gives up, refund fails", 3, errors.New("refund failed"), "A", 2100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &delayedStore{MemoryStore: limiter.NewMemoryStore(limiter.MemoryOptions{}), delay: tc.delay, refundErr: tc.refundErr}
				srv, err := server.New(server.Options{Store: store})
				if err != nil {
					t.Fatal(err)
				}
				srv.SetConfig(server.MustParse(t, modelsConfig))
				start := time.Now()
				srv.ShouldRateLimit(context.Background(), request("ai", desc("agent", "a"))) // the token at 0
				ctxA, cancelA := context.WithCancel(context.Background())
				ctxB, cancelB := context.WithCancel(context.Background())
				defer cancelA()
				defer cancelB()
				a, b := make(chan answer, 1), make(chan answer, 1)
				startCall2 := func(ctx context.Context, out chan answer) {
					go func() {
						resp, err := srv.ShouldRateLimit(ctx, request("ai", desc("agent", "a")))
						out <- answer{after: time.Since(start), code: resp.GetOverallCode(), err: err}
					}()
					synctest.Wait()
				}
				startCall2(ctxA, a) // reserves the token due at 1s
				startCall2(ctxB, b) // reserves the one due at 2s
				time.Sleep(200 * time.Millisecond)
				giver, other := a, b
				cancel := cancelA
				if tc.giver == "B" {
					giver, other, cancel = b, a, cancelB
				}
				cancel()
				if got := <-giver; status.Code(got.err) != codes.Canceled {
					t.Errorf("%s: %v, want Canceled", tc.giver, got.err)
				}
				if got := <-other; got.err != nil || got.code != ok || got.after != tc.want {
					t.Errorf("the other: %v %v after %v, want OK after %v", got.code, got.err, got.after, tc.want)
				}
			})
		})
	}
}

// TestRefundGivesBackOnlyWhatWasTaken: a caller that gives up while it
// waits is refunded what its request took; a shadow rule that would have
// denied took nothing, so its bucket gets nothing back.
func TestRefundGivesBackOnlyWhatWasTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, _ := waitServer(t)
		req := request("ai", desc("agent", "r"), desc("shadow-agent", "r"))
		srv.ShouldRateLimit(context.Background(), req) // both buckets' one token
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := srv.ShouldRateLimit(ctx, req) // waits for agent; shadow-agent would deny
			done <- err
		}()
		synctest.Wait()
		time.Sleep(500 * time.Millisecond)
		cancel()
		if err := <-done; status.Code(err) != codes.Canceled {
			t.Fatalf("the waiter: %v, want Canceled", err)
		}
		for _, tc := range []struct {
			key  string
			want uint32
		}{{"agent", 0}, {"shadow-agent", 0}} {
			resp, err := srv.ShouldRateLimit(context.Background(), request("ai", withHits(desc(tc.key, "r"), 0)))
			if err != nil {
				t.Fatal(err)
			}
			st := resp.GetStatuses()[0]
			if st.GetCode() != ok || st.GetLimitRemaining() != tc.want {
				t.Errorf("%s at 500ms: %v with %d left, want OK with %d (its token due at 1s, none given back twice)",
					tc.key, st.GetCode(), st.GetLimitRemaining(), tc.want)
			}
		}
	})
}

// TestWaitNeverRunsPastTheDeadline: the wait is capped by the caller's
// deadline when the request arrives, but the store takes time to answer;
// a wait that would then end past the deadline is not started. The request
// is denied at once (Retry-After until its tokens would come) and what it
// reserved is given back, rather than held until the caller gives up and
// falls back to its failure mode, unmetered.
func TestWaitNeverRunsPastTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &delayedStore{MemoryStore: limiter.NewMemoryStore(limiter.MemoryOptions{}), delay: 2}
		srv, err := server.New(server.Options{Store: store})
		if err != nil {
			t.Fatal(err)
		}
		srv.SetConfig(server.MustParse(t, modelsConfig))
		req := request("ai", desc("agent", "d"))
		start := time.Now()
		srv.ShouldRateLimit(context.Background(), req) // the token, at 0
		// Deadline 1.05s: a 1s wait fits when the request arrives, but the
		// store answers 100ms late.
		ctx, cancel := context.WithTimeout(context.Background(), 1050*time.Millisecond)
		defer cancel()
		resp, err := srv.ShouldRateLimit(ctx, req)
		if err != nil || resp.GetOverallCode() != over || time.Since(start) != 100*time.Millisecond || header(resp, "retry-after") != "1" {
			t.Fatalf("second call: %v %v after %v, Retry-After %q; want OVER_LIMIT after 100ms with Retry-After 1",
				resp.GetOverallCode(), err, time.Since(start), header(resp, "retry-after"))
		}
		// Its reservation was given back: at 1s the bucket has its token.
		time.Sleep(900 * time.Millisecond)
		resp, _ = srv.ShouldRateLimit(context.Background(), request("ai", withHits(desc("agent", "d"), 0)))
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 1 {
			t.Errorf("check at 1s: %d left, want 1 (the reservation given back)", got)
		}
	})
}
