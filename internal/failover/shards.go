package failover

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// wholeBackend is the shard name of a backend that is not sharded, and of
// a bucket whose shard the backend cannot tell yet.
const wholeBackend = ""

// shardIdle is how long a named shard's breaker is kept with no call
// asking for it: a node that left the topology (a failed master after its
// replica's promotion, an address that changed) then stops counting in
// Healthy. A shard still in use is asked for on every call; one dropped
// and asked for again starts closed, and a dead node costs its first
// FailureThreshold calls again, once per shardIdle.
const shardIdle = 10 * time.Second

// breakers holds the circuit breaker of each shard of the backend, so
// that one shard's fault stays on that shard: a Take asks the breakers of
// the shards its buckets live on, and a failure counts against the shard
// that failed (a *limiter.ShardError names it), or against every shard of
// the Take when the error names none. A backend that is not sharded has
// one breaker, wholeBackend's.
//
// The backend is healthy while some shard's breaker has not opened since
// its last success (or no shard is known): a replica that can decide the
// buckets of some shards is worth keeping in rotation, since every
// replica sees the same failed shard. It is safe for concurrent use.
type breakers struct {
	opts Options

	mu     sync.Mutex
	byName map[string]*shardBreaker

	// notifyMu orders the reports of the whole backend's health.
	notifyMu sync.Mutex
	reported bool // what OnChange last said (initially true)
}

// shardBreaker is one shard's breaker and when a call last asked for it.
type shardBreaker struct {
	*breaker
	name     string
	lastUsed atomic.Int64 // Options.Now, Unix ns
}

func newBreakers(opts Options) *breakers {
	return &breakers{opts: opts, byName: make(map[string]*shardBreaker), reported: true}
}

// get returns name's breaker, made closed and healthy if there is none.
// A new named shard (a promoted replica, a master added) makes the
// backend healthy again if every other had failed, and says so.
func (bs *breakers) get(name string) *shardBreaker {
	bs.mu.Lock()
	sb, ok := bs.byName[name]
	if !ok {
		o := bs.opts
		o.OnChange = func(healthy bool, err error) { bs.changed(name, healthy, err) }
		sb = &shardBreaker{breaker: newBreaker(o), name: name}
		sb.lastUsed.Store(bs.opts.Now().UnixNano())
		bs.byName[name] = sb
	}
	bs.mu.Unlock()
	if !ok && name != wholeBackend {
		bs.report()
	}
	return sb
}

// report tells OnChange the whole backend's health if it is not what was
// last reported.
func (bs *breakers) report() {
	bs.notifyMu.Lock()
	defer bs.notifyMu.Unlock()
	if now, err := bs.health(); now != bs.reported {
		bs.reported = now
		if bs.opts.OnChange != nil {
			bs.opts.OnChange(now, err)
		}
	}
}

// changed reports a shard's health change to Options.OnShardChange, then
// the whole backend's, if that changed, to Options.OnChange.
func (bs *breakers) changed(name string, healthy bool, err error) {
	if bs.opts.OnShardChange != nil && name != wholeBackend {
		bs.opts.OnShardChange(name, healthy, err)
	}
	bs.notifyMu.Lock()
	defer bs.notifyMu.Unlock()
	if now := bs.healthy(); now != bs.reported {
		bs.reported = now
		if bs.opts.OnChange != nil {
			bs.opts.OnChange(now, err)
		}
	}
}

// healthy reports whether some named shard's breaker has not opened
// since its last success; with no named shard known, whether the whole
// backend's has not (or there is none). The whole backend's breaker
// beside named shards (buckets whose shard was not known yet, lease
// pools) does not make a backend whose every node fails healthy.
func (bs *breakers) healthy() bool {
	ok, _ := bs.health()
	return ok
}

// health is healthy, and the last error of an open breaker when not.
func (bs *breakers) health() (bool, error) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	named, whole := false, true
	var last error
	for name, sb := range bs.byName {
		h, err := sb.state()
		if name == wholeBackend {
			whole = h
			if !h {
				last = err
			}
			continue
		}
		if h {
			return true, nil
		}
		named, last = true, err
	}
	if named {
		return false, last
	}
	return whole, last
}

