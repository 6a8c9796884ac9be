package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/goldentest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

const leaseConfig = `
domain: ai-gateway
descriptors:
  - key: model
    value: llama
    descriptors:
      - key: request_id
        concurrency: {max_in_flight: 8, lease: 10m, name: llama-slots}
  - key: model
    value: solo
    descriptors:
      - key: request_id
        concurrency: {max_in_flight: 1, lease: 1m}
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 1, name: per-client}
`

// release is the stream-done descriptor that gives a lease back.
func release(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
	d.IsNegativeHits = true
	return withHits(d, 1)
}

// onLeaseBackends runs test on each lease backend the request path is
// checked on (memory and Redis, each at the caller's clock so that expiry
// is exact), with a server of both the backend's stores serving
// leaseConfig on a fake clock.
func onLeaseBackends(t *testing.T, test func(t *testing.T, clock *clocktest.Clock, client rlsv3.RateLimitServiceClient, srv *server.Server)) {
	backends := map[string]func(t *testing.T) (limiter.LeaseStore, limiter.Store){
		"memory": func(t *testing.T) (limiter.LeaseStore, limiter.Store) {
			return limiter.NewMemoryLeases(limiter.MemoryOptions{}), limiter.NewMemoryStore(limiter.MemoryOptions{})
		},
		"redis": func(t *testing.T) (limiter.LeaseStore, limiter.Store) {
			st := redisStore(t)
			return st, st
		},
	}
	for name, backend := range backends {
		t.Run(name, func(t *testing.T) {
			leases, store := backend(t)
			clock := clocktest.New()
			client, srv := startServer(t, server.Options{Store: store, Leases: leases, Now: clock.Now}, server.MustParse(t, leaseConfig))
			test(t, clock, client, srv)
		})
	}
}

// TestConcurrencyRequestPath runs the table on both backends: 8
// leases taken, the 9th OVER_LIMIT; a retry of a held lease holds one
// slot; release one and the 9th is admitted; releasing an unknown lease or
// one twice changes nothing; a lease past its lease frees its slot.
func TestConcurrencyRequestPath(t *testing.T) {
	onLeaseBackends(t, func(t *testing.T, clock *clocktest.Clock, client rlsv3.RateLimitServiceClient, _ *server.Server) {
		ctx := context.Background()
		call := func(step string, d *ratelimitv3.RateLimitDescriptor, wantCode rlsv3.RateLimitResponse_Code, wantRemaining uint32) *rlsv3.RateLimitResponse {
			t.Helper()
			resp, err := client.ShouldRateLimit(ctx, request("ai-gateway", d))
			if err != nil {
				t.Fatalf("%s: ShouldRateLimit: %v", step, err)
			}
			st := resp.GetStatuses()[0]
			if resp.GetOverallCode() != wantCode || st.GetLimitRemaining() != wantRemaining {
				t.Fatalf("%s: code %v, limit_remaining %d; want %v, %d", step, resp.GetOverallCode(), st.GetLimitRemaining(), wantCode, wantRemaining)
			}
			return resp
		}
		take := func(id string) *ratelimitv3.RateLimitDescriptor { return desc("model", "llama", "request_id", id) }
		for i := 1; i <= 8; i++ {
			resp := call(fmt.Sprintf("acquire r%d", i), take(fmt.Sprintf("r%d", i)), rlsv3.RateLimitResponse_OK, uint32(8-i))
			cl := resp.GetStatuses()[0].GetCurrentLimit()
			if cl.GetName() != "llama-slots" || cl.GetRequestsPerUnit() != 8 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_UNKNOWN {
				t.Fatalf("current_limit = %v, want llama-slots, 8, UNKNOWN", cl)
			}
		}
		clock.Advance(time.Minute)
		denied := call("acquire r9", take("r9"), rlsv3.RateLimitResponse_OVER_LIMIT, 0)
		// r1 expires first, 9 minutes from now.
		if got := headerValue(denied, "retry-after"); got != "540" {
			t.Errorf("Retry-After = %q, want 540 (r1's lease ends in 9m)", got)
		}
		if got := denied.GetStatuses()[0].GetDurationUntilReset().GetSeconds(); got != 540 {
			t.Errorf("duration_until_reset = %ds, want 540", got)
		}
		call("renew r2 (an Envoy retry)", take("r2"), rlsv3.RateLimitResponse_OK, 0)
		call("release r1", release(take("r1")), rlsv3.RateLimitResponse_OK, 1)
		call("acquire r9 after the release", take("r9"), rlsv3.RateLimitResponse_OK, 0)
		call("release unknown", release(take("nobody")), rlsv3.RateLimitResponse_OK, 0)
		call("release r1 twice", release(take("r1")), rlsv3.RateLimitResponse_OK, 0)
		call("acquire r10, still full", take("r10"), rlsv3.RateLimitResponse_OVER_LIMIT, 0)
		call("release r3", release(take("r3")), rlsv3.RateLimitResponse_OK, 1)
		call("release r3 again", release(take("r3")), rlsv3.RateLimitResponse_OK, 1)
		call("acquire r10", take("r10"), rlsv3.RateLimitResponse_OK, 0)
		call("acquire r11, full", take("r11"), rlsv3.RateLimitResponse_OVER_LIMIT, 0)
		// r4…r8 were taken at 0 and end at 10m; r2, r9, r10 a minute later.
		clock.Advance(9 * time.Minute)
		call("acquire r11 once r4…r8 expired", take("r11"), rlsv3.RateLimitResponse_OK, 4)
		clock.Advance(time.Minute)
		call("check (hits 0) once all expired but r11", withHits(take("x"), 0), rlsv3.RateLimitResponse_OK, 7)
	})
}

