package redistest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
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
	// reach only through a faultproxy.Proxy: each is started with
	// cluster-announce-ip 127.0.0.1, cluster-announce-port the proxy's port
	// and cluster-announce-bus-port its real bus port, so CLUSTER SLOTS,
	// CLUSTER NODES, MOVED and ASK name the proxy while the cluster bus
	// between nodes stays direct. Its replicas replicate through the proxy
	// too (they connect to the announced address), so a fault on the proxy
	// reaches them as well.
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
	proxy *faultproxy.Proxy // nil unless a proxied master
	addr  string            // as clients see it
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

// migration is a slot move begun by BeginMigration.
type migration struct {
	from, to *clusterNode
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
	for {
		var state string
		for _, n := range rc.live() {
			v, err := nodeView(ctx, n)
			if err == nil {
				err = rc.shapeError(v)
			}
			if err != nil {
				state = err.Error()
				break
			}
		}
		if state == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: cluster not shaped as asked: %w; %s", ctx.Err(), state)
		case <-time.After(pollInterval):
		}
	}
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
		if n.proxy, err = faultproxy.Start(srv.Addr); err != nil {
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
func (rc *ReplicatedCluster) Proxy(i int) *faultproxy.Proxy {
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

// KillMaster SIGKILLs master i (see MasterAddr; it panics if there is
// none), whatever it is now, and
// returns when it has exited: from then on it answers nothing. Its proxy,
// if any, stays up: connections through it are reset (the node's port
// refuses them). Just before, it records the master's slots and replicas
// for WaitPromotion.
func (rc *ReplicatedCluster) KillMaster(i int) (killedAt time.Time) {
	n := rc.master(i)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if view, err := rc.view(ctx, n.id); err == nil {
		s := shard{id: n.id, replicas: make(map[string]bool)}
		for _, l := range view.lines {
			if l.id == n.id {
				s.slots = l.slots
			}
			if l.masterID == n.id {
				s.replicas[l.id] = true
			}
		}
		rc.mu.Lock()
		rc.killed[n.addr] = s
		rc.mu.Unlock()
	}
	n.srv.Stop()
	killedAt = time.Now()
	rc.mu.Lock()
	n.dead = true
	rc.mu.Unlock()
	return killedAt
}

// WaitPromotion waits until a former replica of the master at
// oldMasterAddr (as clients see it) is a master serving every slot the
// old master served, as a surviving node's CLUSTER NODES says, polled
// every 10 ms: a master other than the old one if one is live. It returns
// the new master's address (as clients see it) and the time of the first
// poll that saw it, which is a little after the promotion. A master killed
// by KillMaster is judged by its slots and replicas just before the kill;
// otherwise by those now.
func (rc *ReplicatedCluster) WaitPromotion(ctx context.Context, oldMasterAddr string) (newMasterAddr string, promotedAt time.Time, err error) {
	rc.mu.Lock()
	old, ok := rc.killed[oldMasterAddr]
	rc.mu.Unlock()
	if !ok {
		view, err := rc.view(ctx, "")
		if err != nil {
			return "", time.Time{}, err
		}
		for _, l := range view.lines {
			if l.addr == oldMasterAddr {
				old = shard{id: l.id, slots: l.slots, replicas: make(map[string]bool)}
			}
		}
		for _, l := range view.lines {
			if old.id != "" && l.masterID == old.id {
				old.replicas[l.id] = true
			}
		}
	}
	if len(old.replicas) == 0 {
		return "", time.Time{}, fmt.Errorf("redistest: WaitPromotion(%s): no replica of it known", oldMasterAddr)
	}
	var state string
	for {
		view, err := rc.view(ctx, old.id)
		if err == nil {
			for _, l := range view.lines {
				if old.replicas[l.id] && l.isMaster() && !l.failed() && covers(l.slots, old.slots) {
					return l.addr, time.Now(), nil
				}
			}
			state = view.from + " says:\n" + view.text
		} else {
			state = err.Error()
		}
		select {
		case <-ctx.Done():
			return "", time.Time{}, fmt.Errorf("redistest: no replica of %s promoted: %w; %s", oldMasterAddr, ctx.Err(), state)
		case <-time.After(pollInterval):
		}
	}
}

// WaitStateOK waits until every live node reports cluster_state:ok with
// all 16384 slots served by masters it does not deem failing
// (cluster_slots_ok), knows every node started (the killed ones too), and,
// if it is a replica, has its link to its master up.
func (rc *ReplicatedCluster) WaitStateOK(ctx context.Context) error {
	rc.mu.Lock()
	total := len(rc.nodes)
	rc.mu.Unlock()
	for _, n := range rc.live() {
		var state string
		for {
			info, err := n.admin.ClusterInfo(ctx).Result()
			if err == nil {
				fields := infoFields(info)
				state = fmt.Sprintf("cluster_state:%s cluster_slots_ok:%s cluster_known_nodes:%s (want %d)",
					fields["cluster_state"], fields["cluster_slots_ok"], fields["cluster_known_nodes"], total)
				if fields["cluster_state"] == "ok" && fields["cluster_slots_ok"] == strconv.Itoa(clusterSlots) &&
					fields["cluster_known_nodes"] == strconv.Itoa(total) {
					repl, err := n.admin.Info(ctx, "replication").Result()
					fields = infoFields(repl)
					if err == nil && (fields["role"] == "master" || fields["master_link_status"] == "up") {
						break
					}
					state += fmt.Sprintf(", role:%s master_link_status:%s %v", fields["role"], fields["master_link_status"], err)
				}
			} else {
				state = err.Error()
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("redistest: cluster node %s (%s) not ok: %w; %s", n.addr, n.srv.Addr, ctx.Err(), state)
			case <-time.After(pollInterval):
			}
		}
	}
	return nil
}

// BeginMigration begins moving slot to the master to, as the cluster
// spec's live resharding does
// (https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/,
// "Live resharding"): CLUSTER SETSLOT slot IMPORTING <source ID> on the
// target first, then CLUSTER SETSLOT slot MIGRATING <target ID> on the
// source (the slot's owner now). From then on the source answers for the
// keys it still has and sends the others to the target with ASK; the
// target answers a command about the slot only after ASKING.
func (rc *ReplicatedCluster) BeginMigration(ctx context.Context, slot int, to Node) error {
	if slot < 0 || slot >= clusterSlots {
		return fmt.Errorf("redistest: BeginMigration: slot %d out of 0 … %d", slot, clusterSlots-1)
	}
	view, err := rc.view(ctx, "")
	if err != nil {
		return err
	}
	owner := ownerOf(view, slot)
	if owner == "" {
		return fmt.Errorf("redistest: BeginMigration: slot %d has no owner:\n%s", slot, view.text)
	}
	if owner == to.ID {
		return fmt.Errorf("redistest: BeginMigration: slot %d is on %s already", slot, to.Addr)
	}
	src, dst := rc.byID(owner), rc.byID(to.ID)
	if src == nil || dst == nil {
		return fmt.Errorf("redistest: BeginMigration: slot %d: source %s or target %s is not a live node", slot, owner, to.ID)
	}
	if err := dst.admin.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id).Err(); err != nil {
		return fmt.Errorf("redistest: CLUSTER SETSLOT %d IMPORTING on %s: %w", slot, dst.addr, err)
	}
	if err := src.admin.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id).Err(); err != nil {
		return fmt.Errorf("redistest: CLUSTER SETSLOT %d MIGRATING on %s: %w", slot, src.addr, err)
	}
	rc.mu.Lock()
	rc.migrations[slot] = migration{from: src, to: dst}
	rc.mu.Unlock()
	return nil
}

