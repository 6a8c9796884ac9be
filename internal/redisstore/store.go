// Package redisstore is a limiter.Store kept in Redis, so that every replica
// of ratelimitd draws from the same buckets.
//
// Each bucket is one Redis string, "TAT:Frac" (limiter.State: the
// theoretical arrival time in Unix microseconds plus Frac/Count of one),
// expiring when the bucket is full again: a missing key is a full bucket. One
// Lua script (take.lua) reads every bucket of a Take, decides with exactly
// the arithmetic of limiter.Decide and limiter.DecideAll whether the Take is
// admitted, and writes back what DecideAll says a store writes (everything
// if every request is admitted, else only the post-paid charges); Redis
// runs it atomically. It answers with the states it read and the time it
// decided at, and the Store computes the rest of the answer (remaining,
// retry after, reset after, wait) by running DecideAll on them in Go: the
// script does only what must be atomic.
// Another (refund.lua) gives tokens back as limiter.Refund does.
//
// On Redis Cluster the keys of one Take may live in several hash slots, which
// one script cannot touch. The Store then runs the script once per slot, in
// parallel, and if any slot denies, gives back what the others took (see
// Store.Take for the window this leaves).
//
// Decisions use the Redis server's clock by default (ServerClock), so
// replicas whose clocks disagree still share one bucket correctly.
//
// Concurrent Takes are coalesced: they travel to Redis together, in one
// round trip, so that under load Redis sees far fewer round trips than
// Takes, while a lone Take is sent at once (see Options.BatchMax). On a
// server without hash slots the coalesced Takes travel merged, as take.lua
// calls of at most 128 buckets each (a larger Take goes alone); each call
// reads all its buckets with one MGET and decides its Takes one after the
// other: one script entry and one TIME per call instead of one per Take.
// Each Take is still decided on its own, all-or-nothing, exactly as if
// sent alone: batching changes how Takes travel, not what they decide.
//
// It needs Redis 6.2 or later (SET … PXAT, and scripts that read TIME and
// then write, by effects replication); it is tested with 7.0.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

var (
	//go:embed clock.lua
	clockSource string
	//go:embed state.lua
	stateSource string
	//go:embed common.lua
	commonSource string
	//go:embed single.lua
	singleSource string
	//go:embed step.lua
	stepSource string
	//go:embed take.lua
	takeSource string
	//go:embed take_one.lua
	takeOneSource string
	//go:embed giveback.lua
	giveBackSource string
	//go:embed refund.lua
	refundSource string
)

// Client is what a Store needs from Redis: running Lua scripts.
// *redis.Client (standalone or Sentinel failover), *redis.ClusterClient,
// *redis.Ring and any redis.UniversalClient satisfy it.
type Client interface {
	redis.Scripter
}

// Clock says whose clock decides.
type Clock int

const (
	// ServerClock, the default, decides at the time the Redis server holding
	// the bucket reads with TIME; the now passed to Take is ignored. Replicas
	// with skewed clocks then agree. No monotonic guard is kept: a bucket is
	// always read against the clock of the one server that holds it, and if
	// that clock steps back the bucket looks emptier, never fuller
	// (limiter.Decide).
	ServerClock Clock = iota
	// CallerClock decides at the now passed to Take, for tests with exact
	// values. Keys still expire on the server's clock (after the time until
	// full, counted from the write), so callers' clocks must advance at
	// least as fast as the server's.
	CallerClock
)

// String returns the constant's name.
func (c Clock) String() string {
	switch c {
	case ServerClock:
		return "ServerClock"
	case CallerClock:
		return "CallerClock"
	}
	return fmt.Sprintf("Clock(%d)", int(c))
}

