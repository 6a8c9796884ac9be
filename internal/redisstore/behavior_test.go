package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

var t0 = limitertest.T0

func take(t *testing.T, s *redisstore.Store, now time.Time, reqs ...limiter.Request) []limiter.Decision {
	t.Helper()
	d, err := s.Take(context.Background(), now, reqs)
	if err != nil {
		t.Fatalf("Take(%v, %v): %v", now, reqs, err)
	}
	return d
}

func TestPTTLIsTimeUntilFull(t *testing.T) {
	c := standalone(t).Client()
	s := newStore(t, c, redisstore.CallerClock)
	ctx := context.Background()
	for _, tc := range []struct {
		l      limiter.Limit
		hits   int64
		wantMS int64
		// mayBeGone: the bucket is full again within a few ms, so its key may
		// have expired (PTTL -2) before the test reads it.
		mayBeGone bool
	}{
		{limiter.Limit{Count: 3, Period: time.Second, Burst: 3}, 1, 334, false},  // 333333⅓µs
		{limiter.Limit{Count: 3, Period: time.Second, Burst: 3}, 3, 1000, false}, // exactly 1s
		{limiter.Limit{Count: 1, Period: 1001 * time.Microsecond, Burst: 1}, 1, 2, true},
		{limiter.Limit{Count: 10, Period: time.Hour, Burst: 10}, 4, 1_440_000, false},
	} {
		key := fmt.Sprintf("%v/%d", tc.l, tc.hits)
		start := time.Now()
		take(t, s, t0, limiter.Request{Key: key, Limit: tc.l, Hits: tc.hits})
		pttl, err := c.PTTL(ctx, s.Key(key)).Result()
		elapsed := time.Since(start) // between the script's SET and the PTTL read, at most
		if err != nil {
			t.Fatal(err)
		}
		// go-redis answers PTTL's -2 (no key) and -1 (no expiry) as
		// Durations of -2ns and -1ns.
		switch {
		case pttl == -2 && tc.mayBeGone:
			continue
		case pttl < 0:
			t.Errorf("after Take(%v, %d hits), PTTL = %d (no key, or no expiry), want %dms",
				tc.l, tc.hits, pttl.Nanoseconds(), tc.wantMS)
			continue
		}
		// PTTL counts down in real time: allow what passed since the Take
		// was sent, and a millisecond of rounding.
		if ms := pttl.Milliseconds(); ms > tc.wantMS || ms < max(0, tc.wantMS-elapsed.Milliseconds()-1) {
			t.Errorf("after Take(%v, %d hits), PTTL = %dms, want %dms", tc.l, tc.hits, ms, tc.wantMS)
		}
	}
}

// TestFullBucketVanishes waits, once, for a short bucket to refill: its key
// is then gone from Redis. It uses the server's clock, as production does.
func TestFullBucketVanishes(t *testing.T) {
	c := standalone(t).Client()
	s := newStore(t, c, redisstore.ServerClock)
	ctx := context.Background()
	l := limiter.Limit{Count: 1, Period: 50 * time.Millisecond, Burst: 1}
	d := take(t, s, time.Time{}, limiter.Request{Key: "short", Limit: l, Hits: 1})
	if !d[0].Allowed || d[0].ResetAfter != 50*time.Millisecond {
		t.Fatalf("Take = %+v, want allowed with ResetAfter 50ms", d[0])
	}
	key := s.Key("short")
	if pttl := c.PTTL(ctx, key).Val(); pttl <= 0 || pttl > 51*time.Millisecond {
		t.Fatalf("PTTL = %v, want at most 51ms (the TAT, rounded up to the ms)", pttl)
	}
	deadline := time.Now().Add(2 * time.Second)
	for c.Exists(ctx, key).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists 2s after a 50ms bucket refilled", key)
		}
		time.Sleep(10 * time.Millisecond)
	}
	d = take(t, s, time.Time{}, limiter.Request{Key: "short", Limit: l, Hits: 0})
	if d[0] != (limiter.Decision{Allowed: true, Remaining: 1}) {
		t.Errorf("check after the key expired = %+v, want a full bucket", d[0])
	}
}

