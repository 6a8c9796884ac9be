package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// takeArgs are take.lua's ARGV for one Take of reqs: now, then the spec of
// its one request, or the number of requests and one spec each (take.lua's
// header gives the layout). envelopes appends other Takes' after the
// first's now (see mergedTakeArgs).
func (s *Store) takeArgs(now time.Time, reqs []limiter.Request) []any {
	args := make([]any, 1, 2+len(reqs))
	args[0] = s.nowArg(now)
	if len(reqs) != 1 {
		args = append(args, len(reqs))
	}
	for _, r := range reqs {
		args = append(args, takeSpec(r))
	}
	return args
}

// mergedTakeArgs appends to merged, take.lua's ARGV of the Takes merged so
// far (nil for none), those of the Take whose own ARGV are args (from
// takeArgs): the first Take's whole, a later one's after its now, preceded
// with a caller's clock by "@µs", its own now.
func mergedTakeArgs(merged, args []any) []any {
	if merged == nil {
		return append(merged, args...)
	}
	if now, ok := args[0].(int64); ok {
		merged = append(merged, "@"+strconv.FormatInt(now, 10))
	}
	return append(merged, args[1:]...)
}

// takeSpec is take.lua's spec of r, "kind:count:h µs:h frac:f µs:f
// frac:floor µs:floor frac:period:cap", formed in one buffer: one string per request
// instead of eight arguments, which go-redis and Redis each handle one by
// one, and Lua converts from strings.
func takeSpec(r limiter.Request) string {
	l := r.Limit
	// As limiter.Decide decides: a charge first, then hits above
	// burst, then a check.
	kind, hits := kindTake, r.Hits
	var floorUS, floorFrac int64
	switch {
	case r.Charge():
		kind, hits = kindCharge, min(r.Hits, l.Burst+l.MaxDebt)
		if r.Counting == limiter.CountWhereDenied {
			kind = kindChargeWhereDenied
		}
		floorUS, floorFrac = l.Span(l.Burst + l.MaxDebt)
	case r.Hits > l.Burst:
		kind, hits = kindAboveBurst, 0
	case r.Hits == 0:
		kind = kindCheck
	default:
		floorUS = r.MaxWait.Microseconds() // rounded down, see take.lua
	}
	if r.Shadow {
		kind++
	}
	hitsUS, hitsFrac := l.Span(hits)
	fillUS, fillFrac := l.Span(l.Burst)
	var buf [8 + 9*20]byte // a kind letter, nine int64s and their colons
	b := append(buf[:0], kinds[kind])
	for _, v := range [...]int64{l.Count, hitsUS, hitsFrac, fillUS, fillFrac, floorUS, floorFrac, l.Period.Microseconds(), l.Burst + l.MaxDebt} {
		b = strconv.AppendInt(append(b, ':'), v, 10)
	}
	return string(b)
}

// The kinds of request take.lua tells apart; each is followed by its Shadow
// variant.
const (
	kindTake = 2 * iota
	kindCheck
	kindAboveBurst
	kindCharge
	kindChargeWhereDenied
)

// kinds are their letters in take.lua's specs: upper case for Shadow.
var kinds = [...]byte{'t', 'T', 'k', 'K', 'x', 'X', 'c', 'C', 'd', 'D'}

// nowArg is the time argument every script reads first (ARGV[1], see
// clock.lua): now in Unix microseconds with CallerClock, else "" (the
// script reads the server's TIME).
func (s *Store) nowArg(now time.Time) any {
	if s.clock == CallerClock {
		return now.UnixMicro()
	}
	return ""
}

// refundArgs are refund.lua's ARGV for reqs.
func (s *Store) refundArgs(now time.Time, reqs []limiter.Request) []any {
	args := make([]any, 1, 1+5*len(reqs))
	args[0] = s.nowArg(now)
	for _, r := range reqs {
		l := r.Limit
		backUS, backFrac := l.Span(min(r.Hits, l.Burst+l.MaxDebt)) // as limiter.Refund
		args = append(args, l.Count, l.Period.Microseconds(), l.Burst+l.MaxDebt, backUS, backFrac)
	}
	return args
}

// takeResult is the answer to one Take (or one slot's part of it): what
// take.lua read, decided by limiter.DecideAll.
type takeResult struct {
	now       int64 // the time it decided at, Unix µs
	allowed   bool
	decisions []limiter.Decision
	// With extras, when this slot admitted the Take:
	denied   []limiter.Decision // what each request answers if the Take is denied
	giveBack []giveBackRecord   // one per request; needed false for most
}