func headerValue(resp *rlsv3.RateLimitResponse, key string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == key {
			return h.GetValue()
		}
	}
	return ""
}

// TestConcurrencyAllOrNothing: a request denied by a rate limit takes no
// slot, and one denied for a slot spends no tokens, on both backends.
func TestConcurrencyAllOrNothing(t *testing.T) {
	onLeaseBackends(t, func(t *testing.T, clock *clocktest.Clock, client rlsv3.RateLimitServiceClient, srv *server.Server) {
		ctx := context.Background()
		code := func(step string, want rlsv3.RateLimitResponse_Code, descs ...*ratelimitv3.RateLimitDescriptor) {
			t.Helper()
			resp, err := client.ShouldRateLimit(ctx, request("ai-gateway", descs...))
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			if resp.GetOverallCode() != want {
				t.Fatalf("%s: %v, want %v", step, resp.GetOverallCode(), want)
			}
		}
		inFlight := func() int64 {
			t.Helper()
			pools := srv.LeasePools(10)
			var n int64
			for _, p := range pools {
				n += p.InFlight
			}
			return n
		}
		solo := func(id string) *ratelimitv3.RateLimitDescriptor { return desc("model", "solo", "request_id", id) }

		// Denied by the rate limit: the slot is given back.
		code("client a's one request", rlsv3.RateLimitResponse_OK, desc("client", "a"))
		code("slot + spent client a", rlsv3.RateLimitResponse_OVER_LIMIT, solo("r1"), desc("client", "a"))
		code("the slot is free", rlsv3.RateLimitResponse_OK, solo("r2"))
		if n := inFlight(); n != 1 {
			t.Errorf("in flight = %d, want 1 (r2's only)", n)
		}
		// Denied for the slot: client b's token is not spent.
		code("full slot + client b", rlsv3.RateLimitResponse_OVER_LIMIT, solo("r3"), desc("client", "b"))
		code("client b still has its token", rlsv3.RateLimitResponse_OK, desc("client", "b"))
		// A renewed lease is not given back by a later denial.
		code("renew r2 + spent client b", rlsv3.RateLimitResponse_OVER_LIMIT, solo("r2"), desc("client", "b"))
		code("r2 still holds the slot", rlsv3.RateLimitResponse_OVER_LIMIT, solo("r4"))
		code("release r2", rlsv3.RateLimitResponse_OK, release(solo("r2")))
		code("admitted with client c", rlsv3.RateLimitResponse_OK, solo("r5"), desc("client", "c"))
		if n := inFlight(); n != 1 {
			t.Errorf("in flight = %d, want 1 (r5's)", n)
		}
	})
}

