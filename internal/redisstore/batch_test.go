package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestCoalescesConcurrentTakes: 64 goroutines hammer one slow bucket and
// their own fast ones. Redis sees far fewer round trips than Takes, and
// the slow bucket admits exactly its burst, not one more.
func TestCoalescesConcurrentTakes(t *testing.T) {
	s := callerClockStore(t)
	slow := limiter.Limit{Count: 1, Period: time.Hour, Burst: 100}
	fast := limiter.Limit{Count: 1e6, Period: time.Second, Burst: 1e6}
	const goroutines, perGoroutine = 64, 40
	var admitted, fastAdmitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range perGoroutine {
				req := limiter.Request{Key: "slow", Limit: slow, Hits: 1}
				if i%2 == 1 {
					req = limiter.Request{Key: fmt.Sprintf("fast%d", g), Limit: fast, Hits: 1}
				}
				d, err := s.Take(context.Background(), t0, []limiter.Request{req})
				if err != nil {
					errs <- err
					return
				}
				switch {
				case d[0].Allowed && req.Key == "slow":
					admitted.Add(1)
				case d[0].Allowed:
					fastAdmitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := admitted.Load(); got != slow.Burst {
		t.Errorf("%d concurrent Takes on a bucket of %d admitted %d, want exactly %d",
			goroutines*perGoroutine/2, slow.Burst, got, slow.Burst)
	}
	if got, want := fastAdmitted.Load(), int64(goroutines*perGoroutine/2); got != want {
		t.Errorf("fast buckets admitted %d, want all %d", got, want)
	}
	st := s.Stats()
	if st.Takes != goroutines*perGoroutine || st.Calls != st.Takes {
		t.Errorf("Stats = %+v, want %d Takes and as many Calls", st, goroutines*perGoroutine)
	}
	if st.Scripts*3 > st.Calls {
		t.Errorf("Stats = %+v: want concurrent Takes merged into a third as many script calls or fewer", st)
	}
	if float64(st.RoundTrips) >= 0.3*float64(st.Takes) {
		t.Errorf("Stats = %+v: %d round trips for %d concurrent Takes, want fewer than 0.3 per Take",
			st, st.RoundTrips, st.Takes)
	}
	t.Logf("%d Takes in %d round trips (%.3f per Take)", st.Takes, st.RoundTrips, float64(st.RoundTrips)/float64(st.Takes))
}

// TestLoneCallerIsSentAtOnce: one caller at a time gets one round trip per
// Take, and is sent at once: with a BatchWait of a second, a Take that
// waited for company that is not coming would take that second.
func TestLoneCallerIsSentAtOnce(t *testing.T) {
	c := standalone(t).Client()
	s := newStoreOpts(t, c, redisstore.Options{Clock: redisstore.CallerClock, BatchWait: time.Second})
	l := limiter.Limit{Count: 10, Period: time.Second, Burst: 10}
	take(t, s, t0, limiter.Request{Key: "k", Limit: l}) // loads the script if needed
	for i := range 50 {
		before := s.Stats()
		start := time.Now()
		take(t, s, t0.Add(time.Duration(i+1)*time.Second), limiter.Request{Key: "k", Limit: l, Hits: 1})
		if took := time.Since(start); took >= 500*time.Millisecond {
			t.Fatalf("Take %d alone took %v, want well under the 1s BatchWait", i, took)
		}
		after := s.Stats()
		if trips, takes := after.RoundTrips-before.RoundTrips, after.Takes-before.Takes; trips != 1 || takes != 1 {
			t.Fatalf("Take %d alone: %d round trips for %d Takes, want 1 for 1", i, trips, takes)
		}
	}
}

// TestBatchMaxOneIsDirect: BatchMax 1 turns coalescing off, and Take still
// decides exactly.
func TestBatchMaxOneIsDirect(t *testing.T) {
	c := standalone(t).Client()
	s := newStoreOpts(t, c, redisstore.Options{Clock: redisstore.CallerClock, BatchMax: 1})
	l := limiter.Limit{Count: 3, Period: time.Second, Burst: 3}
	take(t, s, t0, limiter.Request{Key: "warm-up", Limit: l, Hits: 1}) // the script cached: no NOSCRIPT below
	before := s.Stats()
	d := take(t, s, t0, limiter.Request{Key: "a", Limit: l, Hits: 2})
	if want := (limiter.Decision{Allowed: true, Remaining: 1, ResetAfter: 666667 * time.Microsecond}); d[0] != want {
		t.Errorf("Take = %+v, want %+v", d[0], want)
	}
	st := s.Stats()
	if got := (redisstore.Stats{Takes: st.Takes - before.Takes, Calls: st.Calls - before.Calls,
		Scripts: st.Scripts - before.Scripts, RoundTrips: st.RoundTrips - before.RoundTrips, Direct: st.Direct - before.Direct}); got != (redisstore.Stats{Takes: 1, Calls: 1, Scripts: 1, RoundTrips: 1}) {
		t.Errorf("Stats of one Take = %+v, want one of each, none direct", got)
	}
}

func TestNewRejectsNegativeBatchMax(t *testing.T) {
	if _, err := redisstore.New(standaloneClientless{}, redisstore.Options{BatchMax: -1}); err == nil {
		t.Error("New(BatchMax -1) succeeded, want an error")
	}
}

// TestDoneContextIsNotSent: a Take whose context is already done fails at
// once with a *limiter.DeadlineError of a call never sent (no backend
// failure), and its call never reaches Redis.
func TestDoneContextIsNotSent(t *testing.T) {
	s := callerClockStore(t)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 20 {
		_, err := s.Take(ctx, t0, []limiter.Request{{Key: "k", Limit: l, Hits: 1}})
		var de *limiter.DeadlineError
		if !errors.As(err, &de) || de.InFlight != 0 || errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("Take %d with a cancelled context = %v, want a *limiter.DeadlineError of an unsent call, not ErrUnavailable", i, err)
		}
	}
	if st := s.Stats(); st.Calls != 0 {
		t.Errorf("Stats = %+v after cancelled Takes, want no calls sent", st)
	}
	if d := take(t, s, t0, limiter.Request{Key: "k", Limit: l, Hits: 1}); !d[0].Allowed {
		t.Errorf("Take after cancelled ones = %+v, want the bucket's one token", d[0])
	}
}

// TestDeadlineReturnsPromptly: with Redis paused, a caller whose deadline
// passes gets its error at once, though the batch it rode in is still out.
func TestDeadlineReturnsPromptly(t *testing.T) {
	srv := standalone(t)
	c := srv.Client()
	s := newStore(t, c, redisstore.ServerClock)
	l := limiter.Limit{Count: 10, Period: time.Second, Burst: 10}
	req := []limiter.Request{{Key: "k", Limit: l, Hits: 1}}
	take(t, s, time.Time{}, req...)

	// Another client pauses the server briefly: callers queue behind the
	// paused batch.
	admin := srv.Client()
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", "2000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(context.Background(), "CLIENT", "UNPAUSE")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			checkUnavailable(t, s, req, 20*time.Millisecond)
		})
	}
	wg.Wait()
}