// MigrateKeys moves every key of slot from the source to the target of
// the migration BeginMigration began, per the spec's "Live resharding":
// CLUSTER GETKEYSINSLOT slot 100 on the source, then MIGRATE <target>
// "" 0 5000 KEYS … of those keys, until the source has none left. The
// source dials the target at its real address (a proxy in front of the
// target is not in the way).
func (rc *ReplicatedCluster) MigrateKeys(ctx context.Context, slot int) error {
	rc.mu.Lock()
	m, ok := rc.migrations[slot]
	rc.mu.Unlock()
	if !ok {
		return fmt.Errorf("redistest: MigrateKeys: no migration of slot %d begun", slot)
	}
	host, port, err := net.SplitHostPort(m.to.srv.Addr)
	if err != nil {
		return fmt.Errorf("redistest: MigrateKeys: %w", err)
	}
	// Each round moves at least one key or fails, so the loop ends.
	for {
		keys, err := m.from.admin.ClusterGetKeysInSlot(ctx, slot, migrateBatch).Result()
		if err != nil {
			return fmt.Errorf("redistest: CLUSTER GETKEYSINSLOT %d on %s: %w", slot, m.from.addr, err)
		}
		if len(keys) == 0 {
			return nil
		}
		args := []any{"MIGRATE", host, port, "", 0, migrateTimeout, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := m.from.admin.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("redistest: MIGRATE %d keys of slot %d from %s to %s: %w", len(keys), slot, m.from.addr, m.to.addr, err)
		}
	}
}

