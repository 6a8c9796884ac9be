package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel is a master watched by one sentinel under MasterName.
type Sentinel struct {
	// MasterName is the name the sentinel monitors the master under.
	MasterName string
	// Master is the monitored redis-server.
	Master *Server
	// Sentinel is the redis-server --sentinel process.
	Sentinel *Server
	// SentinelAddrs are the sentinels' addresses, for
	// redis.FailoverOptions.SentinelAddrs.
	SentinelAddrs []string
}

// StartSentinel starts a master and one sentinel monitoring it as
// masterName (quorum 1), waits until the sentinel reports the master, and
// registers their shutdown with t.Cleanup.
func StartSentinel(t testing.TB, masterName string) *Sentinel {
	t.Helper()
	master := Start(t)
	dir := t.TempDir()
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 5000\n",
		masterName, master.Port, masterName)
	// The sentinel rewrites its config file, so it lives in the sentinel's
	// own writable directory.
	if err := os.WriteFile(filepath.Join(dir, "sentinel.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := startServer(dir, filepath.Join(dir, "sentinel.conf"), []string{"--sentinel"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sn := &Sentinel{MasterName: masterName, Master: master, Sentinel: s, SentinelAddrs: []string{s.Addr}}

	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer sc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		addr, err := sc.GetMasterAddrByName(ctx, masterName).Result()
		if err == nil && len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) == master.Addr {
			return sn
		}
		if ctx.Err() != nil {
			t.Fatalf("redistest: sentinel %s does not report master %s: %v %v", s.Addr, masterName, addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SentinelGroup is a master, one replica of it and three sentinels
// monitoring the master (quorum 2), all on 127.0.0.1: the smallest topology
// in which killing the master makes the sentinels elect a leader and
// promote the replica. Every event the sentinels publish (their pub/sub
// channels: +sdown, +odown, +switch-master, …) is recorded from the start,
// with the time it was received, so that a test can wait for one after the
// fact. Its methods are safe for concurrent use.
type SentinelGroup struct {
	// MasterName is the name the sentinels monitor the master under.
	MasterName string
	// Master is the master at the start; Replica replicates it and is the
	// one a failover promotes.
	Master, Replica *Server
	// Sentinels are the three redis-server --sentinel processes.
	Sentinels []*Server
	// SentinelAddrs are the sentinels' addresses, for
	// redis.FailoverOptions.SentinelAddrs.
	SentinelAddrs []string
	// DownAfter is the sentinels' down-after-milliseconds: how long the
	// master must fail to answer before a sentinel deems it down. No
	// failover can begin sooner after the master stops.
	DownAfter time.Duration

	mu      sync.Mutex
	events  []SentinelEvent
	arrived chan struct{} // closed, and replaced, when an event is recorded
}

// SentinelEvent is one message a sentinel published on its pub/sub
// channels.
type SentinelEvent struct {
	// Name is the channel, e.g. "+switch-master".
	Name string
	// Payload is the message, e.g. "<master name> <old ip> <old port>
	// <new ip> <new port>" for +switch-master.
	Payload string
	// Sentinel is the address of the sentinel that published it.
	Sentinel string
	// At is when the test received it: a moment after the sentinel
	// published it.
	At time.Time
}

// Sentinel group timings: short, so that a failover takes about a second
// or two (the sentinels add their own random delay of up to a second to
// the election).
const (
	groupDownAfter       = 500 * time.Millisecond
	groupFailoverTimeout = 2 * time.Second
)

// StartSentinelGroup starts a master, a replica of it and three sentinels
// monitoring it as masterName with quorum 2, waits until the replica is in
// sync (master_link_status:up) and every sentinel knows the master, the
// replica and the two other sentinels (they find each other through hello
// messages every 2 s, so this takes about that long), and registers the
// shutdown of everything with t.Cleanup.
func StartSentinelGroup(t testing.TB, masterName string) *SentinelGroup {
	t.Helper()
	g, err := startSentinelGroup(t, masterName)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func startSentinelGroup(t testing.TB, masterName string) (*SentinelGroup, error) {
	start := func(conf string, extra ...string) (*Server, error) {
		dir := t.TempDir()
		file := ""
		if conf != "" {
			// A sentinel rewrites its config file, so it lives in the
			// process's own writable directory.
			file = filepath.Join(dir, "redis.conf")
			if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
				return nil, fmt.Errorf("redistest: %w", err)
			}
		}
		s, err := startServer(dir, file, extra)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { s.Close() })
		return s, nil
	}
	// Diskless sync with no delay: the replica is in sync in milliseconds
	// rather than after the default 5 s wait for more replicas.
	master, err := start("", "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
	if err != nil {
		return nil, err
	}
	replica, err := start("", "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	if err != nil {
		return nil, err
	}
	g := &SentinelGroup{MasterName: masterName, Master: master, Replica: replica, DownAfter: groupDownAfter,
		arrived: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := waitReplicaInSync(ctx, replica); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
		"sentinel down-after-milliseconds %[1]s %[3]d\n"+
		"sentinel failover-timeout %[1]s %[4]d\n"+
		"sentinel parallel-syncs %[1]s 1\n",
		masterName, master.Port, groupDownAfter.Milliseconds(), groupFailoverTimeout.Milliseconds())
	for range 3 {
		s, err := start(conf, "--sentinel")
		if err != nil {
			return nil, err
		}
		g.Sentinels = append(g.Sentinels, s)
		g.SentinelAddrs = append(g.SentinelAddrs, s.Addr)
	}
	for _, s := range g.Sentinels {
		if err := g.subscribe(ctx, t, s.Addr); err != nil {
			return nil, err
		}
	}
	for _, s := range g.Sentinels {
		if err := noTilt(ctx, s.Addr); err != nil {
			return nil, err
		}
		if err := g.waitSentinelReady(ctx, s.Addr); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// noTilt keeps the sentinel at addr out of TILT mode: a sentinel whose
// timer ran more than 2 s late (a loaded test machine stalls processes
// that long) stops acting for 30 s, longer than a test waits for a
// failover. SENTINEL DEBUG (Redis 7) raises the trigger to a minute.
func noTilt(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	if err := c.Do(ctx, "SENTINEL", "DEBUG", "tilt-trigger", "60000").Err(); err != nil {
		return fmt.Errorf("redistest: sentinel %s: SENTINEL DEBUG tilt-trigger: %w", addr, err)
	}
	return nil
}

// waitReplicaInSync waits until the replica reports its link to the master
// up.
func waitReplicaInSync(ctx context.Context, replica *Server) error {
	c := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer c.Close()
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("redistest: replica %s not in sync with its master: %v %q", replica.Addr, err, info)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// subscribe records every event the sentinel at addr publishes, from now
// until the test ends.
func (g *SentinelGroup) subscribe(ctx context.Context, t testing.TB, addr string) error {
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
	ps := sc.PSubscribe(ctx, "*")
	// The first reply confirms the subscription: no event after this
	// point is missed.
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		sc.Close()
		return fmt.Errorf("redistest: subscribe to sentinel %s: %w", addr, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ps.Channel() {
			g.record(SentinelEvent{Name: m.Channel, Payload: m.Payload, Sentinel: addr, At: time.Now()})
		}
	}()
	t.Cleanup(func() {
		ps.Close()
		sc.Close()
		<-done
	})
	return nil
}

func (g *SentinelGroup) record(e SentinelEvent) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.events = append(g.events, e)
	close(g.arrived)
	g.arrived = make(chan struct{})
}

// waitSentinelReady waits until the sentinel at addr reports the master
// at its address, one replica and two other sentinels: what it needs to
// take part in a failover.
func (g *SentinelGroup) waitSentinelReady(ctx context.Context, addr string) error {
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer sc.Close()
	var state string
	for {
		m, err := sc.Master(ctx, g.MasterName).Result()
		if err == nil {
			state = fmt.Sprintf("master %s:%s, %s replicas, %s other sentinels, flags %s",
				m["ip"], m["port"], m["num-slaves"], m["num-other-sentinels"], m["flags"])
			if net.JoinHostPort(m["ip"], m["port"]) == g.Master.Addr && m["flags"] == "master" &&
				m["num-slaves"] == "1" && m["num-other-sentinels"] == "2" {
				return nil
			}
		} else {
			state = err.Error()
		}
		if ctx.Err() != nil {
			return fmt.Errorf("redistest: sentinel %s not ready for a failover of %s: %s", addr, g.MasterName, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// KillMaster SIGKILLs the master (as Master.Stop does), waits until it has
// exited, and returns the time then: from that moment nothing is answered
// by it.
func (g *SentinelGroup) KillMaster() time.Time {
	g.Master.Stop()
	return time.Now()
}

// Events returns the events recorded so far, in the order received.
func (g *SentinelGroup) Events() []SentinelEvent {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.events)
}

// WaitEvent returns the first event named name (a channel such as
// "+odown") that any sentinel published since the group started, waiting
// for one until ctx is done.
func (g *SentinelGroup) WaitEvent(ctx context.Context, name string) (SentinelEvent, error) {
	for {
		g.mu.Lock()
		for _, e := range g.events {
			if e.Name == name {
				g.mu.Unlock()
				return e, nil
			}
		}
		arrived := g.arrived
		g.mu.Unlock()
		select {
		case <-arrived:
		case <-ctx.Done():
			return SentinelEvent{}, fmt.Errorf("redistest: no %s from the sentinels of %s: %w", name, g.MasterName, ctx.Err())
		}
	}
}

// WaitSwitchMaster waits for the first +switch-master of the group's
// master, the sentinels' announcement that a failover has ended, and
// returns the new master's address and when the announcement arrived.
func (g *SentinelGroup) WaitSwitchMaster(ctx context.Context) (addr string, at time.Time, err error) {
	e, err := g.WaitEvent(ctx, "+switch-master")
	if err != nil {
		return "", time.Time{}, err
	}
	// <master name> <old ip> <old port> <new ip> <new port>
	f := strings.Fields(e.Payload)
	if len(f) != 5 || f[0] != g.MasterName {
		return "", time.Time{}, fmt.Errorf("redistest: +switch-master from %s: unexpected payload %q", e.Sentinel, e.Payload)
	}
	return net.JoinHostPort(f[3], f[4]), e.At, nil
}
