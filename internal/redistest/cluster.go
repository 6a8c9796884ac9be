package redistest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/faultproxy"
	"github.com/ratelimitd/ratelimitd/internal/redisproc"
)

// DefaultNodeTimeout is the default of ClusterOptions.NodeTimeout: short,
// so that a failover takes two or three seconds rather than twenty.
const DefaultNodeTimeout = time.Second

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// Bounds of the cluster kit's own waits.
const (
	// clusterStartTimeout bounds the start of a replicated cluster: the
	// servers, redis-cli --cluster create (which polls once a second) and
	// the replicas' first sync.
	clusterStartTimeout = 30 * time.Second
	// rebalanceTimeout bounds Rebalance whatever its context says.
	rebalanceTimeout = 60 * time.Second
	// migrateBatch is how many keys MigrateKeys moves per MIGRATE.
	migrateBatch = 100
	// migrateTimeout is MIGRATE's own timeout, in milliseconds.
	migrateTimeout = 5000
	// pollInterval is how often the kit polls the nodes while it waits.
	pollInterval = 10 * time.Millisecond
)

// ClusterOptions says what replicated cluster to start. The zero value of
// each field but Masters means its default.
type ClusterOptions struct {
	// Masters is the number of masters at the start, at least 3 (as
	// redis-cli --cluster create requires). Master i is the i-th started;
	// redis-cli gives it the i-th share of the slots.
	Masters int
	// ReplicasPerMaster is the number of replicas of each master (0 or
	// more).
	ReplicasPerMaster int
	// NodeTimeout is cluster-node-timeout: how long a node may fail to
	// answer before it is deemed failing; a failover begins about then.
	// Whole milliseconds. Default DefaultNodeTimeout.
	NodeTimeout time.Duration
	// RequireFullCoverage is cluster-require-full-coverage. The default,
	// false, is "no" (unlike Redis's own default): the nodes keep serving
	// the slots they have while some are uncovered.
	RequireFullCoverage bool
	// ProxiedMasters lists masters (by index, 0 … Masters-1) that clients
	// reach only through a faultproxy.Remote: each is started with
	// cluster-announce-ip 127.0.0.1, cluster-announce-port the proxy's port
	// and cluster-announce-bus-port its real bus port, so CLUSTER SLOTS,
	// CLUSTER NODES, MOVED and ASK name the proxy while the cluster bus
	// between nodes stays direct. Its replicas replicate through the proxy
	// too (they connect to the announced address), so a fault on the proxy
	// reaches them as well. The proxy runs in a process of its own: in the
	// test's process, busy with a race-enabled client driving load, it
	// forwarded bytes tens of milliseconds late on a loaded 2-core machine,
	// which the system under test took for a slow Redis.
	ProxiedMasters []int
}

// validate returns every problem of o, joined.
func (o ClusterOptions) validate() error {
	var errs []error
	if o.Masters < 3 {
		errs = append(errs, fmt.Errorf("Masters = %d: redis-cli --cluster create needs at least 3", o.Masters))
	}
	if o.ReplicasPerMaster < 0 {
		errs = append(errs, fmt.Errorf("ReplicasPerMaster = %d: want 0 or more", o.ReplicasPerMaster))
	}
	if o.NodeTimeout < 0 || o.NodeTimeout%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("NodeTimeout = %v: want whole milliseconds, 0 for the default", o.NodeTimeout))
	}
	seen := make(map[int]bool)
	for _, i := range o.ProxiedMasters {
		switch {
		case i < 0 || i >= o.Masters:
			errs = append(errs, fmt.Errorf("ProxiedMasters: %d is not a master index (0 … %d)", i, o.Masters-1))
		case seen[i]:
			errs = append(errs, fmt.Errorf("ProxiedMasters: %d twice", i))
		}
		seen[i] = true
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redistest: ClusterOptions: %w", err)
	}
	return nil
}

// Node is a cluster node as the cluster describes it.
type Node struct {
	// Addr is the node's address as clients see it (CLUSTER SLOTS, MOVED):
	// its proxy's for a proxied master.
	Addr string
	// ID is the node's 40-character cluster ID.
	ID string
	// Slots are the slot ranges the node serves, first and last
	// inclusive, in ascending order; nil for a replica.
	Slots [][2]int
}

