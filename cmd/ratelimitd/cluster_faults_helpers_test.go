package main

// The kit of cluster_faults_test.go: a config with a rule that never
// denies (for load spread over every master) and one hot bucket, the
// Redis Cluster master of each descriptor's bucket, a load that records
// every call and tells an answer Redis decided from the failure mode's,
// and the figures the tests compare (a no-fault baseline, bounds).

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/readlag"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// clusterFaultsConfig is faultsConfig with the hot bucket of meshConfig:
// 100/s burst 20.
var clusterFaultsConfig = faultsConfig(100, 20)

// faultsConfig is domain faults with two rules: wide (key v), a bucket per
// value at wideRule's rate; and hot (key k), rate a second, burst burst,
// whose admissions the tests bound.
func faultsConfig(rate, burst int) string {
	return "domain: faults\ndescriptors:\n" + wideRule("v") +
		fmt.Sprintf("  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d, burst: %d, name: hot}\n", rate, burst)
}

// wideRule is the descriptor of key named wide, a bucket per value at a
// rate no load here reaches (wideBurst a second), so that Redis admits
// every call of it and any other answer is the failure mode's.
func wideRule(key string) string {
	return fmt.Sprintf("  - key: %s\n    rate_limit: {unit: second, requests_per_unit: %d, name: wide}\n", key, wideBurst)
}

const (
	// wideBurst is the wide rule's burst (requests_per_unit, its
	// default).
	wideBurst = 1_000_000
	// faultDeadline is every call's deadline: Envoy's default timeout.
	faultDeadline = 20 * time.Millisecond
	// backendTimeout and breakerOpenFor are --backend-timeout's and
	// --breaker-open-for's defaults, which the tests keep.
	backendTimeout = 10 * time.Millisecond
	breakerOpenFor = 100 * time.Millisecond
	// probeEvery is how often ratelimitd's background probe, the open
	// breaker's only one, is tried (at most).
	probeEvery = 25 * time.Millisecond
	// hotRate and hotBurst are the hot rule's.
	hotRate, hotBurst = 100.0, 20.0
	// callPause is how long each caller of a load pauses between calls:
	// 32 callers make about 2,500 calls a second. With a millisecond, they
	// made 4,000 to 6,500, which kept both cores saturated (the test
	// client runs with the race detector): ratelimitd's threads then
	// waited 20 ms or more for a CPU a few times a second (read from
	// /proc/<pid>/task/*/schedstat), each time enough for its breaker of a
	// healthy node to open.
	callPause = 10 * time.Millisecond
	// noiseAllowance is the share of calls, beyond the share a no-fault
	// baseline of the same test measured, that may fail (or miss their
	// deadline) during a fault without a stall to explain it: 0.1%, the
	// allowance these tests were specified with for this machine's CPU (2
	// cores shared by the race-enabled test client, ratelimitd and every
	// redis-server).
	noiseAllowance = 0.001
)

// skipUnlessHeavy skips a test that takes more than a few seconds unless
// RATELIMITD_HEAVY_TESTS=1 (make test sets it), as the limiter's heavy
// tests do.
func skipUnlessHeavy(t *testing.T) {
	t.Helper()
	if os.Getenv("RATELIMITD_HEAVY_TESTS") != "1" {
		t.Skip("a Redis Cluster fault test takes seconds: set RATELIMITD_HEAVY_TESTS=1 to run it (make test does)")
	}
}

// faultLogLevel is the flags that make a fault test's ratelimitd log at
// debug level when RATELIMITD_FAULT_DEBUG=1, so that the breaker lines a
// failure prints (nodeLines) show each failed probe too.
func faultLogLevel() []string {
	if os.Getenv("RATELIMITD_FAULT_DEBUG") == "1" {
		return []string{"--log-level", "debug"}
	}
	return nil
}

// faultKeys returns the Redis keys of the buckets that descriptors
// key=value of domain faults (clusterFaultsConfig) draw from, built as
// the server and the store build them (config.Rule.AppendKey, then
// redisstore.Store.Key with the default prefix).
func faultKeys(t *testing.T, key string, values []string) []string {
	t.Helper()
	set, err := config.Parse([]config.File{{Name: "faults.yaml", Data: []byte(clusterFaultsConfig)}})
	if err != nil {
		t.Fatalf("parse clusterFaultsConfig: %v", err)
	}
	// A store only to name keys: it never dials its client.
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rc.Close()
	st, err := redisstore.New(rc, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys := make([]string, len(values))
	for i, v := range values {
		entries := []config.Entry{{Key: key, Value: v}}
		rule := set.Lookup("faults", entries)
		if rule == nil {
			t.Fatalf("no rule of clusterFaultsConfig for %s=%s", key, v)
		}
		keys[i] = st.Key(string(rule.AppendKey(nil, 0, entries)))
	}
	return keys
}

// keySlots asks the cluster (CLUSTER KEYSLOT, one pipeline) for the slot
// of each key.
func keySlots(t *testing.T, cc *redis.ClusterClient, keys []string) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmds, err := cc.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.ClusterKeySlot(ctx, k)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT of %d keys: %v", len(keys), err)
	}
	slots := make([]int, len(keys))
	for i, c := range cmds {
		slots[i] = int(c.(*redis.IntCmd).Val())
	}
	return slots
}

// ownerOf returns the address of the master in masters that serves slot,
// or "".
func ownerOf(masters []redistest.Node, slot int) string {
	for _, m := range masters {
		for _, r := range m.Slots {
			if r[0] <= slot && slot <= r[1] {
				return m.Addr
			}
		}
	}
	return ""
}

// faultLayout is the descriptors a fault test calls and where their
// buckets live when it starts.
type faultLayout struct {
	values []string // wide rule values
	slots  []int    // their buckets' slots
	owners []string // the master of each, at the start
	hot    string   // the hot rule's value
	// hotSlot and hotOwner are the hot bucket's slot and master.
	hotSlot  int
	hotOwner string
}

