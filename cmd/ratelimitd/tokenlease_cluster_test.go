package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/tokenlease"
)

// leaseClusterConfig is clusterFaultsConfig with a hot bucket to lease:
// 800 a second, burst 800 (a slice is at most 50 tokens): 16 tokens
// arrive in a Hold, about one process's demand, so that slices are
// reserved even while the two processes keep the bucket empty.
// The bucket keys are clusterFaultsConfig's (a key names the domain and
// the entries, not the limit), so faultLayout finds their masters.
var leaseClusterConfig = faultsConfig(leaseHotRate, leaseHotBurst)

const (
	leaseHotRate, leaseHotBurst = 800.0, 800.0
	// leaseProcs ratelimitd processes share the hot bucket, each called
	// by leaseHotCallers on it and leaseWideCallers over the wide values,
	// each pausing leasePause after a call: on this 2-core machine,
	// otherwise quiet, 700-830 hot calls a second a process, over
	// tokenlease.DefaultBusy (500), so that each leases, and together
	// about twice the bucket's rate (beside other work, as few as 30:
	// see leaseJudgedFrom).
	leaseProcs       = 2
	leaseHotCallers  = 6
	leaseWideCallers = 1
	leasePause       = 2 * time.Millisecond
	// leaseBeforeKill is how long the load runs, after faultWarmUp,
	// before the kill: long enough for the callers to empty the bucket's
	// burst (offering 1,000 to 1,500 a second) and lease it empty.
	leaseBeforeKill = 2 * time.Second
	// leaseJudgedFrom is the hot calls a second a process from which
	// the test asks that the processes leased: half as many again as
	// tokenlease.DefaultBusy, so that most 20 ms windows are busy.
	leaseJudgedFrom = 1.5 * tokenlease.DefaultBusy
	// sliceLife is the longest a slice answers after its take: a Hold
	// after it was taken, or half a Hold after its last token, reserved
	// within a Hold, arrives.
	sliceLife = tokenlease.DefaultHold + tokenlease.DefaultHold/2
	// lastSliceAnswer is how long after a master dies a slice of its
	// bucket may still answer: a slice taken just before, whose answer
	// the process read as late as its caller's budget allowed (a
	// deadline; a later answer fills no slice), lives sliceLife from
	// then. The denial cache's denials, learned from Redis by then and
	// kept for Redis's retry-after (at most a Hold's reservations ahead),
	// end within it too.
	lastSliceAnswer = faultDeadline + sliceLife
	// lostTakes is what a master's crash may leave unreplicated, and so
	// admitted again by its promoted replica (docs/failure-modes.md: the
	// takes of the last instant before a crash): a slice and a take of
	// each other caller, for each process.
	lostTakes = leaseProcs * (leaseHotBurst/tokenlease.DefaultShareDivisor + leaseHotCallers - 1)
)