// TestConcurrencyHeaders pins the IETF RateLimit fields (and draft 03's,
// which share the pick) of admitted and denied answers, rate and
// concurrency limits alike, against testdata/ietf-headers.golden.
func TestConcurrencyHeaders(t *testing.T) {
	clock := clocktest.New()
	srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), Now: clock.Now, RateLimitHeaders: server.RateLimitHeadersIETF})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(server.MustParse(t, leaseConfig+`
  - key: model
    value: o3
    rate_limits:
      - {unit: second, requests_per_unit: 10, name: o3-rps}
      - {unit: hour, requests_per_unit: 3, name: "o3 \"hourly\""}
`))
	var b strings.Builder
	for _, step := range []struct {
		name  string
		descs []*ratelimitv3.RateLimitDescriptor
	}{
		{"slot admitted", []*ratelimitv3.RateLimitDescriptor{desc("model", "solo", "request_id", "a")}},
		{"slot denied", []*ratelimitv3.RateLimitDescriptor{desc("model", "solo", "request_id", "b")}},
		{"rate admitted, least left", []*ratelimitv3.RateLimitDescriptor{desc("model", "o3")}},
		{"rate and 8 slots admitted: the rate has less left", []*ratelimitv3.RateLimitDescriptor{desc("model", "o3"), desc("model", "llama", "request_id", "c")}},
		{"rate admitted, 1 left", []*ratelimitv3.RateLimitDescriptor{desc("model", "o3")}},
		{"rate denied", []*ratelimitv3.RateLimitDescriptor{desc("model", "o3")}},
		{"released", []*ratelimitv3.RateLimitDescriptor{release(desc("model", "solo", "request_id", "a"))}},
	} {
		resp, err := srv.ShouldRateLimit(context.Background(), request("ai-gateway", step.descs...))
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		fmt.Fprintf(&b, "# %s: %v\n", step.name, resp.GetOverallCode())
		for _, h := range resp.GetResponseHeadersToAdd() {
			fmt.Fprintf(&b, "%s: %s\n", h.GetKey(), h.GetValue())
		}
		clock.Advance(10 * time.Second)
	}
	const path = "testdata/ietf-headers.golden"
	if want, differ := goldentest.Compare(t, path, b.String()); differ {
		t.Errorf("got:\n%s\nwant (%s):\n%s", b.String(), path, want)
	}
}

// leaseEvents records what a LeaseObserver hears.
type leaseEvents struct {
	mu     sync.Mutex
	events []server.LeaseEvent
}

func (l *leaseEvents) ObserveLease(e server.LeaseEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// TestRefreshCountsExpiredLeases: leases whose release never came are
// counted once, by the refresh that finds them expired, and their pool is
// forgotten; every call reports what it purged.
func TestRefreshCountsExpiredLeases(t *testing.T) {
	clock := clocktest.New()
	obs := &leaseEvents{}
	srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), Now: clock.Now, LeaseObserver: obs})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(server.MustParse(t, leaseConfig))
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c"} {
		if resp, err := srv.ShouldRateLimit(ctx, request("ai-gateway", desc("model", "llama", "request_id", id))); err != nil || resp.GetOverallCode() != ok {
			t.Fatalf("acquire %s: %v %v", id, resp.GetOverallCode(), err)
		}
	}
	if pools := srv.LeasePools(10); len(pools) != 1 || pools[0].InFlight != 3 || pools[0].Label != "ai-gateway > model=llama > request_id" {
		t.Fatalf("LeasePools = %+v, want the llama pool with 3", pools)
	}
	clock.Advance(11 * time.Minute)
	srv.RefreshLeasePools(ctx)
	srv.RefreshLeasePools(ctx) // nothing left to count
	var expired int64
	ops := map[server.LeaseOp]int{}
	for _, e := range obs.events {
		expired += e.Expired
		ops[e.Op]++
	}
	if expired != 3 || ops[server.LeaseTaken] != 3 {
		t.Errorf("events %+v: %d expired, %d taken; want 3 and 3", obs.events, expired, ops[server.LeaseTaken])
	}
	if pools := srv.LeasePools(10); len(pools) != 0 {
		t.Errorf("LeasePools after the leases expired = %+v, want none", pools)
	}
}