// newFaultLayout names n wide values and a hot value, all starting with
// tag (so that no two tests share a bucket), and finds their masters; the
// hot value is the first whose bucket lives on the master at hotOn (any
// master if "").
func newFaultLayout(t *testing.T, rc *redistest.ReplicatedCluster, tag string, n int, hotOn string) faultLayout {
	t.Helper()
	cc := rc.Client()
	masters := rc.Masters()
	l := faultLayout{values: make([]string, n)}
	for i := range n {
		l.values[i] = fmt.Sprintf("%s-v%04d", tag, i)
	}
	l.slots = keySlots(t, cc, faultKeys(t, "v", l.values))
	for _, s := range l.slots {
		l.owners = append(l.owners, ownerOf(masters, s))
	}
	var hots []string
	for i := range 200 {
		hots = append(hots, fmt.Sprintf("%s-h%03d", tag, i))
	}
	for i, s := range keySlots(t, cc, faultKeys(t, "k", hots)) {
		if o := ownerOf(masters, s); hotOn == "" || o == hotOn {
			l.hot, l.hotSlot, l.hotOwner = hots[i], s, o
			break
		}
	}
	if l.hot == "" {
		t.Fatalf("none of 200 hot values has its bucket on %s (masters %v)", hotOn, masters)
	}
	return l
}

// nodeOf returns the master of c's bucket at the start.
func (l faultLayout) nodeOf(c faultCall) string {
	if c.value == hotValue {
		return l.hotOwner
	}
	return l.owners[c.value]
}

// on returns the indexes of the values whose buckets were on a master
// that keep accepts, at the start.
func (l faultLayout) on(keep func(owner string) bool) []int {
	var out []int
	for i, o := range l.owners {
		if keep(o) {
			out = append(out, i)
		}
	}
	return out
}

// faultCall is one ShouldRateLimit call of a faultLoad.
type faultCall struct {
	start, end time.Time
	// deadline is the call's (its context's); arrived, when the client's
	// HTTP/2 transport read the answer's end (its trailers; see
	// arrivalClock), zero if it had not when the call returned.
	deadline, arrived time.Time
	value             int // index into the layout's values; hotValue for the hot one
	code              codes.Code
	admitted          bool
	// redis says the answer is known to be Redis's decision (see
	// decidedByRedis).
	redis bool
	// cause is, for an error, what its message blames (see errorCause),
	// and msg the message.
	cause, msg string
}

// hotValue is faultCall.value for a call on the hot bucket.
const hotValue = -1

// answer is OK, OVER_LIMIT or the error's code.
func (c faultCall) answer() string { return answerOf(c.code, c.admitted) }

// answerOf is OK, OVER_LIMIT or code, of a call that ended with code and
// was admitted or not.
func answerOf(code codes.Code, admitted bool) string {
	switch {
	case code != codes.OK:
		return code.String()
	case admitted:
		return "OK"
	}
	return "OVER_LIMIT"
}

// lostByClient reports whether c ended DEADLINE_EXCEEDED at the client
// through the test process's own delay, not ratelimitd's: either the
// deadline had passed before the call was even sent (its goroutine waited
// for a CPU between making the context and the call), or ratelimitd's
// answer had reached the client before the deadline (see arrivalClock:
// its transport read it, or the kernel had received it, by then). grpc-go
// returns DEADLINE_EXCEEDED when the context's deadline fires before the
// call's goroutine has taken an answer already received, and both cores
// are shared by this race-enabled client's 32 callers, ratelimitd and
// every redis-server. Such a call's answer is unknown to the test, so it
// is excused for every check (see noise.explains), as a stall of the
// client's is. An answer that reached the client after the deadline, or
// that the client's transport had not read when the call returned (its
// stream closed first), still counts against ratelimitd.
func (c faultCall) lostByClient() bool {
	if c.code != codes.DeadlineExceeded {
		return false
	}
	if !c.start.Before(c.deadline) {
		return true
	}
	return !c.arrived.IsZero() && !c.arrived.After(c.deadline)
}

// arrival says when c's answer reached the client's transport, against
// its deadline, for messages.
func (c faultCall) arrival() string {
	if c.arrived.IsZero() {
		return "its answer not read by the client's transport when it returned"
	}
	return fmt.Sprintf("its answer at the client %v after the deadline", c.arrived.Sub(c.deadline).Round(10*time.Microsecond))
}

// arrivalKey is the context key of a call's *arrivalClock.
type arrivalKey struct{}

// arrivalClock is when the end of a call's answer reached the client
// (Unix ns), set by arrivals: when the client's transport read it, or, if
// earlier, when the kernel had received the last bytes of the socket read
// that carried it (the connection's latest SO_TIMESTAMPNS: no byte of
// that read came later).
type arrivalClock struct{ ns atomic.Int64 }

func (a *arrivalClock) at() time.Time {
	if ns := a.ns.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// arrivals is a client stats.Handler that notes, on the transport's
// reader goroutine, when each call's trailers (the end of its answer, or
// all of an error answer) reached the client, in the call's arrivalClock
// (see there), for the connection that conn holds (one per ClientConn:
// openFaultConn's).
type arrivals struct{ conn *atomic.Pointer[readlag.Conn] }

func (arrivals) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (arrivals) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (arrivals) HandleConn(context.Context, stats.ConnStats) {}
func (h arrivals) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InTrailer); !ok {
		return
	}
	a, ok := ctx.Value(arrivalKey{}).(*arrivalClock)
	if !ok {
		return
	}
	at := time.Now().UnixNano()
	if c := h.conn.Load(); c != nil {
		if r := c.Received(); !r.IsZero() && r.UnixNano() < at {
			at = r.UnixNano()
		}
	}
	a.ns.CompareAndSwap(0, at)
}