func TestScriptFlushFallsBackToEval(t *testing.T) {
	c := standalone(t).Client()
	s := newStore(t, c, redisstore.CallerClock)
	ctx := context.Background()
	l := limiter.Limit{Count: 3, Period: time.Second, Burst: 3}
	if d := take(t, s, t0, limiter.Request{Key: "a", Limit: l, Hits: 1}); d[0].Remaining != 2 {
		t.Fatalf("first Take = %+v", d[0])
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	d := take(t, s, t0, limiter.Request{Key: "a", Limit: l, Hits: 1})
	if want := (limiter.Decision{Allowed: true, Remaining: 1, ResetAfter: 666667 * time.Microsecond}); d[0] != want {
		t.Errorf("Take after SCRIPT FLUSH = %+v, want %+v", d[0], want)
	}
}

// TestServerClockSharesOneBucket: two replicas whose clocks are seconds
// apart share a bucket exactly, because the Redis server's clock decides.
func TestServerClockSharesOneBucket(t *testing.T) {
	stores := replicas(t)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}
	skew := [2]time.Duration{0, 7 * time.Second}
	admitted := 0
	for i := range 30 {
		r := i % 2
		d := take(t, stores[r], time.Now().Add(skew[r]), limiter.Request{Key: "shared", Limit: l, Hits: 1})
		if d[0].Allowed {
			admitted++
			// The server's clock barely moves between takes: the bucket is
			// full after admitted hours, give or take the test's runtime.
			if want := time.Duration(admitted) * time.Hour; d[0].ResetAfter > want || d[0].ResetAfter < want-time.Second {
				t.Errorf("take %d: ResetAfter = %v, want about %v", i, d[0].ResetAfter, want)
			}
		}
	}
	if admitted != int(l.Burst) {
		t.Errorf("30 takes from replicas with skewed clocks admitted %d, want exactly %d", admitted, l.Burst)
	}
}

// acrossSlots returns a Store on the cluster, deciding at the callers'
// now, the client it uses, and two bucket names whose keys lie in
// different slots.
func acrossSlots(t *testing.T) (*redis.ClusterClient, *redisstore.Store, string, string) {
	t.Helper()
	c := cluster(t).Client()
	s := newStore(t, c, redisstore.CallerClock)
	a, b := twoSlots(t, s)
	return c, s, a, b
}

// twoSlots returns bucket names whose keys lie in different cluster slots.
func twoSlots(t *testing.T, s *redisstore.Store) (string, string) {
	for i := range 100 {
		a, b := "a", fmt.Sprintf("b%d", i)
		if redisstore.Slot(s.Key(a)) != redisstore.Slot(s.Key(b)) {
			return a, b
		}
	}
	t.Fatal("no two buckets in different slots")
	return "", ""
}

