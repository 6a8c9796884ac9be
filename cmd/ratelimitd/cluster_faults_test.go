package main

// Faults of one Redis Cluster node under load, with Envoy's 20 ms
// deadlines, against real ratelimitd processes and real redis-server
// clusters (internal/redistest's replicated cluster, some masters behind
// an in-process fault proxy): a master SIGKILLed and its replica
// promoted, in each failure mode; slots moved under load; a master added
// and the slots rebalanced; a black hole, a latency spike and connection
// resets on one master; a CPU burner beside a healthy cluster.
//
// A call is "decided by Redis" when its answer can only be Redis's (see
// decidedByRedis). Calls on healthy masters must all be, and every call
// must be answered within its deadline, but for this machine's noise: two
// cores shared by the race-enabled test client, ratelimitd, six or more
// redis-servers and, under make test, every other package's tests.
//   - A failure that a stall explains is excused (see noise.explains):
//     a canary process pings each healthy node every 2 ms, the client
//     watches its own wake-ups, and the CPU waits of the client's,
//     ratelimitd's and the redis-servers' threads are read from
//     /proc/<pid>/task/*/schedstat. A healthy node that held a round trip
//     for --backend-timeout (10 ms) because it, or ratelimitd, waited for
//     a CPU is a failing node by design, and its breaker answers per the
//     failure mode for --breaker-open-for (100 ms); a failure no stall
//     explains is ratelimitd's own.
//   - Beyond that, the share of failures a no-fault baseline of the same
//     test measured, plus 0.1% (noiseAllowance), is allowed.
// Every figure of noise is logged beside the figures of each scenario.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimitd/internal/faultproxy"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// Timings of the cluster fault tests.
const (
	// faultWarmUp is how long a load runs before its calls count: the
	// connections open, the scripts are cached.
	faultWarmUp = 300 * time.Millisecond
	// faultBaseline is how long a load runs without a fault, measured, before
	// the fault.
	faultBaseline = time.Second
	// clusterFailoverRecovery is the most a process may take, after the
	// promotion WaitPromotion reports, to answer the failed master's
	// buckets from Redis again.
	clusterFailoverRecovery = time.Second
	// clusterFailoverAfter is how long the load goes on after the promotion.
	clusterFailoverAfter = 1500 * time.Millisecond
	// faultOutageFrom is how long after a fault begins the failure mode's
	// answers alone are expected on its node's buckets: the denial cache
	// may still deny, for Redis, a call on the hot bucket Redis denied
	// just before, for Redis's retry-after (a token's interval, 10 ms).
	faultOutageFrom = 20 * time.Millisecond
)

// outageAnswers are the answers each failure mode gives a bucket of the
// wide rule and one of the hot rule while no Redis decides them.
var outageAnswers = map[string]struct{ wide, hot []string }{
	"error": {[]string{"Unavailable"}, []string{"Unavailable"}},
	"deny":  {[]string{"OVER_LIMIT"}, []string{"OVER_LIMIT"}},
	"allow": {[]string{"OK"}, []string{"OK"}},
	// --replicas-hint 2: the local buckets have half the limits; the wide
	// rule's half is still far above any load.
	"local": {[]string{"OK"}, []string{"OK", "OVER_LIMIT"}},
}

// checkOutageAnswers fails t at the first call of outage, on a bucket of
// a faulted node in failure mode mode, that got an answer outageAnswers
// does not list (a call the client gave up on aside) or that Redis decided
// on a wide bucket. fault names the fault, event what happened at since.
func checkOutageAnswers(t *testing.T, mode, fault, event string, since time.Time, outage callSet) {
	t.Helper()
	want := outageAnswers[mode]
	for _, c := range outage {
		kinds := want.wide
		if c.value == hotValue {
			kinds = want.hot
		}
		if !slices.Contains(kinds, c.answer()) && c.code != codes.DeadlineExceeded || c.redis && c.value != hotValue {
			t.Errorf("%s mode, %s: a call %v after %s answered %s (redis %v), want only %v; outage answers: %s",
				mode, fault, c.start.Sub(since).Round(time.Microsecond), event, c.answer(), c.redis, kinds, outage.answers())
			return
		}
	}
}

// modeFlags are the flags a failure mode's process gets.
func modeFlags(mode string) []string {
	args := []string{"--on-backend-failure", mode}
	if mode == "local" {
		args = append(args, "--replicas-hint", "2")
	}
	return args
}

// failoverProc is one process of a failover and the load on it.
type failoverProc struct {
	mode   string
	p      *proc
	layout faultLayout
	stop   func() []faultCall
}

// TestClusterUnderLoad runs, on a cluster of three masters with a replica
// each (cluster-require-full-coverage no, cluster-node-timeout 1 s, no
// proxy), one scenario after another under load, each leaving the
// cluster healthy for the next: a CPU burner beside it (testCPUBurner);
// slots moved by hand (testSlotMove); then three failovers, each of
// another master (testClusterFailover): in error mode, in deny mode, and
// in allow and local modes at once (two processes, half the load each).
func TestClusterUnderLoad(t *testing.T) {
	skipUnlessHeavy(t)
	rc := redistest.StartReplicatedCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1, NodeTimeout: time.Second})
	t.Run("cpu-burner", func(t *testing.T) { testCPUBurner(t, rc) })
	t.Run("slot-move", func(t *testing.T) {
		testSlotMove(t, rc)
		waitHealthy(t, rc)
	})
	for i, tt := range []struct {
		name  string
		modes []string
	}{
		{"failover-error", []string{"error"}},
		{"failover-deny", []string{"deny"}},
		{"failover-allow-and-local", []string{"allow", "local"}},
	} {
		t.Run(tt.name, func(t *testing.T) { testClusterFailover(t, rc, clusterFailover{victim: i, modes: tt.modes}) })
	}
}

// TestClusterScaleOutThenFullCoverageFailover runs, on a cluster of three
// masters with a replica each under Redis's default
// cluster-require-full-coverage yes (cluster-node-timeout 1 s, no proxy):
// a master added and the slots rebalanced under load (testScaleOut); then
// a master SIGKILLed under load, every master refusing calls while the
// cluster reports cluster_state:fail until the replica's promotion
// (testClusterFailover in error mode).
func TestClusterScaleOutThenFullCoverageFailover(t *testing.T) {
	skipUnlessHeavy(t)
	rc := redistest.StartReplicatedCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1, NodeTimeout: time.Second,
		RequireFullCoverage: true})
	t.Run("scale-out", func(t *testing.T) {
		testScaleOut(t, rc)
		waitHealthy(t, rc)
	})
	t.Run("failover-full-coverage", func(t *testing.T) {
		testClusterFailover(t, rc, clusterFailover{victim: 1, modes: []string{"error"}, fullCoverage: true})
	})
}

// waitHealthy waits until every node of rc says cluster_state:ok.
func waitHealthy(t *testing.T, rc *redistest.ReplicatedCluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := rc.WaitStateOK(ctx); err != nil {
		t.Fatalf("the cluster is not healthy again: %v", err)
	}
}