// dialStamped dials addr and turns on the kernel's receive timestamps
// (internal/readlag), so that an answer the client's goroutines read late
// can be told from one that reached the host late.
func dialStamped(ctx context.Context, addr string) (*readlag.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c, err := readlag.Stamp(nc.(*net.TCPConn), nil)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// openFaultConn is openConn with arrivals as the connection's stats
// handler, on a stamped connection (dialStamped), for a faultLoad.
func openFaultConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	var current atomic.Pointer[readlag.Conn]
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := dialStamped(ctx, addr)
		if err != nil {
			return nil, err
		}
		current.Store(c)
		return c, nil
	}
	conn := servertest.Dial(t, "passthrough:///"+addr, grpc.WithContextDialer(dial), grpc.WithStatsHandler(arrivals{conn: &current}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check of %s: %v", addr, err)
	}
	return conn
}

// decidedByRedis says whether an answer is known to be Redis's, in
// failure mode mode. For the wide rule, which Redis never denies, it is
// an admission whose bucket is not full again at once (duration until
// reset of a second or more: the allow mode's admission says 0) and
// leaves more than half the burst (the local mode's buckets, with
// --replicas-hint 2, have half). For the hot bucket: in error mode any
// answer; in deny mode an admission; in allow mode a denial, or an
// admission with a duration until reset; in local mode nothing can tell.
func decidedByRedis(mode string, hot bool, resp *rlsv3.RateLimitResponse, err error) bool {
	if err != nil || len(resp.GetStatuses()) != 1 {
		return false
	}
	st := resp.GetStatuses()[0]
	ok := resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
	reset := st.GetDurationUntilReset().GetSeconds()
	if !hot {
		return ok && reset > 0 && st.GetLimitRemaining() > wideBurst/2
	}
	switch mode {
	case "error":
		return true
	case "deny":
		return ok
	case "allow":
		return !ok || reset > 0
	}
	return false
}

// errorCause sorts an error answer by what its message blames: the
// client's own deadline, this process's overload, a Cluster that asked
// for the call again later (a slot moving, the cluster down), or the
// backend.
func errorCause(err error) string {
	msg := status.Convert(err).Message()
	switch {
	case status.Code(err) == codes.DeadlineExceeded:
		return "client"
	case strings.Contains(msg, "overloaded"):
		return "overloaded"
	case strings.Contains(msg, "again later"):
		return "try_again"
	}
	return "backend"
}

// faultLoad calls one process: valueCallers goroutines over the layout's
// wide values (caller i takes values i, i+valueCallers, …, round and
// round), hotCallers on the hot value, each call with faultDeadline and a
// pause after it (callPause if zero).
type faultLoad struct {
	rls                      rlsv3.RateLimitServiceClient
	mode                     string
	layout                   faultLayout
	valueCallers, hotCallers int
	pause                    time.Duration
}

// run calls until ctx is done and returns every call, by start. It makes
// at most 200,000 calls a caller.
func (l faultLoad) run(ctx context.Context) []faultCall {
	n := l.valueCallers + l.hotCallers
	per := make([][]faultCall, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			hot := i >= l.valueCallers
			for j := 0; j < 200_000 && ctx.Err() == nil; j++ {
				v, value := hotValue, l.layout.hot
				key := "k"
				if !hot {
					v = (i + j*l.valueCallers) % len(l.layout.values)
					value, key = l.layout.values[v], "v"
				}
				req := &rlsv3.RateLimitRequest{Domain: "faults", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
					Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
				}}}
				callCtx, cancel := context.WithTimeout(context.Background(), faultDeadline)
				deadline, _ := callCtx.Deadline()
				clock := new(arrivalClock)
				callCtx = context.WithValue(callCtx, arrivalKey{}, clock)
				start := time.Now()
				resp, err := l.rls.ShouldRateLimit(callCtx, req)
				end := time.Now()
				cancel()
				c := faultCall{start: start, end: end, deadline: deadline, arrived: clock.at(), value: v, code: status.Code(err),
					admitted: err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK,
					redis:    decidedByRedis(l.mode, hot, resp, err)}
				if err != nil {
					c.cause, c.msg = errorCause(err), status.Convert(err).Message()
				}
				per[i] = append(per[i], c)
				time.Sleep(cmp.Or(l.pause, callPause))
			}
		})
	}
	wg.Wait()
	all := slices.Concat(per...)
	slices.SortFunc(all, func(a, b faultCall) int { return a.start.Compare(b.start) })
	return all
}

// runFor runs the load in the background until stop is called, which
// returns the calls.
func (l faultLoad) start() (stop func() []faultCall) { return background(l.run) }

// background calls run in a goroutine until stop is called, which ends
// run's context and returns what run returned (stop may be called again:
// it returns the same).
func background[T any](run func(ctx context.Context) T) (stop func() T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan T, 1)
	go func() { done <- run(ctx) }()
	return sync.OnceValue(func() T {
		cancel()
		return <-done
	})
}