// FinishMigration ends the migration of slot to the master to, per the
// spec's "Live resharding": CLUSTER SETSLOT slot NODE <target ID> on the
// target first (it stops importing and takes the slot under a new config
// epoch), then on the source (which refuses while it still has keys of
// the slot: call MigrateKeys first), then on every other live master, so
// that none waits for the news by gossip. It returns once every live
// node's CLUSTER NODES gives the slot to the target.
func (rc *ReplicatedCluster) FinishMigration(ctx context.Context, slot int, to Node) error {
	rc.mu.Lock()
	m, ok := rc.migrations[slot]
	rc.mu.Unlock()
	if !ok || m.to.id != to.ID {
		return fmt.Errorf("redistest: FinishMigration: no migration of slot %d to %s begun", slot, to.Addr)
	}
	view, err := rc.view(ctx, "")
	if err != nil {
		return err
	}
	order := []*clusterNode{m.to, m.from}
	for _, l := range view.lines {
		if n := rc.byID(l.id); n != nil && l.isMaster() && !slices.Contains(order, n) {
			order = append(order, n)
		}
	}
	for _, n := range order {
		if err := n.admin.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", to.ID).Err(); err != nil {
			return fmt.Errorf("redistest: CLUSTER SETSLOT %d NODE %s on %s: %w", slot, to.ID, n.addr, err)
		}
	}
	rc.mu.Lock()
	delete(rc.migrations, slot)
	rc.mu.Unlock()
	return rc.waitAgree(ctx, func(v clusterView) error {
		if owner := ownerOf(v, slot); owner != to.ID {
			return fmt.Errorf("slot %d is on %q, want %s", slot, owner, to.ID)
		}
		return nil
	})
}

// AddMaster starts a node with the cluster's options (without a proxy),
// adds it as a master without slots (redis-cli --cluster add-node new
// existing), and waits until every live node knows it and reports
// cluster_state:ok (see WaitStateOK). That takes about 2 s: a master
// reports ok no sooner than 2 s after it started (Redis's
// CLUSTER_WRITABLE_DELAY). It becomes the next master index (see
// MasterAddr).
func (rc *ReplicatedCluster) AddMaster(ctx context.Context) (Node, error) {
	n, err := rc.startNode(ctx, false)
	if err != nil {
		return Node{}, err
	}
	existing := rc.entry()
	if existing == nil {
		n.close()
		return Node{}, errors.New("redistest: AddMaster: no live master to join")
	}
	rc.mu.Lock()
	rc.nodes = append(rc.nodes, n)
	rc.mu.Unlock()
	err = rc.redisCLI(ctx, "--cluster", "add-node", n.addr, existing.addr)
	if err == nil {
		err = rc.WaitStateOK(ctx)
	}
	rc.mu.Lock()
	if err != nil {
		rc.nodes = slices.DeleteFunc(rc.nodes, func(o *clusterNode) bool { return o == n })
	} else {
		rc.masters = append(rc.masters, n)
	}
	rc.mu.Unlock()
	if err != nil {
		n.close()
		return Node{}, fmt.Errorf("redistest: AddMaster %s: %w", n.addr, err)
	}
	return Node{Addr: n.addr, ID: n.id}, nil
}