// TestTokenLeasesClusterFailover: two ratelimitd processes with
// --token-leases, in error mode, share a hot bucket on a Redis Cluster
// (three masters with a replica each) under load that keeps it empty; the
// master that holds the hot bucket's slot is SIGKILLed and its replica
// promoted. It checks that
//   - (a) the hot bucket admits at most rate·t + burst (+ lostTakes, the
//     takes a crash may leave unreplicated), counted from the first call,
//     at every admission of either process;
//   - (b) every call is answered within its 20 ms deadline, but for what
//     the fault kit's noise explains (checkInTime);
//   - (c) after the kill the hot bucket is answered by the slices the
//     processes still held, by lastSliceAnswer at the latest, then
//     UNAVAILABLE until the promotion; Redis decides it again within
//     clusterFailoverRecovery of the promotion, and every bucket from
//     then on;
//   - (d) Redis ran no more scripts than the processes asked for: no take
//     (a slice, a give-back) ran twice;
//
// and, when the host let the callers make the bucket busy (see
// leaseJudgedFrom), that the processes leased it before the kill: a
// tenth of its admissions at least came from slices.
func TestTokenLeasesClusterFailover(t *testing.T) {
	skipUnlessHeavy(t)
	rc := redistest.StartReplicatedCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1, NodeTimeout: time.Second})
	const victim = 0
	target := rc.MasterAddr(victim)
	layout := newFaultLayout(t, rc, "lease", 100, target)
	onVictim := map[int]bool{}
	for _, i := range layout.on(func(o string) bool { return o == target }) {
		onVictim[i] = true
	}
	var seeds, healthy []string
	for _, m := range rc.Masters() {
		seeds = append(seeds, m.Addr)
		if m.Addr != target {
			healthy = append(healthy, m.Addr)
		}
	}
	dir := writeConfig(t, map[string]string{"faults.yaml": leaseClusterConfig})
	var procs []*proc
	var loads []faultLoad
	for range leaseProcs {
		p := startProc(t, append([]string{"--config", dir, "--redis-cluster-addrs", strings.Join(seeds, ","), "--token-leases",
			"--on-backend-failure", "error"}, faultLogLevel()...)...)
		procs = append(procs, p)
		loads = append(loads, faultLoad{rls: rlsv3.NewRateLimitServiceClient(openFaultConn(t, p.grpcAddr)), mode: "error", layout: layout,
			valueCallers: leaseWideCallers, hotCallers: leaseHotCallers, pause: leasePause})
	}
	nodes := func() []string {
		var addrs []string
		for _, m := range rc.Masters() {
			addrs = append(addrs, m.Addr)
			for _, r := range rc.ReplicasOf(m.Addr) {
				addrs = append(addrs, r.Addr)
			}
		}
		return addrs
	}
	asked := func() float64 {
		total := 0.0
		for _, p := range procs {
			total += scrape(t, p).value("ratelimitd_redis_script_calls_total")
		}
		return total
	}
	ranBefore, askedBefore := scriptsRan(t, nodes()), asked()
	victimBefore := scriptsRan(t, []string{target})

	stopNoise := watchNoise(t, healthy, procs)
	defer stopNoise()
	var stops []func() []faultCall
	for _, l := range loads {
		stops = append(stops, l.start())
	}
	stopAll := func() (all callSet) {
		for _, s := range stops {
			all = append(all, s()...)
		}
		slices.SortFunc(all, func(a, b faultCall) int { return a.start.Compare(b.start) })
		return all
	}
	defer stopAll()
	began := time.Now()
	time.Sleep(faultWarmUp + leaseBeforeKill)
	counted := time.Now()
	victimRan := scriptsRan(t, []string{target}) // the victim's last count, of every call ended by counted
	// SIGKILL here, at a known time: KillMaster asks the cluster for the
	// master's slots and replicas first, then kills it (again, to no
	// effect) and returns once it has reaped it, tens of ms later on a
	// busy host, and the victim's sockets reset later still. From died
	// on, it decides nothing.
	died := killVictim(t, target)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	killed, promotedTo, promoted := failOver(ctx, t, rc, victim, func() { stopAll() })
	calls := stopAll()
	if err := rc.WaitStateOK(ctx); err != nil {
		t.Errorf("the cluster is not ok after the failover: %v", err)
	}
	nz := stopNoise()
	nz.nodeOf = layout.nodeOf
	ranAfter := scriptsRan(t, slices.DeleteFunc(nodes(), func(a string) bool { return a == target }))
	askedAfter := asked()
	t.Logf("master %s SIGKILLed %v into the load; replica %s promoted %v later; noise: %s", target, killed.Sub(began).Round(time.Millisecond),
		promotedTo, promoted.Sub(killed).Round(time.Millisecond), nz.summary())

	hot := func(c faultCall) bool { return c.value == hotValue }
	hotCalls := callSet(calls).where(hot)
	all := callSet(calls).where(func(c faultCall) bool { return !c.start.Before(began.Add(faultWarmUp)) })
	before := all.where(func(c faultCall) bool { return c.end.Before(died) })
	base := measureBaseline(before, nz)
	t.Logf("%.0f calls/s before the kill (%.0f/s on the hot bucket: %s), %d hot calls in all", before.rate(), before.where(hot).rate(),
		before.where(hot).answers(), len(hotCalls))

	// The processes leased: an admission not from a slice is a script
	// of its own on the victim, as is each wide call on it; slices,
	// give-backs and denials add more. So at least admitted − (scripts −
	// wide calls) admissions came from slices, counting the calls that
	// ended before the victim's scripts were (some of the scripts counted
	// are of calls that ended after: fewer from slices, not more).
	upToKill := callSet(calls).where(func(c faultCall) bool { return c.end.Before(counted) })
	hotAdmitted := upToKill.where(hot).admitted()
	wideOnVictim := len(upToKill.where(func(c faultCall) bool { return !hot(c) && onVictim[c.value] }))
	victimScripts := victimRan - victimBefore
	fromSlicesAtLeast := hotAdmitted - (victimScripts - wideOnVictim)
	perProc := upToKill.where(hot).rate() / leaseProcs
	t.Logf("before the kill: %.0f hot calls a second a process; %d hot calls admitted, %d wide calls on the victim, which ran %d scripts: %d admissions or more from slices",
		perProc, hotAdmitted, wideOnVictim, victimScripts, fromSlicesAtLeast)
	switch {
	case perProc < leaseJudgedFrom:
		// A host too busy for the callers to make a bucket busy: nothing
		// to lease, and the rest is checked without slices.
		t.Logf("the processes' hot demand, %.0f calls a second each, is under %v: whether they leased is not judged", perProc, leaseJudgedFrom)
	case fromSlicesAtLeast < hotAdmitted/10:
		t.Errorf("before the kill, %d of %d hot admissions or more came from slices at %.0f hot calls a second a process, want a tenth: the processes did not lease the hot bucket",
			fromSlicesAtLeast, hotAdmitted, perProc)
	}

	checkLeaseBound(t, hotCalls, lostTakes)
	checkInTime(t, "every call", all, base, nz)

	// (c) After the kill: the slices, then the failure mode, then Redis.
	unavailable := func(c faultCall) bool { return c.code == codes.Unavailable }
	sliceEnd := died.Add(lastSliceAnswer)
	// From then on Redis decides nothing of the victim's until the
	// promotion: an admission is a slice's, a denial a slice's (its next
	// token not yet arrived) or the denial cache's.
	afterDeath := hotCalls.where(func(c faultCall) bool {
		return !c.start.Before(died) && c.end.Before(promoted.Add(-250*time.Millisecond))
	})
	last := time.Duration(0)
	for _, c := range afterDeath.where(func(c faultCall) bool { return c.code == codes.OK }) {
		last = max(last, c.end.Sub(died))
	}
	t.Logf("the victim SIGKILLed %v before KillMaster returned; in the %v after, the hot bucket answered %s; the last admission (a slice's) %v after",
		killed.Sub(died).Round(100*time.Microsecond), lastSliceAnswer, afterDeath.where(func(c faultCall) bool { return c.start.Before(died.Add(lastSliceAnswer)) }).answers(),
		last.Round(100*time.Microsecond))
	back, ok := hotCalls.firstRedis(sliceEnd, func(c faultCall) bool { return true })
	if !ok {
		t.Fatalf("%v after the promotion, the hot bucket is still not decided by Redis: answers since the promotion %s\n%s",
			clusterFailoverAfter, hotCalls.where(func(c faultCall) bool { return !c.start.Before(promoted) }).answers(), nodeLines(procs[0]))
	}
	outage := hotCalls.where(func(c faultCall) bool { return !c.start.Before(sliceEnd) && c.end.Before(back) })
	t.Logf("the hot bucket from %v after the kill to Redis's first answer again, %v after the promotion: %s",
		lastSliceAnswer, back.Sub(promoted).Round(time.Millisecond), outage.answers())
	for _, c := range outage {
		if !unavailable(c) && c.code != codes.DeadlineExceeded {
			t.Errorf("a hot call %v after the kill answered %s, want UNAVAILABLE (error mode): no slice answers %v after its master died; outage answers %s",
				c.start.Sub(died).Round(100*time.Microsecond), c.answer(), lastSliceAnswer, outage.answers())
			break
		}
	}
	if len(outage.where(unavailable)) == 0 {
		t.Errorf("no hot call answered UNAVAILABLE between the kill and the promotion (%s): the failure mode never answered", outage.answers())
	}
	switch {
	case back.Before(promoted.Add(-250 * time.Millisecond)):
		t.Errorf("the hot bucket was answered %s %v before the promotion, %v after the kill: neither a slice nor Redis could",
			"OK or OVER_LIMIT", promoted.Sub(back).Round(time.Millisecond), back.Sub(killed).Round(time.Millisecond))
	case back.Sub(promoted) > clusterFailoverRecovery:
		t.Errorf("the hot bucket was decided by Redis again %v after the promotion, want within %v", back.Sub(promoted), clusterFailoverRecovery)
	}
	// From then on (and 200 ms for the calls in flight), answered by
	// Redis or its slices: the failure mode's answers no more often than
	// in the baseline (+0.1%), but for those a stall explains. (Answers
	// past their deadline are judged once, with every call, above.)
	recovered := all.where(func(c faultCall) bool { return !c.start.Before(back.Add(200 * time.Millisecond)) })
	answered := func(c faultCall) bool { return c.code != codes.DeadlineExceeded }
	fellBack, explained := nz.failures(recovered.where(answered), notDecided)
	allowed := base.allowance(len(recovered.where(answered)), base.notRedis)
	t.Logf("after the recovery: %d calls (%s), %d answered per the failure mode (%d more explained by stalls; allowed %d)",
		len(recovered), recovered.answers(), len(fellBack), explained, allowed)
	if len(fellBack) > allowed {
		t.Errorf("after the recovery: %d of %d calls answered per the failure mode and not explained by a stall (%s), want at most %d; %s; the first: %s",
			len(fellBack), len(recovered), fellBack.answers(), allowed, nz.summary(), nz.describe(fellBack))
	}

	// (d) No take ran twice. The victim's scripts are counted up to just
	// before the kill, a few too few.
	ran := ranAfter + victimRan - ranBefore
	t.Logf("Redis ran %d scripts; the processes asked for %.0f script calls", ran, askedAfter-askedBefore)
	if float64(ran) > askedAfter-askedBefore {
		t.Errorf("Redis ran %d scripts, more than the %.0f script calls the processes asked for: a take ran twice", ran, askedAfter-askedBefore)
	}
}