// run runs take.lua on keys and their requests (all in one slot, or on a
// server without slots), for a caller that waits until ctx ends or, unless
// zero, until by.
func (s *Store) run(ctx context.Context, by, now time.Time, keys []string, reqs []limiter.Request, extras bool) (takeResult, error) {
	c := scriptCall{script: s.take, keys: keys, args: s.takeArgs(now, reqs), merge: s.group == nil, take: reqs, now: now}
	if len(reqs) == 1 {
		c.groupable = true
		if !reqs[0].Charge() {
			c.alone = s.takeOne // take_one.lua has no charges
		}
	}
	cmd := s.script(ctx, by, c)
	return decodeTakeCmd(cmd, reqs, extras)
}

// decodeTakeCmd reads the answer of a take.lua call that carried one Take of
// reqs (the batcher hands each merged Take such an answer too). With
// extras, it also works out what the Take answers and leaves if another
// slot denies it.
func decodeTakeCmd(cmd *redis.Cmd, reqs []limiter.Request, extras bool) (takeResult, error) {
	slots, err := cmd.Slice()
	if err != nil {
		return takeResult{}, err
	}
	if want := takeSlots(len(reqs)); len(slots) != want {
		return takeResult{}, fmt.Errorf("take script returned %d values for a Take of %d requests, want %d", len(slots), len(reqs), want)
	}
	if err, ok := slots[0].(error); ok {
		return takeResult{}, err
	}
	var buf [2 + 2*8]int64 // a Take of up to 8 requests: on the stack
	reply := buf[:0]
	for _, v := range slots {
		x, ok := v.(int64)
		if !ok {
			return takeResult{}, fmt.Errorf("take script returned %T, not an integer", v)
		}
		reply = append(reply, x)
	}
	return decodeTake(reply, reqs, extras)
}

// takeSlots is how many values take.lua's reply has for a Take of n
// requests (see its header).
func takeSlots(n int) int { return 2 + 2*n }

// decodeTake reads take.lua's reply to a Take of reqs (its header comment
// gives the layout): the time it decided at and the states it read. The
// answer is limiter.DecideAll's on them, which must agree with the script
// on the admission. If it does not (a script and a Go side out of step),
// the Take fails; what the script wrote stays written (on a cluster, such
// a slot is not given back), which can only make later answers stricter.
func decodeTake(reply []int64, reqs []limiter.Request, extras bool) (takeResult, error) {
	n := len(reqs)
	if len(reply) != 2+2*n {
		return takeResult{}, fmt.Errorf("take script returned %d integers, want %d", len(reply), 2+2*n)
	}
	now := time.UnixMicro(reply[0])
	stored := make([]limiter.State, n)
	for i := range stored {
		stored[i] = limiter.State{TAT: reply[2+2*i], Frac: reply[3+2*i]}
	}
	decisions, next, allowed := limiter.DecideAll(now, reqs, stored)
	if allowed != (reply[1] == 1) {
		// A copy, so that stored itself does not escape to the heap.
		return takeResult{}, fmt.Errorf("take script admitted %v where limiter.DecideAll admits %v, on the states %v at %d µs",
			reply[1] == 1, allowed, slices.Clone(stored), reply[0])
	}
	res := takeResult{now: reply[0], allowed: allowed, decisions: decisions}
	if extras && allowed {
		res.denied, res.giveBack = giveBackRecords(now, reqs, stored, decisions, next)
	}
	return res, nil
}

// scriptCall is one run of a script.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	// merge says the call is one Take of take.lua that may travel in one
	// script call with other Takes (on a server without hash slots).
	merge bool
	// alone, when set, is run instead of script when nothing is merged
	// with the call (sent directly, or alone in its command of a batch):
	// take_one.lua for a Take of one request.
	alone *redis.Script
	// take is the requests of a take.lua call, decided at now, and nil for
	// other scripts: what giveBackLate needs.
	take []limiter.Request
	now  time.Time
	// asking sends ASKING before the script: a Cluster node answered ASK
	// for its slot, which is moving to the node it is now sent to.
	asking bool
	// groupable says the call is a take.lua Take of one request: those
	// of a batch that ask alike (alikeOf) travel as one group, decided in
	// one step (see envelopes).
	groupable bool
	// probe says the call is a breaker's probe (probeKey): it is sent
	// directly, on a connection of its own, never queued behind the
	// batcher's round trips, whose senders may be waiting for one a
	// fault holds (see batcher.exchange); its success tells them the
	// server answers again.
	probe bool
}

