package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// On a Redis Cluster, each call goes to the master of its slot through a
// batcher of that master's own, on go-redis's client for that node (its
// pool), not through the cluster client's pipelines: those send to every
// node a batch names and return when the slowest has answered (so one
// dead or slow node would hold back every call in the batch), follow
// redirects after a backoff that can outlive Envoy's deadline, and retry
// a timed-out pipeline, which could run a take twice. Here a node's fault
// stays on that node's calls, redirects are followed at once within the
// caller's deadline, and nothing that may have run is sent again.
//
// The cluster client still keeps the slot map (which master serves which
// slot: MasterForKey) and the node clients; the map is reloaded when a
// node fails, answers MOVED or CLUSTERDOWN (see nodes.suspect), so that
// calls follow a failover within a reload or two of the promotion rather
// than after go-redis's periodic reload (a minute).

// Redirects and retries within a caller's deadline.
const (
	// maxRedirects bounds the MOVED and ASK answers one call follows: a
	// slot moves once at a time, so two or three suffice, and more means
	// the map is in flux.
	maxRedirects = 5
	// maxTryAgain bounds the TRYAGAIN answers one call waits out, within
	// its deadline: about a fifth of a second of tryAgainPause, longer
	// than Envoy waits, and a bound for a caller without a deadline.
	maxTryAgain = 200
	// tryAgainPause is how long a call answered TRYAGAIN (a take of
	// several keys of a slot that is moving, some of them moved) waits
	// before it is sent again, if its deadline allows: the keys of a slot
	// move in batches of milliseconds.
	tryAgainPause = time.Millisecond
	// topologyWatch is how long after a node's last failure the slot map
	// keeps being reloaded (every topologyPoll, each reload coalesced by
	// go-redis with a 200 ms cooldown), so that a replica promoted while
	// the failed master's breaker keeps calls away is found at once.
	topologyWatch = 3 * time.Second
	topologyPoll  = 100 * time.Millisecond
)

// route is where a call goes: a Redis server, named (a Cluster node's
// address, "" for a server without slots), the client to it, and the
// batcher that coalesces its calls (nil: not coalescing).
type route struct {
	node   string
	client Client
	batch  *batcher
}

// nodes routes a Cluster's calls to the master of their slot, each
// master with a batcher of its own. It is safe for concurrent use.
type nodes struct {
	cluster *redis.ClusterClient
	// newBatcher makes the batcher of a node; nil: not coalescing.
	newBatcher func(node string, c *redis.Client) *batcher

	mu     sync.Mutex
	routes atomic.Pointer[map[string]*nodeRoute] // copied on write, under mu
	known  map[string]*redis.Client              // the node clients the cluster client made
	// learned is closed, and replaced, when known gains a node.
	learned chan struct{}

	failedAt  atomic.Int64 // a node's last failure (mono); 0 for none yet
	stop      chan struct{}
	closed    atomic.Bool
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// nodeRoute is a node's route and when a call last took it.
type nodeRoute struct {
	route
	lastUsed atomic.Int64 // mono
}

func newNodes(cc *redis.ClusterClient, newBatcher func(string, *redis.Client) *batcher) *nodes {
	n := &nodes{cluster: cc, newBatcher: newBatcher, known: make(map[string]*redis.Client),
		learned: make(chan struct{}), stop: make(chan struct{})}
	n.routes.Store(&map[string]*nodeRoute{})
	cc.OnNewNode(n.learn)
	n.wg.Go(n.watchTopology)
	return n
}

// learn records a node client the cluster client made.
func (n *nodes) learn(c *redis.Client) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.known[c.Options().Addr] = c
	close(n.learned)
	n.learned = make(chan struct{})
}

// close stops the topology watcher and every batcher.
func (n *nodes) close() {
	n.closed.Store(true)
	n.closeOnce.Do(func() { close(n.stop) })
	n.wg.Wait()
	for _, r := range *n.routes.Load() {
		if r.batch != nil {
			r.batch.close()
		}
	}
}

