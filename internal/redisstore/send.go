package redisstore

import (
	"context"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// maxDetached bounds the round trips a batcher's senders go on without
// (see exchange) while the server does not answer: a server that
// stopped answering holds that many connections, besides the senders',
// until the read timeout. Once a probe finds it answering again, the
// senders go on whatever the count (see answered): the round trips a
// fault still holds are given up on by the read timeout, and new ones
// are answered.
const maxDetached = 8

// answered tells the senders that a probe found the server answering:
// one waiting for a round trip a fault held (see exchange) goes on.
func (b *batcher) answered() {
	b.answeredAt.Store(mono())
	ch := make(chan struct{})
	close(*b.answering.Swap(&ch))
}

// sending records a round trip written at sent (mono) as unanswered;
// the function it returns records its answer.
func (b *batcher) sending(sent int64) (answered func()) {
	u := &b.unanswered
	u.Lock()
	u.sent = append(u.sent, sent)
	u.Unlock()
	return func() {
		u.Lock()
		if i := slices.Index(u.sent, sent); i >= 0 {
			u.sent = slices.Delete(u.sent, i, i+1)
		}
		u.Unlock()
	}
}

// detach stops counting the round trip written at sent (mono) in
// stalled: its sender went on without it (see exchange), so no call waits
// behind it any more. Its answer, when it comes, finds it gone.
func (b *batcher) detach(sent int64) {
	u := &b.unanswered
	u.Lock()
	if i := slices.Index(u.sent, sent); i >= 0 {
		u.sent = slices.Delete(u.sent, i, i+1)
	}
	u.Unlock()
}

// stalled is how long Redis has held the oldest round trip still
// unanswered at now (mono) that a sender waits for, 0 if none: a call
// queued meanwhile waits behind it. Round trips the senders went on
// without (detach) hold no call back: counted, one a black hole swallowed
// made every call whose budget ran out in the queue for any reason (a
// wait for a CPU, a probe whose budget the slot map's round trip had
// spent) Redis's failure until the read timeout, after the fault had
// ended too.
func (b *batcher) stalled(now int64) time.Duration {
	u := &b.unanswered
	u.Lock()
	defer u.Unlock()
	if len(u.sent) == 0 {
		return 0
	}
	return time.Duration(now - slices.Min(u.sent))
}

// send forms batches from the queued calls and sends them, one pipeline
// each; the senders' round trips run at once, but one batch forms at a
// time (see forming). A batch is what is queued when a sender comes for
// it, plus, while another round trip is in flight, what arrives until one
// lands, for at most wait (with hold: what arrives within hold), up to
// max. The sender counts in inflight from its batch's first call until
// its round trip returns, just before the calls get their answers.
func (b *batcher) send() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()

	for {
		var batch []*call
		b.forming.Lock()
		select {
		case c := <-b.calls:
			b.inflight.Add(1)
			b.queued.Add(-1)
			batch = append(make([]*call, 0, b.max), c)
		case <-b.stop:
			b.forming.Unlock()
			return
		}
		batch = b.drain(batch)
		// A landing before the count below is none this batch waits for;
		// one after it leaves a token.
		select {
		case <-b.landings:
		default:
		}
		// With another round trip in flight, latecomers are likely:
		// collect them until it lands. With none in flight but the load
		// busy, the callers of the last shared round trip are coming
		// back: gather those already runnable. Otherwise go at once (a
		// lone caller never waits).
		var stopped bool
		switch {
		case b.hold > 0:
			batch, stopped = b.collect(batch, timer, b.hold, false)
		case len(batch) >= b.max || b.wait <= 0:
		case b.inflight.Load() > 1:
			batch, stopped = b.collect(batch, timer, b.wait, true)
		case b.busy():
			batch = b.gather(batch, min(int(b.shared.Load()), b.max))
		}
		if stopped {
			b.forming.Unlock()
			b.inflight.Add(-1)
			for _, c := range batch {
				b.fail(c, errClosed)
			}
			return
		}
		b.forming.Unlock()
		b.exchange(batch, timer)
	}
}

// exchange sends batch and answers its calls. With slowAfter, a round
// trip Redis has not answered within its allowance (slowAllowance:
// slowAfter, and a little more for each bucket it carries) is reported
// (report), once, and its sender goes on forming and sending batches
// meanwhile, unless maxDetached round trips are already in that state:
// so a node that stopped answering holds its callers no longer than
// their deadlines, every round trip sent to it meanwhile is reported in
// its turn (a black hole under load opens the breaker within a few
// slowAfter), and the round trip after the fault ends is sent at once;
// an answer that comes late is still awaited (until the client's read
// timeout), for its give-back (see Store.giveBackLate). One slow round
// trip is one report: a Redis that is slow once, as a busy host makes
// it, does not open the breaker by itself. timer is the sender's,
// stopped, and stopped again on return.
func (b *batcher) exchange(batch []*call, timer *time.Timer) {
	var sentAt atomic.Int64 // when the round trip was written (mono); 0 if it was not
	trip := func() {
		calls := len(batch) // before roundTrip reuses batch's array
		sent := b.roundTrip(batch, &sentAt)
		// Out of flight before answering: the next batch goes while these
		// calls are answered, and a caller may send its next call as soon
		// as it has its answer, and must not find this round trip still
		// counted (it would join a batch for nothing).
		b.land(calls)
		b.answer(sent)
	}
	if b.slowAfter <= 0 {
		trip()
		return
	}
	allowance := b.slowAllowance(batch) // before roundTrip reuses batch's array
	done := make(chan struct{})
	go func() {
		defer close(done)
		trip()
	}()
	if !b.outlasts(done, &sentAt, timer, allowance) {
		return
	}
	b.reportSlow(sentAt.Load())
	if b.detached.Add(1) > maxDetached {
		// Wait for it, unless a probe sent after it finds the server
		// answering: this round trip is then lost to the fault, and the
		// next ones are not.
		again := *b.answering.Load()
		if b.answeredAt.Load() <= sentAt.Load() {
			select {
			case <-done:
				b.detached.Add(-1)
				return
			case <-again:
			}
		}
	}
	b.detach(sentAt.Load())
	go func() {
		<-done
		b.detached.Add(-1)
	}()
}