// Options configures a Store. The zero value means the defaults.
type Options struct {
	// Prefix starts every key. It must not contain '{' or '}'. Default
	// DefaultPrefix, "ratelimitd:".
	Prefix string
	// Clock chooses whose clock decides. Default ServerClock.
	Clock Clock

	// BatchMax is the most script calls coalesced into one round trip (one
	// pipeline, in which the Takes travel merged, as take.lua calls of at
	// most 128 buckets each, where the server has no hash slots). Default
	// DefaultBatchMax, 64. 1 turns coalescing off: each call is then sent
	// on its caller's goroutine. Clients without pipelines (anything but
	// go-redis's clients) are never coalesced.
	//
	// Batches form opportunistically: a call that finds no round trip in
	// flight and no batch forming is sent at once, with whatever other
	// calls are already queued; calls that arrive while one is in flight
	// collect until a round trip lands (Redis is free again), until
	// BatchMax, or for at most BatchWait, and go out together; while two
	// batches are in flight, calls queue, and the first to return takes
	// up to BatchMax of them. With a client that honours deadlines (as
	// Dial makes them), a call that finds nothing in flight is sent from
	// its caller's goroutine, with no goroutine hand-off; up to three
	// round trips may then be in flight (that call and two batches).
	// Other clients hand each call to a sending goroutine and back. A
	// lone caller never waits for a batch either way.
	BatchMax int
	// BatchWait bounds how long a batch collects calls while another round
	// trip is in flight and has not landed (see BatchMax): a bound, not a
	// delay, and a coarse one, since Go's timers of under a millisecond
	// fire up to a millisecond late in an idle process. Default
	// DefaultBatchWait, 200µs; negative means not at all (a batch goes as
	// soon as a sender is free).
	BatchWait time.Duration
	// TestBatchHold, when positive, holds each batch that long from its
	// first call (or until BatchMax), whatever lands, and sends no call
	// directly: the queueing of a saturated CPU, for tests of what the
	// Store and its callers do then; without coalescing it does nothing.
	// It only adds latency; ratelimitd sets it only when built for its
	// tests (the testhooks build tag).
	TestBatchHold time.Duration

	// QueueWait, when set, observes in seconds how long each coalesced
	// call waited in this process, from Take to the write of its round
	// trip; BatchCalls observes how many calls each round trip carried.
	// A prometheus.Histogram is one. Calls sent directly are not observed.
	QueueWait, BatchCalls Observer

	// OnBackend, when set, learns what Redis did with the coalesced calls
	// no caller waits for, for a circuit breaker (failover.Store.Observe):
	//   - for every call whose caller gave up on it (its deadline came)
	//     while Redis had it, once the answer comes: held is how long
	//     Redis took, err nil when it answered, else the error (the caller
	//     got a *limiter.DeadlineError with Pending set);
	//   - with SlowAfter set, once for every round trip still unanswered
	//     SlowAfter (and 25 µs a bucket it carries) after it was sent:
	//     held is how long Redis has had it, err a *limiter.DeadlineError
	//     with Pending set, so that a server that stopped answering is
	//     found failing within a few SlowAfter under load, whatever its
	//     callers' deadlines.
	// node is the server's name: the Cluster node's address, "" for a
	// server without slots. It is called on a sending or timer goroutine
	// and must be quick.
	OnBackend func(node string, held time.Duration, err error)
	// SlowAfter is how long Redis may hold a round trip before OnBackend
	// hears of it (failover.Options.Timeout). Zero: never.
	SlowAfter time.Duration
}

// Observer records one value (prometheus.Observer is one). It must be safe
// for concurrent use.
type Observer interface {
	Observe(float64)
}

// Store is a limiter.Store in Redis. The zero Store is not usable; call New,
// and Close when done. It is safe for concurrent use.
type Store struct {
	client   Client
	prefix   string
	clock    Clock
	group    func(keys []string) [][]int // nil: one script call for all keys
	take     *redis.Script
	takeOne  *redis.Script // take.lua for a call of one request, not a charge, sent alone
	giveBack *redis.Script
	refund   *redis.Script
	// server is the route to a server without slots (standalone or
	// Sentinel-managed); nodes, on a Cluster, the route to each master.
	server route
	nodes  *nodes
	// deadlines is honorsDeadlines(client): a call sent directly then
	// needs no context.WithDeadline for its caller's by (see ioDeadline).
	deadlines bool
	stats     counters
}