// Rebalance shares the slots evenly among the masters, empty ones
// included (redis-cli --cluster rebalance <a live master>
// --cluster-use-empty-masters), moving keys with them, then waits until
// every live node's CLUSTER NODES gives the same owner to every slot. It
// takes a few seconds and gives up after a minute whatever ctx says.
func (rc *ReplicatedCluster) Rebalance(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, rebalanceTimeout)
	defer cancel()
	existing := rc.entry()
	if existing == nil {
		return errors.New("redistest: Rebalance: no live master")
	}
	if err := rc.redisCLI(ctx, "--cluster", "rebalance", existing.addr, "--cluster-use-empty-masters", "--cluster-yes"); err != nil {
		return err
	}
	return rc.waitAgree(ctx, nil)
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

// clusterView is one node's CLUSTER NODES.
type clusterView struct {
	from  string // the node's address as clients see it
	text  string
	lines []nodeLine
}

// nodeLine is one line of CLUSTER NODES.
type nodeLine struct {
	id       string
	addr     string // ip:port as announced
	flags    []string
	masterID string // "" for a master
	slots    [][2]int
}

func (l nodeLine) isMaster() bool { return slices.Contains(l.flags, "master") }

// failed reports a node flagged as failed, or not (yet) usable.
func (l nodeLine) failed() bool {
	return slices.ContainsFunc(l.flags, func(f string) bool {
		return f == "fail" || f == "noaddr" || f == "handshake"
	})
}

// view returns the CLUSTER NODES of the first live node (masters first)
// that answers, other than the node whose ID is not.
func (rc *ReplicatedCluster) view(ctx context.Context, not string) (clusterView, error) {
	live := rc.live()
	slices.SortStableFunc(live, func(a, b *clusterNode) int { // masters first
		return cmp.Compare(rc.masterIndex(a), rc.masterIndex(b))
	})
	var errs []error
	for _, n := range live {
		if n.id == not {
			continue
		}
		v, err := nodeView(ctx, n)
		if err == nil {
			return v, nil
		}
		errs = append(errs, err)
	}
	return clusterView{}, fmt.Errorf("redistest: no cluster node answered CLUSTER NODES: %w", errors.Join(errs...))
}

// masterIndex is n's index as a master, or a large number for a replica.
func (rc *ReplicatedCluster) masterIndex(n *clusterNode) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if i := slices.Index(rc.masters, n); i >= 0 {
		return i
	}
	return len(rc.masters)
}

// nodeView reads and parses n's CLUSTER NODES.
func nodeView(ctx context.Context, n *clusterNode) (clusterView, error) {
	text, err := n.admin.ClusterNodes(ctx).Result()
	if err != nil {
		return clusterView{}, fmt.Errorf("CLUSTER NODES on %s: %w", n.addr, err)
	}
	lines, err := parseClusterNodes(text)
	if err != nil {
		return clusterView{}, fmt.Errorf("CLUSTER NODES on %s: %w", n.addr, err)
	}
	return clusterView{from: n.addr, text: text, lines: lines}, nil
}

// parseClusterNodes parses CLUSTER NODES: per line, <id>
// <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv>
// <config-epoch> <link-state> <slot>…, where a slot is "n", "first-last", or (on the node itself) a
// migration in brackets, which is skipped.
func parseClusterNodes(text string) ([]nodeLine, error) {
	var lines []nodeLine
	for s := range strings.Lines(text) {
		f := strings.Fields(s)
		if len(f) == 0 {
			continue
		}
		if len(f) < 8 {
			return nil, fmt.Errorf("line %q: want at least 8 fields", s)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		l := nodeLine{id: f[0], addr: addr, flags: strings.Split(f[2], ",")}
		if f[3] != "-" {
			l.masterID = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue
			}
			first, last, isRange := strings.Cut(r, "-")
			if !isRange {
				last = first
			}
			a, err1 := strconv.Atoi(first)
			b, err2 := strconv.Atoi(last)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("line %q: slot range %q", s, r)
			}
			l.slots = append(l.slots, [2]int{a, b})
		}
		lines = append(lines, l)
	}
	return lines, nil
}