// slowPerBucket is the time a round trip is allowed beyond slowAfter for
// each bucket it carries: Redis ran a merged call of 512 buckets in 10–14
// ms on a loaded machine, about 25 µs a bucket, so a pipeline of many
// large Takes (64 descriptors each, say) is not taken for a slow Redis
// when it is merely a big one.
const slowPerBucket = 25 * time.Microsecond

// slowAllowance is how long Redis may hold batch's round trip before it
// is reported: slowAfter, and slowPerBucket for each bucket in it.
func (b *batcher) slowAllowance(batch []*call) time.Duration {
	n := 0
	for _, c := range batch {
		n += len(c.keys)
	}
	return b.slowAfter + time.Duration(n)*slowPerBucket
}

// outlasts reports whether the round trip that closes done when answered
// is still unanswered allowance after it was written (at sentAt, once
// written), using timer (stopped, and stopped again on return). The
// answer's goroutine is given the CPU before the verdict, so that an
// answer already read but not yet handled on a busy CPU is not taken for
// a slow Redis.
func (b *batcher) outlasts(done <-chan struct{}, sentAt *atomic.Int64, timer *time.Timer, allowance time.Duration) bool {
	defer stopTimer(timer)
	wait := allowance
	for {
		timer.Reset(wait)
		select {
		case <-done:
			return false
		case <-timer.C:
		}
		runtime.Gosched()
		select {
		case <-done:
			return false
		default:
		}
		sent := sentAt.Load()
		if sent == 0 {
			wait = allowance // not written yet: every caller may have gone
			continue
		}
		held := time.Duration(mono() - sent)
		if held >= allowance {
			return true
		}
		wait = allowance - held
	}
}

// reportSlow reports a round trip written at sentAt (mono, 0 if it was
// not written: every call had given up) and still unanswered.
func (b *batcher) reportSlow(sentAt int64) {
	if sentAt == 0 || b.report == nil {
		return
	}
	held := time.Duration(mono() - sentAt)
	b.report(b.node, held, &limiter.DeadlineError{InFlight: held, Pending: true, Err: context.DeadlineExceeded})
}

// drain adds to batch whatever is already queued, up to max calls.
func (b *batcher) drain(batch []*call) []*call {
	for len(batch) < b.max {
		select {
		case c := <-b.calls:
			b.queued.Add(-1)
			batch = append(batch, c)
		default:
			return batch
		}
	}
	return batch
}

// gather adds to batch the calls queued while the goroutines already
// runnable run, until it holds upTo: it yields the processor and takes
// what was queued meanwhile, and stops once a yield brings nothing. So a
// busy load's callers, handed their answers and their next calls by one
// read of a gRPC connection, go out together, and no call ever waits for
// a timer or for callers that are not coming.
func (b *batcher) gather(batch []*call, upTo int) []*call {
	for len(batch) < upTo {
		runtime.Gosched()
		n := len(batch)
		if batch = b.drain(batch); len(batch) == n {
			break
		}
	}
	return batch
}

// collect adds to batch the calls that arrive, up to max, for at most d
// and, with untilLanding, until a round trip lands, using timer (stopped,
// and stopped again on return). stopped reports that the batcher was
// closed meanwhile: batch is then to fail, unsent.
func (b *batcher) collect(batch []*call, timer *time.Timer, d time.Duration, untilLanding bool) (_ []*call, stopped bool) {
	landings := b.landings
	if !untilLanding {
		landings = nil
	}
	timer.Reset(d)
	// A tick that fires unread as the batch ends on a landing would end
	// the next collection at once.
	defer stopTimer(timer)
	for len(batch) < b.max {
		select {
		case c := <-b.calls:
			b.queued.Add(-1)
			batch = append(batch, c)
		case <-landings:
			return batch, false
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
func (b *batcher) roundTrip(batch []*call, written *atomic.Int64) []*envelope {
	live := batch[:0]
	now := time.Now()
	for _, c := range batch {
		if err := c.gaveUp(now); err != nil {
			b.deliver(c, errCmd(c.ctx, c.deadlineError(err, now)))
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return nil
	}
	// No caller's deadline or cancellation: a round trip is bounded by the
	// client's read and write timeouts alone, so that Redis is judged by
	// its own answer (see Options.OnBackend) even when every caller in it
	// has given up, and an answer that comes late can still be given back.
	// (Dial's client never retries, so those bound the round trip whole.)
	ctx := context.Background()
	cmds := envelopes(live)
	// From here the time is Redis's, not the queue's (see
	// limiter.DeadlineError): written now, answered when Exec returns.
	sentAt := mono()
	for _, c := range live {
		c.sentAt.Store(sentAt)
	}
	defer b.sending(sentAt)()
	if written != nil {
		written.Store(sentAt)
	}
	if b.observe != nil {
		b.observe(live, sentAt)
	}
	pipe := b.client.Pipeline()
	for _, e := range cmds {
		if e.asking {
			_ = pipe.Process(ctx, redis.NewCmd(ctx, "asking"))
		}
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
			if e.asking {
				_ = again.Process(ctx, redis.NewCmd(ctx, "asking"))
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