// alike is what a groupable call asks: its bucket, its spec and its now
// (0 with the server's clock). A comparable value, so that telling alike
// calls apart makes no string.
type alike struct {
	key, spec string
	now       int64
}

// alikeOf is c's alike.
func alikeOf(c *call) alike {
	now, _ := c.args[0].(int64) // "" with the server's clock
	spec, _ := c.args[1].(string)
	return alike{key: c.keys[0], spec: spec, now: now}
}

// script runs c, for a caller that waits until ctx ends or, unless zero,
// until by: on a Cluster on the master of its slot (see clusterScript),
// else on the one server.
func (s *Store) script(ctx context.Context, by time.Time, c scriptCall) *redis.Cmd {
	if s.nodes != nil {
		return s.clusterScript(ctx, by, c)
	}
	return s.send(&s.server, ctx, by, c)
}

// send runs c on r's server: through r's batcher when coalescing, else
// directly (a probe always directly).
func (s *Store) send(r *route, ctx context.Context, by time.Time, c scriptCall) *redis.Cmd {
	if c.probe {
		return s.sendProbe(r, ctx, c)
	}
	if r.batch != nil && (c.asking || !r.batch.claimIdle()) {
		return r.batch.await(ctx, r.batch.submit(ctx, by, c))
	}
	switch {
	case by.IsZero():
	case s.deadlines:
		ctx = ioDeadline{Context: ctx, by: by}
	default:
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, by)
		defer cancel()
	}
	if r.batch != nil {
		// Redis is idle: send at once from this goroutine, without the two
		// hand-offs to and from a sender; calls arriving meanwhile batch up.
		defer r.batch.land(1)
		if err := r.batch.closedOr(ctx); err != nil {
			return errCmd(ctx, err)
		}
		s.stats.direct.Add(1)
	}
	if c.alone != nil {
		c.script = c.alone
	}
	return s.directTimed(ctx, r.client, c)
}

// sendProbe runs c, a probe, directly on r's server, within ctx (a
// probe has no by: probeKey's time is its context's): a connection of
// the pool's, which a fault that holds the round trip past ctx's
// deadline closes. When it is answered, r's batcher hears that the
// server answers again (batcher.answered).
func (s *Store) sendProbe(r *route, ctx context.Context, c scriptCall) *redis.Cmd {
	if c.alone != nil {
		c.script = c.alone
	}
	s.stats.direct.Add(1)
	cmd := s.directTimed(ctx, r.client, c)
	if cmd.Err() == nil && r.batch != nil {
		r.batch.answered()
	}
	return cmd
}

// ioDeadline is its Context with the deadline by, or the Context's own if
// earlier, for a call sent directly through a client that honours
// deadlines (honorsDeadlines): such a client ends its dial and its socket
// reads and writes at the context's deadline, which is all such a call
// needs of by. Unlike context.WithDeadline it starts no timer and
// registers nothing with the Context. Its Done and Err are the Context's:
// it is not done at by, and endedBy tells a call that ran out of time.
// The one wait that watches Done alone, for a connection of a pool all of
// whose connections are in use, is bounded by the pool's timeout, and
// cannot come about here: a direct call goes only while at most two other
// round trips are in flight.
type ioDeadline struct {
	context.Context
	by time.Time
}

// Deadline is by, or the Context's deadline if earlier.
func (c ioDeadline) Deadline() (time.Time, bool) {
	if dl, ok := c.Context.Deadline(); ok && dl.Before(c.by) {
		return dl, true
	}
	return c.by, true
}

// directTimed runs c as direct does, and when ctx ends before the answer,
// fails it with a *limiter.DeadlineError. Its answer is lost with the
// connection it was read from: a Take Redis ran stays charged, as when a
// reply is lost on the wire (this errs toward denying). A call goes
// directly only when nothing else is in flight, so this happens only when
// Redis is slow or the caller's deadline very short.
func (s *Store) directTimed(ctx context.Context, client Client, c scriptCall) *redis.Cmd {
	s.stats.pending.Add(1)
	defer s.stats.pending.Add(-1)
	sent := time.Now()
	cmd := s.direct(ctx, client, c)
	if cmd.Err() != nil {
		if err := endedBy(ctx); err != nil {
			return errCmd(ctx, &limiter.DeadlineError{InFlight: max(time.Since(sent), 1), Err: err})
		}
	}
	return cmd
}