// clusterFailover is a failover of a master under load.
type clusterFailover struct {
	victim int      // the master to kill (redistest's index)
	modes  []string // a process in each failure mode
	// fullCoverage says the cluster runs with
	// cluster-require-full-coverage yes: every master refuses calls
	// (CLUSTERDOWN) while the cluster reports cluster_state:fail, which
	// the test watches.
	fullCoverage bool
}

// testClusterFailover SIGKILLs, under load, the master that holds the hot
// bucket and waits for its replica's promotion, with a process in each
// failure mode (24 callers over 1,000 wide values and 8 on a hot bucket
// of the victim's, shared among the processes). It checks that
//   - the buckets of the healthy masters are decided by Redis
//     throughout, but, under cluster-require-full-coverage yes, while the
//     cluster reports cluster_state:fail (then UNAVAILABLE as try_again
//     in error mode);
//   - the failed master's buckets are answered per the failure mode, in
//     time, until the promotion;
//   - they are decided by Redis again within clusterFailoverRecovery of
//     the promotion;
//   - the hot bucket admits at most rate·t + burst (+1%) over the whole
//     episode in error and deny modes, before the kill and after the
//     recovery in allow mode, and with the local buckets' share in local
//     mode.
func testClusterFailover(t *testing.T, rc *redistest.ReplicatedCluster, fo clusterFailover) {
	target := rc.MasterAddr(fo.victim)
	if len(rc.ReplicasOf(target)) == 0 {
		t.Fatalf("master %d (%s) has no replica to promote", fo.victim, target)
	}
	dir := writeConfig(t, map[string]string{"faults.yaml": clusterFaultsConfig})
	var seeds, healthy []string
	for _, m := range rc.Masters() {
		seeds = append(seeds, m.Addr)
		if m.Addr != target {
			healthy = append(healthy, m.Addr)
		}
	}
	var procs []*failoverProc
	for _, mode := range fo.modes {
		p := startProc(t, append([]string{"--config", dir, "--redis-cluster-addrs", strings.Join(seeds, ",")}, modeFlags(mode)...)...)
		tag := fmt.Sprintf("fo%d-%s", fo.victim, mode)
		procs = append(procs, &failoverProc{mode: mode, p: p, layout: newFaultLayout(t, rc, tag, 1000, target)})
	}
	for _, fp := range procs {
		load := faultLoad{rls: rlsv3.NewRateLimitServiceClient(openFaultConn(t, fp.p.grpcAddr)), mode: fp.mode, layout: fp.layout,
			valueCallers: 24 / len(procs), hotCallers: 8 / len(procs)}
		fp.stop = load.start()
	}
	stopAll := func() {
		for _, fp := range procs {
			fp.stop()
		}
	}
	defer stopAll()
	var ps []*proc
	for _, fp := range procs {
		ps = append(ps, fp.p)
	}
	stopNoise := watchNoise(t, healthy, ps)
	defer stopNoise()
	var stopWatch func() []stateSample
	if fo.fullCoverage {
		stopWatch = watchClusterState(healthy)
		defer stopWatch()
	}
	began := time.Now()
	time.Sleep(faultWarmUp + faultBaseline)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	killed, promotedTo, promoted := failOver(ctx, t, rc, fo.victim, stopAll)
	stopAll()
	t.Logf("master %s SIGKILLed; replica %s promoted %v later", target, promotedTo, promoted.Sub(killed).Round(time.Millisecond))
	var down stateWindow
	if fo.fullCoverage {
		down = failWindow(stopWatch())
		if down.from.IsZero() {
			t.Logf("cluster-require-full-coverage yes: no healthy master reported cluster_state:fail")
		} else {
			t.Logf("cluster-require-full-coverage yes: healthy masters reported cluster_state:fail from %v to %v after the kill (%v; %s)",
				down.from.Sub(killed).Round(time.Millisecond), down.to.Sub(killed).Round(time.Millisecond),
				down.to.Sub(down.from).Round(time.Millisecond), down.detail)
		}
	}
	if err := rc.WaitStateOK(ctx); err != nil {
		t.Errorf("the cluster is not ok after the failover: %v", err)
	}
	nz := stopNoise()
	t.Logf("noise: %s", nz.summary())
	for _, fp := range procs {
		nz.nodeOf = fp.layout.nodeOf
		checkFailover(t, fp, began.Add(faultWarmUp), killed, promoted, target, down, nz)
	}
}