// every calls step, then waits interval, at most n times, until ctx ends.
func every(ctx context.Context, interval time.Duration, n int, step func()) {
	for i := 0; i < n && ctx.Err() == nil; i++ {
		step()
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
}

// callSet is some calls of a load, to count.
type callSet []faultCall

// where returns the calls keep accepts.
func (cs callSet) where(keep func(faultCall) bool) callSet {
	var out callSet
	for _, c := range cs {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// notRedis counts the calls not known to be Redis's decisions.
func (cs callSet) notRedis() int {
	n := 0
	for _, c := range cs {
		if !c.redis {
			n++
		}
	}
	return n
}

// codes counts the calls with code.
func (cs callSet) count(code codes.Code) int {
	n := 0
	for _, c := range cs {
		if c.code == code {
			n++
		}
	}
	return n
}

// admitted counts the calls admitted.
func (cs callSet) admitted() int {
	n := 0
	for _, c := range cs {
		if c.admitted {
			n++
		}
	}
	return n
}

// answers counts the calls by answer (and cause, for an error), for
// messages.
func (cs callSet) answers() string {
	m := map[string]int{}
	for _, c := range cs {
		a := c.answer()
		if c.cause != "" {
			a += "/" + c.cause
		}
		if c.code == codes.OK && !c.redis {
			a += "/fallback"
		}
		m[a]++
	}
	return counts(m, func(a string) string { return a })
}

// firstRedis returns when the first call that started at or after t and
// that keep accepts was answered by Redis, and whether there was one.
func (cs callSet) firstRedis(t time.Time, keep func(faultCall) bool) (time.Time, bool) {
	var first time.Time
	for _, c := range cs {
		if c.redis && !c.start.Before(t) && keep(c) && (first.IsZero() || c.end.Before(first)) {
			first = c.end
		}
	}
	return first, !first.IsZero()
}

// span is the time from the first call's start to the last one's end.
func (cs callSet) span() time.Duration {
	if len(cs) == 0 {
		return 0
	}
	first, last := cs[0].start, cs[0].end
	for _, c := range cs {
		if c.start.Before(first) {
			first = c.start
		}
		if c.end.After(last) {
			last = c.end
		}
	}
	return last.Sub(first)
}

// rate is the calls a second over their span.
func (cs callSet) rate() float64 {
	if d := cs.span(); d > 0 {
		return float64(len(cs)) / d.Seconds()
	}
	return 0
}

// noise is what the canary process, the client's own monitor and the
// CPU-wait monitor saw stall while a test ran, and the node of each call,
// to excuse the failures of calls that a stall explains.
type noise struct {
	events []canaryEvent
	// nodeOf returns the address of the node a call's bucket lives on, ""
	// if it may be any.
	nodeOf func(faultCall) string
}

// explains reports whether a stall explains the failure of c:
//   - a call the client gave up on though ratelimitd's answer had reached
//     it (see faultCall.lostByClient): the client's own time, whatever
//     the answer was;
//   - an answer past its deadline at the client: the client (its
//     goroutines late, or its threads waiting for a CPU), ratelimitd (its
//     threads waiting for a CPU) or the whole machine (the canary late)
//     stalled for canaryStall or more during the call (a CPU wait, known
//     only to lie between two reads of schedstat, counts if that span
//     overlaps the call: see canaryEvent.during);
//   - an answer not decided by Redis: ratelimitd (waiting for a CPU), the
//     machine (the canary late), or c's node (of any node if unknown: a
//     slow ping, or its redis-server waiting for a CPU) stalled for
//     --backend-timeout or more (a shorter stall cannot hold a round trip
//     past it), from a deadline before c to as long after the stall as
//     an open breaker answers without Redis (--breaker-open-for, 100 ms,
//     and the background probe's 25 ms) and three deadlines (the
//     breaker's probe and the calls then in flight).
func (n noise) explains(c faultCall) bool {
	if c.lostByClient() {
		return true
	}
	node := ""
	if n.nodeOf != nil {
		node = n.nodeOf(c)
	}
	for _, e := range n.events {
		who := strings.TrimPrefix(e.node, "redis ")
		if c.code == codes.DeadlineExceeded {
			from, to := e.during()
			if e.d >= canaryStall && (e.kind == "client" || e.kind == "late" || e.kind == "sched" && (who == "client" || who == "ratelimitd")) &&
				!c.end.Before(from) && !c.start.After(to) {
				return true
			}
			continue
		}
		machine := e.kind == "late" || e.kind == "sched" && who == "ratelimitd"
		redisWait := e.kind == "sched" && strings.HasPrefix(e.node, "redis ")
		ofNode := (e.kind == "slow" || redisWait) && (node == "" || who == node)
		if e.d >= backendTimeout && (machine || ofNode) {
			from, to := e.at.Add(-faultDeadline), e.at.Add(e.d+breakerOpenFor+probeEvery+3*faultDeadline)
			if !c.end.Before(from) && !c.start.After(to) {
				return true
			}
		}
	}
	return false
}

// cpuWait is how long ratelimitd's threads waited for a CPU from start
// to end, all their waits together (as read every schedEvery; a wait
// counts whole if the span it lies in overlaps): a timer of ratelimitd's due meanwhile may
// have fired that late (its goroutines move between threads, and a
// thread that waits holds up those queued on it).
func (n noise) cpuWait(start, end time.Time) time.Duration {
	var total time.Duration
	for _, e := range n.events {
		from, to := e.during()
		if e.kind == "sched" && e.node == "ratelimitd" && !from.After(end) && !to.Before(start) {
			total += e.d
		}
	}
	return total
}

// without returns n without the events drop accepts.
func (n noise) without(drop func(canaryEvent) bool) noise {
	n.events = slices.DeleteFunc(slices.Clone(n.events), drop)
	return n
}

// explainsSpan reports whether a stall of any node, of ratelimitd or of
// the machine explains something ratelimitd did wrong from start to end
// (see explains).
func (n noise) explainsSpan(start, end time.Time) bool {
	n.nodeOf = nil
	return n.explains(faultCall{start: start, end: end})
}

// summary describes the stalls seen, for messages: how many of each
// kind (and process, for CPU waits) of 5, 10 and 20 ms or more.
func (n noise) summary() string {
	type key struct{ kind, who string }
	count := map[key][3]int{}
	var longest time.Duration
	for _, e := range n.events {
		who := ""
		if e.kind == "sched" {
			who, _, _ = strings.Cut(e.node, " ")
		}
		k := key{e.kind, who}
		c := count[k]
		for i, min := range []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond} {
			if e.d >= min {
				c[i]++
			}
		}
		count[k] = c
		longest = max(longest, e.d)
	}
	var parts []string
	for _, k := range []key{{"slow", ""}, {"late", ""}, {"client", ""}, {"sched", "client"}, {"sched", "ratelimitd"}, {"sched", "redis"}} {
		c := count[k]
		name := map[string]string{"slow": "slow pings", "late": "late canary wake-ups", "client": "late client wake-ups"}[k.kind]
		if k.kind == "sched" {
			name = "CPU waits of " + k.who
		}
		parts = append(parts, fmt.Sprintf("%s %d/%d/%d", name, c[0], c[1], c[2]))
	}
	return fmt.Sprintf("stalls of 5/10/20 ms or more: %s; the longest %v", strings.Join(parts, ", "), longest.Round(100*time.Microsecond))
}

// describe lists the first calls of cs (at most 5) with when they started
// and took, their answer and the nearest stall the noise saw, for
// messages.
func (n noise) describe(cs callSet) string {
	var out []string
	for _, c := range cs[:min(len(cs), 5)] {
		nearest, gap := "none", time.Duration(math.MaxInt64)
		for _, e := range n.events {
			if e.d < canaryReport {
				continue
			}
			d := c.start.Sub(e.at)
			if d < 0 {
				d = -d
			}
			if d < gap {
				gap, nearest = d, fmt.Sprintf("%s %s of %v at %s", e.kind, e.node, e.d.Round(100*time.Microsecond), e.at.Format("15:04:05.000"))
			}
		}
		node := ""
		if n.nodeOf != nil {
			node = n.nodeOf(c)
		}
		late := ""
		if c.code == codes.DeadlineExceeded {
			late = "; " + c.arrival()
		}
		out = append(out, fmt.Sprintf("[%s took %v on %s: %s %q%s; nearest stall %s]", c.start.Format("15:04:05.000"),
			c.end.Sub(c.start).Round(100*time.Microsecond), node, c.answer(), c.msg, late, nearest))
	}
	return strings.Join(out, " ")
}

// failures returns the calls of cs that fail (keep) and that n does not
// explain, and how many it explains.
func (n noise) failures(cs callSet, fail func(faultCall) bool) (unexplained callSet, explained int) {
	for _, c := range cs {
		switch {
		case !fail(c):
		case n.explains(c):
			explained++
		default:
			unexplained = append(unexplained, c)
		}
	}
	return unexplained, explained
}

// baseline is what a no-fault period of a load measured: how many calls,
// how many of them not decided by Redis, and how many missed their
// deadline at the client, but for those the noise explains.
type baseline struct {
	calls             int
	notRedis, expired int
}

func notDecided(c faultCall) bool   { return !c.redis }
func pastDeadline(c faultCall) bool { return c.code == codes.DeadlineExceeded }

func measureBaseline(cs callSet, nz noise) baseline {
	notRedis, _ := nz.failures(cs, notDecided)
	late, _ := nz.failures(cs, pastDeadline)
	return baseline{calls: len(cs), notRedis: len(notRedis), expired: len(late)}
}

// allowance is how many of n calls may fail in a fault through this
// machine's noise: the baseline's share of fails, plus noiseAllowance.
func (b baseline) allowance(n, fails int) int {
	share := 0.0
	if b.calls > 0 {
		share = float64(fails) / float64(b.calls)
	}
	return int(math.Ceil((share + noiseAllowance) * float64(n)))
}

func (b baseline) String() string {
	return fmt.Sprintf("%d calls, %d not decided by Redis (%.3f%%), %d past their deadline", b.calls, b.notRedis,
		100*float64(b.notRedis)/float64(max(b.calls, 1)), b.expired)
}

// checkHealthy checks that calls on healthy Redis nodes were decided by
// Redis, but for those a stall explains (see noise) and for the
// baseline's share plus noiseAllowance; and that they were answered in
// time (checkInTime).
func checkHealthy(t *testing.T, what string, cs callSet, base baseline, nz noise) {
	t.Helper()
	fails, explained := nz.failures(cs, notDecided)
	allowed := base.allowance(len(cs), base.notRedis)
	t.Logf("%s: %d calls, %d not decided by Redis (%d more explained by stalls; allowed %d: baseline %s); answers %s",
		what, len(cs), len(fails), explained, allowed, base, cs.answers())
	if len(fails) > allowed {
		t.Errorf("%s: %d of %d calls not decided by Redis and not explained by a stall (%s), want at most %d (the no-fault baseline's share, %d of %d, + %.1f%%); %s; the first: %s",
			what, len(fails), len(cs), fails.answers(), allowed, base.notRedis, base.calls, 100*noiseAllowance, nz.summary(), nz.describe(fails))
	}
	checkInTime(t, what, cs, base, nz)
}

// checkInTime checks that calls were answered within their deadline:
// none CANCELED, and DEADLINE_EXCEEDED at the client, but for the calls a
// stall explains, no more often than in the baseline (plus
// noiseAllowance).
func checkInTime(t *testing.T, what string, cs callSet, base baseline, nz noise) {
	t.Helper()
	if n := cs.count(codes.Canceled); n > 0 {
		t.Errorf("%s: %d calls answered CANCELED, want none", what, n)
	}
	late, explained := nz.failures(cs, pastDeadline)
	if allowed := base.allowance(len(cs), base.expired); len(late) > allowed {
		t.Errorf("%s: %d of %d calls missed their %v deadline at the client (%d more explained by stalls), want at most %d (the no-fault baseline's %d of %d + %.1f%%); %s; the first: %s",
			what, len(late), len(cs), faultDeadline, explained, allowed, base.expired, base.calls, 100*noiseAllowance, nz.summary(), nz.describe(late))
	}
}

// checkHotBound checks the hot bucket's admissions over a period of
// length d: at most rate·d + burst + extra, with the 1% margin of
// checkBound.
func checkHotBound(t *testing.T, what string, cs callSet, d time.Duration, extra float64) {
	t.Helper()
	checkAdmissions(t, what, cs, d, hotRate*d.Seconds()+hotBurst+extra)
}

// checkAdmissions checks that calls admitted at most upper (+1%) over a
// period of length d.
func checkAdmissions(t *testing.T, what string, cs callSet, d time.Duration, upper float64) {
	t.Helper()
	admitted := cs.admitted()
	t.Logf("%s (%v): hot bucket %d admitted of %d calls; bound %.0f", what, d.Round(time.Millisecond), admitted, len(cs), upper)
	if float64(admitted) > upper*1.01 {
		t.Errorf("%s: hot bucket admitted %d in %v, more than its bound %.0f (+1%%)", what, admitted, d.Round(time.Millisecond), upper)
	}
}

// loggedNode returns the time of the first line p logged with message msg
// and attribute node after t.
func loggedNode(p *proc, msg, node string, t time.Time) (time.Time, bool) {
	for l := range p.logLines() {
		if strings.HasPrefix(l.Msg, msg) && (node == "" || l.Node == node) && l.Time.After(t) {
			return l.Time, true
		}
	}
	return time.Time{}, false
}

// nodeFailingAt reports whether p's last log line about Redis Cluster
// node node at or before t says it is failing (its breaker open then).
func nodeFailingAt(p *proc, node string, t time.Time) bool {
	return failingAt(p, node, "Redis Cluster node failing", "Redis Cluster node answers again", t)
}

// backendFailingAt reports whether p's last "backend failing" or
// "backend answers again" line at or before t says failing (the breaker
// of a backend without shards open then).
func backendFailingAt(p *proc, t time.Time) bool {
	return failingAt(p, "", "backend failing", "backend answers again", t)
}

// failingAt reports whether, of p's lines at or before t that start with
// failing or back (and name node, unless it is ""), the last is a
// failing one.
func failingAt(p *proc, node, failing, back string, t time.Time) bool {
	last := false
	for l := range p.logLines() {
		if node != "" && l.Node != node || l.Time.After(t) {
			continue
		}
		switch {
		case strings.HasPrefix(l.Msg, failing):
			last = true
		case strings.HasPrefix(l.Msg, back):
			last = false
		}
	}
	return last
}

// nodeLines returns p's log lines about Redis Cluster nodes, for
// messages.
func nodeLines(p *proc) string {
	var out []string
	for line := range strings.Lines(p.logs.String()) {
		if strings.Contains(line, "Redis Cluster node") || strings.Contains(line, "backend failing") || strings.Contains(line, "backend answers again") || strings.Contains(line, "probe") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}

// readyzPoll is /readyz polled every interval: when, and the status.
type readyzPoll struct {
	// at is when the poll was sent, end when its answer came.
	at, end time.Time
	code    int
	body    string
}

// pollReadyz polls p's /readyz every interval until stop is called, which
// returns the polls.
func pollReadyz(p *proc, interval time.Duration) (stop func() []readyzPoll) {
	client := &http.Client{Timeout: 2 * time.Second}
	return background(func(ctx context.Context) (polls []readyzPoll) {
		every(ctx, interval, 10_000, func() {
			at := time.Now()
			code, body := 0, ""
			if resp, err := client.Get("http://" + p.httpAddr + "/readyz"); err == nil {
				var b strings.Builder
				buf := make([]byte, 512)
				n, _ := resp.Body.Read(buf)
				b.Write(buf[:n])
				resp.Body.Close()
				code, body = resp.StatusCode, strings.TrimSpace(b.String())
			} else {
				body = err.Error()
			}
			polls = append(polls, readyzPoll{at: at, end: time.Now(), code: code, body: body})
		})
		return polls
	})
}

// scriptsRan is how many scripts (EVALSHA and EVAL) the Redis servers at
// addrs ran, from INFO commandstats: calls less failed calls (a NOSCRIPT
// answer is a failed call of EVALSHA that ran nothing). Redirected calls
// (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) are rejected calls, not counted in
// calls.
func scriptsRan(t *testing.T, addrs []string) int {
	t.Helper()
	total := 0
	for _, addr := range addrs {
		for line := range strings.Lines(redisInfo(t, addr, "commandstats")) {
			for _, cmd := range []string{"evalsha", "eval"} {
				rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
				if !ok {
					continue
				}
				fields := map[string]int{}
				for f := range strings.SplitSeq(rest, ",") {
					if k, v, ok := strings.Cut(f, "="); ok {
						if n, err := strconv.Atoi(v); err == nil {
							fields[k] = n
						}
					}
				}
				total += fields["calls"] - fields["failed_calls"]
			}
		}
	}
	return total
}

// failOver SIGKILLs rc's master victim (redistest's index) and waits,
// until ctx ends, for a replica's promotion, then clusterFailoverAfter
// more; it calls stop before it fails t.
func failOver(ctx context.Context, t *testing.T, rc *redistest.ReplicatedCluster, victim int, stop func()) (killed time.Time, promotedTo string, promoted time.Time) {
	t.Helper()
	target := rc.MasterAddr(victim)
	killed = rc.KillMaster(victim)
	promotedTo, promoted, err := rc.WaitPromotion(ctx, target)
	if err != nil {
		stop()
		t.Fatalf("after SIGKILL of master %s: %v", target, err)
	}
	time.Sleep(time.Until(promoted.Add(clusterFailoverAfter)))
	return killed, promotedTo, promoted
}

// redisInfo is the section of INFO of the redis-server at addr.
func redisInfo(t *testing.T, addr, section string) string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s on %s: %v", section, addr, err)
	}
	return info
}

// redisPID is the process id of the redis-server at addr, from INFO
// server.
func redisPID(t *testing.T, addr string) int {
	t.Helper()
	for line := range strings.Lines(redisInfo(t, addr, "server")) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if pid, err := strconv.Atoi(v); err == nil {
				return pid
			}
		}
	}
	t.Fatalf("INFO server on %s: no process_id", addr)
	return 0
}

