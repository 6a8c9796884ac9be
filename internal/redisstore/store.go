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
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

var (
	//go:embed common.lua
	commonSource string
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
	// collect for up to BatchWait (or until BatchMax) and go out together,
	// in parallel with it; while two batches are in flight, calls queue,
	// and the first to return takes up to BatchMax of them. With a client
	// that honours deadlines (as Dial makes them), a call that finds
	// nothing in flight is sent from its caller's goroutine, with no
	// goroutine hand-off; up to three round trips may then be in flight
	// (that call and two batches). Other clients hand each call to a
	// sending goroutine and back. A lone caller never waits for a batch
	// either way.
	BatchMax int
	// BatchWait bounds how long a batch collects calls while another round
	// trip is in flight. Default DefaultBatchWait, 200µs; negative means
	// not at all (a batch goes as soon as a sender is free).
	BatchWait time.Duration

	// QueueWait, when set, observes in seconds how long each coalesced
	// call waited in this process, from Take to the write of its round
	// trip; BatchCalls observes how many calls each round trip carried.
	// A prometheus.Histogram is one. Calls sent directly are not observed.
	QueueWait, BatchCalls Observer

	// OnAbandoned, when set, learns the outcome of every coalesced call
	// whose caller gave up on it (its deadline came) while Redis had it:
	// nil when Redis then answered, else the error. The caller got a
	// *limiter.DeadlineError with Pending set, which says nothing of Redis;
	// this says what Redis did, for a circuit breaker
	// (failover.Store.Observe). It is called on a sending goroutine and
	// must be quick.
	OnAbandoned func(error)
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
	takeOne  *redis.Script // take.lua for a call of one request sent alone
	giveBack *redis.Script
	refund   *redis.Script
	batch    *batcher // nil: not coalescing
	stats    counters
	// bound limits each round trip (see roundTripBound); 0: unbounded.
	bound time.Duration
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
	// because, coalescing, they found Redis idle (a subset of Calls).
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

// Close stops the two goroutines that coalesce and send calls, once the
// batches they are sending return. Takes and Refunds waiting for a batch,
// and those after Close, fail with an error wrapping
// limiter.ErrUnavailable; a call already sent directly from its caller's
// goroutine completes. It does not close the client. It is safe to call
// more than once.
func (s *Store) Close() error {
	if s.batch != nil {
		s.batch.close()
	}
	return nil
}

// probeLimit is the probe bucket's shape: one token a microsecond, so that
// every Probe takes a token and writes the bucket, whose key then expires
// within a millisecond.
var probeLimit = limiter.Limit{Count: 1, Period: time.Microsecond, Burst: 1}

// Probe asks Redis for what a Take needs of it: it takes one token, as a
// Take of one request does (take_one.lua), from a bucket of its own, which
// writes it. So a Redis that answers PING but cannot decide fails it,
// where a PING would pass: a read-only replica after a failover, a user
// whose ACL forbids scripts or the prefix's keys, a server out of memory
// (maxmemory with noeviction). The bucket's key is the prefix, then
// "probe" (outside every bucket's key, which holds braces after the
// prefix). On a Cluster, Probe asks every master, one after the other, on
// a key of a slot it serves ("probe{tag}"); it fails if one of them fails.
// In Stats each counts as a script call and a round trip, not as a Take.
func (s *Store) Probe(ctx context.Context) error {
	keys := []string{s.prefix + "probe"}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		ranges, err := cc.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("redis probe: cluster slots: %w", err)
		}
		keys = keys[:0]
		var masters []string
		for _, r := range ranges { // one range or more per master, listed first
			if len(r.Nodes) == 0 || slices.Contains(masters, r.Nodes[0].Addr) {
				continue
			}
			masters = append(masters, r.Nodes[0].Addr)
			keys = append(keys, fmt.Sprintf("%sprobe{%s}", s.prefix, tagOfSlot(r.Start)))
		}
	}
	for _, key := range keys {
		reqs := []limiter.Request{{Key: key, Limit: probeLimit, Hits: 1}}
		if _, err := s.run(ctx, time.Now(), []string{key}, reqs, false); err != nil {
			return fmt.Errorf("redis probe of %s: %w", key, err)
		}
	}
	return nil
}