// suspect notes that the slot map may be stale (a node failed, a slot
// moved, the cluster said it is down): it is reloaded now, and again
// every topologyPoll for topologyWatch.
func (n *nodes) suspect() {
	n.failedAt.Store(mono())
	n.cluster.ReloadState(context.Background())
}

// watchTopology reloads the slot map while a node failed within
// topologyWatch (see suspect).
func (n *nodes) watchTopology() {
	t := time.NewTicker(topologyPoll)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case now := <-t.C:
			if f := n.failedAt.Load(); f != 0 && monoOf(now)-f < int64(topologyWatch) {
				n.cluster.ReloadState(context.Background())
			}
		}
	}
}

// forKey returns the route to the master that serves key's slot, for a
// caller that waits until ctx ends or, unless zero, until by. With no
// slot map loaded yet (the first call, or every seed unreachable since
// the start), it loads one within that time, so that a failure leaves
// the caller its margin.
func (n *nodes) forKey(ctx context.Context, by time.Time, key string) (*nodeRoute, error) {
	if n.closed.Load() {
		return nil, errClosed
	}
	c, err := n.cluster.MasterForKey(doneContext, key)
	if err != nil {
		if !by.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, by)
			defer cancel()
		}
		if c, err = n.cluster.MasterForKey(ctx, key); err != nil {
			n.suspect()
			return nil, fmt.Errorf("%w: no slot map of the cluster: %w", limiter.ErrUnavailable, err)
		}
	}
	return n.routeTo(c), nil
}