// TestClosedStoreFails: after Close, Take fails with ErrUnavailable.
func TestClosedStoreFails(t *testing.T) {
	s := callerClockStore(t)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
	take(t, s, t0, limiter.Request{Key: "k", Limit: l, Hits: 0})
	s.Close()
	s.Close()
	if _, err := s.Take(context.Background(), t0, []limiter.Request{{Key: "k", Limit: l, Hits: 1}}); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Take after Close = %v, want an error wrapping ErrUnavailable", err)
	}
}

// TestClusterDoesNotMergeTakes: concurrent single-bucket Takes on many
// buckets of a cluster share round trips but never one script call, which
// could not span their slots (CROSSSLOT).
func TestClusterDoesNotMergeTakes(t *testing.T) {
	c := cluster(t).Client()
	s := newStore(t, c, redisstore.CallerClock)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Go(func() {
			for i := range 5 {
				d, err := s.Take(context.Background(), t0, []limiter.Request{{Key: fmt.Sprint("spread", g, ".", i), Limit: l, Hits: 1}})
				if err == nil && !d[0].Allowed {
					err = fmt.Errorf("a fresh bucket denied: %+v", d[0])
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Scripts != st.Calls || st.RoundTrips >= st.Calls {
		t.Errorf("Stats = %+v: want one script per call, in fewer round trips", st)
	}
}

// TestClusterCoalescesAcrossSlots: goroutines race Takes spanning two
// slots. They share round trips; give-backs may deny some requests that a
// single Redis would admit, but never admit more than the smaller bucket
// holds, and in the end each bucket is charged exactly once per admitted
// Take.
func TestClusterCoalescesAcrossSlots(t *testing.T) {
	c, s, a, b := acrossSlots(t)
	la := limiter.Limit{Count: 1, Period: time.Hour, Burst: 30}
	lb := limiter.Limit{Count: 1, Period: time.Minute, Burst: 1000}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for range 10 {
				d, err := s.Take(context.Background(), t0, []limiter.Request{{Key: a, Limit: la, Hits: 1}, {Key: b, Limit: lb, Hits: 1}})
				if err != nil {
					errs <- err
					return
				}
				if d[0].Allowed != d[1].Allowed {
					// A denied Take reports the other bucket as a check
					// would; only a bucket that cannot give one more token
					// denies.
					if d[0].Allowed && d[0].Remaining == 0 || d[1].Allowed && d[1].Remaining == 0 {
						errs <- fmt.Errorf("Take = %+v: a denied Take reports an allowed bucket as empty", d)
						return
					}
				}
				if d[0].Allowed && d[1].Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := admitted.Load()
	if n < 1 || n > la.Burst {
		t.Fatalf("admitted %d, want between 1 and %d", n, la.Burst)
	}
	us := t0.UnixMicro()
	if got, _ := getState(t, c, s.Key(a)); got != (limiter.State{TAT: us + n*time.Hour.Microseconds(), Count: la.Count, PeriodUS: la.Period.Microseconds()}) {
		t.Errorf("a = %+v, want charged exactly %d times", got, n)
	}
	if got, _ := getState(t, c, s.Key(b)); got != (limiter.State{TAT: us + n*time.Minute.Microseconds(), Count: lb.Count, PeriodUS: lb.Period.Microseconds()}) {
		t.Errorf("b = %+v, want charged exactly %d times", got, n)
	}
	st := s.Stats()
	if st.RoundTrips >= st.Calls {
		t.Errorf("Stats = %+v: want fewer round trips than script calls", st)
	}
	t.Logf("%+v", st)
}

// BenchmarkTakeParallel measures concurrent Takes on distinct buckets of
// one standalone server, coalesced (the default) and not (BatchMax 1), and
// reports Redis round trips per Take.
func BenchmarkTakeParallel(b *testing.B) {
	forBatchModes(b, func(b *testing.B, c *redis.Client, s *redisstore.Store) {
		l := limiter.Limit{Count: 1e7, Period: time.Second, Burst: 1e7}
		var ids atomic.Int64
		b.ReportAllocs()
		b.SetParallelism(16) // 16 × GOMAXPROCS callers
		b.ResetTimer()
		before := s.Stats()
		cpuBefore := redisCPU(b, c)
		b.RunParallel(func(pb *testing.PB) {
			reqs := []limiter.Request{{Key: fmt.Sprintf("bucket%d", ids.Add(1)), Limit: l, Hits: 1}}
			for pb.Next() {
				if _, err := s.Take(context.Background(), time.Time{}, reqs); err != nil {
					b.Error(err)
					return
				}
			}
		})
		after := s.Stats()
		cpuAfter := redisCPU(b, c)
		b.ReportMetric(float64(after.RoundTrips-before.RoundTrips)/float64(after.Takes-before.Takes), "roundtrips/op")
		b.ReportMetric((cpuAfter-cpuBefore).Seconds()*1e6/float64(after.Takes-before.Takes), "redis-cpu-µs/op")
	})
}

// forBatchModes runs bench on a Store over the standalone server,
// coalesced (the default) and direct (BatchMax 1).
func forBatchModes(b *testing.B, bench func(b *testing.B, c *redis.Client, s *redisstore.Store)) {
	for _, mode := range []struct {
		name string
		opts redisstore.Options
	}{
		{"coalesced", redisstore.Options{}},
		// As ratelimitd runs it: each round trip watched for the backend
		// timeout (10 ms), on a goroutine of its own.
		{"coalesced-watched", redisstore.Options{SlowAfter: 10 * time.Millisecond, OnBackend: func(string, time.Duration, error) {}}},
		{"direct", redisstore.Options{BatchMax: 1}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			c := standalone(b).Client()
			bench(b, c, newStoreOpts(b, c, mode.opts))
		})
	}
}

// redisCPU is the CPU time the Redis server behind c has used (INFO cpu:
// used_cpu_user + used_cpu_sys).
func redisCPU(t testing.TB, c *redis.Client) time.Duration {
	t.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		name, val, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				t.Fatalf("INFO cpu %s: %v", name, err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// BenchmarkTakeSerial measures one caller at a time, coalesced (the
// default) and not: a lone caller must not wait for company.
func BenchmarkTakeSerial(b *testing.B) {
	forBatchModes(b, func(b *testing.B, c *redis.Client, s *redisstore.Store) {
		reqs := []limiter.Request{{Key: "serial", Limit: limiter.Limit{Count: 1e7, Period: time.Second, Burst: 1e7}, Hits: 1}}
		b.ReportAllocs()
		before := s.Stats()
		for b.Loop() {
			if _, err := s.Take(context.Background(), time.Time{}, reqs); err != nil {
				b.Fatal(err)
			}
		}
		after := s.Stats()
		b.ReportMetric(float64(after.RoundTrips-before.RoundTrips)/float64(after.Takes-before.Takes), "roundtrips/op")
	})
}

// TestIdleCallsAreSentDirectly: with a client that honours deadlines (as
// Dial makes them), a call that finds Redis idle is sent from its caller's
// goroutine; it still is never sent with a done context, still returns at
// its deadline, and concurrent calls still coalesce.
func TestIdleCallsAreSentDirectly(t *testing.T) {
	srv := standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, redisstore.CallerClock)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 30}
	take(t, s, t0, limiter.Request{Key: "serial", Limit: l, Hits: 1}) // loads the script if needed
	start := s.Stats()
	for range 10 {
		take(t, s, t0, limiter.Request{Key: "serial", Limit: l, Hits: 1})
	}
	if st := s.Stats(); st.RoundTrips-start.RoundTrips != 10 || st.Calls-start.Calls != 10 || st.Direct-start.Direct != 10 {
		t.Errorf("10 serial Takes: %+v after %+v, want 10 calls in 10 round trips, all sent directly", st, start)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var de *limiter.DeadlineError
	if _, err := s.Take(ctx, t0, []limiter.Request{{Key: "serial", Limit: l, Hits: 1}}); !errors.As(err, &de) || de.InFlight != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("Take with a done context = %v, want a *limiter.DeadlineError of a call never sent, wrapping context.Canceled", err)
	}
	if st := s.Stats(); st.Calls != start.Calls+10 {
		t.Errorf("a Take with a done context was sent: %+v", st)
	}

	var wg sync.WaitGroup
	before := s.Stats()
	for g := range 64 {
		wg.Go(func() {
			for range 20 {
				if _, err := s.Take(context.Background(), t0, []limiter.Request{{Key: fmt.Sprint("k", g%8), Limit: l, Hits: 1}}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	after := s.Stats()
	if trips, calls := after.RoundTrips-before.RoundTrips, after.Calls-before.Calls; calls != 1280 || trips*3 > calls {
		t.Errorf("64×20 concurrent Takes: %d calls in %d round trips, want 1280 in under a third as many", calls, trips)
	}

	admin := srv.Client()
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", "2000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(context.Background(), "CLIENT", "UNPAUSE")
	checkUnavailable(t, s, []limiter.Request{{Key: "serial", Limit: l, Hits: 1}}, 20*time.Millisecond)
}