var (
	_ limiter.Store    = (*Store)(nil)
	_ limiter.Refunder = (*Store)(nil)
)

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
		take:     redis.NewScript(commonSource + stepSource + takeSource),
		takeOne:  redis.NewScript(commonSource + stepSource + takeOneSource),
		giveBack: redis.NewScript(commonSource + giveBackSource),
		refund:   redis.NewScript(commonSource + refundSource),
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
	s.bound = roundTripBound(c)
	if p, ok := c.(pipeliner); ok && batchMax > 1 {
		s.batch = newBatcher(p, batchMax, batchWait, &s.stats)
		s.batch.bound = s.bound
		s.batch.directWhenIdle = honorsDeadlines(c)
		s.batch.late = s.giveBackLate
		s.batch.abandoned = opts.OnAbandoned
		if opts.QueueWait != nil || opts.BatchCalls != nil {
			s.batch.observe = func(batch []*call, sentAt int64) {
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
	}
	return s, nil
}

// Prepare readies Redis and the client for calls: it loads every script
// (on every master of a Cluster), so that no call pays a NOSCRIPT retry,
// opens a connection for each sender of batches and one for direct calls,
// and ends with a Probe. Call it before reporting the service ready; it
// returns the first failure.
func (s *Store) Prepare(ctx context.Context) error {
	for _, sc := range []*redis.Script{s.take, s.takeOne, s.giveBack, s.refund} {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("redis: load scripts: %w", err)
		}
	}
	if p, ok := s.client.(interface {
		Ping(context.Context) *redis.StatusCmd
	}); ok {
		errs := make([]error, senders+1)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = p.Ping(ctx).Err() })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("redis: open connections: %w", err)
		}
	}
	return s.Probe(ctx)
}

// Key returns the Redis key that holds the bucket named bucket:
// the prefix, then the bucket's bytes in unpadded URL-safe base64 between
// braces (the Redis Cluster hash tag), e.g. "ratelimitd:{djEFYWktZ3c}".
func (s *Store) Key(bucket string) string {
	return redisKey(s.prefix, bucket)
}

// groupBy returns a function that groups request indexes by part(key), in
// order of first appearance.
func groupBy[P comparable](part func(string) P) func([]string) [][]int {
	return func(keys []string) [][]int {
		var parts []P
		var groups [][]int
		for i, k := range keys {
			p := part(k)
			j := slices.Index(parts, p)
			if j < 0 {
				j = len(parts)
				parts = append(parts, p)
				groups = append(groups, nil)
			}
			groups[j] = append(groups[j], i)
		}
		return groups
	}
}

// groups splits keys by hash slot (or Ring shard): nil when one script call
// covers them all.
func (s *Store) groups(keys []string) [][]int {
	if s.group == nil {
		return nil
	}
	return s.group(keys)
}

// groupOf returns the keys and requests at indexes idx (one group), in
// order.
func groupOf(keys []string, reqs []limiter.Request, idx []int) ([]string, []limiter.Request) {
	gkeys := make([]string, len(idx))
	greqs := make([]limiter.Request, len(idx))
	for j, i := range idx {
		gkeys[j], greqs[j] = keys[i], reqs[i]
	}
	return gkeys, greqs
}

// Take implements limiter.Store: it applies reqs all-or-nothing, deciding
// exactly as limiter.DecideAll at the time of the Redis server (ServerClock)
// or at now (CallerClock). Backend failures, including ctx's deadline,
// are returned wrapping limiter.ErrUnavailable; invalid requests wrapping
// limiter.ErrInvalidRequest.
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
		res, err := s.run(ctx, now, keys, reqs, false)
		if err != nil {
			return nil, takeError(err)
		}
		return res.decisions, nil
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

// giveBackRecord is what giveback.lua needs to take one bucket from the
// state the admitted Take left to the one a denied Take leaves.
type giveBackRecord struct {
	needed                    bool
	admittedTAT, admittedFrac int64
	deniedTAT, deniedFrac     int64
}