// stateSample is one node's cluster_state as polled.
type stateSample struct {
	node string
	at   time.Time // when the poll was sent
	ok   bool      // cluster_state:ok
	err  error
}

// stateWatchEvery is how often watchClusterState polls each node.
const stateWatchEvery = 10 * time.Millisecond

// watchClusterState polls CLUSTER INFO on each node at addrs every
// stateWatchEvery until stop is called, which returns the samples.
func watchClusterState(addrs []string) (stop func() []stateSample) {
	return background(func(ctx context.Context) []stateSample {
		done := make(chan []stateSample, len(addrs))
		for _, addr := range addrs {
			go func() {
				c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: 200 * time.Millisecond})
				defer c.Close()
				var samples []stateSample
				every(ctx, stateWatchEvery, 20_000, func() {
					at := time.Now()
					info, err := c.ClusterInfo(ctx).Result()
					if ctx.Err() != nil { // cut short by stop
						return
					}
					samples = append(samples, stateSample{node: addr, at: at, ok: strings.Contains(info, "cluster_state:ok"), err: err})
				})
				done <- samples
			}()
		}
		var all []stateSample
		for range addrs {
			all = append(all, <-done...)
		}
		return all
	})
}

// stateWindow is when some node reported cluster_state:fail, widened by
// a poll interval on each side; zero if none did.
type stateWindow struct {
	from, to time.Time
	detail   string // per node, for messages
}

