package redisstore

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// ownServerStore returns a Store made with opts over a client of a
// redis-server of the test's own, and that client (for hooks, or to read
// what the Store wrote). The client's calls end at their context's
// deadline (ContextTimeoutEnabled). All are stopped when the test ends.
func ownServerStore(t *testing.T, opts Options) (*Store, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s, err := New(c, opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts, err)
	}
	t.Cleanup(func() { s.Close() })
	return s, c
}

// TestALandingSendsTheFormingBatch: with BatchWait an hour, a batch that
// forms while a direct call is held in flight collects every call
// submitted meanwhile, and goes the moment that call lands, not when its
// wait ends.
func TestALandingSendsTheFormingBatch(t *testing.T) {
	s, c := ownServerStore(t, Options{Clock: CallerClock, Prefix: "landing:", BatchWait: time.Hour})
	sizes := batchSizes(s)
	gate := &holdKey{key: s.Key("direct"), release: make(chan struct{})}
	c.AddHook(gate)
	t.Cleanup(gate.open) // a failing test must not leave the call held
	// Bounds the test: without the landing, the batch would wait its hour.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}
	if _, err := s.Take(ctx, t0, []limiter.Request{{Key: "warm", Limit: l, Hits: 1}}); err != nil { // loads the script
		t.Fatal(err)
	}
	start := s.Stats()
	direct := make(chan error, 1)
	go func() {
		_, err := s.Take(ctx, t0, []limiter.Request{{Key: "direct", Limit: l, Hits: 1}})
		direct <- err
	}()
	waitFor(t, "the first call to be sent directly", func() bool { return s.Stats().Direct == start.Direct+1 })
	var queued []*call
	for _, key := range []string{"queued0", "queued1"} {
		reqs := []limiter.Request{{Key: key, Limit: l, Hits: 1}}
		queued = append(queued, s.server.batch.submit(ctx, time.Time{}, scriptCall{script: s.take, keys: []string{s.Key(key)}, args: s.takeArgs(t0, reqs), merge: true}))
		waitFor(t, "a sender to take the queued call", func() bool { return s.server.batch.queued.Load() == 0 })
	}
	if n := s.server.batch.inflight.Load(); n != 2 {
		t.Fatalf("with the direct call held and a batch forming, %d round trips counted in flight, want 2", n)
	}
	if early := sizes(); len(early) != 0 {
		t.Fatalf("batches of %v went while the direct call was held, want none", early)
	}
	gate.open()
	if err := <-direct; err != nil {
		t.Fatalf("direct call: %v", err)
	}
	for i, q := range queued {
		if err := s.server.batch.await(ctx, q).Err(); err != nil {
			t.Fatalf("queued call %d after the direct call landed: %v", i, err)
		}
	}
	if got := sizes(); !slices.Equal(got, []int{2}) {
		t.Errorf("two calls queued while a direct call was held went out in batches of %v, want one of 2", got)
	}
}