// Stats counts what a Store sent to Redis, since New.
type Stats struct {
	// Takes is the number of Takes that went to Redis (valid and not
	// empty).
	Takes int64
	// Calls is the number of script runs asked for: one per Take, or on a
	// cluster one per hash slot a Take spans, plus give-backs and refunds.
	Calls int64
	// Scripts is the number of script commands (EVALSHA) sent: Calls, less
	// the Takes that travelled merged into one command with others.
	Scripts int64
	// RoundTrips is the number of round trips to Redis: pipelines when
	// coalescing (one pipeline to a cluster goes to each node it names, in
	// parallel, and counts once), script calls otherwise. A call retried
	// with EVAL after NOSCRIPT adds one.
	RoundTrips int64
	// Direct is the number of calls sent from their caller's goroutine
	// because, coalescing, they found Redis idle, or because they were a
	// probe (a subset of Calls).
	Direct int64
	// GiveBackFailures is the number of give-back calls (a Take across
	// hash slots that one slot denied) that failed or were not answered
	// by the Take's deadline: their buckets may keep the take's tokens
	// spent until they refill.
	GiveBackFailures int64
	// DeniedWithFailures is the number of Takes across hash slots that one
	// slot denied while another failed: they answer the denial (see
	// Store.Take), and the failure is counted here, not returned.
	DeniedWithFailures int64
	// Pending is the number of script calls asked for and not yet
	// answered (queued or in flight), now: a gauge.
	Pending int64
	// Late is the number of coalesced calls answered by Redis after their
	// caller had given up on them; LateGiveBacks those of them that were
	// Takes Redis admitted, whose tokens were then given back (see
	// Store.Take), and LateGiveBackFailures the give-backs that failed.
	Late, LateGiveBacks, LateGiveBackFailures int64
}

// Stats returns the counts so far. It is safe to call concurrently with
// Take.
func (s *Store) Stats() Stats {
	return Stats{
		Takes:      s.stats.takes.Load(),
		Calls:      s.stats.calls.Load(),
		Scripts:    s.stats.scripts.Load(),
		RoundTrips: s.stats.roundTrips.Load(),
		Direct:     s.stats.direct.Load(),

		GiveBackFailures:   s.stats.giveBackFailures.Load(),
		DeniedWithFailures: s.stats.deniedWithFailures.Load(),

		Pending:              s.stats.pending.Load(),
		Late:                 s.stats.late.Load(),
		LateGiveBacks:        s.stats.lateGiveBacks.Load(),
		LateGiveBackFailures: s.stats.lateGiveBackFailures.Load(),
	}
}

// Close stops the goroutines that coalesce and send calls (two per
// server, or per Cluster master), once the batches they are sending
// return; a round trip a sender went on without (Redis held it past
// SlowAfter) ends on its own, by the client's read timeout. Takes and
// Refunds waiting for a batch, and those after Close, fail with an error
// wrapping limiter.ErrUnavailable; a call already sent directly from its
// caller's goroutine completes. It does not close the client. It is safe
// to call more than once, and concurrently.
func (s *Store) Close() error {
	if s.server.batch != nil {
		s.server.batch.close()
	}
	if s.nodes != nil {
		s.nodes.close()
	}
	return nil
}

// SweepNodes forgets, on a Redis Cluster, the nodes no call has gone to
// for idle (nodes that left the cluster or changed address), stopping
// their batchers. It does nothing on a server without slots.
func (s *Store) SweepNodes(idle time.Duration) {
	if s.nodes != nil {
		s.nodes.sweep(idle)
	}
}

var (
	_ limiter.Store         = (*Store)(nil)
	_ limiter.Refunder      = (*Store)(nil)
	_ limiter.DeadlineTaker = (*Store)(nil)
)

// takeScriptSource is take.lua as a Store loads it, after the scripts it
// starts with (see take.lua's header).
func takeScriptSource() string {
	return clockSource + stateSource + commonSource + singleSource + stepSource + takeSource
}