// mastersOf returns the masters v does not flag as failed, by first slot
// (those without slots last, by address).
func mastersOf(v clusterView) []Node {
	var ms []Node
	for _, l := range v.lines {
		if l.isMaster() && !l.failed() {
			ms = append(ms, Node{Addr: l.addr, ID: l.id, Slots: l.slots})
		}
	}
	slices.SortFunc(ms, func(a, b Node) int {
		switch {
		case len(a.Slots) == 0 && len(b.Slots) == 0:
			return strings.Compare(a.Addr, b.Addr)
		case len(a.Slots) == 0:
			return 1
		case len(b.Slots) == 0:
			return -1
		}
		return cmp.Compare(a.Slots[0][0], b.Slots[0][0])
	})
	return ms
}

// replicasOf returns the replicas of the master with that ID that v does
// not flag as failed, by address.
func replicasOf(v clusterView, masterID string) []Node {
	var rs []Node
	for _, l := range v.lines {
		if l.masterID == masterID && !l.isMaster() && !l.failed() {
			rs = append(rs, Node{Addr: l.addr, ID: l.id})
		}
	}
	slices.SortFunc(rs, func(a, b Node) int { return strings.Compare(a.Addr, b.Addr) })
	return rs
}

// ownerOf returns the ID of the node v gives slot to, or "".
func ownerOf(v clusterView, slot int) string {
	for _, l := range v.lines {
		for _, r := range l.slots {
			if r[0] <= slot && slot <= r[1] {
				return l.id
			}
		}
	}
	return ""
}

// covers reports whether the ranges have cover every slot of want.
func covers(have, want [][2]int) bool {
	for _, w := range want {
		for s := w[0]; s <= w[1]; s++ {
			if !slices.ContainsFunc(have, func(r [2]int) bool { return r[0] <= s && s <= r[1] }) {
				return false
			}
		}
	}
	return true
}

// slotMap is a canonical form of who serves which slot in v: each owner's
// ID and ranges, by ID. Two nodes agree when their slot maps are equal.
func slotMap(v clusterView) string {
	var owners []string
	for _, l := range v.lines {
		if len(l.slots) > 0 {
			owners = append(owners, fmt.Sprintf("%s:%v", l.id, l.slots))
		}
	}
	slices.Sort(owners)
	return strings.Join(owners, " ")
}

// waitAgree waits until every live node's CLUSTER NODES gives the same
// owner to every slot and check (if not nil) accepts it.
func (rc *ReplicatedCluster) waitAgree(ctx context.Context, check func(clusterView) error) error {
	for {
		state := rc.disagreement(ctx, check)
		if state == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: cluster nodes do not agree on the slots: %w; %s", ctx.Err(), state)
		case <-time.After(pollInterval):
		}
	}
}

// disagreement says how the live nodes' slot maps differ or check refuses
// one, or returns "" if they agree.
func (rc *ReplicatedCluster) disagreement(ctx context.Context, check func(clusterView) error) string {
	var first string
	for _, n := range rc.live() {
		v, err := nodeView(ctx, n)
		if err == nil && check != nil {
			err = check(v)
		}
		if err != nil {
			return fmt.Sprintf("%s: %v", n.addr, err)
		}
		switch m := slotMap(v); {
		case first == "":
			first = m
		case m != first:
			return fmt.Sprintf("%s says %s; the first node says %s", n.addr, m, first)
		}
	}
	return ""
}

// infoFields parses the "key:value" lines of INFO or CLUSTER INFO.
func infoFields(info string) map[string]string {
	fields := make(map[string]string)
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields
}