func getState(t *testing.T, c redis.Cmdable, key string) (limiter.State, bool) {
	t.Helper()
	v, err := c.Get(context.Background(), key).Result()
	if err == redis.Nil {
		return limiter.State{}, false
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return parseState(t, v), true
}

// TestClusterAcrossSlotsIsAllOrNothing: a request whose buckets lie in two
// slots is admitted or charged in both; when one slot denies, the tokens the
// other took are given back exactly.
func TestClusterAcrossSlotsIsAllOrNothing(t *testing.T) {
	c, s, a, b := acrossSlots(t)
	twoPerMin := limiter.Limit{Count: 2, Period: time.Minute, Burst: 2}
	onePerMin := limiter.Limit{Count: 1, Period: time.Minute, Burst: 1}
	us := t0.UnixMicro()

	// b is empty; a, never used, has no key: the denied Take must leave a
	// without one.
	take(t, s, t0, limiter.Request{Key: b, Limit: onePerMin, Hits: 1})
	d := take(t, s, t0, limiter.Request{Key: a, Limit: twoPerMin, Hits: 1}, limiter.Request{Key: b, Limit: onePerMin, Hits: 1})
	want := []limiter.Decision{
		{Allowed: true, Remaining: 2}, // a check on a, as DecideAll reports it
		{RetryAfter: time.Minute, ResetAfter: time.Minute},
	}
	for i := range want {
		if d[i] != want[i] {
			t.Errorf("denied Take [%d] = %+v, want %+v", i, d[i], want[i])
		}
	}
	if st, ok := getState(t, c, s.Key(a)); ok {
		t.Errorf("after a denied Take, %s holds %+v, want no key (full)", s.Key(a), st)
	}

	// a holds a state: a denied Take must leave exactly that state.
	take(t, s, t0, limiter.Request{Key: a, Limit: twoPerMin, Hits: 1})
	before, _ := getState(t, c, s.Key(a))
	if wantA := (limiter.State{TAT: us + 30e6, Count: 2, PeriodUS: 60e6}); before != wantA {
		t.Fatalf("a = %+v, want %+v", before, wantA)
	}
	pttlBefore := c.PTTL(context.Background(), s.Key(a)).Val()
	take(t, s, t0, limiter.Request{Key: a, Limit: twoPerMin, Hits: 1}, limiter.Request{Key: b, Limit: onePerMin, Hits: 1})
	if after, _ := getState(t, c, s.Key(a)); after != before {
		t.Errorf("after a denied Take, a = %+v, want %+v as before", after, before)
	}
	// (With CallerClock the restored key's TTL counts again from the write.)
	if pttl := c.PTTL(context.Background(), s.Key(a)).Val(); pttl > 30*time.Second || pttl < pttlBefore-time.Second {
		t.Errorf("after a denied Take, PTTL a = %v, want about %v as before, at most 30s", pttl, pttlBefore)
	}
	// And a still has its last token.
	if d := take(t, s, t0, limiter.Request{Key: a, Limit: twoPerMin, Hits: 1}); d[0] != (limiter.Decision{Allowed: true, ResetAfter: time.Minute}) {
		t.Errorf("Take(a) after the give-back = %+v, want the last token", d[0])
	}
}

func TestUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	rdb, err := redisstore.Dial(redisstore.ClientOptions{URL: "redis://" + srv.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	s := newStore(t, rdb, redisstore.ServerClock)
	l := limiter.Limit{Count: 10, Period: time.Second, Burst: 10}
	req := []limiter.Request{{Key: "k", Limit: l, Hits: 1}}
	take(t, s, time.Time{}, req...)

	// A server that does not answer: the context's deadline bounds Take.
	if err := rdb.Do(context.Background(), "CLIENT", "PAUSE", "2000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	checkUnavailable(t, s, req, 30*time.Millisecond)
	rdb.Do(context.Background(), "CLIENT", "UNPAUSE")

	// A server that is gone.
	srv.Stop()
	checkUnavailable(t, s, req, 200*time.Millisecond)

	// Back again (empty): Take works again.
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if d := take(t, s, time.Time{}, req...); !d[0].Allowed || d[0].Remaining != 9 {
		t.Errorf("Take after restart = %+v, want allowed, 9 left", d[0])
	}
}

func checkUnavailable(t *testing.T, s *redisstore.Store, reqs []limiter.Request, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	_, err := s.Take(ctx, time.Time{}, reqs)
	elapsed := time.Since(start)
	// A server that refuses fails the call; one that does not answer
	// leaves it to the deadline, which says how long the call was queued
	// here and at Redis, for the caller to judge.
	var de *limiter.DeadlineError
	switch {
	case errors.As(err, &de):
		if errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("Take = %v (%+v), want a deadline error, not also a failure", err, de)
		}
	case !errors.Is(err, limiter.ErrUnavailable):
		t.Errorf("Take = %v, want an error wrapping ErrUnavailable or a *limiter.DeadlineError", err)
	}
	// The callers pause Redis for 2 s: a Take that waited for it would take
	// that long; one that returns at its deadline may still be late by a
	// stall of a busy test machine.
	if elapsed > timeout+250*time.Millisecond {
		t.Errorf("Take took %v with a %v deadline", elapsed, timeout)
	}
}

func BenchmarkTake(b *testing.B) {
	c := standalone(b).Client()
	s := newStore(b, c, redisstore.ServerClock)
	reqs := []limiter.Request{{Key: "v1\x0aai-gateway\x05model\x06gpt-4o", Limit: limiter.Limit{Count: 1e6, Period: time.Second, Burst: 1e6}, Hits: 1}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Take(ctx, time.Time{}, reqs); err != nil {
			b.Fatal(err)
		}
	}
}

// TestInventedValuesDoNotAccumulate: a caller inventing a fresh value per
// request (a key-only rule) leaves one key per value in Redis only until
// that bucket is full again; then Redis holds none of them.
func TestInventedValuesDoNotAccumulate(t *testing.T) {
	srv := redistest.Start(t) // its own server, so that DBSIZE counts only this test's keys
	c := srv.Client()
	s := newStore(t, c, redisstore.ServerClock)
	ctx := context.Background()
	l := limiter.Limit{Count: 10, Period: time.Second, Burst: 10} // one token back in 100ms
	const values = 20000
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := g; i < values; i += 32 {
				if _, err := s.Take(ctx, time.Time{}, []limiter.Request{{Key: fmt.Sprint("invented-", i), Limit: l, Hits: 1}}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := c.DBSize(ctx).Val(); n > values {
		t.Fatalf("DBSIZE = %d after %d distinct values, want at most one key each", n, values)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := c.DBSize(ctx).Val()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DBSIZE = %d five seconds after buckets that fill in 100ms were last touched", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFirstFormatBucket: a bucket in ratelimitd's first format,
// "TAT:Frac", with no rate, is read as written under the limit reading it,
// by both take scripts, and written back in the current format.
func TestFirstFormatBucket(t *testing.T) {
	c := standalone(t).Client()
	s := newStore(t, c, redisstore.CallerClock)
	ctx := context.Background()
	l := limiter.Limit{Count: 1, Period: time.Second, Burst: 2}
	for _, tc := range []struct {
		name  string
		extra []limiter.Request // sent beside it: take.lua rather than take_one.lua
	}{
		{"alone", nil},
		{"beside another", []limiter.Request{{Key: "other", Limit: l}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "first:" + tc.name
			// one token of two spent: full a second after t0
			if err := c.Set(ctx, s.Key(key), fmt.Sprintf("%d:0", t0.Add(time.Second).UnixMicro()), 0).Err(); err != nil {
				t.Fatal(err)
			}
			reqs := append([]limiter.Request{{Key: key, Limit: l, Hits: 1}}, tc.extra...)
			for i, want := range []limiter.Decision{
				{Allowed: true, ResetAfter: 2 * time.Second},
				{RetryAfter: time.Second, ResetAfter: 2 * time.Second},
			} {
				got, err := s.Take(ctx, t0, reqs)
				if err != nil || got[0] != want {
					t.Fatalf("Take %d = %+v, %v; want %+v", i+1, got, err, want)
				}
			}
			want := fmt.Sprintf("%d:0:1:1000000", t0.Add(2*time.Second).UnixMicro())
			if v, err := c.Get(ctx, s.Key(key)).Result(); err != nil || v != want {
				t.Errorf("bucket holds %q, %v; want %q", v, err, want)
			}
		})
	}
}

// TestGarbageBucket: a bucket holding anything but "TAT:Frac" fails the
// Takes and the Refund that touch it, with an error that names it, and is
// left as it is; a Take of several buckets writes none of the others.
func TestGarbageBucket(t *testing.T) {
	c := standalone(t).Client()
	s := newStore(t, c, redisstore.CallerClock)
	ctx := context.Background()
	if err := c.Set(ctx, s.Key("garbage"), "12:x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	l := limiter.Limit{Count: 1, Period: time.Second, Burst: 1}
	reqs := []limiter.Request{{Key: "garbage", Limit: l, Hits: 1}}
	_, takeErr := s.Take(ctx, t0, reqs)
	_, pairErr := s.Take(ctx, t0, []limiter.Request{{Key: "fine", Limit: l, Hits: 1}, reqs[0]})
	refundErr := s.Refund(ctx, t0, reqs)
	if n := c.Exists(ctx, s.Key("fine")).Val(); n != 0 {
		t.Errorf("a Take that failed on a garbage bucket wrote its other bucket")
	}
	for name, err := range map[string]error{"Take": takeErr, "Take of two buckets": pairErr, "Refund": refundErr} {
		if !errors.Is(err, limiter.ErrUnavailable) || !strings.Contains(err.Error(), "holds 12:x, not TAT:Frac") {
			t.Errorf("%s on a garbage bucket = %v, want ErrUnavailable saying what it holds", name, err)
		}
	}
	if v, err := c.Get(ctx, s.Key("garbage")).Result(); err != nil || v != "12:x" {
		t.Errorf("garbage bucket = %q, %v after the failed calls, want it untouched", v, err)
	}
}

// TestKeyOfAnotherTypeIsFull: a bucket's key that holds a hash (some other
// program's key under the prefix) reads as a full bucket, alone
// (take_one.lua) or beside another bucket (take.lua), and a Take that
// writes the bucket overwrites it.
func TestKeyOfAnotherTypeIsFull(t *testing.T) {
	c := standalone(t).Client()
	s := newStore(t, c, redisstore.CallerClock)
	ctx := context.Background()
	l := limiter.Limit{Count: 1, Period: time.Second, Burst: 3}
	for _, reqs := range [][]limiter.Request{
		{{Key: "hash-alone", Limit: l, Hits: 1}},
		{{Key: "fine", Limit: l, Hits: 1}, {Key: "hash-beside", Limit: l, Hits: 1}},
	} {
		hashed := reqs[len(reqs)-1].Key
		if err := c.HSet(ctx, s.Key(hashed), "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
		d := take(t, s, t0, reqs...)
		if got := d[len(d)-1]; !got.Allowed || got.Remaining != 2 {
			t.Errorf("Take on %s, a hash = %+v, want admitted with 2 left, as from a full bucket", hashed, got)
		}
		if typ := c.Type(ctx, s.Key(hashed)).Val(); typ != "string" {
			t.Errorf("%s after the Take is a %s, want the bucket's string", hashed, typ)
		}
	}
}

// TestLoneTakeFailsOnAReadError: take_one.lua reads the bucket with
// redis.pcall('GET'), so that a key of another type (WRONGTYPE) reads as a
// full bucket as take.lua's MGET has it; any other error reading it (here a
// user that may not run GET) fails the Take and leaves the bucket as it
// is, rather than reading an empty bucket as full.
func TestLoneTakeFailsOnAReadError(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	if err := srv.Client().Do(ctx, "ACL", "SETUSER", "noget", "on", ">secret", "~*", "+@all", "-get").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "noget", Password: "secret"})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, redisstore.CallerClock)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1}
	empty := "1900000000000000:0" // a TAT in 2030: an empty bucket at t0
	if err := srv.Client().Set(ctx, s.Key("b"), empty, 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Take(ctx, t0, []limiter.Request{{Key: "b", Limit: l, Hits: 1}})
	if !errors.Is(err, limiter.ErrUnavailable) || !strings.Contains(err.Error(), "can't run this command") {
		t.Errorf("Take with GET forbidden = %v, want ErrUnavailable naming the refused command", err)
	}
	if v := srv.Client().Get(ctx, s.Key("b")).Val(); v != empty {
		t.Errorf("bucket = %q after the failed Take, want %q", v, empty)
	}
}

// TestDocumentedACLSuffices: a user with exactly the ACL rules
// docs/redis.md gives can do everything a Store asks of Redis: load the
// scripts, probe, take (alone and merged, on the server's clock), charge,
// refund, hold and release leases, and subscribe to the pools' channel.
func TestDocumentedACLSuffices(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	p := prefix(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "ratelimitd", Password: "secret"})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.Options{Prefix: p, Clock: redisstore.ServerClock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// PSUBSCRIBE's pattern must be one of the user's channel patterns, as
	// written: the pools' pattern itself.
	rules := []any{"ACL", "SETUSER", "ratelimitd", "on", ">secret",
		"+@read", "+@write", "+@scripting", "+@pubsub", "+time", "+ping", "~" + p + "*", "&" + s.LeaseChannelPattern()}
	if err := srv.Client().Do(ctx, rules...).Err(); err != nil {
		t.Fatal(err)
	}
	l := limiter.Limit{Count: 10, Period: time.Second, Burst: 10}
	debt := limiter.Limit{Count: 10, Period: time.Second, Burst: 10, MaxDebt: 5}
	steps := []struct {
		name string
		do   func() error
	}{
		{"Prepare", func() error { return s.Prepare(ctx) }},
		{"Probe", func() error { return s.Probe(ctx) }},
		{"a lone Take", func() error {
			_, err := s.Take(ctx, time.Time{}, []limiter.Request{{Key: "a", Limit: l, Hits: 1}})
			return err
		}},
		{"a Take of two buckets", func() error {
			_, err := s.Take(ctx, time.Time{}, []limiter.Request{{Key: "a", Limit: l, Hits: 1}, {Key: "b", Limit: l, Hits: 1}})
			return err
		}},
		{"a charge", func() error {
			_, err := s.Take(ctx, time.Time{}, []limiter.Request{{Key: "c", Limit: debt, Hits: 3}})
			return err
		}},
		{"a refund", func() error {
			return s.Refund(ctx, time.Time{}, []limiter.Request{{Key: "a", Limit: l, Hits: 1}})
		}},
		{"a lease", func() error {
			pl := limiter.PoolLimit{MaxInFlight: 2, Lease: time.Second}
			if _, err := s.Acquire(ctx, time.Time{}, limiter.LeaseRequest{Pool: "pool", ID: "x", Limit: pl, MaxWait: time.Second}); err != nil {
				return err
			}
			if _, err := s.InFlight(ctx, time.Time{}, "pool"); err != nil {
				return err
			}
			_, err := s.Release(ctx, time.Time{}, "pool", "x")
			return err
		}},
		{"PSUBSCRIBE to the pools", func() error {
			ps := c.PSubscribe(ctx, s.LeaseChannelPattern())
			defer ps.Close()
			_, err := ps.Receive(ctx)
			return err
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Errorf("%s as the documented ACL user: %v", st.name, err)
		}
	}
}

// TestServerClockExpiryIsCeilOfTAT: on the server's clock a written bucket
// expires (PXAT) exactly when it is full again, its TAT rounded up to the
// microsecond and then to the millisecond, through take_one.lua and
// through take.lua's path for one request; with whole and fractional TATs
// and a reservation.
func TestServerClockExpiryIsCeilOfTAT(t *testing.T) {
	c := standalone(t).Client()
	ctx := context.Background()
	for _, script := range []string{"take_one.lua", "take.lua"} {
		s := newStore(t, c, redisstore.ServerClock)
		if script == "take.lua" {
			redisstore.OnlyTakeLua(s)
		}
		for _, r := range []limiter.Request{
			{Key: "third", Limit: limiter.Limit{Count: 3, Period: time.Second, Burst: 3}, Hits: 1},
			{Key: "whole", Limit: limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}, Hits: 1},
			// An interval of 142,857.29 µs: a fractional TAT, off the
			// millisecond, that stays in Redis for 0.7 s after a Take (a
			// bucket full again within a millisecond could expire before
			// the test reads it on a busy machine).
			{Key: "odd", Limit: limiter.Limit{Count: 7, Period: time.Second + time.Microsecond, Burst: 3000}, Hits: 5},
			{Key: "wait", Limit: limiter.Limit{Count: 3, Period: time.Second, Burst: 1}, Hits: 1, MaxWait: time.Hour},
		} {
			for i := range 3 { // the later Takes find the bucket not full
				if _, err := s.Take(ctx, time.Time{}, []limiter.Request{r}); err != nil {
					t.Fatal(err)
				}
				st, ok := getState(t, c, s.Key(r.Key))
				if !ok {
					t.Fatalf("%s, %s, take %d: no key", script, r.Key, i)
				}
				at, err := c.PExpireTime(ctx, s.Key(r.Key)).Result()
				if err != nil {
					t.Fatal(err)
				}
				us := st.TAT
				if st.Frac > 0 {
					us++
				}
				if want := (us + 999) / 1000; at.Milliseconds() != want {
					t.Errorf("%s, %s, take %d: state %+v expires at %d ms, want %d", script, r.Key, i, st, at.Milliseconds(), want)
				}
			}
		}
	}
}

// TestProbe: Probe passes on a Redis that can decide, standalone or
// cluster, without counting a Take, and fails where a PING passes but no
// Take could be decided: a read-only replica (what a failed-over master
// becomes), a user whose ACL forbids scripts, a server out of memory.
func TestProbe(t *testing.T) {
	ctx := context.Background()
	t.Run("standalone", func(t *testing.T) {
		s := newStore(t, standalone(t).Client(), redisstore.ServerClock)
		for range 3 { // a token a microsecond: back to back probes pass
			if err := s.Probe(ctx); err != nil {
				t.Fatalf("Probe: %v", err)
			}
		}
		if st := s.Stats(); st.Takes != 0 {
			t.Errorf("Stats().Takes after probes = %d, want 0", st.Takes)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		cl := cluster(t)
		s := newStore(t, cl.Client(), redisstore.ServerClock)
		if err := s.Probe(ctx); err != nil { // loads the script on each master
			t.Fatalf("Probe: %v", err)
		}
		before := s.Stats().RoundTrips
		if err := s.Probe(ctx); err != nil {
			t.Fatalf("Probe: %v", err)
		}
		if n := s.Stats().RoundTrips - before; n != int64(len(cl.Addrs)) {
			t.Errorf("Probe took %d round trips, want one per master, %d", n, len(cl.Addrs))
		}
		// Any one master that cannot write fails it: each is asked.
		for _, addr := range cl.Addrs {
			node := redis.NewClient(&redis.Options{Addr: addr})
			defer node.Close()
			setMaxMemory := func(v string) {
				t.Helper()
				if err := node.ConfigSet(ctx, "maxmemory", v).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := node.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
				t.Fatal(err)
			}
			setMaxMemory("1")
			err := s.Probe(ctx)
			setMaxMemory("0")
			if err == nil || !strings.Contains(err.Error(), "OOM") {
				t.Errorf("Probe with master %s out of memory = %v, want an OOM error", addr, err)
			}
		}
	})

	gone := redistest.Start(t) // a master that is not there
	gone.Stop()
	for _, tc := range []struct {
		name    string
		setup   [][]any // commands run as the default user
		user    string
		wantErr string
	}{
		{"read-only replica", [][]any{{"REPLICAOF", "127.0.0.1", gone.Port}}, "", "READONLY"},
		{"no scripts", [][]any{{"ACL", "SETUSER", "noscripts", "on", ">secret", "~*", "+@all", "-@scripting"}}, "noscripts", "NOPERM"},
		{"out of memory", [][]any{{"CONFIG", "SET", "maxmemory-policy", "noeviction"}, {"CONFIG", "SET", "maxmemory", "1"}}, "", "OOM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			for _, cmd := range tc.setup {
				if err := srv.Client().Do(ctx, cmd...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			o := &redis.Options{Addr: srv.Addr}
			if tc.user != "" {
				o.Username, o.Password = tc.user, "secret"
			}
			c := redis.NewClient(o)
			defer c.Close()
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatalf("PING: %v, want it to pass", err)
			}
			err := newStore(t, c, redisstore.ServerClock).Probe(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Probe = %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}