// ReplicatedCluster is a Redis Cluster of masters with replicas, all on
// 127.0.0.1, some masters optionally behind a fault proxy, with the
// operations fault tests need: kill a master and wait for its replica's
// promotion, move a slot by hand, add a master and rebalance. The kit
// talks to each node at its real address, never through a proxy, so a
// fault on a proxy does not stop it (but redis-cli, in AddMaster and
// Rebalance, goes where the cluster says: through the proxies).
//
// Its methods are safe for concurrent use. Methods without an error
// result fail the test (Errorf) when no node answers.
type ReplicatedCluster struct {
	t    testing.TB
	opts ClusterOptions
	cli  string // redis-cli

	mu         sync.Mutex
	nodes      []*clusterNode    // every node started, in order
	masters    []*clusterNode    // master i, started as a master
	seeds      []string          // the masters' client addresses at the start
	killed     map[string]shard  // by client address, as KillMaster saw it
	migrations map[int]migration // by slot

	clients   clients
	closeOnce sync.Once
	closeErr  error
}

// clusterNode is one redis-server of the cluster.
type clusterNode struct {
	srv   *Server
	proxy *faultproxy.Remote // nil unless a proxied master
	addr  string             // as clients see it
	id    string
	admin *redis.Client // to srv.Addr, never through the proxy
	dead  bool          // killed; guarded by ReplicatedCluster.mu
}

// shard is a master and its replicas as seen just before it was killed.
type shard struct {
	id       string
	slots    [][2]int
	replicas map[string]bool // by ID
}

