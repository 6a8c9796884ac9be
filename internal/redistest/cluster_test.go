package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// keyOn returns a key (prefix:n) whose slot master m serves.
func keyOn(t *testing.T, cc *redis.ClusterClient, m Node, prefix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 1000 {
		key := fmt.Sprintf("%s:%d", prefix, i)
		slot, err := cc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
		}
		if covers(m.Slots, [][2]int{{int(slot), int(slot)}}) {
			return key
		}
	}
	t.Fatalf("no key %s:0…999 on master %s (slots %v)", prefix, m.Addr, m.Slots)
	return ""
}

// slotCount is how many slots the ranges hold.
func slotCount(ranges [][2]int) int {
	n := 0
	for _, r := range ranges {
		n += r[1] - r[0] + 1
	}
	return n
}

// getEventually GETs key through cc until it succeeds or ctx is done.
// After a failed GET it asks cc to reload the slots: go-redis v9 reloads
// them by itself only on MOVED, ASK or READONLY, or once its state is
// ClusterStateReloadInterval (60 s by default) old, and a dead master
// sends none of these, so without the reload a client keeps sending the
// dead master's slots to it.
func getEventually(ctx context.Context, cc *redis.ClusterClient, key string) (string, error) {
	for {
		v, err := cc.Get(ctx, key).Result()
		if err == nil || errors.Is(err, redis.Nil) || ctx.Err() != nil {
			return v, err
		}
		cc.ReloadState(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestReplicatedCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	rc := StartReplicatedCluster(t, ClusterOptions{Masters: 3, ReplicasPerMaster: 1, ProxiedMasters: []int{1}})
	t.Logf("started in %v", time.Since(start))

	masters := rc.Masters()
	if len(masters) != 3 {
		t.Fatalf("Masters() = %v, want 3", masters)
	}
	if rc.Proxy(0) != nil || rc.Proxy(1) == nil {
		t.Fatalf("Proxy(0) = %v, Proxy(1) = %v; want only master 1 proxied", rc.Proxy(0), rc.Proxy(1))
	}
	if got, want := masters[1].Addr, rc.Proxy(1).Addr(); got != want {
		t.Errorf("master 1 announces %s, want its proxy %s", got, want)
	}
	total := 0
	seen := make(map[string]bool)
	for i, m := range masters {
		if m.Addr != rc.MasterAddr(i) {
			t.Errorf("Masters()[%d].Addr = %s, want MasterAddr(%d) = %s", i, m.Addr, i, rc.MasterAddr(i))
		}
		total += slotCount(m.Slots)
		seen[m.Addr] = true
	}
	if total != clusterSlots {
		t.Errorf("masters serve %d slots, want %d", total, clusterSlots)
	}
	for _, m := range masters {
		rs := rc.ReplicasOf(m.Addr)
		if len(rs) != 1 || seen[rs[0].Addr] || rs[0].ID == "" {
			t.Errorf("ReplicasOf(%s) = %v, want one replica that is no master and not another's", m.Addr, rs)
			continue
		}
		seen[rs[0].Addr] = true
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc := rc.Client()
	keys := make([]string, len(masters))
	for i, m := range masters {
		keys[i] = keyOn(t, cc, m, "k")
		if err := cc.Set(ctx, keys[i], m.Addr, 0).Err(); err != nil {
			t.Fatalf("SET %s (on master %s): %v", keys[i], m.Addr, err)
		}
		if got, err := cc.Get(ctx, keys[i]).Result(); err != nil || got != m.Addr {
			t.Fatalf("GET %s (on master %s) = %q, %v", keys[i], m.Addr, got, err)
		}
	}
	// Client connections and master 1's replica reach master 1 through
	// the proxy.
	if n, err := rc.Proxy(1).Conns(); err != nil || n < 2 {
		t.Errorf("Proxy(1).Conns() = %d, %v; want ≥ 2 (the client's and the replica's)", n, err)
	}

	// A blackhole on the proxy stops commands to master 1 only.
	fc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{rc.MasterAddr(0)},
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRedirects: 1})
	defer fc.Close()
	if err := fc.Get(ctx, keys[1]).Err(); err != nil {
		t.Fatalf("GET %s before the blackhole: %v", keys[1], err)
	}
	if err := rc.Proxy(1).Blackhole(); err != nil {
		t.Fatal(err)
	}
	if err := fc.Get(ctx, keys[1]).Err(); err == nil {
		t.Errorf("GET %s on master 1 during its proxy's blackhole succeeded, want a timeout", keys[1])
	}
	if err := fc.Get(ctx, keys[0]).Err(); err != nil {
		t.Errorf("GET %s on master 0 during master 1's blackhole: %v", keys[0], err)
	}
	if err := rc.Proxy(1).Pass(); err != nil {
		t.Fatal(err)
	}
	if got, err := getEventually(ctx, fc, keys[1]); err != nil || got != masters[1].Addr {
		t.Errorf("GET %s after Pass = %q, %v", keys[1], got, err)
	}
}

func TestReplicatedClusterFailover(t *testing.T) {
	t.Parallel()
	rc := StartReplicatedCluster(t, ClusterOptions{Masters: 3, ReplicasPerMaster: 1, ProxiedMasters: []int{1}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cc := rc.Client()
	old := rc.Masters()[1]
	key := keyOn(t, cc, old, "failover")
	// Written, and acknowledged by the replica (WAIT, on the same
	// connection), before the kill: the promoted replica must have it.
	mc, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	conn := mc.Conn()
	defer conn.Close()
	if err := conn.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("SET %s: %v", key, err)
	}
	if n, err := conn.Do(ctx, "WAIT", 1, 2000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 2000 = %d, %v; want the replica to acknowledge", n, err)
	}
	replicas := rc.ReplicasOf(old.Addr)

	killedAt := rc.KillMaster(1)
	waitCtx, cancelWait := context.WithTimeout(ctx, 10*time.Second)
	defer cancelWait()
	addr, promotedAt, err := rc.WaitPromotion(waitCtx, old.Addr)
	if err != nil {
		t.Fatal(err)
	}
	took := promotedAt.Sub(killedAt)
	t.Logf("master %s killed; replica %s promoted %v later", old.Addr, addr, took)
	if len(replicas) != 1 || addr != replicas[0].Addr {
		t.Errorf("WaitPromotion(%s) = %s, want its replica %v", old.Addr, addr, replicas)
	}
	// No failover can begin before the node timeout has passed.
	if took < DefaultNodeTimeout {
		t.Errorf("promotion %v after the kill, want ≥ the node timeout %v", took, DefaultNodeTimeout)
	}
	if err := rc.WaitStateOK(ctx); err != nil {
		t.Fatal(err)
	}
	masters := rc.Masters()
	if !slices.ContainsFunc(masters, func(m Node) bool { return m.Addr == addr && slices.Equal(m.Slots, old.Slots) }) ||
		slices.ContainsFunc(masters, func(m Node) bool { return m.Addr == old.Addr }) {
		t.Errorf("Masters() = %v after the failover, want %s with slots %v and not %s", masters, addr, old.Slots, old.Addr)
	}
	getCtx, cancelGet := context.WithTimeout(ctx, 5*time.Second)
	defer cancelGet()
	if got, err := getEventually(getCtx, cc, key); err != nil || got != "v" {
		t.Errorf("GET %s after the failover = %q, %v; want \"v\"", key, got, err)
	}
}

func TestReplicatedClusterMigration(t *testing.T) {
	t.Parallel()
	rc := StartReplicatedCluster(t, ClusterOptions{Masters: 3, ProxiedMasters: []int{1}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cc := rc.Client()
	masters := rc.Masters()
	from, to := masters[0], masters[1] // to is behind a proxy
	tag := keyOn(t, cc, from, "tag")
	slot64, err := cc.ClusterKeySlot(ctx, "{"+tag+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	slot := int(slot64)
	// More keys than one MIGRATE moves, all in one slot.
	const n = migrateBatch + 50
	for i := range n {
		if err := cc.Set(ctx, fmt.Sprintf("{%s}:%d", tag, i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	key := fmt.Sprintf("{%s}:0", tag)

	if err := rc.BeginMigration(ctx, slot, to); err != nil {
		t.Fatal(err)
	}
	if err := rc.MigrateKeys(ctx, slot); err != nil {
		t.Fatal(err)
	}
	// Between the moves of the keys and of the slot, the source ASKs the
	// client to go to the target.
	if got, err := cc.Get(ctx, key).Result(); err != nil || got != "0" {
		t.Errorf("GET %s with its keys moved, slot not yet = %q, %v", key, got, err)
	}
	if err := rc.FinishMigration(ctx, slot, to); err != nil {
		t.Fatal(err)
	}

	for _, m := range rc.Masters() {
		has := covers(m.Slots, [][2]int{{slot, slot}})
		if has != (m.ID == to.ID) {
			t.Errorf("after the migration, master %s has slot %d: %v; want it on %s only", m.Addr, slot, has, to.Addr)
		}
	}
	for i := range n {
		k := fmt.Sprintf("{%s}:%d", tag, i)
		if got, err := cc.Get(ctx, k).Result(); err != nil || got != fmt.Sprint(i) {
			t.Fatalf("GET %s after the migration = %q, %v; want %d", k, got, err, i)
		}
	}
	if c, err := rc.Proxy(1).Conns(); err != nil || c == 0 {
		t.Errorf("Proxy(1).Conns() = %d, %v; want the client's GETs to go through it", c, err)
	}
}

func TestReplicatedClusterScaleOut(t *testing.T) {
	t.Parallel()
	rc := StartReplicatedCluster(t, ClusterOptions{Masters: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	cc := rc.Client()
	const n = 50
	for i := range n {
		if err := cc.Set(ctx, fmt.Sprintf("scale:%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	added, err := rc.AddMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rc.MasterAddr(3) != added.Addr {
		t.Errorf("MasterAddr(3) = %s, want the added %s", rc.MasterAddr(3), added.Addr)
	}
	t.Logf("AddMaster took %v", time.Since(start))
	start = time.Now()
	if err := rc.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("Rebalance took %v", time.Since(start))

	masters := rc.Masters()
	i := slices.IndexFunc(masters, func(m Node) bool { return m.ID == added.ID })
	if len(masters) != 4 || i < 0 {
		t.Fatalf("Masters() after AddMaster and Rebalance = %v, want 4 with %s", masters, added.Addr)
	}
	// An even share is 4096; redis-cli's threshold leaves it near that.
	if got := slotCount(masters[i].Slots); got < clusterSlots/8 {
		t.Errorf("the added master serves %d slots after Rebalance, want about %d", got, clusterSlots/4)
	}
	for i := range n {
		k := fmt.Sprintf("scale:%d", i)
		if got, err := cc.Get(ctx, k).Result(); err != nil || got != fmt.Sprint(i) {
			t.Fatalf("GET %s after Rebalance = %q, %v; want %d", k, got, err, i)
		}
	}
}

func TestClusterOptionsValidate(t *testing.T) {
	err := ClusterOptions{Masters: 2, ReplicasPerMaster: -1, NodeTimeout: time.Microsecond, ProxiedMasters: []int{1, 1, 5}}.validate()
	for _, want := range []string{"Masters = 2", "ReplicasPerMaster = -1", "NodeTimeout = 1µs", "1 twice", "5 is not a master index"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate() = %v, want it to mention %q", err, want)
		}
	}
	if err := (ClusterOptions{Masters: 3}).validate(); err != nil {
		t.Errorf("validate() of 3 masters = %v, want nil", err)
	}
}