// sweep drops the breakers of named shards no call has asked for within
// shardIdle, and reports the whole backend's health if that changed it.
func (bs *breakers) sweep() {
	cutoff := bs.opts.Now().Add(-shardIdle).UnixNano()
	var dropped []string
	bs.mu.Lock()
	for name, sb := range bs.byName {
		if name != wholeBackend && sb.lastUsed.Load() < cutoff {
			delete(bs.byName, name)
			dropped = append(dropped, name)
		}
	}
	bs.mu.Unlock()
	for _, name := range dropped {
		if bs.opts.OnShardDropped != nil {
			bs.opts.OnShardDropped(name)
		}
	}
	if len(dropped) > 0 {
		bs.report()
	}
}

// open returns the breakers that are open and due for a probe.
func (bs *breakers) due() []*shardBreaker {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	var out []*shardBreaker
	for _, sb := range bs.byName {
		if !sb.closed() {
			out = append(out, sb)
		}
	}
	return out
}

// allClosed reports whether the breakers of names (wholeBackend's for
// none) all let every call through.
func (bs *breakers) allClosed(names []string) bool {
	if len(names) == 0 {
		names = []string{wholeBackend}
	}
	for _, n := range names {
		if !bs.get(n).closed() {
			return false
		}
	}
	return true
}

// admitted is one shard's breaker that let a call through, and whether
// the call is its half-open probe.
type admitted struct {
	sb    *shardBreaker
	probe bool
}

// admission is the breakers a call went past (see breakers.admit).
type admission struct {
	bs     *breakers
	shards []admitted
}

// admit asks the breaker of every shard in names (wholeBackend's for
// none): the call goes to the backend only if they all let it through;
// otherwise the probes it was given are released and the refusing
// shard's outage is returned.
func (bs *breakers) admit(names []string) (admission, bool, outage) {
	if len(names) == 0 {
		names = []string{wholeBackend}
	}
	now := bs.opts.Now().UnixNano()
	a := admission{bs: bs, shards: make([]admitted, 0, len(names))}
	for _, n := range names {
		sb := bs.get(n)
		sb.lastUsed.Store(now)
		probe, ok, o := sb.admit(true)
		if !ok {
			a.release()
			return admission{}, false, o
		}
		a.shards = append(a.shards, admitted{sb, probe})
	}
	return a, true, outage{}
}

// release gives back a call that tells nothing of the backend.
func (a admission) release() {
	for _, s := range a.shards {
		s.sb.release(s.probe)
	}
}

// succeeded records the backend's answer on every shard of the call.
func (a admission) succeeded() {
	for _, s := range a.shards {
		s.sb.succeeded(s.probe)
	}
}

// failedAll records err, a backend failure, against every shard of the
// call, and returns the first one's outage.
func (a admission) failedAll(err error) outage {
	var o outage
	for i, s := range a.shards {
		if so := s.sb.failed(s.probe, err); i == 0 {
			o = so
		}
	}
	return o
}

// failedOne records err, a backend failure, against the shard name: one
// of the call's, or one it was redirected to (its slot moved), and
// returns that shard's outage.
func (a admission) failedOne(name string, err error) outage {
	if j := slices.IndexFunc(a.shards, func(s admitted) bool { return s.sb.name == name }); j >= 0 {
		return a.shards[j].sb.failed(a.shards[j].probe, err)
	}
	return a.bs.get(name).failed(false, err)
}

// releaseExcept releases the shards of the call not in names.
func (a admission) releaseExcept(names []string) {
	for _, s := range a.shards {
		if !slices.Contains(names, s.sb.name) {
			s.sb.release(s.probe)
		}
	}
}

// shardErrors returns the *limiter.ShardError values in err (through
// errors.Join and wrapping), in order.
func shardErrors(err error) []*limiter.ShardError {
	var out []*limiter.ShardError
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if se, ok := err.(*limiter.ShardError); ok {
			out = append(out, se)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// shardOf returns the shard a failure observed outside a call belongs to:
// the one err names, else name.
func shardOf(name string, err error) string {
	var se *limiter.ShardError
	if errors.As(err, &se) {
		return se.Shard
	}
	return name
}
