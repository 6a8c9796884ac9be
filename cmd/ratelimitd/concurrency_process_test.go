package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

const concurrencyConfig = `domain: ai
descriptors:
  - key: model
    value: vllm
    descriptors:
      - key: request_id
        concurrency: {max_in_flight: 4, lease: 30s, max_wait: 2s, max_waiters: 100}
  - key: model
    value: solo
    descriptors:
      - key: request_id
        concurrency: {max_in_flight: 1, lease: 30s, max_wait: 2s}
`

// leaseReq is the request-time (or, release, the stream-done) call for
// lease id of model.
func leaseReq(model, id string, release bool) *rlsv3.RateLimitRequest {
	d := servertest.Desc("model", model, "request_id", id)
	if release {
		d.HitsAddend, d.IsNegativeHits = wrapperspb.UInt64(1), true
	}
	return servertest.Request("ai", d)
}

// poolKey is the Redis key of model's pool under the default prefix.
func poolKey(t *testing.T, srv *redistest.Server, model string) string {
	t.Helper()
	set := servertest.ParseConfig(t, "ai.yaml", concurrencyConfig)
	entries := []config.Entry{{Key: "model", Value: model}, {Key: "request_id", Value: "x"}}
	st, err := redisstore.New(srv.Client(), redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return st.LeaseKey(string(set.Lookup("ai", entries).AppendPool(nil, entries)))
}

// TestConcurrencyAcrossReplicas: three replicas on one Redis, 50 clients
// each taking a lease (waiting for it), holding it 50 to 150 ms, then
// releasing it through any replica. The leases held, sampled from Redis
// all along, never exceed max_in_flight, and while clients wait the slots
// are used at least 95% of the time.
func TestConcurrencyAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	dir := writeConfig(t, map[string]string{"ai.yaml": concurrencyConfig})
	var conns []rlsv3.RateLimitServiceClient
	for range 3 {
		p := startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr)
		conns = append(conns, rlsClient(t, p.grpcAddr))
	}
	key := poolKey(t, srv, "vllm")
	rc := srv.Client()
	const maxInFlight = 4
	const run = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()

	var (
		samples, sum, over atomic.Int64
		peak               atomic.Int64
		admitted, denied   atomic.Int64
		errs               sync.Map
		sampling           sync.WaitGroup
		clients            sync.WaitGroup
	)
	start := time.Now()
	sampling.Go(func() {
		for ctx.Err() == nil {
			n, err := rc.ZCard(context.Background(), key).Result()
			if err != nil {
				errs.Store("zcard: "+err.Error(), true)
				return
			}
			// The first and last half second are the clients starting and
			// stopping: the slots are counted in between.
			if el := time.Since(start); el > run/10 && el < run-run/10 {
				samples.Add(1)
				sum.Add(n)
			}
			if n > maxInFlight {
				over.Add(1)
			}
			if n > peak.Load() {
				peak.Store(n)
			}
			time.Sleep(time.Millisecond)
		}
	})
	for c := range 50 {
		clients.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(c), 1))
			for n := 0; n < 10_000 && ctx.Err() == nil; n++ {
				id := fmt.Sprintf("c%d-%d", c, n)
				callCtx, cancelCall := context.WithTimeout(context.Background(), 3*time.Second)
				resp, err := conns[rnd.IntN(3)].ShouldRateLimit(callCtx, leaseReq("vllm", id, false))
				cancelCall()
				if err != nil {
					errs.Store(status.Code(err).String()+": "+status.Convert(err).Message(), true)
					continue
				}
				if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					denied.Add(1)
					continue
				}
				admitted.Add(1)
				time.Sleep(time.Duration(50+rnd.IntN(100)) * time.Millisecond)
				if _, err := conns[rnd.IntN(3)].ShouldRateLimit(context.Background(), leaseReq("vllm", id, true)); err != nil {
					errs.Store("release: "+err.Error(), true)
				}
			}
		})
	}
	clients.Wait()
	cancel()
	sampling.Wait()
	errs.Range(func(k, _ any) bool {
		t.Errorf("error during the run: %v", k)
		return true
	})
	used := float64(sum.Load()) / float64(samples.Load()*maxInFlight)
	t.Logf("%d admitted, %d denied after max_wait; %d samples, peak %d held, slots used %.1f%%", admitted.Load(), denied.Load(), samples.Load(), peak.Load(), 100*used)
	if over.Load() > 0 {
		t.Errorf("%d samples saw more than %d leases held (peak %d)", over.Load(), maxInFlight, peak.Load())
	}
	if used < 0.95 {
		t.Errorf("slots used %.1f%% of the time while 50 clients wait for 4, want at least 95%%", 100*used)
	}
	if admitted.Load() < 100 {
		t.Errorf("only %d leases taken in %v", admitted.Load(), run)
	}
}