// overlaps reports whether the call from start to end overlaps w.
func (w stateWindow) overlaps(start, end time.Time) bool {
	return !w.from.IsZero() && !end.Before(w.from) && !start.After(w.to)
}

// failWindow is the window of samples: from a poll interval before the
// first poll of any node that saw cluster_state:fail to a poll interval
// after the last (a node's state changes between two polls of it).
func failWindow(samples []stateSample) stateWindow {
	var w stateWindow
	perNode := map[string][2]time.Time{}
	for _, s := range samples {
		if s.ok || s.err != nil {
			continue
		}
		r := perNode[s.node]
		if r[0].IsZero() || s.at.Before(r[0]) {
			r[0] = s.at
		}
		if s.at.After(r[1]) {
			r[1] = s.at
		}
		perNode[s.node] = r
	}
	var parts []string
	for node, r := range perNode {
		parts = append(parts, fmt.Sprintf("%s fail from %s to %s", node, r[0].Format("15:04:05.000"), r[1].Format("15:04:05.000")))
		if w.from.IsZero() || r[0].Before(w.from) {
			w.from = r[0]
		}
		if r[1].After(w.to) {
			w.to = r[1]
		}
	}
	slices.Sort(parts)
	if !w.from.IsZero() {
		w.from = w.from.Add(-stateWatchEvery)
		w.to = w.to.Add(2 * stateWatchEvery) // the poll's own round trip too
	}
	w.detail = strings.Join(parts, "; ")
	return w
}