// run runs take.lua on keys and their requests (all in one slot, or on a
// server without slots).
func (s *Store) run(ctx context.Context, now time.Time, keys []string, reqs []limiter.Request, extras bool) (takeResult, error) {
	c := scriptCall{script: s.take, keys: keys, args: s.takeArgs(now, reqs), merge: s.group == nil, take: reqs, now: now}
	if len(reqs) == 1 {
		c.alone = s.takeOne
	}
	cmd := s.script(ctx, c)
	return decodeTakeCmd(cmd, reqs, extras)
}

// decodeTakeCmd reads the answer of a take.lua call that carried one Take of
// reqs (the batcher hands each merged Take such an answer too). With
// extras, it also works out what the Take answers and leaves if another
// slot denies it.
func decodeTakeCmd(cmd *redis.Cmd, reqs []limiter.Request, extras bool) (takeResult, error) {
	replies, err := cmd.Slice()
	if err != nil {
		return takeResult{}, err
	}
	if len(replies) != 1 {
		return takeResult{}, fmt.Errorf("take script returned %d replies for one Take", len(replies))
	}
	var buf [2 + 2*8]int64 // a Take of up to 8 requests: on the stack
	reply := buf[:0]
	switch r := replies[0].(type) {
	case error:
		return takeResult{}, r
	case []any:
		for _, v := range r {
			x, ok := v.(int64)
			if !ok {
				return takeResult{}, fmt.Errorf("take script returned %T, not an integer", v)
			}
			reply = append(reply, x)
		}
	default:
		return takeResult{}, fmt.Errorf("take script returned %T, not an array", r)
	}
	return decodeTake(reply, reqs, extras)
}

// takeArgs are take.lua's ARGV for one Take of reqs: now, the number of
// requests, then one spec per request (take.lua's header lists its
// fields). Several Takes' ARGV concatenated are one call's (see envelopes).
func (s *Store) takeArgs(now time.Time, reqs []limiter.Request) []any {
	args := make([]any, 2, 2+len(reqs))
	args[0] = s.nowArg(now)
	args[1] = len(reqs)
	for _, r := range reqs {
		args = append(args, takeSpec(r))
	}
	return args
}

// takeSpec is take.lua's spec of r, "kind:count:h µs:h frac:f µs:f
// frac:floor µs:floor frac", formed in one buffer: one string per request
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
	var buf [8 + 7*20]byte // a kind letter, seven int64s and their colons
	b := append(buf[:0], kinds[kind])
	for _, v := range [...]int64{l.Count, hitsUS, hitsFrac, fillUS, fillFrac, floorUS, floorFrac} {
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
)

// kinds are their letters in take.lua's specs: upper case for Shadow.
var kinds = [...]byte{'t', 'T', 'k', 'K', 'x', 'X', 'c', 'C'}

// nowArg is the time argument every script reads first (ARGV[1], see
// common.lua): now in Unix microseconds with CallerClock, else "" (the
// script reads the server's TIME).
func (s *Store) nowArg(now time.Time) any {
	if s.clock == CallerClock {
		return now.UnixMicro()
	}
	return ""
}

// roundTripBound is how long one round trip through c may take, retries
// included: its read and write timeouts, added (0: unbounded, a client
// whose options are not known). go-redis retries a command that timed out
// (MaxRetries), on a new connection whose handshake may time out too;
// without this bound a stalled Redis held one call for several of its
// timeouts.
func roundTripBound(c Client) time.Duration {
	var read, write time.Duration
	switch c := c.(type) {
	case *redis.Client:
		read, write = c.Options().ReadTimeout, c.Options().WriteTimeout
	case *redis.ClusterClient:
		read, write = c.Options().ReadTimeout, c.Options().WriteTimeout
	default:
		return 0
	}
	if read <= 0 || write <= 0 {
		return 0
	}
	return read + write
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
}

