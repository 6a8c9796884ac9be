package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"
)

// migration is a slot move begun by BeginMigration.
type migration struct {
	from, to *clusterNode
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