// New returns a Store keeping its buckets through c.
//
// How a Take is split depends on c's concrete type: a *redis.ClusterClient
// gets one script call per hash slot, a *redis.Ring one per bucket (each
// bucket is its own hash tag, which is what a Ring shards by), and anything
// else (a *redis.Client, standalone or through Sentinel) one call for all.
func New(c Client, opts Options) (*Store, error) {
	if c == nil {
		return nil, errors.New("redisstore: nil Client")
	}
	s := &Store{
		client:   c,
		prefix:   opts.Prefix,
		clock:    opts.Clock,
		take:     redis.NewScript(takeScriptSource()),
		takeOne:  redis.NewScript(clockSource + stateSource + singleSource + takeOneSource),
		giveBack: redis.NewScript(clockSource + stateSource + commonSource + giveBackSource),
		refund:   redis.NewScript(clockSource + stateSource + commonSource + refundSource),
	}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	if err := checkPrefix(s.prefix); err != nil {
		return nil, err
	}
	switch s.clock {
	case ServerClock, CallerClock:
	default:
		return nil, fmt.Errorf("redisstore: Options.Clock %v: want ServerClock or CallerClock", s.clock)
	}
	s.deadlines = honorsDeadlines(c)
	switch c.(type) {
	case *redis.ClusterClient:
		s.group = groupBy(slot)
	case *redis.Ring:
		s.group = groupBy(func(key string) string { return key })
	}
	batchMax, batchWait := opts.BatchMax, opts.BatchWait
	switch {
	case batchMax < 0:
		return nil, fmt.Errorf("redisstore: Options.BatchMax %d: must not be negative", batchMax)
	case batchMax == 0:
		batchMax = DefaultBatchMax
	}
	switch {
	case batchWait < 0:
		batchWait = 0
	case batchWait == 0:
		batchWait = DefaultBatchWait
	}
	var newBatcherFor func(node string, p pipeliner) *batcher
	if _, ok := c.(pipeliner); ok && batchMax > 1 {
		newBatcherFor = func(node string, p pipeliner) *batcher {
			b := newBatcher(p, batchMax, batchWait, &s.stats)
			b.node = node
			b.directWhenIdle = s.deadlines && opts.TestBatchHold <= 0
			b.hold = opts.TestBatchHold
			b.late = s.giveBackLate
			b.report, b.slowAfter = opts.OnBackend, opts.SlowAfter
			if opts.QueueWait != nil || opts.BatchCalls != nil {
				b.observe = func(batch []*call, sentAt int64) {
					if opts.BatchCalls != nil {
						opts.BatchCalls.Observe(float64(len(batch)))
					}
					if opts.QueueWait != nil {
						for _, c := range batch {
							opts.QueueWait.Observe(time.Duration(sentAt - c.queuedAt).Seconds())
						}
					}
				}
			}
			return b.start()
		}
	}
	s.server = route{client: c}
	if cc, ok := c.(*redis.ClusterClient); ok {
		var perNode func(string, *redis.Client) *batcher
		if newBatcherFor != nil {
			perNode = func(node string, nc *redis.Client) *batcher { return newBatcherFor(node, nc) }
		}
		s.nodes = newNodes(cc, perNode)
	} else if newBatcherFor != nil {
		s.server.batch = newBatcherFor("", c.(pipeliner))
	}
	return s, nil
}

// Key returns the Redis key that holds the bucket named bucket:
// the prefix, then the bucket's bytes in unpadded URL-safe base64 between
// braces (the Redis Cluster hash tag), e.g. "ratelimitd:{djEFYWktZ3c}".
func (s *Store) Key(bucket string) string {
	return redisKey(s.prefix, bucket)
}

// Take implements limiter.Store: it applies reqs all-or-nothing, deciding
// exactly as limiter.DecideAll at the time of the Redis server (ServerClock)
// or at now (CallerClock). Backend failures are returned wrapping
// limiter.ErrUnavailable; ctx ending before the answer, wrapping a
// *limiter.DeadlineError (whether the backend is to blame is the caller's
// to judge); invalid requests, wrapping limiter.ErrInvalidRequest.
//
// When the keys span several Redis Cluster hash slots (or Ring shards), the
// slots are taken in parallel, and if one denies, a second script gives back
// what the others took (their takes and reservations; post-paid charges
// stay, as DecideAll keeps them), under ctx: it puts a bucket in the state a
// denied Take leaves exactly if nothing wrote to it meanwhile, and otherwise
// moves its TAT back by exactly what the admitted Take added beyond that.
// This is not one atomic step, and it leaves a window of one round trip (the
// take, then the give-back):
//   - during it, other requests see those buckets emptier than they are, and
//     may be denied when they should not be;
//   - a request that takes from such a bucket during the window while it
//     also refills builds on the raised TAT; moving the TAT back afterwards
//     can leave the bucket fuller than it would be had the denied Take never
//     run, by at most what refills during the window;
//   - a bucket reset to full during the window (its key deleted by a refund
//     that filled it, evicted, or lost in a failover) and then taken again
//     no longer holds the take, yet is moved back all the same: it can end
//     up to the take's own tokens fuller. Telling this apart would need a
//     mark in every stored state, or a read-only check of every slot before
//     taking (a second round trip for every Take across slots); for a
//     window of one round trip, it is left so;
//   - if the give-back fails or ctx is done before it is answered, the
//     tokens stay spent until they refill (Stats.GiveBackFailures counts
//     such calls): stricter, never more lenient.
//
// The answer of a Take one slot denied is that denial, whatever happened to
// the give-back and to the other slots: requests in a slot that failed
// (Stats.DeniedWithFailures counts such Takes) answer Allowed with
// Remaining 0 and no ResetAfter, since their buckets' state is unknown and
// they did not deny the Take; their post-paid charges may or may not have
// been recorded. The answer waits for every slot and for the give-back, so
// one that stalls rather than fails holds it until ctx is done (the denial
// then comes when the caller has given up). A Take that no slot denied but one failed
// returns the error, after giving back the slots that admitted.
//
// A standalone or Sentinel-managed Redis has no slots: one script call
// covers every key and none of this applies.
//
// When ctx is done, Take returns at once. A script call still waiting for
// its batch is then dropped, unsent; one already sent may still run on
// Redis and charge its buckets, as when a reply is lost (this errs toward
// denying). On a cluster, a slot still unanswered is left as it lands, and
// the give-back, sent under ctx too, is not sent or not waited for.
func (s *Store) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	return s.TakeBy(ctx, time.Time{}, now, reqs)
}

