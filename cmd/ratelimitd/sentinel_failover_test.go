package main

// A Sentinel failover under load, in every failure mode: the master is
// SIGKILLed while two ratelimitd processes share one bucket on it, three
// real sentinels promote its replica, and the test measures how long after
// +switch-master the processes answer from Redis again and counts every
// admission against rate·t + burst.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// sentinelFailoverConfig is meshConfig's bucket (100/s, burst 20: the
// load) and a probe rule of one call an hour for each value.
const sentinelFailoverConfig = meshConfig + `  - key: probe
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// The load bucket's limit, as sentinelFailoverConfig has it.
const (
	failoverRate  = 100.0 // tokens a second
	failoverBurst = 20.0
)

// Timings of TestSentinelFailoverUnderLoad.
const (
	failoverCallTimeout = time.Second // each call's deadline
	// failoverRecoveryBound is the most the processes may take, after
	// +switch-master, to answer from Redis again. Measured on a 2-core
	// machine: 0.3–0.7 s, up to 1.9 s while other work saturated it
	// (--breaker-open-for is 500 ms: a probe that misses the new master
	// waits that long for the next).
	failoverRecoveryBound = 3 * time.Second
	// failoverAfter is how long the load goes on once both processes
	// answer from Redis again.
	failoverAfter = 1500 * time.Millisecond
)

// TestSentinelFailoverUnderLoad SIGKILLs the Sentinel-managed master under
// load and, in each failure mode, checks that
//   - both processes answer from Redis (the promoted replica) again within
//     failoverRecoveryBound of +switch-master (or before it: a client
//     finds the new master as soon as a sentinel names it, which the
//     leader does a moment before it announces the switch);
//   - while no Redis can decide (from the kill until the leader sentinel
//     sends REPLICAOF NO ONE to the replica), every call is answered per
//     the failure mode: UNAVAILABLE, OK, OVER_LIMIT, or the local buckets;
//   - admissions decided by Redis never exceed rate·t + burst: before the
//     kill, after recovery, and over the whole episode where the failure
//     mode admits nothing (error, deny) or only its local share (local);
//   - no call outlives its deadline.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	for _, tt := range []failoverCase{
		{mode: "error", outage: []string{"Unavailable"}, fresh: "Unavailable"},
		{mode: "allow", outage: []string{"OK"}, fresh: "OK"},
		{mode: "deny", outage: []string{"OVER_LIMIT"}, fresh: "OVER_LIMIT"},
		// The local buckets both admit and deny; the one of a value never
		// seen has a token (--replicas-hint leaves every bucket at least
		// one). Two replicas: each local bucket has half the rate and
		// burst.
		{mode: "local", outage: []string{"OK", "OVER_LIMIT"}, fresh: "OK", flags: []string{"--replicas-hint", "2"}},
	} {
		t.Run(tt.mode, func(t *testing.T) { testSentinelFailover(t, tt) })
	}
}

// failoverCase is a failure mode and how it answers. An answer is OK,
// OVER_LIMIT or the gRPC code of an error.
type failoverCase struct {
	mode string
	// outage lists the answers, every one of them given, while no Redis
	// can decide.
	outage []string
	// fresh is the answer to a bucket the process has never seen, while
	// no Redis can decide.
	fresh string
	// flags are added to both processes' command lines.
	flags []string
}

func testSentinelFailover(t *testing.T, tt failoverCase) {
	mode := tt.mode
	g := redistest.StartSentinelGroup(t, "rl-master")
	dir := writeConfig(t, map[string]string{"mesh.yaml": sentinelFailoverConfig})
	// Every timing flag is left at its default (--backend-timeout 10 ms,
	// --breaker-open-for 500 ms): the time to answers from Redis again is
	// measured as an operator gets it.
	args := []string{"--config", dir, "--redis-sentinel-master", g.MasterName,
		"--redis-sentinel-addrs", strings.Join(g.SentinelAddrs, ","), "--on-backend-failure", mode}
	args = append(args, tt.flags...)
	procs := []*proc{startProc(t, args...), startProc(t, args...)}
	conns := make([]rlsv3.RateLimitServiceClient, len(procs))
	for i, p := range procs {
		conns[i] = rlsClient(t, p.grpcAddr)
	}
	dump := func() string {
		var b strings.Builder
		for _, e := range g.Events() {
			fmt.Fprintf(&b, "%s %s %s %s\n", e.At.Format("15:04:05.000"), e.Sentinel, e.Name, e.Payload)
		}
		for i, p := range procs {
			fmt.Fprintf(&b, "ratelimitd %d:\n%s", i, p.logs)
		}
		return b.String()
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	loaded := make(chan []timedCall, 1)
	go func() { loaded <- runTimedLoad(ctx, conns, 20, failoverCallTimeout) }()
	probes := &failoverProbes{fresh: tt.fresh}
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		probes.run(ctx, conns)
	}()
	finish := func() []timedCall {
		stop()
		<-probed
		return <-loaded
	}

	time.Sleep(time.Second)
	// Calls that end before the signal are Redis's; those that fail
	// while the master dies (EOF) end between the two times.
	signalled := time.Now()
	killed := g.KillMaster()
	waitCtx, cancelWait := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelWait()
	newMaster, switched, err := g.WaitSwitchMaster(waitCtx)
	if err != nil {
		finish()
		// A sentinel in TILT mode acts on nothing for 30 s. The group
		// raises the trigger for a stall to a minute, but a clock that
		// steps back (as a virtual machine's may) trips it at once: the
		// failover this test is about cannot happen then.
		if _, tilt := g.WaitEvent(expired(), "+tilt"); tilt == nil {
			t.Skipf("the sentinels entered TILT mode (the clock stepped back or stalled), so no failover could happen: %v\n%s", err, dump())
		}
		t.Fatalf("%v after SIGKILL of the master:\n%s", err, dump())
	}
	if took := switched.Sub(killed); took > 3*time.Second {
		// A split vote or an aborted promotion: the sentinels retry after
		// twice their failover-timeout.
		t.Logf("+switch-master took %v; the sentinels' events:\n%s", took, dump())
	}
	if newMaster != g.Replica.Addr {
		t.Errorf("+switch-master to %s, want the replica %s", newMaster, g.Replica.Addr)
	}
	// The first moment a Redis could decide again is after the leader
	// sentinel sent REPLICAOF NO ONE to the replica, which it announces
	// just before; until then the dead master and the read-only replica
	// decide nothing, so every answer is the failure mode's. (A client
	// reaches the new master only later still: once a sentinel names it
	// for get-master-addr-by-name, after +promoted-slave.)
	noone, err := g.WaitEvent(waitCtx, "+failover-state-send-slaveof-noone")
	if err != nil {
		finish()
		t.Fatalf("%v, yet +switch-master came:\n%s", err, dump())
	}

	// back is when the later of the two processes answered from Redis
	// again.
	var recovered [2]time.Time
	var back time.Time
	var fallbacksAtBack []map[string]float64
	for {
		if r, ok := probes.recovered(killed); ok {
			recovered, back = r, slices.MaxFunc(r[:], time.Time.Compare)
			fallbacksAtBack = fallbackCounts(t, procs)
			break
		} else if time.Since(switched) > failoverRecoveryBound {
			recovered = r
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !back.IsZero() {
		time.Sleep(time.Until(back.Add(failoverAfter)))
	}
	calls := finish()
	// What each process answered per the failure mode after recovery, and
	// why (the counters moved by calls already in flight at recovery, and
	// by any fallback since: "overloaded" is this machine's saturation,
	// not Redis).
	var since []string
	if fallbacksAtBack != nil {
		for i, now := range fallbackCounts(t, procs) {
			for k, v := range now {
				if d := v - fallbacksAtBack[i][k]; d > 0 {
					since = append(since, fmt.Sprintf("process %d %s +%.0f", i, k, d))
				}
			}
		}
		slices.Sort(since)
		t.Logf("%s mode: failure-mode answers since both processes answer from Redis again: %v", tt.mode, since)
	}
	if back.IsZero() {
		t.Fatalf("%s mode: %v after +switch-master, a process still does not answer from Redis (recovered at %v; probes: %s):\n%s",
			mode, failoverRecoveryBound, recovered, probes.summary(killed), dump())
	}
	if !probes.redisBefore(signalled) {
		t.Fatalf("the probe never saw both processes answer from Redis before the kill: it cannot tell a recovery (probes: %s)", probes.summary(time.Time{}))
	}

	if len(calls) == 0 {
		t.Fatal("the load made no call")
	}
	first, last := calls[0].start, calls[0].end
	var slowest time.Duration
	for _, c := range calls {
		if c.end.After(last) {
			last = c.end
		}
		slowest = max(slowest, c.end.Sub(c.start))
	}
	var own []string // what each process logged
	for _, p := range procs {
		if at, ok := loggedAfter(p, "backend answers again", killed); ok {
			own = append(own, at.Sub(switched).Round(time.Millisecond).String())
		} else {
			own = append(own, "never")
		}
	}
	t.Logf("%s mode: +switch-master %v after SIGKILL; answers from Redis again %v after +switch-master (process 0 %v, 1 %v; logged \"backend answers again\" at %s); %d calls in %v, the slowest %v",
		mode, switched.Sub(killed).Round(time.Millisecond), back.Sub(switched).Round(time.Millisecond),
		recovered[0].Sub(switched).Round(time.Millisecond), recovered[1].Sub(switched).Round(time.Millisecond),
		strings.Join(own, ", "), len(calls), last.Sub(first).Round(time.Millisecond), slowest.Round(time.Millisecond))
	if took := back.Sub(switched); took > time.Second && took <= failoverRecoveryBound {
		// Within the bound, but slower than usual: say why.
		t.Logf("answers from Redis resumed %v after +switch-master, slower than the usual 0.3–0.7 s (probes: %s):\n%s",
			took.Round(time.Millisecond), probes.summary(killed), dump())
	}
	if took := back.Sub(switched); took > failoverRecoveryBound {
		t.Errorf("answers from Redis resumed %v after +switch-master, want within %v", took, failoverRecoveryBound)
	}

	// No call outlives its deadline: every one is answered, or fails with
	// a code of its own, before it.
	if all := tally(calls, nil); all.errs[codes.DeadlineExceeded]+all.errs[codes.Canceled] > 0 || slowest >= failoverCallTimeout {
		t.Errorf("calls hung: %v, slowest %v, want every call answered within its %v deadline", all.errs, slowest, failoverCallTimeout)
	}

	// Before the kill: Redis decides every call.
	pre := tally(calls, func(c timedCall) bool { return c.end.Before(signalled) })
	checkBound(t, "before the kill", pre, signalled.Sub(first), 0)
	if pre.failed() > 0 {
		// Redis was healthy: issue 16's "no UNAVAILABLE while Redis is
		// healthy".
		t.Errorf("before the kill, %d calls failed (%v), want all answered by Redis:\n%s", pre.failed(), pre.errs, dump())
	}

	// While no Redis can decide: the failure mode's answers alone. The
	// window starts a little after the kill: the denial cache may still
	// deny, for Redis, a call on a bucket Redis denied just before it, for
	// Redis's retry-after, at most a token's interval (10 ms).
	from := killed.Add(2 * time.Second / time.Duration(failoverRate))
	outage := func(c timedCall) bool { return !c.start.Before(from) && c.end.Before(noone.At) }
	outageLen := noone.At.Sub(from)
	out := tally(calls, outage)
	t.Logf("%s mode: in the %v from the kill to REPLICAOF NO ONE: %d admitted, %d denied, errors %v",
		mode, outageLen.Round(time.Millisecond), out.admitted, out.denied, out.errs)
	if out.calls() < 20 {
		t.Fatalf("only %d calls between the kill and REPLICAOF NO ONE (%v): too few to judge the failure mode", out.calls(), outageLen)
	}
	var wrong []string
	seen := map[string]bool{}
	for _, c := range calls {
		if !outage(c) {
			continue
		}
		seen[c.answer()] = true
		if !slices.Contains(tt.outage, c.answer()) && len(wrong) < 5 {
			wrong = append(wrong, fmt.Sprintf("%s asked %v after the kill", c.answer(), c.start.Sub(killed).Round(time.Microsecond)))
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%s mode, master down: %d admitted, %d denied, errors %v; want only %v; first wrong: %s",
			mode, out.admitted, out.denied, out.errs, tt.outage, strings.Join(wrong, ", "))
	}
	for _, a := range tt.outage {
		if !seen[a] {
			t.Errorf("%s mode, master down: no call answered %s (%d admitted, %d denied, errors %v)", mode, a, out.admitted, out.denied, out.errs)
		}
	}
	if mode == "local" {
		// Two local buckets of half the rate and burst: together at most
		// rate·t + burst.
		checkBound(t, "local buckets, master down", out, outageLen, 0)
	}

	// After both processes answer from Redis again: Redis decides every
	// call, and the bucket admits about its rate (it refilled in the
	// outage).
	post := tally(calls, func(c timedCall) bool { return !c.start.Before(back) })
	postLen := last.Sub(back)
	checkBound(t, "after recovery", post, postLen, 0)
	if post.failed() > 0 {
		t.Errorf("after recovery, %d calls failed (%v), want all answered by Redis (failure-mode answers since: %v):\n%s",
			post.failed(), post.errs, since, dump())
	}
	if least := 0.5 * failoverRate * postLen.Seconds(); float64(post.admitted) < least {
		t.Errorf("after recovery, %d admitted in %v, want at least %.0f (half the rate): is Redis deciding?", post.admitted, postLen, least)
	}

	// The whole episode. Error and deny modes admit nothing without
	// Redis, so Redis's bucket bounds it all: the promoted replica holds
	// the bucket as replicated, the takes of the last instant before the
	// kill maybe lost (replication is asynchronous), which the 1% margin
	// covers. Local mode adds its share: each process's local bucket (half
	// the rate and burst, --replicas-hint 2) admits at most
	// rate/2·t + burst/2 while it answers, which is from the kill until
	// that process answers from Redis again, so both together at most
	// rate·(back − kill) + burst. Allow mode admits every call of the
	// outage: only the periods before and after are bounded, above.
	whole := tally(calls, nil)
	switch mode {
	case "error", "deny":
		checkBound(t, "the whole episode", whole, last.Sub(first), 0)
	case "local":
		share := failoverRate*back.Sub(signalled).Seconds() + failoverBurst
		checkBound(t, "the whole episode, with the local buckets' share", whole, last.Sub(first), share)
	}
}

// fallbackCounts reads each process's ratelimitd_failure_mode_answers_total
// from /metrics, by labels.
func fallbackCounts(t *testing.T, procs []*proc) []map[string]float64 {
	t.Helper()
	const name = "ratelimitd_failure_mode_answers_total"
	var counts []map[string]float64
	for _, p := range procs {
		m := map[string]float64{}
		_, body := servertest.Get(t, "http://"+p.httpAddr+"/metrics")
		for line := range strings.Lines(body) {
			labels, ok := strings.CutPrefix(strings.TrimSpace(line), name)
			if i := strings.LastIndexByte(labels, ' '); ok && i >= 0 {
				v, err := strconv.ParseFloat(labels[i+1:], 64)
				if err == nil {
					m[labels[:i]] = v
				}
			}
		}
		counts = append(counts, m)
	}
	return counts
}

// loggedAfter returns the time of the first line p logged with message msg
// after t.
func loggedAfter(p *proc, msg string, t time.Time) (time.Time, bool) {
	for l := range p.logLines() {
		if l.Msg == msg && l.Time.After(t) {
			return l.Time, true
		}
	}
	return time.Time{}, false
}

// timedCall is one ShouldRateLimit call of runTimedLoad.
type timedCall struct {
	start, end time.Time
	code       codes.Code // OK when answered
	admitted   bool
}

// answer is OK, OVER_LIMIT or the error's code.
func (c timedCall) answer() string { return answerOf(c.code, c.admitted) }

// runTimedLoad is runLoad recording every call: clients call
// ShouldRateLimit on the bucket of meshConfig through conns, round-robin,
// until ctx is done, each call with its own deadline. The calls are
// returned in the order they started.
func runTimedLoad(ctx context.Context, conns []rlsv3.RateLimitServiceClient, clients int, callTimeout time.Duration) []timedCall {
	per := make([][]timedCall, clients)
	callEach(ctx, conns, clients, callTimeout, meshRequest(), func(i int, start, end time.Time, resp *rlsv3.RateLimitResponse, err error) {
		per[i] = append(per[i], timedCall{start: start, end: end, code: status.Code(err),
			admitted: err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK})
	})
	all := slices.Concat(per...)
	slices.SortFunc(all, func(a, b timedCall) int { return a.start.Compare(b.start) })
	return all
}

// callTally counts the outcomes of some calls.
type callTally struct {
	admitted, denied int
	errs             map[codes.Code]int
}

func (c callTally) failed() int {
	n := 0
	for _, v := range c.errs {
		n += v
	}
	return n
}

func (c callTally) calls() int { return c.admitted + c.denied + c.failed() }

// tally counts the calls keep selects (nil: all).
func tally(calls []timedCall, keep func(timedCall) bool) callTally {
	t := callTally{errs: map[codes.Code]int{}}
	for _, c := range calls {
		switch {
		case keep != nil && !keep(c):
		case c.code != codes.OK:
			t.errs[c.code]++
		case c.admitted:
			t.admitted++
		default:
			t.denied++
		}
	}
	return t
}

// checkBound checks that the calls of a period of length d admitted at most
// rate·d + burst + extra, with a 1% margin: a token bucket's bound over any
// period.
func checkBound(t *testing.T, period string, c callTally, d time.Duration, extra float64) {
	t.Helper()
	upper := failoverRate*d.Seconds() + failoverBurst + extra
	t.Logf("%s (%v): %d admitted, %d denied, errors %v; bound %.0f", period, d.Round(time.Millisecond), c.admitted, c.denied, c.errs, upper)
	if float64(c.admitted) > upper*1.01 {
		t.Errorf("%s: %d admitted in %v, more than rate·t + burst + %.0f = %.0f (+1%%)",
			period, c.admitted, d.Round(time.Millisecond), extra, upper)
	}
}

// failoverProbes tells answers decided by Redis from the failure mode's,
// from outside the processes. Each probe takes a fresh value of the probe
// rule (one call an hour) through one process, then through the other;
// they take turns at being first. A bucket both share, in Redis, answers
// OK then OVER_LIMIT. The failure mode answers a value its process has
// never seen in one way only: error UNAVAILABLE, allow OK, deny
// OVER_LIMIT, local OK (the local bucket of the value is fresh, and
// --replicas-hint leaves it at least one token). So an answer that is
// neither an error nor that one is Redis's: in error mode any answer, in
// deny mode the first call's OK, in allow and local modes the second
// call's OVER_LIMIT (Redis charged the first call, whatever that call was
// answered: a take Redis applied may still be answered per the failure
// mode, its reply late). Each process is first and second in turn, so
// the later of the two to answer from Redis again is dated within a probe
// period (two calls and 10 ms); in allow and local modes the earlier is
// seen only then too (the other's calls charge nothing in Redis before),
// so its own figure is an upper bound. (Pairing alone would not do: in deny mode a Redis OK
// just before the kill and the failure mode's OVER_LIMIT just after it
// look like Redis's pair.) The denial cache plays no part: every value is
// new.
type failoverProbes struct {
	fresh string // the failure mode's answer to a value never seen

	mu    sync.Mutex
	calls []probeCall
}

type probeCall struct {
	proc       int // which process answered
	start, end time.Time
	got        string // OK, OVER_LIMIT, or the error's code
	redis      bool   // the answer is Redis's
}

// run probes through conns (two of them) until ctx is done.
func (p *failoverProbes) run(ctx context.Context, conns []rlsv3.RateLimitServiceClient) {
	call := func(proc int, value string) probeCall {
		callCtx, cancel := context.WithTimeout(context.Background(), failoverCallTimeout)
		defer cancel()
		pc := probeCall{proc: proc, start: time.Now()}
		resp, err := conns[proc].ShouldRateLimit(callCtx, servertest.Request("mesh", servertest.Desc("probe", value)))
		pc.end = time.Now()
		if err != nil {
			pc.got = status.Code(err).String()
		} else {
			pc.got = resp.GetOverallCode().String()
		}
		return pc
	}
	for n := 0; ctx.Err() == nil; n++ {
		value := fmt.Sprintf("p%d", n)
		for _, proc := range []int{n % 2, (n + 1) % 2} {
			c := call(proc, value)
			c.redis = (c.got == "OK" || c.got == "OVER_LIMIT") && c.got != p.fresh
			p.mu.Lock()
			p.calls = append(p.calls, c)
			p.mu.Unlock()
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// recovered returns, for each of the two processes, when it first
// answered from Redis a call it was asked after since, and whether both
// did.
func (p *failoverProbes) recovered(since time.Time) ([2]time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var at [2]time.Time
	found := 0
	for _, c := range p.calls {
		if c.redis && !c.start.Before(since) && at[c.proc].IsZero() {
			at[c.proc] = c.end
			found++
		}
	}
	return at, found == len(at)
}

// redisBefore says whether each of the two processes answered from Redis
// before t.
func (p *failoverProbes) redisBefore(t time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	var seen [2]bool
	for _, c := range p.calls {
		if c.redis && c.end.Before(t) {
			seen[c.proc] = true
		}
	}
	return seen[0] && seen[1]
}

// summary lists the answers of the probes asked after since, each as
// "first answer,second answer" (the processes take turns at being first),
// run-length encoded.
func (p *failoverProbes) summary(since time.Time) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	prev, count := "", 0
	flush := func() {
		if count > 0 {
			fmt.Fprintf(&b, "%s ×%d; ", prev, count)
		}
	}
	for i := 0; i+1 < len(p.calls); i += 2 {
		a, c := p.calls[i], p.calls[i+1]
		if a.start.Before(since) {
			continue
		}
		if got := a.got + "," + c.got; got != prev {
			flush()
			prev, count = got, 0
		}
		count++
	}
	flush()
	return b.String()
}

// expired is a context that has ended: WaitEvent with it looks only at the
// events recorded so far.
func expired() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