// TestNoBatchWaitsOutItsWait: with BatchWait an hour, 32 callers taking
// at once, then a lone one, are all answered, and once the load's busy
// window has passed a lone call goes directly: a batch waits for a round
// trip to land or for the callers already runnable, never for the timer,
// and no load makes a lone call wait for company.
func TestNoBatchWaitsOutItsWait(t *testing.T) {
	s, _ := ownServerStore(t, Options{Clock: CallerClock, Prefix: "nowait:", BatchWait: time.Hour})
	var batched atomic.Int64
	s.server.batch.observe = func(batch []*call, _ int64) { batched.Add(int64(len(batch))) }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1000}
	take := func(key string) error {
		_, err := s.Take(ctx, t0, []limiter.Request{{Key: key, Limit: l, Hits: 1}})
		return err
	}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for range 10 {
				if err := take("k" + strconv.Itoa(g%8)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if batched.Load() == 0 {
		t.Fatal("32 callers at once: no call was batched, want some")
	}
	// At once, likely within the busy window: queued, not sent directly,
	// and still not held for the hour.
	if err := take("lone"); err != nil {
		t.Fatalf("a lone call right after the load: %v", err)
	}
	waitFor(t, "the load's busy window to pass", func() bool { return !s.server.batch.busy() })
	before := s.Stats().Direct
	if err := take("lone"); err != nil {
		t.Fatalf("a lone call after the load: %v", err)
	}
	if got := s.Stats().Direct - before; got != 1 {
		t.Errorf("a lone call after the load: %d sent directly, want 1", got)
	}
}

// TestABusyLoadGoesTogether: while the load is busy (a round trip of
// several calls has just landed), callers that find Redis idle are not
// sent directly one by one: each joins a batch, and every one is answered
// without waiting out BatchWait (an hour).
func TestABusyLoadGoesTogether(t *testing.T) {
	s, _ := ownServerStore(t, Options{Clock: CallerClock, Prefix: "busy:", BatchWait: time.Hour})
	sizes := batchSizes(s)
	b := s.server.batch
	// As after a round trip of 8 calls landed, for the rest of the test.
	b.shared.Store(8)
	b.busyUntil.Store(mono() + int64(time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 1000}
	before := s.Stats().Direct
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			<-start
			if _, err := s.Take(ctx, t0, []limiter.Request{{Key: "b" + strconv.Itoa(g), Limit: l, Hits: 1}}); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	if got := s.Stats().Direct - before; got != 0 {
		t.Errorf("while busy, %d calls were sent directly, want 0", got)
	}
	total := 0
	for _, n := range sizes() {
		total += n
	}
	if total != 8 {
		t.Errorf("while busy, batches %v carried %d calls, want 8", sizes(), total)
	}
}

// TestOneBatchFormsAtATime: with a direct call held in flight, calls
// submitted one after another while a batch collects latecomers all go in
// that one batch; the second sender, free meanwhile, takes none of them
// into a batch of its own.
func TestOneBatchFormsAtATime(t *testing.T) {
	const n = 6
	// BatchMax n: the batch goes as soon as it holds all n; split in two,
	// neither half would fill before its 10 s wait.
	s, c := ownServerStore(t, Options{Clock: CallerClock, Prefix: "forming-one:", BatchMax: n, BatchWait: 10 * time.Second})
	sizes := batchSizes(s)
	gate := &holdKey{key: s.Key("direct"), release: make(chan struct{})}
	c.AddHook(gate)
	t.Cleanup(gate.open)
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}
	direct := make(chan error, 1)
	go func() {
		_, err := s.Take(ctx, t0, []limiter.Request{{Key: "direct", Limit: l, Hits: 1}})
		direct <- err
	}()
	waitFor(t, "the held call to be sent directly", func() bool { return s.Stats().Direct == 1 })
	var queued []*call
	for i := range n {
		key := "queued" + strconv.Itoa(i)
		reqs := []limiter.Request{{Key: key, Limit: l, Hits: 1}}
		queued = append(queued, s.server.batch.submit(ctx, time.Time{}, scriptCall{script: s.take, keys: []string{s.Key(key)}, args: s.takeArgs(t0, reqs), merge: true}))
		// Each one taken before the next is sent: a free second sender
		// would be first in line for it.
		waitFor(t, "a sender to take the queued call", func() bool { return s.server.batch.queued.Load() == 0 })
	}
	for i, q := range queued {
		if err := s.server.batch.await(ctx, q).Err(); err != nil {
			t.Fatalf("queued call %d: %v", i, err)
		}
	}
	gate.open()
	if err := <-direct; err != nil {
		t.Fatalf("held call: %v", err)
	}
	if got := sizes(); !slices.Equal(got, []int{n}) {
		t.Errorf("%d calls queued while a batch formed went out in batches of %v, want one of %d", n, got, n)
	}
}

// batchSizes records how many calls each batch of s carries, as it is
// written, and returns a func that reads them so far.
func batchSizes(s *Store) func() []int {
	var mu sync.Mutex
	var sizes []int
	s.server.batch.observe = func(batch []*call, _ int64) {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(batch))
	}
	return func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(sizes)
	}
}

// holdKey is a client hook that holds each single command naming key
// (not pipelines) until open is called or the command's context ends.
type holdKey struct {
	key      string
	release  chan struct{}
	openOnce sync.Once
}

func (h *holdKey) open() { h.openOnce.Do(func() { close(h.release) }) }

func (h *holdKey) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if a == h.key {
				select {
				case <-h.release:
				case <-ctx.Done():
					return ctx.Err()
				}
				break
			}
		}
		return next(ctx, cmd)
	}
}

func (h *holdKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// waitFor polls cond until it holds, failing the test after 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMergedReplyOfTheWrongLength: a merged call whose reply does not hold
// the slots of every Take fails every Take of it, saying so.
func TestMergedReplyOfTheWrongLength(t *testing.T) {
	ctx := context.Background()
	one := scriptCall{keys: []string{"k"}}
	calls := []*call{{ctx: ctx, scriptCall: one, done: make(chan struct{})}, {ctx: ctx, scriptCall: one, done: make(chan struct{})}}
	cmd := redis.NewCmd(ctx)
	cmd.SetVal([]any{int64(1), int64(1), int64(0), int64(0), int64(1)}) // one Take's 4 slots and one more
	(&envelope{calls: calls, cmd: cmd}).answer(func(c *call, cmd *redis.Cmd) { c.deliver(cmd) })
	for i, c := range calls {
		<-c.done
		if err := c.cmd.Err(); err == nil || !strings.Contains(err.Error(), "returned 5 values for 2 Takes, want 8") {
			t.Errorf("Take %d of the merged call: %v, want an error about the reply's length", i+1, err)
		}
	}
}