// TestConcurrencyCheckOfAFullPool: a check (hits 0) of a pool that is full
// but not over admits, as a check of an empty bucket does, so a request
// whose answer is OK spends its tokens once and only once, under the
// default overdraft too (which records the hits of denied requests).
func TestConcurrencyCheckOfAFullPool(t *testing.T) {
	for _, overdraft := range []bool{false, true} {
		t.Run(fmt.Sprintf("overdraft=%v", overdraft), func(t *testing.T) {
			clock := clocktest.New()
			client, _ := startServer(t, server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}),
				Leases: limiter.NewMemoryLeases(limiter.MemoryOptions{}), Now: clock.Now,
				Overdraft: server.Overdraft{On: overdraft}}, server.MustParse(t, leaseConfig))
			code := func(ds ...*ratelimitv3.RateLimitDescriptor) rlsv3.RateLimitResponse_Code {
				t.Helper()
				return call(t, client, request("ai-gateway", ds...)).GetOverallCode()
			}
			if c := code(desc("model", "solo", "request_id", "a")); c != ok {
				t.Fatalf("taking solo's one slot: %v", c)
			}
			if c := code(desc("client", "c1"), withHits(desc("model", "solo", "request_id", "b"), 0)); c != ok {
				t.Errorf("client c1 beside a check of the full pool: %v, want OK (a check denies only a pool over its limit)", c)
			}
			if c := code(desc("client", "c1")); c != over {
				t.Errorf("client c1 again within the minute: %v, want OVER_LIMIT (its token spent)", c)
			}
			// Under the overdraft the denied call's hit is owed too: a
			// minute more (and a denied probe would add one). Either way
			// the request beside the check spent once, not twice.
			wait := time.Minute + time.Second
			if overdraft {
				wait += time.Minute
			}
			clock.Advance(wait)
			if c := code(desc("client", "c1")); c != ok {
				t.Errorf("client c1 after %v: %v, want OK", wait, c)
			}
		})
	}
}

// failingLeases is a lease store whose Acquire of one id fails after it
// ran: its answer lost, as a Redis call past its deadline.
type failingLeases struct {
	*limiter.MemoryLeases
	failID string
}

func (f failingLeases) Acquire(ctx context.Context, now time.Time, r limiter.LeaseRequest) (limiter.LeaseDecision, error) {
	d, err := f.MemoryLeases.Acquire(ctx, now, r)
	if err == nil && r.ID == f.failID {
		return limiter.LeaseDecision{}, fmt.Errorf("fake: %w: answer lost", limiter.ErrUnavailable)
	}
	return d, err
}

// TestConcurrencyLostRenewalKeepsTheSlot: a renewal (an Envoy retry of a
// request still running) whose answer is lost does not give the lease
// back, which would free the running request's slot for another.
func TestConcurrencyLostRenewalKeepsTheSlot(t *testing.T) {
	clock := clocktest.New()
	leases := failingLeases{MemoryLeases: limiter.NewMemoryLeases(limiter.MemoryOptions{})}
	client, _ := startServer(t, server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), Leases: &leases, Now: clock.Now},
		server.MustParse(t, leaseConfig))
	if c := call(t, client, request("ai-gateway", desc("model", "solo", "request_id", "a"))).GetOverallCode(); c != ok {
		t.Fatalf("taking solo's one slot: %v", c)
	}
	leases.failID = "a"
	if _, err := client.ShouldRateLimit(context.Background(), request("ai-gateway", desc("model", "solo", "request_id", "a"))); err == nil {
		t.Fatal("the renewal whose answer was lost succeeded; want its error")
	}
	leases.failID = ""
	if c := call(t, client, request("ai-gateway", desc("model", "solo", "request_id", "b"))).GetOverallCode(); c != over {
		t.Errorf("another request after the lost renewal: %v, want OVER_LIMIT (a still holds the slot)", c)
	}
}