// A canary tells this machine's stalls from a product's fault: a process
// of its own (this test binary again, running only
// TestClusterFaultsCanaryProcess) that pings each healthy Redis node every
// canaryEvery and reports each ping slower than canaryReport, and each
// of its own wake-ups later than that (a stall of the whole machine: its
// CPUs busy with other work). A ratelimitd whose calls to a healthy node
// fail when the canary saw that node (or the machine) stall did what it
// documents (a node that holds a round trip for --backend-timeout is a
// failing node); one whose calls fail while the canary saw nothing has a
// fault of its own.
const (
	canaryEnv    = "RATELIMITD_FAULT_CANARY_ADDRS"
	canaryEvery  = 2 * time.Millisecond
	canaryLife   = 5 * time.Minute
	canaryReport = 3 * time.Millisecond
	// canaryStall is how long a stall of the client or of ratelimitd
	// during a call must be to explain its answer past its deadline at
	// the client: ratelimitd answers a call it could not decide a margin
	// before the deadline, a fifth of the time left (4 ms of 20 ms) on an
	// idle host, up to a quarter (5 ms) on a busy one
	// (internal/failover/budget.go), so a stall as long as the least
	// margin, at the budget's end, pushes the answer past the deadline.
	// (At 5 ms, answers late by 0.1–2 ms came with a 4.2 ms stall of
	// ratelimitd beside them and none of 5 ms.) A failure of Redis needs
	// a stall of --backend-timeout: see noise.explains.
	canaryStall = 4 * time.Millisecond
)

// TestClusterFaultsCanaryProcess is the canary process (see canaryEnv);
// run otherwise, it skips.
func TestClusterFaultsCanaryProcess(t *testing.T) {
	addrs := os.Getenv(canaryEnv)
	if addrs == "" {
		t.Skip("the cluster fault tests' canary process: run by them, with " + canaryEnv + " set")
	}
	var mu sync.Mutex
	report := func(kind, node string, at time.Time, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, "%s %s %d %d\n", kind, node, at.UnixNano(), d.Nanoseconds())
	}
	for _, addr := range strings.Split(addrs, ",") {
		go func() {
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1, ReadTimeout: time.Second})
			for {
				start := time.Now()
				err := c.Ping(context.Background()).Err()
				if d := time.Since(start); d > canaryReport || err != nil {
					report("slow", addr, start, d)
				}
				slept := time.Now()
				time.Sleep(canaryEvery)
				if late := time.Since(slept) - canaryEvery; late > canaryReport {
					report("late", "-", slept.Add(canaryEvery), late)
				}
			}
		}()
	}
	// The test that started it closes its stdin to end it; it ends by
	// itself after canaryLife in any case.
	ended := make(chan struct{})
	go func() {
		buf := make([]byte, 1)
		for {
			if _, err := os.Stdin.Read(buf); err != nil {
				close(ended)
				return
			}
		}
	}()
	select {
	case <-ended:
	case <-time.After(canaryLife):
	}
}

// canaryEvent is a stall seen from at for d: a slow ping of node (kind
// "slow"), a late wake-up of the canary ("late") or of the client
// ("client"), or a wait for a CPU of a thread of the process node names
// ("sched": "client", "ratelimitd" or "redis <addr>").
type canaryEvent struct {
	kind, node string
	at         time.Time
	d          time.Duration
	// from, unless zero, is the earliest the stall may have begun: a
	// CPU wait read from schedstat (schedMonitor) is known only to have
	// happened since the read before, not when (at is then the read less
	// d).
	from time.Time
}

