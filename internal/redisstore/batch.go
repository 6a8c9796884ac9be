package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of Options.BatchMax and Options.BatchWait.
const (
	// DefaultBatchMax is the most script calls one round trip carries.
	DefaultBatchMax = 64
	// DefaultBatchWait is how long a batch that forms while another round
	// trip is in flight keeps collecting calls before it is sent: well under
	// one Redis round trip, so that it adds little latency while the batch
	// grows.
	DefaultBatchWait = 200 * time.Microsecond
)

// senders is how many batches may be in flight at once. Redis runs one
// command at a time, so more buys little; two let a batch form and go out
// while the previous one is answered.
const senders = 2

// errClosed is what calls get after Store.Close.
var errClosed = errors.New("redisstore: store closed")

// pipeliner is a Client that can send several commands in one round trip.
// *redis.Client, *redis.ClusterClient (one pipeline per node, sent in
// parallel), *redis.Ring and redis.UniversalClient are.
type pipeliner interface {
	Client
	Pipeline() redis.Pipeliner
}

// call is one script run waiting for, or carried by, a batch.
type call struct {
	ctx context.Context // the caller's: a call whose ctx is done before it is sent is dropped
	scriptCall
	cmd  *redis.Cmd    // the answer, set before done is closed
	done chan struct{} // closed when cmd is set
}

// batcher coalesces script calls into pipelines, the mergeable Takes of
// a batch into take.lua calls of the pipeline (see envelopes). Calls queue
// in one channel; senders goroutines each take what is queued as a batch
// and send it. A call that arrives while no round trip is in flight and no
// batch is forming is sent at once, alone if it is alone; calls that
// arrive while one is in flight wait up to wait (or until max) and go out
// together in the next; while every sender is busy, they queue, and the
// next free sender takes up to max of them.
type batcher struct {
	client pipeliner
	max    int
	wait   time.Duration

	calls chan *call
	// inflight counts the round trips in flight or about to be: each
	// sender from the moment it receives the first call of a batch until
	// its round trip returns (so a batch still collecting latecomers
	// counts), and each call sent directly (see claimIdle).
	inflight atomic.Int32
	// directWhenIdle lets a call that finds nothing in flight be sent from
	// its caller's goroutine (the client honours deadlines).
	directWhenIdle bool
	stop           chan struct{}
	stopOnce       sync.Once
	wg             sync.WaitGroup

	stats *counters
}

// counters are the Store's Stats.
type counters struct {
	takes, calls, scripts, roundTrips, direct atomic.Int64
	giveBackFailures, deniedWithFailures      atomic.Int64
}

func newBatcher(c pipeliner, max int, wait time.Duration, stats *counters) *batcher {
	b := &batcher{
		client: c,
		max:    max,
		wait:   wait,
		calls:  make(chan *call, senders*max),
		stop:   make(chan struct{}),
		stats:  stats,
	}
	for range senders {
		b.wg.Go(b.send)
	}
	return b
}

// close stops the goroutines; calls not yet sent fail with errClosed.
func (b *batcher) close() {
	b.stopOnce.Do(func() { close(b.stop) })
	b.wg.Wait()
	// Calls that slipped into the channel as it stopped.
	for {
		select {
		case c := <-b.calls:
			c.fail(errClosed)
		default:
			return
		}
	}
}

// claimIdle reports whether no round trip is in flight, no batch is
// forming and no call is queued, and if so counts the caller's own call as
// in flight (the caller sends it directly, then calls inflight.Add(-1)).
// A sender counts itself in flight as soon as it holds a call, so a call
// never goes around a batch that is collecting latecomers.
func (b *batcher) claimIdle() bool {
	return b.directWhenIdle && len(b.calls) == 0 && b.inflight.CompareAndSwap(0, 1)
}

// closedOr is the error a call sent directly fails with before it is
// sent: the store is closed, or the caller has given up.
func (b *batcher) closedOr(ctx context.Context) error {
	select {
	case <-b.stop:
		return errClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("before sending: %w", err)
	}
	return nil
}

// submit queues sc. The answer comes through await.
func (b *batcher) submit(ctx context.Context, sc scriptCall) *call {
	c := &call{ctx: ctx, scriptCall: sc, done: make(chan struct{})}
	select {
	case <-b.stop:
		c.fail(errClosed)
	default:
		select {
		case b.calls <- c:
		case <-ctx.Done():
			c.fail(ctx.Err())
		case <-b.stop:
			c.fail(errClosed)
		}
	}
	return c
}

// await returns c's answer, or, as soon as ctx is done, ctx's error. A call
// given up on that was already sent may still run on Redis.
func (b *batcher) await(ctx context.Context, c *call) *redis.Cmd {
	select {
	case <-c.done:
		return c.cmd
	default:
	}
	select {
	case <-c.done:
		return c.cmd
	case <-ctx.Done():
		return errCmd(ctx, fmt.Errorf("waiting for a batched call: %w", ctx.Err()))
	case <-b.stop:
		return errCmd(ctx, errClosed)
	}
}

func (c *call) fail(err error) {
	c.cmd = errCmd(c.ctx, err)
	close(c.done)
}

func errCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// send forms batches from the queued calls and sends them, one pipeline
// each; senders of them run at once. A batch is what is queued when a
// sender comes for it, plus, while another round trip is in flight, what
// arrives within wait, up to max. The sender counts in inflight from its
// batch's first call until its round trip returns, just before the calls
// get their answers.
func (b *batcher) send() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		var batch []*call
		select {
		case c := <-b.calls:
			b.inflight.Add(1)
			batch = append(make([]*call, 0, b.max), c)
		case <-b.stop:
			return
		}
		batch = b.drain(batch)
		// With another round trip in flight, latecomers are likely: wait a
		// little for them. With none, go at once (a lone caller never
		// waits).
		if len(batch) < b.max && b.wait > 0 && b.inflight.Load() > 1 {
			var stopped bool
			batch, stopped = b.collect(batch, timer)
			if stopped {
				b.inflight.Add(-1)
				for _, c := range batch {
					c.fail(errClosed)
				}
				return
			}
		}
		sent := b.roundTrip(batch)
		// Out of flight before answering: a caller may send its next call
		// as soon as it has its answer, and must not find this round trip
		// still counted (it would wait for latecomers for nothing).
		b.inflight.Add(-1)
		answer(sent)
	}
}

// drain adds to batch whatever is already queued, up to max calls.
func (b *batcher) drain(batch []*call) []*call {
	for len(batch) < b.max {
		select {
		case c := <-b.calls:
			batch = append(batch, c)
		default:
			return batch
		}
	}
	return batch
}

// collect adds to batch the calls that arrive within wait, up to max, using
// timer (stopped, and stopped again on return). stopped reports that the
// batcher was closed meanwhile: batch is then to fail, unsent.
func (b *batcher) collect(batch []*call, timer *time.Timer) (_ []*call, stopped bool) {
	timer.Reset(b.wait)
	defer timer.Stop()
	for len(batch) < b.max {
		select {
		case c := <-b.calls:
			batch = append(batch, c)
		case <-timer.C:
			return batch, false
		case <-b.stop:
			return batch, true
		}
	}
	return batch, false
}

// roundTrip sends batch as one pipeline: the Takes that may merge (see
// scriptCall.merge) as take.lua calls of up to mergeMaxKeys buckets each
// (see envelopes), every other call as its own
// EVALSHA; those that find their script missing (NOSCRIPT: a restarted or
// flushed server) go again as EVAL, which runs them and caches the script.
// Calls whose caller has given up are dropped first (failed at once). It
// returns the commands sent, answered but not yet handed to their calls
// (see answer).
func (b *batcher) roundTrip(batch []*call) []*envelope {
	live := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.fail(fmt.Errorf("before sending: %w", err))
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return nil
	}
	ctx, cancel := batchContext(live)
	defer cancel()
	cmds := envelopes(live)
	pipe := b.client.Pipeline()
	for _, e := range cmds {
		e.cmd = e.script.EvalSha(ctx, pipe, e.keys, e.args...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	b.stats.roundTrips.Add(1)
	b.stats.calls.Add(int64(len(live)))
	b.stats.scripts.Add(int64(len(cmds)))

	var again redis.Pipeliner
	for _, e := range cmds {
		if redis.HasErrorPrefix(e.cmd.Err(), "NOSCRIPT") {
			if again == nil {
				again = b.client.Pipeline()
			}
			e.cmd = e.script.Eval(ctx, again, e.keys, e.args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
		b.stats.roundTrips.Add(1)
	}
	return cmds
}

// answer hands each call of the commands sent its answer.
func answer(sent []*envelope) {
	for _, e := range sent {
		e.answer()
	}
}

// envelope is one command of a pipeline: one call, or several mergeable
// Takes as one take.lua call (their KEYS and ARGV concatenated, in order).
type envelope struct {
	scriptCall
	calls []*call
	cmd   *redis.Cmd
}

// mergeMaxKeys bounds the buckets of one merged call: a script runs
// atomically and Redis serves no one else meanwhile, so a batch of large
// Takes is split into several calls, between which other clients' commands
// run (a Take of more buckets still goes whole, alone).
const mergeMaxKeys = 512

// envelopes puts each call of batch in its command: the mergeable ones
// (Takes of take.lua, the only script that merges) together, up to
// mergeMaxKeys buckets a command, the others alone. A call left alone in
// its command runs its alone script when it has one.
func envelopes(batch []*call) []*envelope {
	out := make([]*envelope, 0, len(batch))
	var merged *envelope
	for _, c := range batch {
		if !c.merge {
			out = append(out, &envelope{scriptCall: c.scriptCall, calls: []*call{c}})
			continue
		}
		if merged == nil || len(merged.keys)+len(c.keys) > mergeMaxKeys {
			merged = &envelope{scriptCall: scriptCall{script: c.script}}
			out = append(out, merged)
		}
		merged.keys = append(merged.keys, c.keys...)
		merged.args = append(merged.args, c.args...)
		merged.calls = append(merged.calls, c)
	}
	for _, e := range out {
		if len(e.calls) == 1 && e.calls[0].alone != nil {
			e.script = e.calls[0].alone // nothing merged with it
		}
	}
	return out
}

// answer hands each call of e its answer: e's own, or, merged, its Take's
// reply from the list take.lua answers, as a one-Take call would get it.
func (e *envelope) answer() {
	if len(e.calls) == 1 {
		e.calls[0].cmd = e.cmd
		close(e.calls[0].done)
		return
	}
	replies, err := e.cmd.Slice()
	if err == nil && len(replies) != len(e.calls) {
		err = fmt.Errorf("take script returned %d replies for %d Takes", len(replies), len(e.calls))
	}
	for i, c := range e.calls {
		if err != nil {
			c.fail(err)
			continue
		}
		c.cmd = redis.NewCmd(c.ctx)
		c.cmd.SetVal([]any{replies[i]})
		close(c.done)
	}
}

// batchContext is the context a batch is sent under: no caller's
// cancellation (the others still want their answers), and the latest of
// their deadlines, after which nobody waits for it; none if one of them has
// none (the client's read and write timeouts still bound it).
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}