// checkFailover checks one process's calls through a failover of master
// target, SIGKILLed at killed and replaced at promoted.
func checkFailover(t *testing.T, fp *failoverProc, from, killed, promoted time.Time, target string, down stateWindow, nz noise) {
	mode, l := fp.mode, fp.layout
	all := callSet(fp.stop()).where(func(c faultCall) bool { return !c.start.Before(from) })
	onFailed := map[int]bool{hotValue: true}
	for _, i := range l.on(func(o string) bool { return o == target }) {
		onFailed[i] = true
	}
	wide := func(c faultCall) bool { return c.value != hotValue }
	failedWide := func(c faultCall) bool { return wide(c) && onFailed[c.value] }
	healthyWide := func(c faultCall) bool { return wide(c) && !onFailed[c.value] }
	hot := func(c faultCall) bool { return c.value == hotValue }

	before := all.where(func(c faultCall) bool { return c.end.Before(killed) })
	base := measureBaseline(before.where(wide), nz)
	during := all.where(func(c faultCall) bool { return !c.start.Before(killed) && c.end.Before(promoted) })
	t.Logf("%s mode: %.0f calls/s before the kill, %.0f from the kill to the promotion; %d of %d wide values on the failed master",
		mode, before.rate(), during.rate(), len(onFailed)-1, len(l.values))
	if before.where(failedWide).notRedis() == len(before.where(failedWide)) {
		t.Fatalf("%s mode: no call on the failed master's buckets was decided by Redis before the kill (%s): the test cannot tell a recovery",
			mode, before.where(failedWide).answers())
	}

	// (a) The healthy masters' buckets, from the kill to the end (but
	// while the cluster reports itself down, under
	// cluster-require-full-coverage yes).
	inDown := func(c faultCall) bool { return down.overlaps(c.start, c.end) }
	checkHealthy(t, mode+" mode, healthy masters' buckets from the kill on", all.where(func(c faultCall) bool {
		return healthyWide(c) && !c.start.Before(killed) && !inDown(c)
	}), base, nz)
	if !down.from.IsZero() {
		// While it does: the failure mode's answers, as try_again.
		refused := all.where(func(c faultCall) bool { return healthyWide(c) && inDown(c) })
		t.Logf("%s mode, healthy masters' buckets while the cluster reported cluster_state:fail (%v): %s; failure-mode answers %s",
			mode, down.to.Sub(down.from).Round(time.Millisecond), refused.answers(), scrape(t, fp.p).series("ratelimitd_failure_mode_answers_total"))
		// A call a stall explains is excused here as in checkHealthy: a
		// healthy master that held a round trip for --backend-timeout
		// while it, or ratelimitd, waited for a CPU is a failing node by
		// design (measured: "answered after 102ms" and "12.7ms at the
		// backend" during stalls of 0.3-0.9 s of the whole machine).
		for _, c := range refused {
			if !c.redis && !(c.code == codes.Unavailable && (c.cause == "try_again" || c.cause == "overloaded")) && c.code != codes.DeadlineExceeded && !nz.explains(c) {
				t.Errorf("%s mode, cluster_state:fail: a call on a healthy master's bucket answered %s (%q), want decided by Redis or UNAVAILABLE as try_again; answers %s",
					mode, c.answer(), c.msg, refused.answers())
				break
			}
		}
		checkInTime(t, mode+" mode, healthy masters' buckets while the cluster reported cluster_state:fail", refused, base, nz)
	}

	// (c) Decided by Redis again soon after the promotion.
	back, ok := all.firstRedis(killed.Add(faultOutageFrom), failedWide)
	var hotBack time.Time
	hotOK := true
	if mode != "local" {
		hotBack, hotOK = all.firstRedis(killed.Add(faultOutageFrom), hot)
	}
	hotFigure := "not told apart in local mode"
	if hotOK && mode != "local" {
		hotFigure = hotBack.Sub(promoted).Round(time.Millisecond).String()
	}
	t.Logf("%s mode: failed master's buckets decided by Redis again %v after the promotion (the hot bucket: %s); promotion %v after the kill; node lines:\n%s",
		mode, back.Sub(promoted).Round(time.Millisecond), hotFigure, promoted.Sub(killed).Round(time.Millisecond), nodeLines(fp.p))
	switch {
	case !ok || !hotOK:
		t.Fatalf("%s mode: %v after the promotion, the failed master's buckets are still not decided by Redis (wide: %v, hot: %v; answers since the promotion: %s)\n%s",
			mode, clusterFailoverAfter, ok, hotOK, all.where(func(c faultCall) bool { return onFailed[c.value] && !c.start.Before(promoted) }).answers(), warnings(fp.p))
	case back.Sub(promoted) > clusterFailoverRecovery:
		t.Errorf("%s mode: the failed master's wide buckets were decided by Redis again %v after the promotion, want within %v",
			mode, back.Sub(promoted), clusterFailoverRecovery)
	case mode != "local" && hotBack.Sub(promoted) > clusterFailoverRecovery:
		t.Errorf("%s mode: the hot bucket was decided by Redis again %v after the promotion, want within %v", mode, hotBack.Sub(promoted), clusterFailoverRecovery)
	case back.Before(promoted.Add(-250 * time.Millisecond)):
		// The kit sees the promotion within a poll (10 ms) of a live
		// node's learning it: a Redis answer long before is no Redis's.
		t.Errorf("%s mode: a call on the failed master's buckets was classed as decided by Redis %v before the promotion", mode, promoted.Sub(back))
	}

	// (b) The failed master's buckets, until Redis decides them again:
	// the failure mode's answers, in time.
	until := promoted
	if ok && back.Before(until) {
		until = back
	}
	if mode != "local" && hotOK && hotBack.Before(until) {
		until = hotBack
	}
	outage := all.where(func(c faultCall) bool {
		return onFailed[c.value] && !c.start.Before(killed.Add(faultOutageFrom)) && c.end.Before(until)
	})
	t.Logf("%s mode: failed master's buckets in the %v outage: %s", mode, until.Sub(killed).Round(time.Millisecond), outage.answers())
	if len(outage.where(failedWide)) < 100 {
		t.Errorf("%s mode: only %d calls on the failed master's wide buckets in the outage: too few to judge", mode, len(outage.where(failedWide)))
	}
	checkOutageAnswers(t, mode, "failed master down", "the kill", killed, outage)
	checkInTime(t, mode+" mode, failed master's buckets in the outage", outage, base, nz)
	checkInTime(t, mode+" mode, every call", all, base, nz)

	// After the recovery (and 200 ms for calls in flight at it): every
	// bucket decided by Redis again.
	if ok {
		checkHealthy(t, mode+" mode, every wide bucket after the recovery", all.where(func(c faultCall) bool {
			return wide(c) && !c.start.Before(back.Add(200*time.Millisecond))
		}), base, nz)
	}

	// (d) The hot bucket's admissions.
	hotCalls := all.where(hot)
	switch mode {
	case "error", "deny":
		checkHotBound(t, mode+" mode, the whole episode", hotCalls, hotCalls.span(), 0)
	case "allow":
		// The admissions Redis decided (allow mode's own admit all, by
		// design: a stall that opens the breaker adds some anywhere).
		redis := func(c faultCall) bool { return c.redis }
		pre := before.where(hot)
		checkHotBound(t, "allow mode, before the kill, Redis's admissions", pre.where(redis), pre.span(), 0)
		post := hotCalls.where(func(c faultCall) bool { return !c.start.Before(hotBack) })
		checkHotBound(t, "allow mode, after the recovery, Redis's admissions", post.where(redis), post.span(), 0)
	case "local":
		// The local bucket (half the rate and burst) admits at most
		// rate/2·t + burst/2 over any period: alone while no Redis
		// decides, and beside Redis over the whole episode (it answers
		// whenever the breaker is open, which a stall may cause at any
		// time).
		out := hotCalls.where(func(c faultCall) bool { return !c.start.Before(killed.Add(faultOutageFrom)) && c.end.Before(until) })
		checkAdmissions(t, "local mode, the local bucket while no Redis decides", out, until.Sub(killed), hotRate/2*until.Sub(killed).Seconds()+hotBurst/2)
		d := hotCalls.span()
		checkHotBound(t, "local mode, the whole episode with the local bucket's share", hotCalls, d, hotRate/2*d.Seconds()+hotBurst/2)
	}
}

// TestClusterNodeFaults runs, on a cluster of three masters with a
// replica each (master 0 behind a fault proxy), a black hole, a latency
// spike and connection resets on master 0 under load, one after another,
// each followed by the cluster's recovery (see testProxyFault).
func TestClusterNodeFaults(t *testing.T) {
	skipUnlessHeavy(t)
	rc := redistest.StartReplicatedCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1, NodeTimeout: time.Second,
		ProxiedMasters: []int{0}})
	healthyAgain := func(t *testing.T) {
		if err := rc.Proxy(0).Pass(); err != nil {
			t.Fatal(err)
		}
		waitHealthy(t, rc)
	}
	t.Run("blackhole", func(t *testing.T) {
		defer healthyAgain(t)
		testProxyFault(t, rc, proxyFault{modes: []string{"error", "deny"}, length: 3 * time.Second,
			apply: (*faultproxy.Remote).Blackhole, breakerBound: true, readyz: true, leaks: true})
	})
	t.Run("latency", func(t *testing.T) {
		defer healthyAgain(t)
		testProxyFault(t, rc, proxyFault{modes: []string{"error"}, length: 5 * time.Second,
			apply: func(p *faultproxy.Remote) error { return p.Latency(30 * time.Millisecond) }, breakerBound: true})
	})
	t.Run("resets", func(t *testing.T) {
		defer healthyAgain(t)
		testProxyFault(t, rc, proxyFault{modes: []string{"error"}, length: 3 * time.Second,
			apply: (*faultproxy.Remote).ResetPeer})
	})
}

