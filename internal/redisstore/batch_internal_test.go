package redisstore

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestNoDirectCallAroundAFormingBatch: a call sent directly is held (a
// client hook stops it before it is written); a second call queues behind
// it, and its sender waits for latecomers. Once the direct call is
// answered, a third call must queue for a sender rather than go around the
// forming batch directly (which would leave the batch waiting its whole
// BatchWait for nobody).
func TestNoDirectCallAroundAFormingBatch(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s, err := New(c, Options{Clock: CallerClock, Prefix: "forming:", BatchWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	gate := &holdKey{key: s.Key("direct"), release: make(chan struct{})}
	c.AddHook(gate)
	t.Cleanup(gate.open) // a failing test must not leave the call held
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}
	takeAsync := func(key string) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := s.Take(ctx, t0, []limiter.Request{{Key: key, Limit: l, Hits: 1}})
			done <- err
		}()
		return done
	}
	if err := <-takeAsync("warm"); err != nil { // loads the script
		t.Fatal(err)
	}
	start := s.Stats()

	direct := takeAsync("direct")
	waitFor(t, "the first call to be sent directly", func() bool { return s.Stats().Direct == start.Direct+1 })
	// Submitted by hand, so that the test knows when it is queued.
	reqs := []limiter.Request{{Key: "queued", Limit: l, Hits: 1}}
	queued := s.batch.submit(ctx, time.Time{}, scriptCall{script: s.take, keys: []string{s.Key("queued")}, args: s.takeArgs(t0, reqs), merge: true})
	waitFor(t, "a sender to take the queued call", func() bool { return s.batch.queued.Load() == 0 })
	if n := s.batch.inflight.Load(); n != 2 {
		t.Fatalf("with the direct call held and a batch forming, %d round trips counted in flight, want 2", n)
	}
	gate.open()
	if err := <-direct; err != nil {
		t.Fatalf("direct call: %v", err)
	}
	late := takeAsync("late")
	if _, err := decodeTakeCmd(s.batch.await(ctx, queued), reqs, false); err != nil {
		t.Fatalf("queued call: %v", err)
	}
	if err := <-late; err != nil {
		t.Fatalf("late call: %v", err)
	}
	// The late call may ride with the queued one or form a batch of its
	// own with the other sender; either way it must not go directly.
	if st := s.Stats(); st.Direct != start.Direct+1 {
		t.Errorf("a direct call, then two while a batch formed: %d sent directly, want only the first",
			st.Direct-start.Direct)
	}
}

// TestABusyBatchMakesTheNextLoneCallWait: once the last batch sent has
// carried busyBatch calls, a call that finds Redis idle is not sent
// directly and alone: it waits BatchWait for company. The batch it then goes in carries one call, so the call
// after it goes directly again, at once.
func TestABusyBatchMakesTheNextLoneCallWait(t *testing.T) {
	const wait = 100 * time.Millisecond
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s, err := New(c, Options{Clock: CallerClock, Prefix: "busy:", BatchWait: wait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}
	take := func(key string) error {
		_, err := s.Take(ctx, t0, []limiter.Request{{Key: key, Limit: l, Hits: 1}})
		return err
	}
	if err := take("warm"); err != nil { // loads the script
		t.Fatal(err)
	}
	if s.batch.busy() {
		t.Fatal("busy before any batch")
	}

	s.batch.lastBatch.Store(busyBatch) // as after a batch of busyBatch calls
	before := s.Stats().Direct
	begin := time.Now()
	if err := take("lone"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d < wait {
		t.Errorf("a lone call after a busy batch was answered in %v, want it to wait BatchWait (%v) for company", d, wait)
	}
	if got := s.Stats().Direct - before; got != 0 {
		t.Errorf("a lone call after a busy batch went directly (%d), want it queued", got)
	}
	if s.batch.busy() {
		t.Fatalf("after a batch of one call: still busy (last batch %d)", s.batch.lastBatch.Load())
	}
	begin = time.Now()
	if err := take("next"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d >= wait {
		t.Errorf("a lone call after a batch of one took %v, want it sent at once", d)
	}
	if got := s.Stats().Direct - before; got != 1 {
		t.Errorf("a lone call after a batch of one: %d sent directly, want 1", got)
	}
}

// TestOneBatchFormsAtATime: with a direct call held in flight, calls
// submitted one after another while a batch collects latecomers all go in
// that one batch; the second sender, free meanwhile, takes none of them
// into a batch of its own.
func TestOneBatchFormsAtATime(t *testing.T) {
	const n = 6
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	// BatchMax n: the batch goes as soon as it holds all n; split in two,
	// neither half would fill before its 10 s wait.
	s, err := New(c, Options{Clock: CallerClock, Prefix: "forming-one:", BatchMax: n, BatchWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var mu sync.Mutex
	var sizes []int
	s.batch.observe = func(batch []*call, _ int64) {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(batch))
	}
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
		queued = append(queued, s.batch.submit(ctx, time.Time{}, scriptCall{script: s.take, keys: []string{s.Key(key)}, args: s.takeArgs(t0, reqs), merge: true}))
		// Each one taken before the next is sent: a free second sender
		// would be first in line for it.
		waitFor(t, "a sender to take the queued call", func() bool { return s.batch.queued.Load() == 0 })
	}
	for i, q := range queued {
		if err := s.batch.await(ctx, q).Err(); err != nil {
			t.Fatalf("queued call %d: %v", i, err)
		}
	}
	gate.open()
	if err := <-direct; err != nil {
		t.Fatalf("held call: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(sizes, []int{n}) {
		t.Errorf("%d calls queued while a batch formed went out in batches of %v, want one of %d", n, sizes, n)
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
// one reply per Take fails every Take of it, saying so.
func TestMergedReplyOfTheWrongLength(t *testing.T) {
	ctx := context.Background()
	calls := []*call{{ctx: ctx, done: make(chan struct{})}, {ctx: ctx, done: make(chan struct{})}}
	cmd := redis.NewCmd(ctx)
	cmd.SetVal([]any{[]any{int64(1)}})
	(&envelope{calls: calls, cmd: cmd}).answer(func(c *call, cmd *redis.Cmd) { c.deliver(cmd) })
	for i, c := range calls {
		<-c.done
		if err := c.cmd.Err(); err == nil || !strings.Contains(err.Error(), "returned 1 replies for 2 Takes") {
			t.Errorf("Take %d of the merged call: %v, want an error about the reply's length", i+1, err)
		}
	}
}