// script runs c: through the batcher when coalescing, else directly.
func (s *Store) script(ctx context.Context, c scriptCall) *redis.Cmd {
	if s.batch != nil {
		if !s.batch.claimIdle() {
			return s.batch.await(ctx, s.batch.submit(ctx, c))
		}
		// Redis is idle: send at once from this goroutine, without the two
		// hand-offs to and from a sender; calls arriving meanwhile batch up.
		defer s.batch.inflight.Add(-1)
		if err := s.batch.closedOr(ctx); err != nil {
			return errCmd(ctx, err)
		}
		s.stats.direct.Add(1)
	}
	if c.alone != nil {
		c.script = c.alone
	}
	return s.directTimed(ctx, c)
}

// directTimed runs c as direct does, and when ctx ends before the answer,
// fails it with a *limiter.DeadlineError. Its answer is lost with the
// connection it was read from: a Take Redis ran stays charged, as when a
// reply is lost on the wire (this errs toward denying). A call goes
// directly only when nothing else is in flight, so this happens only when
// Redis is slow or the caller's deadline very short.
func (s *Store) directTimed(ctx context.Context, c scriptCall) *redis.Cmd {
	s.stats.pending.Add(1)
	defer s.stats.pending.Add(-1)
	sent := time.Now()
	callCtx := ctx
	if s.bound > 0 {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(ctx, s.bound)
		defer cancel()
	}
	cmd := s.direct(callCtx, c)
	if cmd.Err() != nil {
		if err := ctx.Err(); err != nil {
			return errCmd(ctx, &limiter.DeadlineError{InFlight: max(time.Since(sent), 1), Err: err})
		}
	}
	return cmd
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

// scripts runs calls concurrently and returns their answers in order:
// through the batcher when coalescing (they may share a round trip), else
// one goroutine each.
func (s *Store) scripts(ctx context.Context, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	if s.batch != nil {
		pending := make([]*call, len(calls))
		for i, c := range calls {
			pending[i] = s.batch.submit(ctx, c)
		}
		for i, p := range pending {
			cmds[i] = s.batch.await(ctx, p)
		}
		return cmds
	}
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() { cmds[i] = s.directTimed(ctx, c) })
	}
	wg.Wait()
	return cmds
}

// direct runs c on its own: EVALSHA, then EVAL if the server lacks the
// script (which caches it again).
func (s *Store) direct(ctx context.Context, c scriptCall) *redis.Cmd {
	s.stats.calls.Add(1)
	s.stats.scripts.Add(1)
	s.stats.roundTrips.Add(1)
	cmd := c.script.EvalSha(ctx, s.client, c.keys, c.args...)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		s.stats.roundTrips.Add(1)
		cmd = c.script.Eval(ctx, s.client, c.keys, c.args...)
	}
	return cmd
}

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

// giveBackRecords works out, for a Take that one slot admitted, what its
// requests answer if another slot denies it (limiter.DecideDenied), and for the
// last request naming each key whose admitted state differs from the
// denied one, the record giveback.lua needs.
func giveBackRecords(now time.Time, reqs []limiter.Request, stored []limiter.State, decisions []limiter.Decision, next []limiter.State) ([]limiter.Decision, []giveBackRecord) {
	denied, deniedNext := limiter.DecideDenied(now, reqs, stored, decisions)
	records := make([]giveBackRecord, len(reqs))
	for i, r := range reqs {
		last := !slices.ContainsFunc(reqs[i+1:], func(later limiter.Request) bool { return later.Key == r.Key })
		if last && next[i] != deniedNext[i] {
			records[i] = giveBackRecord{
				needed:      true,
				admittedTAT: next[i].TAT, admittedFrac: next[i].Frac,
				deniedTAT: deniedNext[i].TAT, deniedFrac: deniedNext[i].Frac,
			}
		}
	}
	return denied, records
}

