package server_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

const leaseWaitConfig = `
domain: ai
descriptors:
  - key: model
    value: vllm
    descriptors:
      - key: request_id
        concurrency: {max_in_flight: 1, lease: 10s, max_wait: 2s, max_waiters: 2, name: vllm}
`

// leaseWaitServer is a Server on memory stores for synctest bubbles.
func leaseWaitServer(t *testing.T, opts server.Options) (*server.Server, *limiter.MemoryLeases) {
	leases := limiter.NewMemoryLeases(limiter.MemoryOptions{})
	opts.Store, opts.Leases = limiter.NewMemoryStore(limiter.MemoryOptions{}), leases
	srv, err := server.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(server.MustParse(t, leaseWaitConfig))
	return srv, leases
}

func slot(id string) *ratelimitv3.RateLimitDescriptor {
	return desc("model", "vllm", "request_id", id)
}

// startLease calls for slot id on its own goroutine.
func startLease(ctx context.Context, srv *server.Server, start time.Time, d *ratelimitv3.RateLimitDescriptor, out chan<- answer) {
	go func() {
		resp, err := srv.ShouldRateLimit(ctx, request("ai", d))
		out <- answer{after: time.Since(start), code: resp.GetOverallCode(), err: err, resp: resp}
	}()
}

func held(t *testing.T, leases *limiter.MemoryLeases, srv *server.Server) int64 {
	t.Helper()
	var n int64
	for _, p := range srv.LeasePools(10) {
		n += p.InFlight
	}
	return n
}

// TestLeaseWaitFIFO: waiters are admitted in arrival order, each at the
// release that frees the slot; one beyond max_waiters is shed at once
// with ratelimitd.queue_full; a waiter whose caller gives up holds nothing.
func TestLeaseWaitFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, leases := leaseWaitServer(t, server.Options{})
		start := time.Now()
		ctx := context.Background()
		if resp, err := srv.ShouldRateLimit(ctx, request("ai", slot("a"))); err != nil || resp.GetOverallCode() != ok {
			t.Fatalf("a: %v %v, want OK", resp.GetOverallCode(), err)
		}
		b, c := make(chan answer, 1), make(chan answer, 1)
		startLease(ctx, srv, start, slot("b"), b)
		synctest.Wait()
		cctx, cancel := context.WithCancel(ctx)
		startLease(cctx, srv, start, slot("c"), c)
		synctest.Wait()
		resp, err := srv.ShouldRateLimit(ctx, request("ai", slot("d")))
		if err != nil || resp.GetOverallCode() != over {
			t.Fatalf("d beyond max_waiters: %v %v, want OVER_LIMIT at once", resp.GetOverallCode(), err)
		}
		if resp.GetDynamicMetadata().GetFields()["ratelimitd.queue_full"] == nil {
			t.Errorf("d's metadata = %v, want ratelimitd.queue_full", resp.GetDynamicMetadata())
		}
		time.Sleep(300 * time.Millisecond)
		if _, err := srv.ShouldRateLimit(ctx, request("ai", release(slot("a")))); err != nil {
			t.Fatalf("release a: %v", err)
		}
		ab := <-b
		if ab.err != nil || ab.code != ok || ab.after != 300*time.Millisecond {
			t.Fatalf("b: %v %v after %v, want OK at the release, 300ms", ab.code, ab.err, ab.after)
		}
		if ab.resp.GetDynamicMetadata().GetFields()["ratelimitd.waited"] == nil {
			t.Errorf("b's metadata = %v, want ratelimitd.waited", ab.resp.GetDynamicMetadata())
		}
		time.Sleep(200 * time.Millisecond)
		cancel()
		if ac := <-c; status.Code(ac.err) != codes.Canceled || ac.after != 500*time.Millisecond {
			t.Errorf("c: %v after %v, want Canceled at 500ms", ac.err, ac.after)
		}
		if n := held(t, leases, srv); n != 1 {
			t.Errorf("held = %d, want 1 (b's; the cancelled c holds nothing)", n)
		}
		if _, err := srv.ShouldRateLimit(ctx, request("ai", release(slot("b")))); err != nil {
			t.Fatalf("release b: %v", err)
		}
		if st, _ := leases.InFlight(ctx, time.Now(), srv.LeasePoolName(t, "ai", slot("b"))); st.InFlight != 0 {
			t.Errorf("after b's release %d held, want 0", st.InFlight)
		}
	})
}

// TestLeaseWaitEnds: a waiter is admitted when the held lease expires
// (RetryAfter, no release needed); one that cannot get a slot within
// max_wait is denied after it, holding nothing; and none waits past the
// caller's deadline.
func TestLeaseWaitEnds(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hold     time.Duration // how long before the test's request the lease was taken
		deadline time.Duration // the caller's; 0 none
		want     rlsv3.RateLimitResponse_Code
		wantErr  codes.Code
		after    time.Duration
	}{
		{"expiry frees the slot", 9 * time.Second, 0, ok, codes.OK, time.Second},
		{"max_wait ends the wait", 0, 0, over, codes.OK, 2 * time.Second},
		{"the deadline comes first", 0, time.Second, over, codes.OK, time.Second - 5*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv, _ := leaseWaitServer(t, server.Options{})
				ctx := context.Background()
				if resp, err := srv.ShouldRateLimit(ctx, request("ai", slot("a"))); err != nil || resp.GetOverallCode() != ok {
					t.Fatalf("a: %v %v", resp.GetOverallCode(), err)
				}
				time.Sleep(tc.hold)
				cctx := ctx
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					cctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				start := time.Now()
				resp, err := srv.ShouldRateLimit(cctx, request("ai", slot("b")))
				if status.Code(err) != tc.wantErr || resp.GetOverallCode() != tc.want || time.Since(start) != tc.after {
					t.Fatalf("b: %v %v after %v, want %v %v after %v", resp.GetOverallCode(), err, time.Since(start), tc.want, tc.wantErr, tc.after)
				}
				want := int64(1)
				if n := held(t, nil, srv); n != want {
					t.Errorf("held = %d, want %d", n, want)
				}
			})
		})
	}
}

// TestLeaseReleasedWakes: a release elsewhere, announced by
// Server.LeaseReleased (the daemon's pub/sub subscriber), wakes the head
// waiter at once.
func TestLeaseReleasedWakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		leases := limiter.NewMemoryLeases(limiter.MemoryOptions{})
		// Two servers on one lease store: two replicas.
		var srvs [2]*server.Server
		for i := range srvs {
			s, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), Leases: leases})
			if err != nil {
				t.Fatal(err)
			}
			s.SetConfig(server.MustParse(t, leaseWaitConfig))
			srvs[i] = s
		}
		ctx := context.Background()
		if resp, _ := srvs[0].ShouldRateLimit(ctx, request("ai", slot("a"))); resp.GetOverallCode() != ok {
			t.Fatal("a not admitted")
		}
		start := time.Now()
		b := make(chan answer, 1)
		startLease(ctx, srvs[1], start, slot("b"), b)
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		if _, err := srvs[0].ShouldRateLimit(ctx, request("ai", release(slot("a")))); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case ab := <-b:
			t.Fatalf("b answered before it was told of the release: %v", ab.code)
		default:
		}
		time.Sleep(10 * time.Millisecond)
		srvs[1].LeaseReleased(srvs[1].LeasePoolName(t, "ai", slot("b")))
		if ab := <-b; ab.code != ok || ab.after != 110*time.Millisecond {
			t.Errorf("b: %v %v after %v, want OK at the message, 110ms", ab.code, ab.err, ab.after)
		}
	})
}