// startFaultProc starts a ratelimitd on rc's cluster with
// clusterFaultsConfig, in failure mode mode, and returns it with a client.
func startFaultProc(t *testing.T, rc *redistest.ReplicatedCluster, mode string, extra ...string) (*proc, rlsv3.RateLimitServiceClient) {
	t.Helper()
	dir := writeConfig(t, map[string]string{"faults.yaml": clusterFaultsConfig})
	var seeds []string
	for _, m := range rc.Masters() {
		seeds = append(seeds, m.Addr)
	}
	args := append([]string{"--config", dir, "--redis-cluster-addrs", strings.Join(seeds, ",")}, modeFlags(mode)...)
	extra = append(extra, faultLogLevel()...)
	p := startProc(t, append(args, extra...)...)
	return p, rlsv3.NewRateLimitServiceClient(openFaultConn(t, p.grpcAddr))
}

// testCPUBurner: 32 callers (24 over 1,000 wide values, 8 on the hot
// bucket) call a process on the healthy cluster for 3 s, with 20 ms
// deadlines, while two busy processes keep both cores busy: at least
// 99.9% of the calls are decided by Redis, but for calls the client
// itself read too late (its own stall) and failures a stall of a Redis
// node explains (a slow ping, or its redis-server waiting for a CPU
// for --backend-timeout). ratelimitd's own waits for a CPU, and the
// whole machine's, explain nothing here: they are what the test is
// about.
func testCPUBurner(t *testing.T, rc *redistest.ReplicatedCluster) {
	const minDecided = 0.999
	p, rls := startFaultProc(t, rc, "error")
	layout := newFaultLayout(t, rc, "burner", 1000, "")
	stopNoise := watchNoise(t, masterAddrs(rc), []*proc{p})
	burnCPU(t, 2)
	stop := faultLoad{rls: rls, mode: "error", layout: layout, valueCallers: 24, hotCallers: 8}.start()
	began := time.Now()
	time.Sleep(faultWarmUp + 3*time.Second)
	calls := callSet(stop()).where(func(c faultCall) bool { return !c.start.Before(began.Add(faultWarmUp)) })
	nz := stopNoise().without(func(e canaryEvent) bool {
		return e.kind == "late" || e.kind == "sched" && e.node == "ratelimitd"
	})
	nz.nodeOf = layout.nodeOf
	m := scrape(t, p)
	decided := 1 - float64(calls.notRedis())/float64(max(len(calls), 1))
	unexplained, explained := nz.failures(calls, notDecided)
	t.Logf("CPU burner: %d calls in %v (%.0f/s), %.3f%% decided by Redis (%d of the others explained by stalls, %d not: %s); answers %s; failure-mode answers %s; noise: %s",
		len(calls), calls.span().Round(time.Millisecond), calls.rate(), 100*decided, explained, len(unexplained), unexplained.answers(), calls.answers(),
		m.series("ratelimitd_failure_mode_answers_total"), nz.summary())
	if len(calls) < 1000 {
		t.Fatalf("CPU burner: only %d calls in 3 s", len(calls))
	}
	// Every answer per the failure mode is an UNAVAILABLE the client sees
	// (error mode), with its cause: the client's view is the judge.
	// ratelimitd's own count is logged above.
	if share := float64(len(unexplained)) / float64(len(calls)); share > 1-minDecided {
		t.Errorf("CPU burner, healthy cluster: %d of %d calls not decided by Redis and not explained by a stall (%s), want at most %.1f%%; %s\n%s",
			len(unexplained), len(calls), unexplained.answers(), 100*(1-minDecided), nz.summary(), warnings(p))
	}
	checkHotBound(t, "CPU burner", calls.where(func(c faultCall) bool { return c.value == hotValue }), calls.span(), 0)
}

// proxyFault is a fault on master 0's proxy under load.
type proxyFault struct {
	modes  []string // a process in each failure mode, at once
	length time.Duration
	apply  func(*faultproxy.Remote) error
	// breakerBound checks that master 0's breaker opens within
	// breakerBound of the fault's start (a fault that holds round trips:
	// calls answered per the failure mode at once show the breaker open).
	breakerBound bool
	// readyz checks that /readyz says 200 throughout (other masters
	// decide); leaks that goroutines and connections come back to their
	// count before the fault.
	readyz, leaks bool
}

const (
	// breakerOpenBound is how soon after a black hole or a latency spike
	// begins a node's breaker must open, but for ratelimitd's waits for a
	// CPU meanwhile (see breakerBound): three backend timeouts, the
	// issue's bound. (Three failures over --breaker-failing-for, twice the
	// timeout, counted from the send of the first round trip the fault
	// held, open it: about 20 ms after the fault began, the first round
	// trip being sent within a millisecond of it, and the report that
	// opens it a timer, which fires a little late.)
	breakerOpenBound = 3 * backendTimeout
	// faultRecovery is how soon after a fault ends Redis must decide the
	// node's buckets again, plus the time ratelimitd's threads waited for
	// a CPU meanwhile (see recoveryBound).
	faultRecovery = 500 * time.Millisecond
	// faultAfter is how long the load goes on after a fault ends.
	faultAfter = time.Second
)