// takeGroups takes each group (one hash slot) in parallel, and if one
// denies or fails, gives back what the others took, under ctx. See Take.
func (s *Store) takeGroups(ctx context.Context, now time.Time, keys []string, reqs []limiter.Request, groups [][]int) ([]limiter.Decision, error) {
	results := make([]takeResult, len(groups))
	errs := make([]error, len(groups))
	calls := make([]scriptCall, len(groups))
	greqs := make([][]limiter.Request, len(groups))
	for g, idx := range groups {
		var gkeys []string
		gkeys, greqs[g] = groupOf(keys, reqs, idx)
		calls[g] = scriptCall{script: s.take, keys: gkeys, args: s.takeArgs(now, greqs[g]), take: greqs[g], now: now}
	}
	for g, cmd := range s.scripts(ctx, calls) {
		results[g], errs[g] = decodeTakeCmd(cmd, greqs[g], true)
	}

	allowed, denied := true, false
	var failed []error
	for g := range groups {
		switch {
		case errs[g] != nil:
			failed = append(failed, errs[g])
			allowed = false
		case !results[g].allowed:
			allowed, denied = false, true
		}
	}
	decisions := make([]limiter.Decision, len(reqs))
	for g, idx := range groups {
		res := results[g]
		for j, i := range idx {
			switch {
			case errs[g] != nil:
				// Unknown: not what denied the Take, nothing known left.
				decisions[i] = limiter.Decision{Allowed: true}
			case allowed || !res.allowed:
				// Admitted everywhere, or this slot denied: it already
				// answered as DecideAll does.
				decisions[i] = res.decisions[j]
			default:
				// Admitted here, denied elsewhere: as DecideAll, the
				// post-paid charges alone, the others reported as checks.
				decisions[i] = res.denied[j]
			}
		}
	}
	if allowed {
		return decisions, nil
	}
	// Under ctx: the caller gets its answer by its deadline; a give-back
	// not done by then leaves tokens spent, which errs toward denying.
	gerr := s.giveBackGroups(ctx, now, keys, reqs, groups, results, errs)
	if denied {
		// The admission is known: denied. Failures only cost accuracy
		// (tokens left spent, a failed slot's state unknown).
		if len(failed) > 0 {
			s.stats.deniedWithFailures.Add(1)
		}
		return decisions, nil
	}
	if gerr != nil {
		failed = append(failed, gerr)
	}
	return nil, takeError(errors.Join(failed...))
}

// giveBackGroups runs giveback.lua on every group that admitted, for the
// buckets whose state differs from what a denied Take leaves, under ctx,
// and counts the calls that fail in Stats.GiveBackFailures.
func (s *Store) giveBackGroups(ctx context.Context, now time.Time, keys []string, reqs []limiter.Request, groups [][]int, results []takeResult, errs []error) error {
	var calls []scriptCall
	for g, idx := range groups {
		res := results[g]
		if errs[g] != nil || !res.allowed {
			continue
		}
		var gkeys []string
		args := []any{s.nowArg(now), res.now}
		for j, i := range idx {
			r := res.giveBack[j]
			if !r.needed {
				continue
			}
			gkeys = append(gkeys, keys[i])
			args = append(args, reqs[i].Limit.Count, r.admittedTAT, r.admittedFrac, r.deniedTAT, r.deniedFrac)
		}
		if len(gkeys) == 0 {
			continue
		}
		calls = append(calls, scriptCall{script: s.giveBack, keys: gkeys, args: args})
	}
	if len(calls) == 0 {
		return nil
	}
	var gerrs []error
	for i, cmd := range s.scripts(ctx, calls) {
		if err := cmd.Err(); err != nil {
			s.stats.giveBackFailures.Add(1)
			gerrs = append(gerrs, fmt.Errorf("give back %d buckets: %w", len(calls[i].keys), err))
		}
	}
	return errors.Join(gerrs...)
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
		err = s.script(ctx, scriptCall{script: s.refund, keys: keys, args: s.refundArgs(now, reqs)}).Err()
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

// refundArgs are refund.lua's ARGV for reqs.
func (s *Store) refundArgs(now time.Time, reqs []limiter.Request) []any {
	args := make([]any, 1, 1+3*len(reqs))
	args[0] = s.nowArg(now)
	for _, r := range reqs {
		l := r.Limit
		backUS, backFrac := l.Span(min(r.Hits, l.Burst+l.MaxDebt)) // as limiter.Refund
		args = append(args, l.Count, backUS, backFrac)
	}
	return args
}
