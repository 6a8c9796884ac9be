package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

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
	keys, err := s.probeKeys(ctx)
	if err != nil {
		return err
	}
	for _, key := range keys {
		if err := s.probeKey(ctx, key); err != nil {
			return err
		}
	}
	return nil
}

// ProbeAny is Probe that, on a Cluster, asks every master at once and
// passes if one of them can decide: a replica whose Redis Cluster has a
// failed master still decides the other masters' buckets (each master's
// failures are its own; see failover.Options.Shard), so its readiness
// does not depend on one master. It fails with every master's error
// when none can decide. On a server without slots it is Probe.
func (s *Store) ProbeAny(ctx context.Context) error {
	keys, err := s.probeKeys(ctx)
	if err != nil {
		return err
	}
	// The first master that decides answers: one in a black hole does
	// not hold the check to its deadline. The others' probes end by ctx.
	results := make(chan error, len(keys))
	for _, key := range keys {
		go func() { results <- s.probeKey(ctx, key) }()
	}
	var errs []error
	for range keys {
		err := <-results
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// probeKeys are the probe buckets' keys: one, or on a Cluster one in a
// slot of each master ("probe{tag}").
func (s *Store) probeKeys(ctx context.Context) ([]string, error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return []string{s.prefix + "probe"}, nil
	}
	ranges, err := s.clusterSlots(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("redis probe: cluster slots: %w", err)
	}
	var keys, masters []string
	for _, r := range ranges { // one range or more per master, listed first
		if len(r.Nodes) == 0 || slices.Contains(masters, r.Nodes[0].Addr) {
			continue
		}
		masters = append(masters, r.Nodes[0].Addr)
		keys = append(keys, fmt.Sprintf("%sprobe{%s}", s.prefix, tagOfSlot(r.Start)))
	}
	return keys, nil
}

// clusterSlots asks every node the cluster client knows for CLUSTER
// SLOTS at once and returns the first answer, so that one node that does
// not answer (a black hole) does not hold the probe until its deadline;
// with no node known yet, it asks the cluster client (a seed).
func (s *Store) clusterSlots(ctx context.Context, cc *redis.ClusterClient) ([]redis.ClusterSlot, error) {
	clients := s.nodes.clients()
	if len(clients) == 0 {
		return cc.ClusterSlots(ctx).Result()
	}
	type answer struct {
		slots []redis.ClusterSlot
		err   error
	}
	answers := make(chan answer, len(clients))
	for _, c := range clients {
		go func() {
			slots, err := c.ClusterSlots(ctx).Result()
			answers <- answer{slots, err}
		}()
	}
	var errs []error
	for range clients {
		a := <-answers
		if a.err == nil {
			return a.slots, nil
		}
		errs = append(errs, a.err)
	}
	return nil, errors.Join(errs...)
}

// probeKey takes a token from the probe bucket at key, sent directly
// (scriptCall.probe).
func (s *Store) probeKey(ctx context.Context, key string) error {
	now := time.Now()
	reqs := []limiter.Request{{Key: key, Limit: probeLimit, Hits: 1}}
	c := scriptCall{script: s.take, keys: []string{key}, args: s.takeArgs(now, reqs), take: reqs, now: now, probe: true}
	if !reqs[0].Charge() {
		c.alone = s.takeOne
	}
	if _, err := decodeTakeCmd(s.script(ctx, time.Time{}, c), reqs, false); err != nil {
		return fmt.Errorf("redis probe of %s: %w", key, err)
	}
	return nil
}

// Prepare readies Redis and the client for calls: it loads every script
// (on every master of a Cluster), so that no call pays a NOSCRIPT retry,
// opens a connection for each sender of batches and one for direct calls,
// and ends with a Probe. Call it before reporting the service ready; it
// returns the first failure.
//
// On a Cluster it is ready when some master is (ProbeAny), as /readyz
// is: each master's faults are its own, and a master that missed the
// scripts (down at the time) gets each with its first call (EVAL after
// NOSCRIPT). Loading them gets at most half of ctx's time.
func (s *Store) Prepare(ctx context.Context) error {
	if s.nodes != nil {
		loadCtx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok {
			loadCtx, cancel = context.WithDeadline(ctx, dl.Add(-time.Until(dl)/2))
		}
		for _, sc := range []*redis.Script{s.take, s.takeOne, s.giveBack, s.refund, leaseScript} {
			if sc.Load(loadCtx, s.client).Err() != nil {
				break
			}
		}
		cancel()
		return s.ProbeAny(ctx)
	}
	for _, sc := range []*redis.Script{s.take, s.takeOne, s.giveBack, s.refund, leaseScript} {
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
