package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Lease pools (limiter.LeaseStore) in Redis.
//
// A pool is one sorted set, lease id → expiry in Unix microseconds, under
// LeaseKey(pool); one script (lease.lua) runs each Acquire, Release and
// InFlight atomically on it, purging the expired leases first, on the
// Redis server's clock (ServerClock) or at the now given (CallerClock).
// The key expires one lease (the Lease of the latest Acquire) after its
// latest lease does: an abandoned pool disappears, and a call within that
// grace still counts the leases that expired unreleased (past it they
// vanish uncounted).
// The pool's identity is the key's hash tag: a pool lives in one Cluster
// slot, whatever the slots of the buckets beside it. The calls travel like
// Takes' (coalesced into pipelines, or sent directly when Redis is idle),
// each its own script call.
//
// Waking waiters on other replicas: a denied Acquire with MaxWait > 0 sets
// the pool's waiting mark (a key beside it, in its slot, expiring after
// MaxWait), and while it exists every Release that frees a lease
// PUBLISHes the number still held on LeaseChannel(pool). With no one
// waiting, a release publishes nothing (on a Cluster a PUBLISH reaches
// every node). A replica subscribes once, to LeaseChannelPattern, and
// hands each message to the local waiters of the pool it names. Pub/sub
// delivers at most once (a subscriber reconnecting misses messages), and
// leases that expire publish nothing, so a waiter also retries at the
// RetryAfter its denial gave, within its own deadline.

var (
	//go:embed lease.lua
	leaseSource string
	// leaseScript is immutable: its source and SHA.
	leaseScript = redis.NewScript(clockSource + stateSource + commonSource + leaseSource)
)

// LeaseKey returns the Redis key of the pool named pool: the prefix,
// "lease", then the pool's bytes in unpadded URL-safe base64 between
// braces (its Cluster hash tag), e.g. "ratelimitd:lease{cG9vbA}". It never
// equals a bucket's key (whose brace follows the prefix) nor the probe's.
func (s *Store) LeaseKey(pool string) string {
	return redisKey(s.prefix+"lease", pool)
}

// PoolShard is Shard for the lease pool named pool.
func (s *Store) PoolShard(pool string) string {
	if s.nodes == nil {
		return ""
	}
	return s.nodes.node(s.LeaseKey(pool))
}

// leaseWaitingKey is the key of pool's waiting mark, in its slot.
func (s *Store) leaseWaitingKey(pool string) string {
	return redisKey(s.prefix+"lease-waiting", pool)
}

// LeaseChannel returns the pub/sub channel on which a Release that frees
// a lease of pool publishes while someone may wait (see
// limiter.LeaseRequest.MaxWait): the pool's key. The message is the number
// of leases held after the release, in decimal.
func (s *Store) LeaseChannel(pool string) string {
	return s.LeaseKey(pool)
}

// LeaseChannelPattern returns the PSUBSCRIBE pattern that matches every
// LeaseChannel of this Store's prefix (glob characters in the prefix
// escaped).
func (s *Store) LeaseChannelPattern() string {
	var b strings.Builder
	for _, r := range s.prefix + "lease" {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteString("{*")
	return b.String()
}

// leaseReply is lease.lua's answer.
type leaseReply struct {
	ok, renewed    bool
	held, expired  int64
	untilNext, now int64 // µs
}

// lease runs lease.lua on pool.
func (s *Store) lease(ctx context.Context, pool string, args ...any) (leaseReply, error) {
	cmd := s.script(ctx, time.Time{}, scriptCall{
		script: leaseScript,
		keys:   []string{s.LeaseKey(pool), s.leaseWaitingKey(pool)},
		args:   args,
	})
	v, err := cmd.Int64Slice()
	if err != nil {
		return leaseReply{}, err
	}
	if len(v) != 6 {
		return leaseReply{}, fmt.Errorf("lease script returned %d integers, want 6", len(v))
	}
	return leaseReply{ok: v[0] == 1, renewed: v[1] == 1, held: v[2], expired: v[3], untilNext: v[4], now: v[5]}, nil
}

// leaseError wraps err, of the call named op, as takeError does.
func leaseError(op string, err error) error {
	if isDeadline(err) {
		return fmt.Errorf("redis %s: %w", op, err)
	}
	return fmt.Errorf("redis %s: %w: %w", op, limiter.ErrUnavailable, err)
}

// Acquire implements limiter.LeaseStore, atomically on the pool's key, at
// the Redis server's time (ServerClock) or at now (CallerClock). On a
// backend failure (an error wrapping limiter.ErrUnavailable, or a
// *limiter.DeadlineError) the lease may have been taken, as when a reply
// is lost: it is held until released or expired, so a caller that answers
// the request as not admitted should Release the id.
func (s *Store) Acquire(ctx context.Context, now time.Time, r limiter.LeaseRequest) (limiter.LeaseDecision, error) {
	if err := r.Validate(); err != nil {
		return limiter.LeaseDecision{}, fmt.Errorf("acquire lease: %w", err)
	}
	// A max wait in whole milliseconds, rounded up: the mark outlives it.
	waitMS := (r.MaxWait + time.Millisecond - 1).Milliseconds()
	rep, err := s.lease(ctx, r.Pool, s.nowArg(now), "a", r.ID, r.Limit.MaxInFlight, r.Limit.Lease.Microseconds(), waitMS)
	if err != nil {
		return limiter.LeaseDecision{}, leaseError("acquire lease", err)
	}
	d := limiter.LeaseDecision{
		Allowed:   rep.ok,
		Renewed:   rep.renewed,
		InFlight:  rep.held,
		Remaining: max(r.Limit.MaxInFlight-rep.held, 0),
		Expired:   rep.expired,
	}
	if !rep.ok {
		d.RetryAfter = time.Duration(rep.untilNext) * time.Microsecond
	}
	return d, nil
}

// Release implements limiter.LeaseStore, atomically on the pool's key. A
// release that frees a lease while the pool's waiting mark is set
// publishes on LeaseChannel(pool). A failed Release may or may not have
// freed the lease; it is idempotent, so the caller may retry it.
func (s *Store) Release(ctx context.Context, now time.Time, pool, id string) (limiter.LeaseRelease, error) {
	if err := limiter.ValidateLeaseID(id); err != nil {
		return limiter.LeaseRelease{}, fmt.Errorf("release lease: %w", err)
	}
	rep, err := s.lease(ctx, pool, s.nowArg(now), "r", id, 0, 0, 0, s.LeaseChannel(pool))
	if err != nil {
		return limiter.LeaseRelease{}, leaseError("release lease", err)
	}
	return limiter.LeaseRelease{Released: rep.ok, InFlight: rep.held, Expired: rep.expired}, nil
}

// InFlight implements limiter.LeaseStore. It is a write (it purges the
// expired leases, and reports them), so it needs the master, as Acquire
// does.
func (s *Store) InFlight(ctx context.Context, now time.Time, pool string) (limiter.PoolState, error) {
	rep, err := s.lease(ctx, pool, s.nowArg(now), "n")
	if err != nil {
		return limiter.PoolState{}, leaseError("read lease pool", err)
	}
	return limiter.PoolState{
		InFlight:   rep.held,
		NextExpiry: time.Duration(rep.untilNext) * time.Microsecond,
		Expired:    rep.expired,
	}, nil
}

var _ limiter.LeaseStore = (*Store)(nil)
