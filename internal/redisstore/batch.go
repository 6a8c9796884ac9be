package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Defaults of Options.BatchMax and Options.BatchWait.
const (
	// DefaultBatchMax is the most script calls one round trip carries.
	DefaultBatchMax = 64
	// DefaultBatchWait is the longest a batch that forms while another
	// round trip is in flight keeps collecting calls when that round trip
	// has not landed: about one Redis round trip under load.
	DefaultBatchWait = 200 * time.Microsecond
)

// senders is how many batches may be in flight at once. Redis runs one
// command at a time, so more buys little; two let a batch form and go out
// while the previous one is answered (one or three measured no better:
// docs/benchmarks/2026-12-02-0b460a1.md).
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
	// by, unless zero, is when the caller stops waiting, before ctx's
	// deadline (limiter.DeadlineTaker): the call is dropped as when ctx
	// ends.
	by time.Time
	scriptCall
	queuedAt int64         // when submitted (mono)
	sentAt   atomic.Int64  // when its round trip was written (mono); 0 until then
	state    atomic.Int32  // callWaiting, then callAnswered or callAbandoned
	batcher  *batcher      // the one it was submitted to
	cmd      *redis.Cmd    // the answer, set before done is closed
	done     chan struct{} // closed when cmd is set
}

// A call's states: its caller waits for it until the answer comes
// (answered) or the caller's context ends or its by passes first
// (abandoned). Whichever
// happens first wins, by compare-and-swap, so an answer that comes as the
// caller gives up is either taken or handed to the batcher's late handler,
// never both, never neither.
const (
	callWaiting int32 = iota
	callAnswered
	callAbandoned
)

// batcher coalesces script calls into pipelines, the mergeable Takes of
// a batch into take.lua calls of the pipeline (see envelopes). Calls queue
// in one channel; senders goroutines each take what is queued as a batch
// and send it. A call that arrives while no round trip is in flight and no
// batch is forming is sent at once, alone if it is alone; while the load
// is busy (see busy), it goes with the calls already on their way
// (gather). Calls that
// arrive while a round trip is in flight collect in the next batch until
// that round trip, or any other, lands (Redis is free again), until max,
// or for at most wait, and go out together; while every sender is busy,
// they queue, and the next free sender takes up to max of them.
//
// The landing, not the timer, ends a batch in the usual case: a Go timer
// of under a millisecond fires about a millisecond late when the process
// has nothing else to do meanwhile (netpoll waits in whole milliseconds on
// Linux: golang/go#44343), which is when a light load forms its batches.
type batcher struct {
	client pipeliner
	// node names the Redis server the batcher sends to, in errors and
	// reports: a Cluster node's address, "" for a server without slots.
	node string
	max  int
	wait time.Duration
	// hold, when positive, makes every batch collect for that long (see
	// Options.TestBatchHold).
	hold time.Duration

	calls chan *call
	// inflight counts the round trips in flight or about to be: each
	// sender from the moment it receives the first call of a batch until
	// its round trip returns (so a batch still collecting latecomers
	// counts), and each call sent directly (see claimIdle).
	inflight atomic.Int32
	// queued counts the calls submitted and not yet counted in flight by a
	// sender: those waiting for room, those in calls, and each one a
	// sender has just received, until it has counted itself in inflight.
	// claimIdle reads it, not len(calls), which a sender empties a moment
	// before it counts itself.
	queued atomic.Int32
	// directWhenIdle lets a call that finds nothing in flight be sent from
	// its caller's goroutine (the client honours deadlines), unless the
	// load is busy (see busy).
	directWhenIdle bool
	// busyUntil (mono) is when the load stops counting as busy: until
	// busyFor after a round trip that carried more than one call landed.
	// shared is how many calls the last such round trip carried.
	busyUntil atomic.Int64
	shared    atomic.Int32
	stop      chan struct{}
	stopOnce  sync.Once
	// landings holds a token once a round trip or a direct call has left
	// flight (see land): the forming batch, if any, goes.
	landings chan struct{}
	// forming is held by the sender whose batch is forming, from before
	// it takes the batch's first call until the batch is complete: one
	// batch forms at a time, and takes every latecomer, rather than two
	// senders each taking every other one.
	forming sync.Mutex
	wg      sync.WaitGroup

	stats *counters
	// late, when set, is run on a goroutine of its own with each call that
	// its caller abandoned after it was sent, once the answer has come.
	late func(*call)
	// report, when set, learns what Redis did with the calls no caller
	// waits for (see Options.OnBackend): each abandoned call's outcome
	// when it comes, and, once, each round trip still unanswered after
	// its allowance (see exchange).
	report func(node string, held time.Duration, err error)
	// slowAfter, when positive, is how long a round trip may go
	// unanswered before it is reported (report) and its sender goes on
	// without it (see exchange).
	slowAfter time.Duration
	// unanswered holds when each round trip in flight was written (Unix
	// ns), so that a call given up on can tell how long Redis has held
	// the oldest (limiter.DeadlineError.Stalled); detached counts the
	// round trips their senders went on without.
	unanswered struct {
		sync.Mutex
		sent []int64
	}
	detached atomic.Int32
	// answering is closed, and replaced, when a probe finds the server
	// answering again, at answeredAt (mono; see answered): a sender
	// waiting for a round trip a fault held, maxDetached being reached,
	// then goes on.
	answering  atomic.Pointer[chan struct{}]
	answeredAt atomic.Int64
	// observe, when set, learns each round trip's calls as it is written.
	observe func(batch []*call, sentAt int64)
	// timers are stopped *time.Timer, for the callers that wait until a
	// call's by.
	timers sync.Pool
}