// during returns when the stall may have been: from at for d, or, for one
// known only within a span (from set), from from to the end of at + d.
func (e canaryEvent) during() (from, to time.Time) {
	if e.from.IsZero() || e.from.After(e.at) {
		return e.at, e.at.Add(e.d)
	}
	return e.from, e.at.Add(e.d)
}

// canary is a running canary process.
type canary struct {
	stop func() []canaryEvent
}

// startCanary starts a canary process pinging the nodes at addrs.
func startCanary(t *testing.T, addrs []string) *canary {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestClusterFaultsCanaryProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), canaryEnv+"="+strings.Join(addrs, ","))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the canary process: %v", err)
	}
	c := &canary{stop: sync.OnceValue(func() []canaryEvent {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		var events []canaryEvent
		for line := range strings.Lines(out.String()) {
			f := strings.Fields(line)
			if len(f) != 4 || (f[0] != "slow" && f[0] != "late") {
				continue
			}
			at, err1 := strconv.ParseInt(f[2], 10, 64)
			d, err2 := strconv.ParseInt(f[3], 10, 64)
			if err1 == nil && err2 == nil {
				events = append(events, canaryEvent{kind: f[0], node: f[1], at: time.Unix(0, at), d: time.Duration(d)})
			}
		}
		return events
	})}
	t.Cleanup(func() { c.stop() })
	return c
}

// clientMonitor records the late wake-ups of a goroutine of this test
// process that sleeps canaryEvery in a loop: the client's own stalls (a
// call whose answer came in time misses its deadline when the client
// reads it late). stop returns them, as canary events of kind "client".
func clientMonitor() (stop func() []canaryEvent) {
	return background(func(ctx context.Context) (events []canaryEvent) {
		for i := 0; i < 1_000_000 && ctx.Err() == nil; i++ {
			slept := time.Now()
			time.Sleep(canaryEvery)
			if late := time.Since(slept) - canaryEvery; late > canaryReport {
				events = append(events, canaryEvent{kind: "client", node: "-", at: slept.Add(canaryEvery), d: late})
			}
		}
		return events
	})
}

// watchNoise starts a canary on the Redis nodes at addrs, the client
// monitor and a CPU-wait monitor of this process, of the ratelimitd
// processes procs and of the redis-servers at addrs; its stop returns
// what they saw.
func watchNoise(t *testing.T, addrs []string, procs []*proc) (stop func() noise) {
	t.Helper()
	pids := map[int]string{os.Getpid(): "client"}
	for _, p := range procs {
		pids[p.cmd.Process.Pid] = "ratelimitd"
	}
	for _, a := range addrs {
		pids[redisPID(t, a)] = "redis " + a
	}
	c := startCanary(t, addrs)
	stopClient := clientMonitor()
	stopSched := schedMonitor(pids)
	t.Cleanup(func() { stopClient(); stopSched() })
	return sync.OnceValue(func() noise {
		events := slices.Concat(c.stop(), stopClient(), stopSched())
		return noise{events: events}
	})
}

// schedEvery is how often schedMonitor reads the CPU waits.
const schedEvery = 10 * time.Millisecond

// schedMonitor reads, every schedEvery, how long each thread of the
// processes pids (by name) has waited for a CPU while runnable (the
// second field of /proc/<pid>/task/<tid>/schedstat, in ns), and records
// as an event of kind "sched" each wait of canaryReport or more (every
// wait of ratelimitd's): this machine's CPUs were busy with other work
// while the process had work to do. stop returns the events.
func schedMonitor(pids map[int]string) (stop func() []canaryEvent) {
	return background(func(ctx context.Context) (events []canaryEvent) {
		last := map[string]int64{} // by /proc path
		var readAt time.Time       // when the reads before began
		every(ctx, schedEvery, 100_000, func() {
			now := time.Now()
			for pid, name := range pids {
				// ratelimitd's every wait (they delay its timers: see
				// cpuWait); others' of canaryReport or more.
				report := canaryReport
				if name == "ratelimitd" {
					report = 1
				}
				paths, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
				for _, path := range paths {
					b, err := os.ReadFile(path)
					f := strings.Fields(string(b))
					if err != nil || len(f) < 2 {
						continue
					}
					waited, err := strconv.ParseInt(f[1], 10, 64)
					if err != nil {
						continue
					}
					prev, seen := last[path]
					last[path] = waited
					if d := time.Duration(waited - prev); seen && d >= report {
						events = append(events, canaryEvent{kind: "sched", node: name, at: now.Add(-d), d: d, from: readAt})
					}
				}
			}
			readAt = now
		})
		return events
	})
}

// nodeQuiet waits, for at most within, until p's breaker of node has been
// closed (its last line about node, if any, says it answers again) for
// quiet; it reports whether it was.
func nodeQuiet(p *proc, node string, quiet, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		var last time.Time
		open := false
		for l := range p.logLines() {
			if l.Node == node && strings.HasPrefix(l.Msg, "Redis Cluster node") {
				last, open = l.Time, strings.HasPrefix(l.Msg, "Redis Cluster node failing")
			}
		}
		if !open && time.Since(last) >= quiet {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lateHistogram counts the calls of cs that missed their deadline at the
// client by 100 ms from t, for messages.
func lateHistogram(cs callSet, t time.Time) string {
	m := map[int]int{}
	for _, c := range cs {
		if c.code == codes.DeadlineExceeded {
			m[int(math.Floor(c.start.Sub(t).Seconds()*10))]++
		}
	}
	return counts(m, func(k int) string { return fmt.Sprintf("%+.1fs", float64(k)/10) })
}

// counts is "key:n key:n ...", for messages: the counts m, in the order
// of their keys, each key as label writes it.
func counts[K cmp.Ordered](m map[K]int, label func(K) string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s:%d ", label(k), m[k])
	}
	return strings.TrimSpace(b.String())
}