// TestConcurrencyWaitAcrossReplicas: with max_in_flight 1 and max_wait
// 2s, a request waiting on replica B is admitted within 50 ms of the
// release of the held lease on replica A (Redis pub/sub); a waiter whose
// caller gives up holds nothing.
func TestConcurrencyWaitAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	dir := writeConfig(t, map[string]string{"ai.yaml": concurrencyConfig})
	a := rlsClient(t, startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr).grpcAddr)
	b := rlsClient(t, startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr).grpcAddr)
	key := poolKey(t, srv, "solo")
	ctx := context.Background()
	call := func(c rlsv3.RateLimitServiceClient, ctx context.Context, id string, release bool) (rlsv3.RateLimitResponse_Code, error) {
		resp, err := c.ShouldRateLimit(ctx, leaseReq("solo", id, release))
		return resp.GetOverallCode(), err
	}
	for round := range 3 {
		first, second := fmt.Sprintf("a%d", round), fmt.Sprintf("b%d", round)
		if code, err := call(a, ctx, first, false); err != nil || code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("round %d: A's lease: %v %v", round, code, err)
		}
		type result struct {
			code rlsv3.RateLimitResponse_Code
			err  error
			at   time.Time
		}
		done := make(chan result, 1)
		go func() {
			callCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			code, err := call(b, callCtx, second, false)
			done <- result{code, err, time.Now()}
		}()
		time.Sleep(300 * time.Millisecond) // B is waiting
		select {
		case r := <-done:
			t.Fatalf("round %d: B answered while A held the slot: %v %v", round, r.code, r.err)
		default:
		}
		released := time.Now()
		if code, err := call(a, ctx, first, true); err != nil || code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("round %d: A's release: %v %v", round, code, err)
		}
		r := <-done
		if r.err != nil || r.code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("round %d: B: %v %v, want OK", round, r.code, r.err)
		}
		if lag := r.at.Sub(released); lag > 50*time.Millisecond {
			t.Errorf("round %d: B admitted %v after A's release, want within 50ms", round, lag)
		} else {
			t.Logf("round %d: B admitted %v after A's release began", round, lag)
		}
		// A waiter on A that gives up holds nothing.
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		// It is answered OVER_LIMIT as its deadline nears, or its call
		// ends with the deadline: either way it is not admitted.
		if code, err := call(a, cctx, "gives-up", false); err == nil && code == rlsv3.RateLimitResponse_OK ||
			err != nil && status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("round %d: a waiter past its deadline: %v %v, want OVER_LIMIT or DeadlineExceeded", round, code, err)
		}
		cancel()
		if ids, err := srv.Client().ZRange(ctx, key, 0, -1).Result(); err != nil || len(ids) != 1 || ids[0] != second {
			t.Errorf("round %d: leases held %v (%v), want only %s", round, ids, err, second)
		}
		if code, err := call(b, ctx, second, true); err != nil || code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("round %d: B's release: %v %v", round, code, err)
		}
	}
}