// testProxyFault applies f to master 0's proxy for f.length under a
// process per mode (24 callers over 1,000 wide values and 8 on a hot
// bucket of master 0's, shared among the processes) and checks that
//   - every call is answered within its deadline, none CANCELED (the
//     faulted node's calls during the fault by checkFaultedInTime);
//   - ratelimitd_redis_node_up says master 0 is down half way through;
//   - the other masters' buckets are decided by Redis throughout;
//   - master 0's buckets are answered per the failure mode once its
//     breaker opened, within breakerBound (if f.breakerBound);
//   - Redis decides them again within recoveryBound of the fault's end;
//   - /readyz says 200 throughout (if f.readyz);
//   - goroutines and connections to master 0 come back to about their
//     count before the fault (if f.leaks).
func testProxyFault(t *testing.T, rc *redistest.ReplicatedCluster, f proxyFault) {
	target, proxy := rc.MasterAddr(0), rc.Proxy(0)
	type faultProc struct {
		mode   string
		p      *proc
		layout faultLayout
		stop   func() []faultCall
		readyz func() []readyzPoll
		// goroutines before the fault.
		goroutines int
	}
	var procs []*faultProc
	for _, mode := range f.modes {
		p, rls := startFaultProc(t, rc, mode, "--pprof")
		fp := &faultProc{mode: mode, p: p, layout: newFaultLayout(t, rc, "pf-"+t.Name()+"-"+mode, 1000, target)}
		fp.stop = faultLoad{rls: rls, mode: mode, layout: fp.layout,
			valueCallers: 24 / len(f.modes), hotCallers: 8 / len(f.modes)}.start()
		defer fp.stop()
		if f.readyz {
			fp.readyz = pollReadyz(p, 20*time.Millisecond)
			defer fp.readyz()
		}
		procs = append(procs, fp)
	}
	var healthy []string
	for _, a := range masterAddrs(rc) {
		if a != target {
			healthy = append(healthy, a)
		}
	}
	var ps []*proc
	for _, fp := range procs {
		ps = append(ps, fp.p)
	}
	stopNoise := watchNoise(t, healthy, ps)
	defer stopNoise()
	began := time.Now()
	time.Sleep(faultWarmUp)
	connsBefore, err := proxy.Conns()
	if err != nil {
		t.Fatal(err)
	}
	for _, fp := range procs {
		fp.goroutines = goroutines(t, fp.p.httpAddr)
	}
	time.Sleep(faultBaseline)
	// The breaker of master 0 closed, and for a while: the proxy, in this
	// busy test process, may itself hold a round trip for
	// --backend-timeout now and then.
	for _, fp := range procs {
		if !nodeQuiet(fp.p, target, 100*time.Millisecond, 2*time.Second) {
			t.Logf("%s mode: master 0's breaker not closed for 100 ms in 2 s before the fault:\n%s", fp.mode, nodeLines(fp.p))
		}
	}
	faultAt := time.Now()
	if err := f.apply(proxy); err != nil {
		t.Fatal(err)
	}
	time.Sleep(f.length / 2)
	// Half way: ratelimitd_redis_node_up says master 0 is down.
	for _, fp := range procs {
		m := scrape(t, fp.p)
		if v, ok := m.sum("ratelimitd_redis_node_up", "node", target); !ok || v != 0 {
			t.Errorf("%s mode, %v into the fault: ratelimitd_redis_node_up{node=%q} = %v (found %v), want 0; node_up %s",
				fp.mode, f.length/2, target, v, ok, m.series("ratelimitd_redis_node_up"))
		}
	}
	time.Sleep(f.length - f.length/2)
	passAt := time.Now()
	if err := proxy.Pass(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(faultAfter)
	for _, fp := range procs {
		fp.stop()
	}
	ended := time.Now()
	nz := stopNoise()
	t.Logf("fault from %s to %s; noise: %s", faultAt.Format("15:04:05.000"), passAt.Format("15:04:05.000"), nz.summary())

	for _, fp := range procs {
		mode := fp.mode
		nz.nodeOf = fp.layout.nodeOf
		all := callSet(fp.stop()).where(func(c faultCall) bool { return !c.start.Before(began.Add(faultWarmUp)) })
		onNode := map[int]bool{hotValue: true}
		for _, i := range fp.layout.on(func(o string) bool { return o == target }) {
			onNode[i] = true
		}
		wide := func(c faultCall) bool { return c.value != hotValue }
		before := all.where(func(c faultCall) bool { return c.end.Before(faultAt) })
		base := measureBaseline(before.where(wide), nz)
		during := all.where(func(c faultCall) bool { return !c.start.Before(faultAt) && c.end.Before(passAt) })
		t.Logf("%s mode: %.0f calls/s before the fault, %.0f during; %d of %d wide values on master 0",
			mode, before.rate(), during.rate(), len(onNode)-1, len(fp.layout.values))

		t.Logf("%s mode: calls past their deadline at the client, by 100 ms from the fault's start: %s", mode, lateHistogram(all, faultAt))
		// The faulted node's calls during the fault have a check of their
		// own.
		faulted := func(c faultCall) bool { return onNode[c.value] && duringFault(c, faultAt, passAt) }
		checkInTime(t, mode+" mode, every call but the faulted node's during the fault", all.where(func(c faultCall) bool { return !faulted(c) }), base, nz)
		checkFaultedInTime(t, mode+" mode", all.where(faulted), faultAt, passAt, nz, fp.p)
		checkHealthy(t, mode+" mode, the other masters' buckets from the fault on", all.where(func(c faultCall) bool {
			return wide(c) && !onNode[c.value] && !c.start.Before(faultAt)
		}), base, nz)

		// The breaker opened by the first call on master 0 answered per
		// the failure mode at once (one the breaker let through waits for
		// Redis until its deadline), and by the time of its log line
		// (which may come later: a change is reported when the call that
		// made it returns): by the earlier of the two.
		opened, ok := firstFastFallback(all.where(func(c faultCall) bool { return onNode[c.value] }), faultAt)
		if !f.breakerBound {
			// A fault that fails calls at once (resets): a fast answer
			// tells nothing of the breaker.
			ok = false
		}
		logged, wasLogged := loggedNode(fp.p, "Redis Cluster node failing", target, faultAt)
		if wasLogged && (!ok || logged.Before(opened)) {
			opened, ok = logged, true
		}
		switch {
		case !ok && nodeFailingAt(fp.p, target, faultAt):
			// A stall before the fault opened it (see nodeQuiet), and the
			// fault kept it open: nothing to time.
			t.Logf("%s mode: master 0's breaker was open already when the fault began, and stayed open", mode)
			opened, ok = faultAt, true
		case !ok:
			t.Errorf("%s mode: master 0's breaker never opened during the fault (no call answered per the failure mode at once; node lines:\n%s", mode, nodeLines(fp.p))
		case f.breakerBound && opened.Sub(faultAt) > breakerBound(nz, faultAt, opened):
			t.Errorf("%s mode: master 0's breaker opened %v after the fault began, want within %v (3 × --backend-timeout %v + ratelimitd's waits for a CPU meanwhile, %v)",
				mode, opened.Sub(faultAt).Round(100*time.Microsecond), breakerBound(nz, faultAt, opened), backendTimeout, nz.cpuWait(faultAt, opened))
		}
		if !ok {
			opened = faultAt
		}
		// Once the breaker is open (and a deadline later, for the calls
		// sent before), master 0's buckets get the failure mode's
		// answers, never Redis's.
		outage := all.where(func(c faultCall) bool {
			return onNode[c.value] && !c.start.Before(opened.Add(faultDeadline)) && c.end.Before(passAt)
		})
		checkOutageAnswers(t, mode, "master 0 faulted", "its breaker opened", opened, outage)
		back, ok := all.firstRedis(passAt, func(c faultCall) bool { return wide(c) && onNode[c.value] })
		m := scrape(t, fp.p)
		t.Logf("%s mode: master 0's breaker opened %v after the fault began (logged at %v; ratelimitd waited %v for a CPU meanwhile); its buckets while faulted: %s; decided by Redis again %v after the fault ended; failure-mode answers %s; backend errors %s; node_up %s",
			mode, opened.Sub(faultAt).Round(100*time.Microsecond), logged.Sub(faultAt).Round(100*time.Microsecond), nz.cpuWait(faultAt, opened).Round(100*time.Microsecond), outage.answers(), back.Sub(passAt).Round(time.Millisecond),
			m.series("ratelimitd_failure_mode_answers_total"), m.series("ratelimitd_backend_errors_total"), m.series("ratelimitd_redis_node_up"))
		switch {
		case !ok:
			t.Errorf("%s mode: %v after the fault ended, master 0's buckets are still not decided by Redis:\n%s", mode, faultAfter, nodeLines(fp.p))
		case back.Sub(passAt) > recoveryBound(nz, passAt, back):
			t.Errorf("%s mode: master 0's buckets decided by Redis again %v after the fault ended, want within %v (%v + ratelimitd's waits for a CPU meanwhile, %v):\n%s",
				mode, back.Sub(passAt).Round(time.Millisecond), recoveryBound(nz, passAt, back), faultRecovery, nz.cpuWait(passAt, back), nodeLines(fp.p))
		}
		if mode == "error" || mode == "deny" { // no admission without Redis
			checkHotBound(t, mode+" mode, the whole run", all.where(func(c faultCall) bool { return c.value == hotValue }), all.span(), 0)
		}

		if f.readyz {
			polls := fp.readyz()
			var bad []string
			n, failed, explained := 0, 0, 0
			for _, p := range polls {
				if p.at.Before(faultAt) || p.at.After(ended) {
					continue
				}
				n++
				switch {
				case p.code == 200:
				case nz.explainsSpan(p.at, p.at.Add(250*time.Millisecond)):
					// A stall of every master (ratelimitd's breakers all
					// open) or of the probe's round trips: see noise.
					explained++
				default:
					failed++
					if len(bad) < 5 {
						bad = append(bad, fmt.Sprintf("%d %q %v after the fault began", p.code, p.body, p.at.Sub(faultAt).Round(time.Millisecond)))
					}
				}
			}
			t.Logf("%s mode: /readyz polled %d times during and after the fault, %d not 200 (%d more explained by stalls)", mode, n, failed, explained)
			if len(bad) > 0 {
				t.Errorf("%s mode, one master of three faulted: /readyz said %s; want 200 throughout (the other masters decide); %s; node lines:\n%s",
					mode, strings.Join(bad, "; "), nz.summary(), nodeLines(fp.p))
			}
		}
		if f.leaks {
			var g int
			for range 60 {
				if g = goroutines(t, fp.p.httpAddr); g <= fp.goroutines+30 {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("%s mode: goroutines %d before the fault, %d after", mode, fp.goroutines, g)
			if g > fp.goroutines+30 {
				t.Errorf("%s mode: %d goroutines after the fault, %d before: a leak", mode, g, fp.goroutines)
			}
		}
	}
	if f.leaks {
		var conns int
		for range 60 {
			if conns, err = proxy.Conns(); err != nil {
				t.Fatal(err)
			}
			if conns <= connsBefore+2*len(procs) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("connections to master 0: %d before the fault, %d after", connsBefore, conns)
		if conns > connsBefore+2*len(procs) {
			t.Errorf("connections to master 0: %d after the fault, %d before: a leak", conns, connsBefore)
		}
	}
}

// masterAddrs returns the addresses of rc's masters now.
func masterAddrs(rc *redistest.ReplicatedCluster) []string {
	var addrs []string
	for _, m := range rc.Masters() {
		addrs = append(addrs, m.Addr)
	}
	return addrs
}

// testSlotMove holds the hot bucket's slot and the slots of 20 wide
// values MIGRATING on their masters and IMPORTING on the next for about
// 2 s under load (a process in error mode, 24 callers over 1,000 wide
// values and 8 on the hot bucket): their keys are moved half at 0.5 s,
// the rest at 1.2 s, then the slots are given to their targets. It
// checks that
//   - the buckets outside the moving slots are decided by Redis
//     throughout;
//   - those inside are decided by Redis or answered per the failure mode
//     (UNAVAILABLE), within their deadline;
//   - the hot bucket admits at most rate·t + burst across the move, and
//     its key is on its new master after it;
//   - Redis ran no more scripts than the process asked for (a redirected
//     call ran nothing, so none ran twice).
func testSlotMove(t *testing.T, rc *redistest.ReplicatedCluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	masters := rc.Masters()
	addrs := masterAddrs(rc)
	ranBefore := scriptsRan(t, addrs)
	p, rls := startFaultProc(t, rc, "error")
	layout := newFaultLayout(t, rc, "move", 1000, "")
	moving := map[int]bool{layout.hotSlot: true}
	slots := []int{layout.hotSlot}
	for _, s := range layout.slots {
		if len(slots) == 21 {
			break
		}
		if !moving[s] {
			moving[s] = true
			slots = append(slots, s)
		}
	}
	targetOf := func(slot int) redistest.Node {
		owner := ownerOf(masters, slot)
		for i, m := range masters {
			if m.Addr == owner {
				return masters[(i+1)%len(masters)]
			}
		}
		t.Fatalf("slot %d has no master in %v", slot, masters)
		return redistest.Node{}
	}
	targets := map[int]redistest.Node{}
	for _, s := range slots {
		targets[s] = targetOf(s)
	}
	stopNoise := watchNoise(t, addrs, []*proc{p})
	defer stopNoise()
	stop := faultLoad{rls: rls, mode: "error", layout: layout, valueCallers: 24, hotCallers: 8}.start()
	defer stop()
	began := time.Now()
	time.Sleep(faultWarmUp + faultBaseline)
	// migrate does step of the migration on each slot of slots, stopping
	// the load before it fails the test.
	migrate := func(slots []int, step func(s int) error) {
		for _, s := range slots {
			if err := step(s); err != nil {
				stop()
				t.Fatal(err)
			}
		}
	}
	moveAt := time.Now()
	migrate(slots, func(s int) error { return rc.BeginMigration(ctx, s, targets[s]) })
	begun := time.Now()
	for i, half := range [][]int{slots[:len(slots)/2], slots[len(slots)/2:]} {
		time.Sleep([]time.Duration{500 * time.Millisecond, 700 * time.Millisecond}[i])
		migrate(half, func(s int) error { return rc.MigrateKeys(ctx, s) })
	}
	time.Sleep(300 * time.Millisecond)
	finishing := time.Now()
	migrate(slots, func(s int) error { return rc.FinishMigration(ctx, s, targets[s]) })
	movedAt := time.Now()
	time.Sleep(200 * time.Millisecond)
	// The hot bucket's state moved with its key: the key is on its new
	// master (asked while the load keeps it from filling, which would
	// expire it).
	target := targets[layout.hotSlot]
	tc := redis.NewClient(&redis.Options{Addr: target.Addr, MaxRetries: -1})
	defer tc.Close()
	if n, err := tc.Exists(ctx, faultKeys(t, "k", []string{layout.hot})[0]).Result(); err != nil || n != 1 {
		t.Errorf("after the move, EXISTS of the hot bucket's key on its new master %s = %d, %v; want 1", target.Addr, n, err)
	}
	time.Sleep(500 * time.Millisecond)
	all := callSet(stop()).where(func(c faultCall) bool { return !c.start.Before(began.Add(faultWarmUp)) })
	ranAfter := scriptsRan(t, addrs)
	m := scrape(t, p)
	nz := stopNoise()
	t.Logf("slot move: noise: %s", nz.summary())
	t.Logf("slot move: %d slots MIGRATING/IMPORTING for %v (began in %v, finished in %v); %d calls, %.0f/s",
		len(slots), movedAt.Sub(moveAt).Round(time.Millisecond), begun.Sub(moveAt).Round(time.Millisecond),
		movedAt.Sub(finishing).Round(time.Millisecond), len(all), all.rate())

	inside := func(c faultCall) bool { return c.value == hotValue || moving[layout.slots[c.value]] }
	base := measureBaseline(all.where(func(c faultCall) bool { return c.end.Before(moveAt) && c.value != hotValue }), nz)
	checkHealthy(t, "slot move, buckets outside the moving slots", all.where(func(c faultCall) bool {
		return !inside(c) && !c.start.Before(moveAt)
	}), base, nz)
	in := all.where(func(c faultCall) bool { return inside(c) && !c.start.Before(moveAt) && c.end.Before(movedAt) })
	t.Logf("slot move, buckets in the moving slots while they moved: %s", in.answers())
	checkInTime(t, "slot move, buckets in the moving slots", in, base, nz)
	for _, c := range in {
		if !c.redis && c.code != codes.Unavailable && c.code != codes.DeadlineExceeded {
			t.Errorf("slot move: a call in a moving slot answered %s, want decided by Redis or UNAVAILABLE (error mode); answers %s", c.answer(), in.answers())
			break
		}
	}
	if n := len(in.where(func(c faultCall) bool { return c.value != hotValue && c.redis })); n == 0 {
		t.Errorf("slot move: no call on a wide bucket in a moving slot was decided by Redis while they moved (%s): ASK not followed?", in.answers())
	}
	checkHotBound(t, "slot move, the whole run", all.where(func(c faultCall) bool { return c.value == hotValue }), all.span(), 0)

	checkRanOnce(t, "slot move", ranAfter-ranBefore, m)
}

// checkRanOnce checks that no take ran twice in the run what: that Redis
// ran, ran scripts, no more than the process (whose metrics are m) asked
// for.
func checkRanOnce(t *testing.T, what string, ran int, m promText) {
	t.Helper()
	asked := m.value("ratelimitd_redis_script_calls_total")
	t.Logf("%s: Redis ran %d scripts; the process asked for %.0f script calls; failure-mode answers %s",
		what, ran, asked, m.series("ratelimitd_failure_mode_answers_total"))
	if float64(ran) > asked {
		t.Errorf("%s: Redis ran %d scripts, more than the %.0f script calls the process asked for: a take ran twice", what, ran, asked)
	}
}

// testScaleOut adds a master and rebalances the slots (a quarter of them
// move to it, keys and all) under load (a process in error mode, 24
// callers over 1,000 wide values and 8 on the hot bucket), and checks
// that
//   - no more calls fail while the slots move than before (but for 0.1%
//     of them: noiseAllowance);
//   - the hot bucket admits at most rate·t + burst across it;
//   - buckets now on the new master are decided by Redis after it;
//   - Redis ran no more scripts than the process asked for.
func testScaleOut(t *testing.T, rc *redistest.ReplicatedCluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ranBefore := scriptsRan(t, masterAddrs(rc))
	p, rls := startFaultProc(t, rc, "error")
	layout := newFaultLayout(t, rc, "scale", 1000, "")
	stopNoise := watchNoise(t, masterAddrs(rc), []*proc{p})
	defer stopNoise()
	stop := faultLoad{rls: rls, mode: "error", layout: layout, valueCallers: 24, hotCallers: 8}.start()
	defer stop()
	began := time.Now()
	time.Sleep(faultWarmUp + faultBaseline)
	added, err := rc.AddMaster(ctx)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	rebalanceAt := time.Now()
	if err := rc.Rebalance(ctx); err != nil {
		stop()
		t.Fatal(err)
	}
	rebalanced := time.Now()
	time.Sleep(500 * time.Millisecond)
	all := callSet(stop()).where(func(c faultCall) bool { return !c.start.Before(began.Add(faultWarmUp)) })
	masters := rc.Masters()
	ranAfter := scriptsRan(t, masterAddrs(rc))
	m := scrape(t, p)
	nz := stopNoise()
	t.Logf("scale-out: noise: %s", nz.summary())
	var onNew []int
	for i, s := range layout.slots {
		if ownerOf(masters, s) == added.Addr {
			onNew = append(onNew, i)
		}
	}
	t.Logf("scale-out: master %s added in %v, the slots rebalanced in %v; %d of %d wide values now on it; %d calls, %.0f/s",
		added.Addr, rebalanceAt.Sub(began.Add(faultWarmUp+faultBaseline)).Round(time.Millisecond), rebalanced.Sub(rebalanceAt).Round(time.Millisecond),
		len(onNew), len(layout.values), len(all), all.rate())
	if len(onNew) == 0 {
		t.Fatalf("scale-out: none of %d wide values is on the new master %s after the rebalance (masters %v)", len(layout.values), added.Addr, masters)
	}
	base := measureBaseline(all.where(func(c faultCall) bool { return c.end.Before(rebalanceAt) }), nz)
	checkHealthy(t, "scale-out, every call while the slots moved", all.where(func(c faultCall) bool {
		return !c.start.Before(rebalanceAt) && c.end.Before(rebalanced)
	}), base, nz)
	isNew := map[int]bool{}
	for _, i := range onNew {
		isNew[i] = true
	}
	checkHealthy(t, "scale-out, the new master's buckets after the rebalance", all.where(func(c faultCall) bool {
		return c.value != hotValue && isNew[c.value] && !c.start.Before(rebalanced)
	}), base, nz)
	checkHotBound(t, "scale-out, the whole run", all.where(func(c faultCall) bool { return c.value == hotValue }), all.span(), 0)
	checkRanOnce(t, "scale-out", ranAfter-ranBefore, m)
}

// TestClusterFaultsStandaloneBlackhole black-holes a standalone Redis
// (behind a fault proxy) for 1.5 s under a light load, in error mode:
// /readyz says 503 while the breaker is open and 200 again once Redis
// decides, within faultRecovery of the fault's end; every call is
// answered within its deadline. (How soon the breaker opens is logged;
// the cluster's black hole checks it.)
func TestClusterFaultsStandaloneBlackhole(t *testing.T) {
	skipUnlessHeavy(t)
	srv := redistest.Start(t)
	proxy, err := faultproxy.StartRemote(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	dir := writeConfig(t, map[string]string{"faults.yaml": clusterFaultsConfig})
	args := []string{"--config", dir, "--redis-url", "redis://" + proxy.Addr(), "--on-backend-failure", "error"}
	args = append(args, faultLogLevel()...)
	p := startProc(t, args...)
	layout := faultLayout{hot: "standalone-hot"}
	for i := range 100 {
		layout.values = append(layout.values, fmt.Sprintf("standalone-v%03d", i))
	}
	stopNoise := watchNoise(t, []string{srv.Addr}, []*proc{p})
	defer stopNoise()
	stopReadyz := pollReadyz(p, 20*time.Millisecond)
	defer stopReadyz()
	stop := faultLoad{rls: rlsv3.NewRateLimitServiceClient(openFaultConn(t, p.grpcAddr)), mode: "error", layout: layout,
		valueCallers: 4, hotCallers: 2}.start()
	defer stop()
	began := time.Now()
	time.Sleep(faultWarmUp + 500*time.Millisecond)
	faultAt := time.Now()
	if err := proxy.Blackhole(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	passAt := time.Now()
	if err := proxy.Pass(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(faultAfter)
	all := callSet(stop()).where(func(c faultCall) bool { return !c.start.Before(began.Add(faultWarmUp)) })
	polls := stopReadyz()
	nz := stopNoise()

	base := measureBaseline(all.where(func(c faultCall) bool { return c.end.Before(faultAt) && c.value != hotValue }), nz)
	faulted := func(c faultCall) bool { return duringFault(c, faultAt, passAt) }
	checkInTime(t, "standalone black hole, every call but those during the fault", all.where(func(c faultCall) bool { return !faulted(c) }), base, nz)
	checkFaultedInTime(t, "standalone black hole", all.where(faulted), faultAt, passAt, nz, p)
	opened, ok := loggedNode(p, "backend failing", "", faultAt)
	switch {
	case backendFailingAt(p, faultAt):
		// A stall before the fault opened it (see the /readyz check
		// below), and the fault kept it open: nothing to time.
		t.Logf("standalone black hole: the breaker was open already when the fault began, and stayed open")
		opened, ok = faultAt, true
	case !ok:
		t.Fatalf("the breaker never opened during the black hole (no \"backend failing\" line):\n%s", p.logs)
	}
	back, ok := all.firstRedis(passAt, func(c faultCall) bool { return c.value != hotValue })
	t.Logf("standalone black hole: breaker opened (logged) %v after the fault began; Redis decides again %v after it ended; baseline %s",
		opened.Sub(faultAt).Round(100*time.Microsecond), back.Sub(passAt).Round(time.Millisecond), base)
	if !ok || back.Sub(passAt) > recoveryBound(nz, passAt, back) {
		t.Errorf("standalone black hole: Redis decided again %v after the fault ended (found: %v), want within %v (%v + ratelimitd's waits for a CPU meanwhile); breaker lines:\n%s",
			back.Sub(passAt), ok, recoveryBound(nz, passAt, back), faultRecovery, nodeLines(p))
	}
	// /readyz: 200 before (a poll answered before the fault began: one
	// whose probe was in flight at the onset waits for the black hole,
	// and 503 is its right answer); 503 from the breaker's opening (and
	// a poll's round trip) to the fault's end; 200 again from within
	// faultRecovery of the end on.
	// A 503 where 200 is wanted is excused when a stall explains it (see
	// noise.explains), as in testProxyFault: a Redis that held a round
	// trip for --backend-timeout while it, or ratelimitd, waited for a CPU
	// opens the breaker by design, and /readyz then says 503, as it must
	// (measured: breakers opened by round trips held 10.7-14.2 ms in the
	// baseline, on a host at load 6-8).
	var ready time.Time
	var bad []string
	explained := 0
	for _, q := range polls {
		var want int
		switch {
		case q.end.Before(faultAt):
			want = 200
		case q.at.After(opened.Add(5*time.Millisecond)) && q.at.Before(passAt.Add(-5*time.Millisecond)):
			want = 503
		case q.at.After(passAt) && q.code == 200 && ready.IsZero():
			ready = q.at
		}
		if !ready.IsZero() && q.at.After(ready) {
			want = 200
		}
		if want == 200 && q.code == 503 && nz.explainsSpan(q.at, q.at) {
			explained++
			continue
		}
		if want != 0 && q.code != want && len(bad) < 5 {
			bad = append(bad, fmt.Sprintf("%d %q %v after the fault began (want %d)", q.code, q.body, q.at.Sub(faultAt).Round(time.Millisecond), want))
		}
	}
	t.Logf("standalone black hole: /readyz 200 again %v after the fault ended (%d polls, %d 503s where 200 was wanted explained by stalls)",
		ready.Sub(passAt).Round(time.Millisecond), len(polls), explained)
	if len(bad) > 0 {
		t.Errorf("standalone black hole: /readyz said %s; %s; breaker lines:\n%s", strings.Join(bad, "; "), nz.summary(), nodeLines(p))
	}
	if ready.IsZero() || ready.Sub(passAt) > faultRecovery+20*time.Millisecond {
		t.Errorf("standalone black hole: /readyz 200 again %v after the fault ended, want within %v (+ a poll interval)", ready.Sub(passAt), faultRecovery)
	}
}

// checkFaultedInTime checks that the calls of a faulted node during the
// fault (see duringFault) were answered within their deadline at the
// client, but for those a stall explains. ratelimitd answers a call it
// could not decide (one in flight when the fault began, one sent before
// the breaker opened, one sent on a connection the fault still holds
// after it ends) per the failure mode at the end of its budget, a margin
// before the deadline: the margin must leave room for the answer to
// reach the caller. A failure shows p's breaker lines.
func checkFaultedInTime(t *testing.T, what string, cs callSet, faultAt, passAt time.Time, nz noise, p *proc) {
	t.Helper()
	late, explained := nz.failures(cs, pastDeadline)
	var edge int // answered past the deadline by less than 5 ms
	for _, c := range late {
		if c.end.Sub(c.start) < faultDeadline+5*time.Millisecond {
			edge++
		}
	}
	t.Logf("%s: the faulted node's %d calls during the fault: %s (%d past their deadline explained by stalls, %d of them the client's own: see lostByClient)",
		what, len(cs), cs.answers(), explained, len(cs.where(faultCall.lostByClient)))
	if len(late) > 0 {
		var when []string
		for _, c := range late[:min(len(late), 5)] {
			when = append(when, fmt.Sprintf("%v after the fault began (it ended at %v), took %v, %s", c.start.Sub(faultAt).Round(100*time.Microsecond),
				passAt.Sub(faultAt).Round(time.Millisecond), c.end.Sub(c.start).Round(100*time.Microsecond), c.arrival()))
		}
		t.Errorf("%s: %d of the faulted node's %d calls during the fault missed their %v deadline at the client, with no stall to explain it, %d of them by less than 5 ms (ratelimitd answered them too close to the deadline): %s; %s; breaker lines:\n%s",
			what, len(late), len(cs), faultDeadline, edge, strings.Join(when, "; "), nz.summary(), nodeLines(p))
	}
}

// duringFault reports whether c was in flight at some time from a fault's
// start, at faultAt, to a second after its end, at passAt (the time a
// connection the fault held may take to fail: --redis-read-timeout, and
// the breaker's probe after it).
func duringFault(c faultCall, faultAt, passAt time.Time) bool {
	return !c.end.Before(faultAt) && c.start.Before(passAt.Add(time.Second))
}

// breakerBound is how soon after a fault began at faultAt a breaker that
// opened at opened had to: breakerOpenBound, plus the time ratelimitd's
// threads waited for a CPU meanwhile (nz.cpuWait), when its timers could
// not fire. (Measured on this machine: 20 to 24 ms.)
func breakerBound(nz noise, faultAt, opened time.Time) time.Duration {
	return breakerOpenBound + nz.cpuWait(faultAt, opened)
}

// recoveryBound is how soon after a fault ended at passAt Redis had to
// decide its node's buckets again, when it did at back: faultRecovery,
// plus the time ratelimitd's threads waited for a CPU meanwhile, when
// its probe's timers could not fire (as for breakerBound). Measured on
// this machine: 55-270 ms on a quiet host; 0.6 s once, while ratelimitd
// waited for a CPU 20 ms or more a hundred times in the run.
func recoveryBound(nz noise, passAt, back time.Time) time.Duration {
	return faultRecovery + nz.cpuWait(passAt, back)
}

// fastFallback is how soon a call answered per the failure mode by an
// open breaker is answered, at most: it does not wait for Redis.
const fastFallback = 5 * time.Millisecond

// firstFastFallback returns the start of the first call of cs, sent at
// or after faultAt, answered per the failure mode (not by Redis, nor past
// its deadline at the client) within fastFallback: the faulted node's
// breaker was open then.
func firstFastFallback(cs callSet, faultAt time.Time) (time.Time, bool) {
	for _, c := range cs { // by start
		if !c.start.Before(faultAt) && !c.redis && c.code != codes.DeadlineExceeded && c.end.Sub(c.start) < fastFallback {
			return c.start, true
		}
	}
	return time.Time{}, false
}