// counters are the Store's Stats.
type counters struct {
	takes, calls, scripts, roundTrips, direct atomic.Int64
	giveBackFailures, deniedWithFailures      atomic.Int64
	pending                                   atomic.Int64
	late, lateGiveBacks, lateGiveBackFailures atomic.Int64
}

// newBatcher returns a batcher over c; start starts it.
func newBatcher(c pipeliner, max int, wait time.Duration, stats *counters) *batcher {
	b := &batcher{
		client: c,
		max:    max,
		wait:   wait,
		// Bounded: while it is full, callers wait in submit, in arrival
		// order, each until its deadline.
		calls:    make(chan *call, senders*max),
		stop:     make(chan struct{}),
		landings: make(chan struct{}, 1),
		stats:    stats,
	}
	answering := make(chan struct{})
	b.answering.Store(&answering)
	return b
}

// start starts the senders, once the batcher's fields are set.
func (b *batcher) start() *batcher {
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
	b.failQueued()
}

// failQueued fails, with errClosed, the calls in the channel, once the
// batcher has stopped.
func (b *batcher) failQueued() {
	for {
		select {
		case c := <-b.calls:
			b.queued.Add(-1)
			b.fail(c, errClosed)
		default:
			return
		}
	}
}

// queuedAsClosed fails the calls in the channel, a call just put there
// among them, if the batcher has stopped meanwhile: close may have
// emptied the channel already, and no sender would take them. A call put
// there before stop closes is close's to fail, or a sender's to send.
func (b *batcher) queuedAsClosed() {
	select {
	case <-b.stop:
		b.failQueued()
	default:
	}
}

// claimIdle reports whether no round trip is in flight, no batch is
// forming and no call is queued, and if so counts the caller's own call
// as in flight (the caller sends it directly, then calls land).
// A sender counts itself in flight before it stops counting the call it
// received as queued, so a call never goes around a batch that is
// collecting latecomers.
func (b *batcher) claimIdle() bool {
	return b.directWhenIdle && b.queued.Load() == 0 && !b.busy() && b.inflight.CompareAndSwap(0, 1)
}

// busyFor is how long after a round trip that carried more than one call
// landed the load counts as busy: about the time its callers take to come
// back with their next calls through Envoy and gRPC (1–3 ms at 64
// callers on one connection here). While busy, a call that finds Redis
// idle does not go alone: it starts a batch that gathers the calls already
// on their way (see send and gather), so that a busy load's round trips do
// not alternate between one carrying the first caller back and one
// carrying all the rest.
const busyFor = 2 * time.Millisecond

// busy reports whether a round trip that carried more than one call
// landed within busyFor.
func (b *batcher) busy() bool {
	return mono() < b.busyUntil.Load()
}

// land counts a round trip of calls calls, or a call sent directly (1),
// out of flight and tells the batch forming meanwhile, if any, to go:
// Redis is free. A round trip of more than one call marks the load busy.
func (b *batcher) land(calls int) {
	if calls > 1 {
		b.shared.Store(int32(calls))
		b.busyUntil.Store(mono() + int64(busyFor))
	}
	b.inflight.Add(-1)
	select {
	case b.landings <- struct{}{}:
	default: // a token is there already
	}
}

// closedOr is the error a call sent directly fails with before it is
// sent: the store is closed, or the caller has given up or has no time
// left (its deadline, or its by, see ioDeadline, has passed).
func (b *batcher) closedOr(ctx context.Context) error {
	select {
	case <-b.stop:
		return errClosed
	default:
	}
	if err := endedBy(ctx); err != nil {
		return &limiter.DeadlineError{Err: err}
	}
	return nil
}