// endedBy is ctx's error, or context.DeadlineExceeded once its deadline
// has passed: the client's I/O ends at the deadline (its socket deadline),
// which can come a moment before ctx's own timer marks ctx done.
func endedBy(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// scripts runs calls concurrently and returns their answers in order:
// through the batcher when coalescing (they may share a round trip), else
// one goroutine each. On a Cluster, each goes to the master of its slot.
func (s *Store) scripts(ctx context.Context, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	if s.nodes != nil {
		routes := make([]*nodeRoute, len(calls))
		pending := make([]*call, len(calls))
		for i, c := range calls {
			r, err := s.nodes.forKey(ctx, time.Time{}, c.keys[0])
			if err != nil {
				cmds[i] = errCmd(ctx, err)
				continue
			}
			routes[i] = r
			if r.batch != nil {
				pending[i] = r.batch.submit(ctx, time.Time{}, c)
			}
		}
		var wg sync.WaitGroup
		for i, c := range calls {
			r := routes[i]
			if r == nil {
				continue
			}
			wg.Go(func() {
				var cmd *redis.Cmd
				if p := pending[i]; p != nil {
					cmd = r.batch.await(ctx, p)
				} else {
					cmd = s.directTimed(ctx, r.client, c)
				}
				cmds[i] = s.followRedirects(ctx, time.Time{}, c, r, cmd)
			})
		}
		wg.Wait()
		return cmds
	}
	if s.server.batch != nil {
		b := s.server.batch
		pending := make([]*call, len(calls))
		for i, c := range calls {
			pending[i] = b.submit(ctx, time.Time{}, c)
		}
		for i, p := range pending {
			cmds[i] = b.await(ctx, p)
		}
		return cmds
	}
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() { cmds[i] = s.directTimed(ctx, s.client, c) })
	}
	wg.Wait()
	return cmds
}

// direct runs c on its own: EVALSHA, then EVAL if the server lacks the
// script (which caches it again).
func (s *Store) direct(ctx context.Context, client Client, c scriptCall) *redis.Cmd {
	s.stats.calls.Add(1)
	s.stats.scripts.Add(1)
	s.stats.roundTrips.Add(1)
	run := func(send func(redis.Scripter) *redis.Cmd) *redis.Cmd { return send(client) }
	if p, ok := client.(pipeliner); ok && c.asking {
		// ASKING must come just before the script, on its connection.
		run = func(send func(redis.Scripter) *redis.Cmd) *redis.Cmd {
			pipe := p.Pipeline()
			_ = pipe.Process(ctx, redis.NewCmd(ctx, "asking"))
			cmd := send(pipe)
			_, _ = pipe.Exec(ctx) // cmd carries its own error
			return cmd
		}
	}
	cmd := run(func(sc redis.Scripter) *redis.Cmd { return c.script.EvalSha(ctx, sc, c.keys, c.args...) })
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		s.stats.roundTrips.Add(1)
		cmd = run(func(sc redis.Scripter) *redis.Cmd { return c.script.Eval(ctx, sc, c.keys, c.args...) })
	}
	return cmd
}

// honorsDeadlines reports whether c ends its network I/O at the context's
// deadline (go-redis's ContextTimeoutEnabled, which Dial sets): only then
// may a call be sent from the caller's goroutine and still return at its
// deadline.
func honorsDeadlines(c Client) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// giveBackLate gives back what c took, a Take its caller gave up on after
// it was sent: the caller was told it failed (or answered per the failure
// mode), so it must not also have spent tokens. Post-paid charges stay, as
// they are recorded whatever the answer; a Take that was denied took
// nothing. The refund runs under a context of its own; if it fails, the
// tokens stay spent until they refill (stricter, never more lenient).
func (s *Store) giveBackLate(c *call) {
	if c.take == nil {
		return
	}
	res, err := decodeTakeCmd(c.cmd, c.take, false)
	if err != nil || !res.allowed {
		return
	}
	var back []limiter.Request
	for i, r := range c.take {
		if r.Hits > 0 && !r.Charge() && res.decisions[i].Allowed {
			back = append(back, r)
		}
	}
	if len(back) == 0 {
		return
	}
	s.stats.lateGiveBacks.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), lateGiveBackTimeout)
	defer cancel()
	if err := s.Refund(ctx, c.now, back); err != nil {
		s.stats.lateGiveBackFailures.Add(1)
	}
}

// lateGiveBackTimeout bounds a give-back of giveBackLate.
const lateGiveBackTimeout = time.Second