// StartReplicatedCluster starts opts.Masters masters with
// opts.ReplicasPerMaster replicas each (redis-cli --cluster create
// --cluster-replicas), then waits until every node reports cluster_state:ok
// with all 16384 slots served and knows every other node, and every
// replica's link to its master is up, and every node's CLUSTER NODES
// shows the first opts.Masters nodes as the masters, in slot order, with
// opts.ReplicasPerMaster replicas each. It registers the shutdown of
// everything with t.Cleanup. It takes about 2 s: a master reports ok no
// sooner than 2 s after it started (Redis's CLUSTER_WRITABLE_DELAY).
func StartReplicatedCluster(t testing.TB, opts ClusterOptions) *ReplicatedCluster {
	t.Helper()
	rc, err := newReplicatedCluster(t, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	return rc
}

func newReplicatedCluster(t testing.TB, opts ClusterOptions) (*ReplicatedCluster, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.NodeTimeout = cmp.Or(opts.NodeTimeout, DefaultNodeTimeout)
	cli, err := redisproc.LookPath("redis-cli")
	if err != nil {
		return nil, err
	}
	rc := &ReplicatedCluster{t: t, opts: opts, cli: cli, killed: make(map[string]shard), migrations: make(map[int]migration)}
	if err := rc.create(); err != nil {
		rc.Close()
		return nil, err
	}
	return rc, nil
}

// create starts the nodes, makes them a cluster and checks its shape.
func (rc *ReplicatedCluster) create() error {
	if len(rc.opts.ProxiedMasters) > 0 {
		// The proxy process is built before the clock starts: a cold
		// build takes a good part of clusterStartTimeout.
		if err := faultproxy.Prepare(); err != nil {
			return fmt.Errorf("redistest: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterStartTimeout)
	defer cancel()
	total := rc.opts.Masters * (1 + rc.opts.ReplicasPerMaster)
	for i := range total {
		proxied := i < rc.opts.Masters && slices.Contains(rc.opts.ProxiedMasters, i)
		n, err := rc.startNode(ctx, proxied)
		if err != nil {
			return err
		}
		rc.nodes = append(rc.nodes, n)
		if i < rc.opts.Masters {
			rc.masters = append(rc.masters, n)
			rc.seeds = append(rc.seeds, n.addr)
		}
	}
	// redis-cli must be given the addresses the nodes announce: it reads
	// CLUSTER NODES and matches. With one host, the first Masters given
	// become the masters, sharing the slots in that order; which master
	// each replica gets is shuffled (its anti-affinity pass), so that is
	// read back below.
	args := []string{"--cluster", "create"}
	for _, n := range rc.nodes {
		args = append(args, n.addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(rc.opts.ReplicasPerMaster), "--cluster-yes")
	if err := rc.redisCLI(ctx, args...); err != nil {
		return err
	}
	if err := rc.WaitStateOK(ctx); err != nil {
		return err
	}
	return rc.waitShape(ctx)
}

// waitShape waits until every live node's CLUSTER NODES shows master i
// serving the i-th share of the slots with its replicas: a node learns
// that another turned replica (CLUSTER REPLICATE, sent by redis-cli) only
// from that node's next ping, some time after the replica itself says so.
func (rc *ReplicatedCluster) waitShape(ctx context.Context) error {
	return rc.waitAgree(ctx, rc.shapeError)
}

// shapeError says how v differs from the shape asked for, or returns nil.
func (rc *ReplicatedCluster) shapeError(v clusterView) error {
	masters := mastersOf(v)
	if len(masters) != len(rc.masters) {
		return fmt.Errorf("%s sees %d masters, want %d:\n%s", v.from, len(masters), len(rc.masters), v.text)
	}
	for i, m := range masters {
		if m.ID != rc.masters[i].id || m.Addr != rc.masters[i].addr {
			return fmt.Errorf("%s sees master %d by slot order at %s %s, want %s %s:\n%s",
				v.from, i, m.Addr, m.ID, rc.masters[i].addr, rc.masters[i].id, v.text)
		}
		if got := len(replicasOf(v, m.ID)); got != rc.opts.ReplicasPerMaster {
			return fmt.Errorf("%s sees %d replicas of %s, want %d:\n%s", v.from, got, m.Addr, rc.opts.ReplicasPerMaster, v.text)
		}
	}
	return nil
}

// startNode starts a cluster-enabled redis-server, behind a proxy if
// proxied.
func (rc *ReplicatedCluster) startNode(ctx context.Context, proxied bool) (*clusterNode, error) {
	dir, err := nodeDir()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(rc.opts.NodeTimeout.Milliseconds(), 10),
		"--cluster-port", "{bus}",
		"--cluster-require-full-coverage", yesNo(rc.opts.RequireFullCoverage),
		// A replica is in sync in milliseconds rather than after the
		// default 5 s wait for more replicas.
		"--repl-diskless-sync", "yes",
		"--repl-diskless-sync-delay", "0",
	}
	if proxied {
		args = append(args, "--cluster-announce-ip", "127.0.0.1", "--cluster-announce-bus-port", "{bus}")
	}
	srv, err := startServer(dir, "", args)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	n := &clusterNode{srv: srv, addr: srv.Addr, admin: redis.NewClient(&redis.Options{
		Addr: srv.Addr, MaxRetries: -1, DialTimeout: time.Second, ContextTimeoutEnabled: true,
	})}
	if proxied {
		// The proxy's port is the node's announced port, and the node's
		// port is chosen when it starts: so the node starts first, then
		// the proxy in front of it, then the node is told the port to
		// announce (cluster-announce-port may be set at run time). A
		// restart of the node would forget it.
		if n.proxy, err = faultproxy.StartRemote(srv.Addr); err != nil {
			n.close()
			return nil, fmt.Errorf("redistest: proxy for cluster node %s: %w", srv.Addr, err)
		}
		n.addr = n.proxy.Addr()
		if err := n.admin.ConfigSet(ctx, "cluster-announce-port", strconv.Itoa(n.proxy.Port())).Err(); err != nil {
			n.close()
			return nil, fmt.Errorf("redistest: cluster node %s: CONFIG SET cluster-announce-port: %w", srv.Addr, err)
		}
	}
	if n.id, err = n.admin.ClusterMyID(ctx).Result(); err != nil {
		n.close()
		return nil, fmt.Errorf("redistest: cluster node %s: CLUSTER MYID: %w", srv.Addr, err)
	}
	return n, nil
}

// nodeDir makes a cluster node's directory: in /dev/shm if it can, else
// in the temporary directory. A node writes and fsyncs nodes.conf on every
// slot change, and a rebalance changes thousands: on a disk that alone
// takes seconds more (measured 9 s against 5 s for 4096 slots on ext4),
// in memory it costs nothing.
func nodeDir() (string, error) {
	const pattern = "redistest-rcluster-"
	if dir, err := os.MkdirTemp("/dev/shm", pattern); err == nil {
		return dir, nil
	}
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", fmt.Errorf("redistest: %w", err)
	}
	return dir, nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (n *clusterNode) close() error {
	var errs []error
	if err := n.admin.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
		errs = append(errs, err)
	}
	if n.proxy != nil {
		errs = append(errs, n.proxy.Close())
	}
	return errors.Join(append(errs, n.srv.Close())...)
}

// redisCLI runs redis-cli with args until it exits or ctx is done.
func (rc *ReplicatedCluster) redisCLI(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, rc.cli, args...)
	cmd.WaitDelay = time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("redistest: redis-cli %s: %w: %s", strings.Join(args[:2], " "), err, lastLines(string(out)))
	}
	return nil
}

// Client returns a new cluster client seeded with the masters' addresses
// at the start (as clients see them), closed when the cluster is.
func (rc *ReplicatedCluster) Client() *redis.ClusterClient {
	rc.mu.Lock()
	seeds := slices.Clone(rc.seeds)
	rc.mu.Unlock()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds})
	rc.clients.add(cc)
	return cc
}