// node returns the address of the master that serves key's slot, "" if
// the slot map cannot say. It never waits: with no slot map loaded yet,
// MasterForKey would load one, a round trip or a dial timeout per seed
// node, so it is asked under a context already done, which fails that
// load at once and leaves a loaded map untouched.
func (n *nodes) node(key string) string {
	c, err := n.cluster.MasterForKey(doneContext, key)
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// doneContext is a context that is already done (see nodes.node).
var doneContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// forAddr returns the route to the node at addr, which a redirect named.
// A node the cluster client has not made yet (one just added) is waited
// for, while the slot map reloads, until the call's deadline.
func (n *nodes) forAddr(ctx context.Context, by time.Time, addr string) (*nodeRoute, error) {
	for {
		n.mu.Lock()
		c, ok := n.known[addr]
		learned := n.learned
		n.mu.Unlock()
		if ok {
			return n.routeTo(c), nil
		}
		n.suspect()
		if err := awaitLearned(ctx, by, learned); err != nil {
			return nil, err
		}
	}
}

// awaitLearned waits until learned is closed, or fails when ctx ends or
// by passes first.
func awaitLearned(ctx context.Context, by time.Time, learned <-chan struct{}) error {
	var expiry <-chan time.Time
	if !by.IsZero() {
		t := time.NewTimer(time.Until(by))
		defer t.Stop()
		expiry = t.C
	}
	select {
	case <-learned:
		return nil
	case <-ctx.Done():
		return &limiter.DeadlineError{Err: ctx.Err()}
	case <-expiry:
		return &limiter.DeadlineError{Err: context.DeadlineExceeded}
	}
}

// routeTo returns c's route, made on first use (and made again if the
// cluster client replaced the node's client).
func (n *nodes) routeTo(c *redis.Client) *nodeRoute {
	addr := c.Options().Addr
	now := mono()
	if r, ok := (*n.routes.Load())[addr]; ok && r.client == Client(c) {
		if r.lastUsed.Load() < now-int64(time.Second) {
			r.lastUsed.Store(now)
		}
		return r
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	old := *n.routes.Load()
	if r, ok := old[addr]; ok && r.client == Client(c) {
		return r
	}
	r := &nodeRoute{route: route{node: addr, client: c}}
	r.lastUsed.Store(now)
	if n.newBatcher != nil {
		r.batch = n.newBatcher(addr, c)
	}
	routes := make(map[string]*nodeRoute, len(old)+1)
	for a, o := range old {
		routes[a] = o
	}
	if prev, ok := old[addr]; ok && prev.batch != nil {
		go prev.batch.close() // its client was replaced: its calls fail
	}
	routes[addr] = r
	n.routes.Store(&routes)
	return r
}

// sweep closes the routes no call has taken for idle: nodes that left the
// cluster, or whose address changed.
func (n *nodes) sweep(idle time.Duration) {
	cutoff := mono() - int64(idle)
	n.mu.Lock()
	defer n.mu.Unlock()
	old := *n.routes.Load()
	routes := make(map[string]*nodeRoute, len(old))
	for a, r := range old {
		if r.lastUsed.Load() >= cutoff {
			routes[a] = r
		} else if r.batch != nil {
			go r.batch.close()
		}
	}
	n.routes.Store(&routes)
}

// redirect is what a Cluster node answered instead of running a script:
// nothing ran, so the call may be sent again.
type redirect struct {
	kind redirectKind
	addr string // the node to ask, for MOVED and ASK
}

type redirectKind int

const (
	notRedirected redirectKind = iota
	moved                      // the slot is served elsewhere: the map is stale
	ask                        // the slot is moving; this key already has
	tryAgain                   // the slot is moving and the keys are split
	clusterDown                // the cluster refuses every query
)

// redirectOf reads a node's error reply.
func redirectOf(err error) redirect {
	var re redis.Error
	if !errors.As(err, &re) {
		return redirect{}
	}
	msg := re.Error()
	word, rest, _ := strings.Cut(msg, " ")
	switch word {
	case "MOVED", "ASK":
		// "MOVED 3999 127.0.0.1:6381"; an IPv6 host is not bracketed
		// ("MOVED 3999 ::1:6381"), as go-redis's node addresses are.
		_, addr, ok := strings.Cut(rest, " ")
		i := strings.LastIndexByte(addr, ':')
		if !ok || i <= 0 {
			return redirect{}
		}
		addr = net.JoinHostPort(strings.Trim(addr[:i], "[]"), addr[i+1:])
		if word == "MOVED" {
			return redirect{kind: moved, addr: addr}
		}
		return redirect{kind: ask, addr: addr}
	case "TRYAGAIN":
		return redirect{kind: tryAgain}
	case "CLUSTERDOWN":
		return redirect{kind: clusterDown}
	}
	return redirect{}
}

// clusterScript runs c on the master of its slot (all of c's keys share
// one), following MOVED, ASK and TRYAGAIN within the caller's deadline.
func (s *Store) clusterScript(ctx context.Context, by time.Time, c scriptCall) *redis.Cmd {
	r, err := s.nodes.forKey(ctx, by, c.keys[0])
	if err != nil {
		return errCmd(ctx, err)
	}
	return s.followRedirects(ctx, by, c, r, s.send(&r.route, ctx, by, c))
}

// followRedirects returns cmd, the answer to c from r, once any redirect
// it is has been followed: MOVED (the slot map is reloaded) and ASK at
// once to the node named, TRYAGAIN after tryAgainPause, up to
// maxRedirects, within the caller's deadline; each was answered without
// running the script, so nothing is charged twice. Errors name the node
// (*limiter.ShardError); those that are no node's fault (a slot moving
// or the cluster down: TRYAGAIN, CLUSTERDOWN, redirects beyond
// maxRedirects) also wrap limiter.ErrTryAgain. A node that failed
// otherwise than with an error reply (a connection refused or reset, a
// timeout) gets the slot map reloaded.
func (s *Store) followRedirects(ctx context.Context, by time.Time, c scriptCall, r *nodeRoute, cmd *redis.Cmd) *redis.Cmd {
	for attempt, waits := 0, 0; ; {
		err := cmd.Err()
		if err == nil || errors.Is(err, redis.Nil) {
			return cmd
		}
		red := redirectOf(err)
		switch {
		case errors.Is(err, errClosed):
			// The store is closing, or the node's route was swept: no
			// fault of the node's.
			return errCmd(ctx, fmt.Errorf("%w: %w", limiter.ErrTryAgain, err))
		case red.kind == notRedirected:
			var re redis.Error
			if !errors.As(err, &re) && !isDeadline(err) {
				s.nodes.suspect()
			}
			return errCmd(ctx, &limiter.ShardError{Shard: r.node, Err: err})
		case red.kind == clusterDown:
			s.nodes.suspect()
			return errCmd(ctx, &limiter.ShardError{Shard: r.node, Err: fmt.Errorf("%w: %w", limiter.ErrTryAgain, err)})
		case red.kind != tryAgain && attempt == maxRedirects,
			red.kind == tryAgain && waits == maxTryAgain:
			return errCmd(ctx, &limiter.ShardError{Shard: r.node, Err: fmt.Errorf("%w: %d redirects, %d retries: %w", limiter.ErrTryAgain, attempt, waits, err)})
		}
		switch red.kind {
		case moved, ask:
			attempt++
			if red.kind == moved {
				s.nodes.suspect()
			}
			next, err := s.nodes.forAddr(ctx, by, red.addr)
			if err != nil {
				return errCmd(ctx, &limiter.ShardError{Shard: red.addr, Err: err})
			}
			r, c.asking = next, red.kind == ask
		case tryAgain:
			waits++
			if err := pause(ctx, by, tryAgainPause); err != nil {
				return errCmd(ctx, &limiter.ShardError{Shard: r.node, Err: fmt.Errorf("%w: %w", limiter.ErrTryAgain, cmd.Err())})
			}
		}
		cmd = s.send(&r.route, ctx, by, c)
	}
}

// pause waits d, or fails if ctx ends or by passes first.
func pause(ctx context.Context, by time.Time, d time.Duration) error {
	if !by.IsZero() && time.Until(by) < d {
		return context.DeadlineExceeded
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shard implements limiter.Sharded: on a Redis Cluster, the address of
// the master that serves the slot of bucket's key, as the slot map has
// it now ("" if there is none yet); "" on a server without slots.
func (s *Store) Shard(bucket string) string {
	if s.nodes == nil {
		return ""
	}
	return s.nodes.node(s.Key(bucket))
}

// ProbeNode asks the Cluster master at addr, within ctx, what Probe asks
// of each master: to take a token from a probe bucket in a slot it
// serves, so that a master that answers PING but cannot decide (out of
// memory, scripts refused) keeps its breaker open. It fails for a node
// that serves no slot (a failed master back as a replica): its breaker
// stays open until no call asks for it. A failure gets the slot map
// reloaded. On a server without slots it is Probe.
func (s *Store) ProbeNode(ctx context.Context, addr string) error {
	if s.nodes == nil {
		return s.Probe(ctx)
	}
	err := s.probeNode(ctx, addr)
	if err != nil {
		s.nodes.suspect()
	}
	return err
}

func (s *Store) probeNode(ctx context.Context, addr string) error {
	ranges, err := s.clusterSlots(ctx, s.nodes.cluster)
	if err != nil {
		return fmt.Errorf("redis probe of %s: %w: cluster slots: %w", addr, limiter.ErrUnavailable, err)
	}
	for _, r := range ranges {
		if len(r.Nodes) > 0 && r.Nodes[0].Addr == addr {
			return s.probeKey(ctx, fmt.Sprintf("%sprobe{%s}", s.prefix, tagOfSlot(r.Start)))
		}
	}
	return fmt.Errorf("redis probe of %s: %w: it serves no slot", addr, limiter.ErrUnavailable)
}

// clients returns the node clients the cluster client made.
func (n *nodes) clients() []*redis.Client {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*redis.Client, 0, len(n.known))
	for _, c := range n.known {
		out = append(out, c)
	}
	return out
}