// TakeBy implements limiter.DeadlineTaker: it is Take for a caller that
// stops waiting at by (unless by is zero), before ctx's deadline. A call
// that goes through the batcher waits on a timer of its own until by;
// one sent directly, or across hash slots, runs under ctx ending at by.
func (s *Store) TakeBy(ctx context.Context, by, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
	}
	if len(reqs) == 0 {
		return []limiter.Decision{}, nil
	}
	s.stats.takes.Add(1)
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = s.Key(r.Key)
	}
	groups := s.groups(keys)
	if len(groups) <= 1 {
		res, err := s.run(ctx, by, now, keys, reqs, false)
		if err != nil {
			return nil, takeError(err)
		}
		return res.decisions, nil
	}
	if !by.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, by)
		defer cancel()
	}
	return s.takeGroups(ctx, now, keys, reqs, groups)
}

func unavailable(err error) error {
	return fmt.Errorf("redis take: %w: %w", limiter.ErrUnavailable, err)
}

// takeError is the error of a Take that failed with err: a
// *limiter.DeadlineError as it is (whether the backend is to blame is the
// caller's to judge), anything else a backend failure.
func takeError(err error) error {
	if isDeadline(err) {
		return fmt.Errorf("redis take: %w", err)
	}
	return unavailable(err)
}

// isDeadline reports whether err is a *limiter.DeadlineError, or errors
// joined that all are.
func isDeadline(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		errs := joined.Unwrap()
		for _, e := range errs {
			if !isDeadline(e) {
				return false
			}
		}
		return len(errs) > 0
	}
	var de *limiter.DeadlineError
	return errors.As(err, &de)
}

// Refund implements limiter.Refunder: it gives back the Hits of each
// request, one after the other, exactly as limiter.Refund does, at the time
// of the Redis server (ServerClock) or at now (CallerClock): each bucket's
// TAT moves back by the time those tokens take to arrive, but never before
// now. A bucket left full is deleted; a missing one (full) stays missing.
// On a cluster the slots are refunded in parallel, each atomically.
// Backend failures are returned wrapping limiter.ErrUnavailable (some slots
// may have been refunded); invalid requests wrapping
// limiter.ErrInvalidRequest, before anything is sent.
func (s *Store) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = s.Key(r.Key)
	}
	var err error
	if groups := s.groups(keys); len(groups) <= 1 {
		err = s.script(ctx, time.Time{}, scriptCall{script: s.refund, keys: keys, args: s.refundArgs(now, reqs)}).Err()
	} else {
		calls := make([]scriptCall, len(groups))
		for g, idx := range groups {
			gkeys, greqs := groupOf(keys, reqs, idx)
			calls[g] = scriptCall{script: s.refund, keys: gkeys, args: s.refundArgs(now, greqs)}
		}
		var errs []error
		for _, cmd := range s.scripts(ctx, calls) {
			errs = append(errs, cmd.Err())
		}
		err = errors.Join(errs...)
	}
	switch {
	case err == nil:
		return nil
	case isDeadline(err):
		return fmt.Errorf("redis refund: %w", err)
	}
	return fmt.Errorf("redis refund: %w: %w", limiter.ErrUnavailable, err)
}