// Proxy returns the proxy in front of master i (see MasterAddr), or nil
// if it has none. It panics if there is no master i.
func (rc *ReplicatedCluster) Proxy(i int) *faultproxy.Remote {
	return rc.master(i).proxy
}

// MasterAddr returns the address, as clients see it, of master i: the
// i-th node started as a master (0 … Masters-1 at the start, then in the
// order AddMaster added them), whatever it is now. At the start,
// Masters()[i].Addr is MasterAddr(i). It panics if there is no master i.
func (rc *ReplicatedCluster) MasterAddr(i int) string {
	return rc.master(i).addr
}

func (rc *ReplicatedCluster) master(i int) *clusterNode {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if i < 0 || i >= len(rc.masters) {
		panic(fmt.Sprintf("redistest: master %d of a cluster of %d masters", i, len(rc.masters)))
	}
	return rc.masters[i]
}

// Masters returns the masters that the first live node answering CLUSTER
// NODES does not flag as failed, in the order of the first slot they
// serve (masters without slots last, by address).
func (rc *ReplicatedCluster) Masters() []Node {
	view, err := rc.view(context.Background(), "")
	if err != nil {
		rc.t.Errorf("Masters: %v", err)
		return nil
	}
	return mastersOf(view)
}

// ReplicasOf returns the replicas of the master at masterAddr (as clients
// see it) that the first live node answering CLUSTER NODES does not flag
// as failed, by address.
func (rc *ReplicatedCluster) ReplicasOf(masterAddr string) []Node {
	view, err := rc.view(context.Background(), "")
	if err != nil {
		rc.t.Errorf("ReplicasOf(%s): %v", masterAddr, err)
		return nil
	}
	for _, l := range view.lines {
		if l.addr == masterAddr {
			return replicasOf(view, l.id)
		}
	}
	return nil
}

// entry returns a live master that redis-cli can start from, one without
// a proxy if there is one, or nil.
func (rc *ReplicatedCluster) entry() *clusterNode {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var found *clusterNode
	for _, n := range rc.masters {
		if !n.dead && (found == nil || found.proxy != nil && n.proxy == nil) {
			found = n
		}
	}
	return found
}

// Close stops every node and proxy and closes the clients handed out.
// Close after the first returns the first's result.
func (rc *ReplicatedCluster) Close() error {
	rc.closeOnce.Do(func() {
		errs := []error{rc.clients.take().close()}
		rc.mu.Lock()
		nodes := slices.Clone(rc.nodes)
		rc.mu.Unlock()
		for _, n := range nodes {
			errs = append(errs, n.close())
		}
		rc.closeErr = errors.Join(errs...)
	})
	return rc.closeErr
}

// live returns the nodes not killed, in start order.
func (rc *ReplicatedCluster) live() []*clusterNode {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var live []*clusterNode
	for _, n := range rc.nodes {
		if !n.dead {
			live = append(live, n)
		}
	}
	return live
}

// byID returns the live node with that ID, or nil.
func (rc *ReplicatedCluster) byID(id string) *clusterNode {
	for _, n := range rc.live() {
		if n.id == id {
			return n
		}
	}
	return nil
}