// checkLeaseBound checks that the hot calls cs admitted at most
// leaseHotRate·t + leaseHotBurst + extra by every time t from the first
// call's start: at each admitted call's end, what was admitted by then
// (every call that ended before). It logs the admissions of each second.
func checkLeaseBound(t *testing.T, cs callSet, extra float64) {
	t.Helper()
	if len(cs) == 0 {
		t.Fatal("no hot calls")
	}
	t0 := cs[0].start
	var ends []time.Time
	for _, c := range cs {
		if c.admitted {
			ends = append(ends, c.end)
		}
	}
	slices.SortFunc(ends, time.Time.Compare)
	perSecond := map[int]int{}
	worst, worstAt := -1e9, time.Duration(0)
	for i, end := range ends {
		perSecond[int(end.Sub(t0)/time.Second)]++
		bound := leaseHotRate*end.Sub(t0).Seconds() + leaseHotBurst + extra
		if over := float64(i+1) - bound; over > worst {
			worst, worstAt = over, end.Sub(t0)
		}
	}
	var secs []string
	for s := 0; s <= int(cs.span()/time.Second); s++ {
		secs = append(secs, fmt.Sprint(perSecond[s]))
	}
	t.Logf("hot bucket: %d admitted of %d calls over %v; by second %s; admitted − (rate·t + burst) at most %+.0f, at %v (allowed: %.0f)",
		len(ends), len(cs), cs.span().Round(time.Millisecond), strings.Join(secs, " "), worst+extra, worstAt.Round(time.Millisecond), extra)
	if worst > 0 {
		t.Errorf("hot bucket: %.0f more admitted by %v than rate·t + burst + %.0f (%.0f/s, %.0f)", worst, worstAt.Round(time.Millisecond), extra, leaseHotRate, leaseHotBurst)
	}
}

// killVictim sends SIGKILL to the redis-server at addr (its pid from
// INFO server) and returns when it did.
func killVictim(t *testing.T, addr string) time.Time {
	t.Helper()
	pid := redisPID(t, addr)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL redis-server %d (%s): %v", pid, addr, err)
	}
	return time.Now()
}