// submit queues sc, for a caller that waits until ctx ends or, unless
// zero, until by. The answer comes through await. While the queue is full,
// it waits for room, in arrival order; a call whose caller stops waiting
// first fails with a *limiter.DeadlineError, unsent.
func (b *batcher) submit(ctx context.Context, by time.Time, sc scriptCall) *call {
	c := &call{ctx: ctx, by: by, scriptCall: sc, queuedAt: mono(), done: make(chan struct{}), batcher: b}
	b.stats.pending.Add(1)
	select {
	case <-b.stop:
		b.fail(c, errClosed)
		return c
	default:
	}
	b.queued.Add(1)
	select {
	case b.calls <- c:
		b.queuedAsClosed()
		return c
	default:
	}
	expiry := b.expiry(by)
	defer b.release(expiry)
	select {
	case b.calls <- c:
		b.queuedAsClosed()
	case <-ctx.Done():
		b.queued.Add(-1)
		b.fail(c, c.deadlineError(ctx.Err(), time.Now()))
	case <-channel(expiry):
		b.queued.Add(-1)
		b.fail(c, c.deadlineError(context.DeadlineExceeded, time.Now()))
	case <-b.stop:
		b.queued.Add(-1)
		b.fail(c, errClosed)
	}
	return c
}

// await returns c's answer, or, as soon as ctx is done or c's by passes,
// an error: a *limiter.DeadlineError that says how long c was queued and
// in flight. A call given up on after it was sent may still run on Redis:
// its answer goes to the batcher's late handler (see Store.giveBackLate).
// An answer that comes as the caller gives up is taken.
func (b *batcher) await(ctx context.Context, c *call) *redis.Cmd {
	select {
	case <-c.done:
		return c.cmd
	default:
	}
	expiry := b.expiry(c.by)
	defer b.release(expiry)
	var err error
	select {
	case <-c.done:
		return c.cmd
	case <-ctx.Done():
		err = c.deadlineError(ctx.Err(), time.Now())
	case <-channel(expiry):
		err = c.deadlineError(context.DeadlineExceeded, time.Now())
	case <-b.stop:
		err = errClosed
	}
	if !c.state.CompareAndSwap(callWaiting, callAbandoned) {
		<-c.done // answered meanwhile: the answer is there, or about to be
		return c.cmd
	}
	return errCmd(ctx, err)
}

// expiry returns a timer that fires at by, to give back with release; nil
// for a zero by. Timers come from a pool: a caller waits on one for every
// call.
func (b *batcher) expiry(by time.Time) *time.Timer {
	if by.IsZero() {
		return nil
	}
	t, _ := b.timers.Get().(*time.Timer)
	if t == nil {
		return time.NewTimer(time.Until(by))
	}
	t.Reset(time.Until(by))
	return t
}

// release stops t, from expiry, and gives it back; nil is ignored. Since
// Go 1.23 a stopped timer's channel holds nothing; the drain is for a
// process run with GODEBUG=asynctimerchan=1, where a tick that fired
// unread would stay and fail the timer's next user at once.
func (b *batcher) release(t *time.Timer) {
	if t == nil {
		return
	}
	stopTimer(t)
	b.timers.Put(t)
}

// stopTimer stops t and drains a tick that fired unread (see release).
func stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
}

// channel is t's channel, nil (never ready) for a nil t.
func channel(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// gaveUp is the error c fails with, unsent, when its caller has stopped
// waiting at now: its context is done or its by has passed; nil otherwise.
func (c *call) gaveUp(now time.Time) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	if !c.by.IsZero() && !now.Before(c.by) {
		return context.DeadlineExceeded
	}
	return nil
}

// deadlineError describes c, given up on at now because of err: its
// context's, or context.DeadlineExceeded when its by passed.
func (c *call) deadlineError(err error, now time.Time) error {
	de := &limiter.DeadlineError{Err: err}
	if sent := c.sentAt.Load(); sent != 0 {
		de.Queued, de.InFlight = time.Duration(sent-c.queuedAt), max(time.Duration(monoOf(now)-sent), 1)
		de.Pending = true // the sender waits for the round trip all the same
	} else {
		de.Queued = time.Duration(monoOf(now) - c.queuedAt)
	}
	if b := c.batcher; b != nil {
		de.Stalled = b.stalled(monoOf(now))
	}
	return de
}

// fail answers c with err.
func (b *batcher) fail(c *call, err error) { b.deliver(c, errCmd(c.ctx, err)) }

// deliver hands c its answer, and reports whether its caller took it (it
// had not abandoned the call).
func (c *call) deliver(cmd *redis.Cmd) bool {
	c.cmd = cmd
	close(c.done)
	return c.state.CompareAndSwap(callWaiting, callAnswered)
}

func errCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// deliver hands c its answer, or the late handler the call its caller gave
// up on.
func (b *batcher) deliver(c *call, cmd *redis.Cmd) {
	b.stats.pending.Add(-1)
	if sent := c.sentAt.Load(); !c.deliver(cmd) && sent != 0 {
		b.stats.late.Add(1)
		if b.report != nil {
			b.report(b.node, time.Duration(mono()-sent), roundTripErr(cmd))
		}
		if b.late != nil {
			go b.late(c)
		}
	}
}
