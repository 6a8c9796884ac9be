package limitspage_test

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/limitspage"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// admissionConfig has buckets that refill at different rates.
const admissionConfig = `
domain: adm
descriptors:
  - key: fast
    rate_limit: {unit: minute, requests_per_unit: 10, burst: 10}
  - key: slow
    rate_limit: {unit: hour, requests_per_unit: 10, burst: 10}
  - key: other
    rate_limit: {unit: minute, requests_per_unit: 10, burst: 10}
  - key: wide
    rate_limit: {unit: minute, requests_per_unit: 100, burst: 100}
`

// use is a call on one bucket of admissionConfig: key=value, after t0,
// leaving used tokens in use (all of them: the call was denied), under the
// rule's limit or the one given.
type use struct {
	after      time.Duration
	key, value string
	used       int64
	limit      limiter.Limit
}

func (u use) call(tb testing.TB, set *config.Set, t0 time.Time) server.Call {
	tb.Helper()
	rule := set.Lookup("adm", []config.Entry{{Key: u.key, Value: u.value}})
	if rule == nil {
		tb.Fatalf("no rule for %s=%s", u.key, u.value)
	}
	var l limiter.Limit // the rule's first bucket; none for an unlimited rule
	if len(rule.Limits) > 0 {
		l = rule.Limits[0].Limit
	}
	if u.limit != (limiter.Limit{}) {
		l = u.limit
	}
	o := server.DescriptorOutcome{
		Descriptor: servertest.Desc(u.key, u.value),
		Rule:       rule, Outcome: server.WithinLimit, Hits: 1, Limit: l,
		Decision: limiter.Decision{Allowed: true, Remaining: l.Burst - u.used},
	}
	if u.used >= l.Burst {
		o.Outcome, o.Decision = server.OverLimit, limiter.Decision{}
	}
	return server.Call{Domain: "adm", Start: t0.Add(u.after), Descriptors: []server.DescriptorOutcome{o}}
}

// parseAdmission parses admissionConfig.
func parseAdmission(t *testing.T) *config.Set {
	t.Helper()
	return servertest.ParseConfig(t, "adm.yaml", admissionConfig)
}

// checkListed observes setup then calls on a tracker of 4, and checks
// whether Busiest lists the last call's bucket with its tokens in use, as
// want says.
func checkListed(t *testing.T, set *config.Set, t0 time.Time, setup, calls []use, want bool) {
	t.Helper()
	tr := limitspage.NewTracker(limitspage.TrackerOptions{MaxBuckets: 4})
	for _, u := range append(setup[:len(setup):len(setup)], calls...) {
		tr.ObserveCall(u.call(t, set, t0))
	}
	last := calls[len(calls)-1]
	if got := listed(tr, last, t0); got != want {
		t.Errorf("after %+v, Busiest lists %s=%s with %d in use: %v, want %v\nBusiest = %+v",
			calls, last.key, last.value, last.used, got, want, tr.Busiest(100, t0.Add(last.after)))
	}
}

// listed reports whether Busiest at u's time lists u's bucket with u's
// tokens in use.
func listed(tr *limitspage.Tracker, u use, t0 time.Time) bool {
	for _, b := range tr.Busiest(100, t0.Add(u.after)) {
		if b.Descriptor == u.key+"="+u.value {
			return b.Used == u.used
		}
	}
	return false
}

// TestTrackerAdmission: a tracker of 4 holds slow=k1 8/10, fast=k2 6/10,
// slow=k3 4/10 and slow=k4 2/10 at t0, when fast=d is denied. That evicts
// k3 and k4, and sets the bar at k2's 0.6, falling by the fast rule's
// refill, 0.1 every 6 s. Each case then makes some calls and checks
// whether the last one's bucket is listed.
func TestTrackerAdmission(t *testing.T) {
	set := parseAdmission(t)
	t0 := clocktest.Start
	setup := []use{
		{0, "slow", "k1", 8, limiter.Limit{}},
		{0, "fast", "k2", 6, limiter.Limit{}},
		{0, "slow", "k3", 4, limiter.Limit{}},
		{0, "slow", "k4", 2, limiter.Limit{}},
		{0, "fast", "d", 10, limiter.Limit{}},
	}
	perSecond := limiter.Limit{Count: 10, Period: time.Second, Burst: 10}
	tests := []struct {
		name  string
		calls []use
		want  bool
	}{
		{"barely used", []use{{0, "fast", "new", 1, limiter.Limit{}}}, false},
		{"barely used, on a rule with no bucket held", []use{{0, "other", "new", 1, limiter.Limit{}}}, false},
		{"below the bar", []use{{0, "fast", "new", 5, limiter.Limit{}}}, false},
		{"at the bar", []use{{0, "fast", "new", 6, limiter.Limit{}}}, true},
		{"above the bar, on a rule with no bucket held", []use{{0, "other", "new", 7, limiter.Limit{}}}, true},
		{"denied", []use{{0, "slow", "new", 10, limiter.Limit{}}}, true},
		{"held, updated below the bar", []use{{time.Second, "fast", "d", 1, limiter.Limit{}}}, true},
		{"held, updated again", []use{{time.Second, "slow", "k1", 2, limiter.Limit{}}, {2 * time.Second, "slow", "k1", 5, limiter.Limit{}}}, true},
		{"above the bar fallen in 12 s", []use{{12 * time.Second, "fast", "new", 5, limiter.Limit{}}}, true},
		{"below the bar fallen in 12 s", []use{{12 * time.Second, "fast", "new", 3, limiter.Limit{}}}, false},
		{"after the kept fast bucket refilled", []use{{36 * time.Second, "fast", "new", 1, limiter.Limit{}}}, true},
		{"after every bucket refilled", []use{{time.Hour, "slow", "new", 1, limiter.Limit{}}}, true},
		{"a kept bucket left below the bar removes it", []use{{0, "fast", "k2", 1, limiter.Limit{}}, {0, "fast", "new", 2, limiter.Limit{}}}, true},
		{"a kept bucket left at the bar keeps it", []use{{0, "fast", "k2", 6, limiter.Limit{}}, {0, "fast", "new", 2, limiter.Limit{}}}, false},
		{"a kept bucket given a faster limit removes the bar", []use{{0, "fast", "k2", 6, perSecond}, {time.Second, "fast", "new", 5, limiter.Limit{}}}, true},
		// k2, left at 5/10 at 12 s (the bar is 0.4 then), shows 5/10 at
		// any instant before too: at 1 s, where the bar would be about
		// 0.58, a bucket at 0.55 is fuller than k2.
		{"a late call judged at the last call on a kept bucket", []use{
			{12 * time.Second, "fast", "k2", 5, limiter.Limit{}},
			{time.Second, "wide", "new", 55, limiter.Limit{}},
		}, true},
		// After k1's call at 12 s, new buckets are judged at 12 s at the
		// earliest (the bar is 0.4), and so are kept ones: k2, left at
		// 5/10 by a call at 1 s, is about 0.32 by then, and by 13 s it
		// shows 3/10, less than a new bucket's 0.35.
		{"a late call leaves a kept bucket below the bar at the last call", []use{
			{12 * time.Second, "slow", "k1", 8, limiter.Limit{}},
			{time.Second, "fast", "k2", 5, limiter.Limit{}},
			{13 * time.Second, "wide", "new", 35, limiter.Limit{}},
		}, true},
		{"a held bucket not kept, left below the bar, keeps it", []use{{0, "fast", "d", 1, limiter.Limit{}}, {0, "fast", "new", 2, limiter.Limit{}}}, false},
		{"a call that fills the tracker evicts, and meets the new bar", []use{
			{0, "other", "a", 7, limiter.Limit{}}, // held: k1, k2, d, a
			{0, "other", "b", 7, limiter.Limit{}}, // evicts all but d and k1: the bar is 0.8
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkListed(t, set, t0, setup, tt.calls, tt.want)
		})
	}
}

// TestTrackerBarFollowsTheEstimate: slow=k1 8/10, fast=k2 6/10, slow=k3
// 3/10 and slow=k4 2/10 at t0 fill a tracker of 4; fast=d, denied at
// evictAt, evicts all but k1 and k2. The bar must stay at or below what
// the page estimates for k2, which counts its refill in whole tokens, and
// which calls that started before the eviction can change.
func TestTrackerBarFollowsTheEstimate(t *testing.T) {
	set := parseAdmission(t)
	t0 := clocktest.Start
	tests := []struct {
		name    string
		evictAt time.Duration
		calls   []use // the last one's bucket is checked
		want    bool
	}{
		// At 9 s k2 shows 5/10 but has refilled 1.5 tokens: the bar is
		// 0.45, and 0.40 at 12 s, when k2 shows 4/10.
		{"above k2 once it refilled another token", 9 * time.Second, []use{{12 * time.Second, "wide", "new", 42, limiter.Limit{}}}, true},
		{"below k2 once it refilled another token", 9 * time.Second, []use{{12 * time.Second, "wide", "new", 39, limiter.Limit{}}}, false},
		// At 12 s k2 shows 4/10: the bar is 0.4. A call that started at
		// 1 s leaves it with 5 or 6 in use, less 11/6 refilled by 12 s:
		// about 0.32 or 0.42.
		{"a late call leaves a kept bucket below the bar", 12 * time.Second, []use{{time.Second, "fast", "k2", 5, limiter.Limit{}}, {12 * time.Second, "fast", "new", 3, limiter.Limit{}}}, true},
		{"a late call leaves a kept bucket above the bar", 12 * time.Second, []use{{time.Second, "fast", "k2", 6, limiter.Limit{}}, {12 * time.Second, "fast", "new", 3, limiter.Limit{}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setup := []use{
				{0, "slow", "k1", 8, limiter.Limit{}},
				{0, "fast", "k2", 6, limiter.Limit{}},
				{0, "slow", "k3", 3, limiter.Limit{}},
				{0, "slow", "k4", 2, limiter.Limit{}},
				{tt.evictAt, "fast", "d", 10, limiter.Limit{}},
			}
			checkListed(t, set, t0, setup, tt.calls, tt.want)
		})
	}
}

// TestTrackerKeepsASlowerBucketWhileItHasRoom: after an eviction leaves
// room, a bucket below the bar that refills more slowly than the bar falls
// is still remembered, since it outranks the kept buckets once they have
// refilled: fast=k1..k4 at 9/10 fill a tracker of 4 at t0, fast=k5 at 9/10
// evicts down to two and sets a bar of 0.9 falling 0.1 every 6 s; slow=s
// at 3/10 arrives at 6 s (the bar is 0.8), and two minutes later it is the
// one bucket still in use.
func TestTrackerKeepsASlowerBucketWhileItHasRoom(t *testing.T) {
	set := parseAdmission(t)
	t0 := clocktest.Start
	tr := limitspage.NewTracker(limitspage.TrackerOptions{MaxBuckets: 4})
	for _, v := range []string{"k1", "k2", "k3", "k4", "k5"} {
		tr.ObserveCall(use{0, "fast", v, 9, limiter.Limit{}}.call(t, set, t0))
	}
	slow := use{6 * time.Second, "slow", "s", 3, limiter.Limit{}}
	tr.ObserveCall(slow.call(t, set, t0))
	// Two minutes on, the fast buckets have refilled; s has refilled a
	// third of a token and still shows 3 in use.
	later := 2 * time.Minute
	got := tr.Busiest(10, t0.Add(later))
	if len(got) != 1 || got[0].Descriptor != "slow=s" {
		t.Errorf("Busiest at +%v = %+v, want slow=s alone", later, got)
	}
}

// TestTrackerBusiestWhileObserving is for the race detector: Busiest
// ranks buckets after letting go of the lock that calls update them under.
func TestTrackerBusiestWhileObserving(t *testing.T) {
	set := parseAdmission(t)
	t0 := clocktest.Start
	tr := limitspage.NewTracker(limitspage.TrackerOptions{MaxBuckets: 8})
	var calls []server.Call
	for i := range 2000 {
		calls = append(calls, use{time.Duration(i) * time.Millisecond, "fast", strconv.Itoa(i % 12), int64(1 + i%10), limiter.Limit{}}.call(t, set, t0))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, c := range calls {
			tr.ObserveCall(c)
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		default:
		}
		for _, b := range tr.Busiest(5, t0.Add(time.Duration(i)*time.Millisecond)) {
			if b.Used <= 0 || b.Used > b.Burst {
				t.Fatalf("Busiest lists %+v", b)
			}
		}
	}
}

// benchConfig is the descriptor file of ratelimit-bench's load: generous
// per-client rules that always admit, and abuser buckets of one per hour.
const benchConfig = "../../bench/config/bench.yaml"

// zipfCalls returns n calls shaped like ratelimit-bench's mixed load, one
// descriptor each, 20 µs apart from t0: a client value drawn Zipf-like
// (s = 1.1) from 10,000 with 1–3 entries, admitted; or, for a fifth of
// them, an abuser value drawn the same way, denied. It also returns the
// calls that spend each abuser's only token first, as the load tool's
// priming does.
func zipfCalls(tb testing.TB, n int, t0 time.Time) (prime, calls []server.Call) {
	tb.Helper()
	data, err := os.ReadFile(benchConfig)
	if err != nil {
		tb.Fatal(err)
	}
	set := servertest.ParseConfig(tb, "bench.yaml", string(data))
	const keyspace = 10000
	values := make([]string, keyspace)
	for i := range values {
		values[i] = "tenant-" + strconv.Itoa(i)
	}
	routes := make([]string, 16)
	for i := range routes {
		routes[i] = "/api/v1/resource" + strconv.Itoa(i)
	}
	methods := []string{"GET", "POST", "PUT", "DELETE"}
	call := func(at time.Time, allowed bool, kv ...string) server.Call {
		d := servertest.Desc(kv...)
		rule := set.Lookup("bench", servertest.Entries(kv...))
		if rule == nil {
			tb.Fatalf("no rule for %v", kv)
		}
		o := server.DescriptorOutcome{Descriptor: d, Rule: rule, Outcome: server.WithinLimit, Hits: 1, Limit: rule.Limits[0].Limit,
			Decision: limiter.Decision{Allowed: true, Remaining: rule.Limits[0].Limit.Burst - 1}}
		if !allowed {
			o.Outcome, o.Decision = server.OverLimit, limiter.Decision{}
		}
		return server.Call{Domain: "bench", Start: at, Descriptors: []server.DescriptorOutcome{o}}
	}
	at := t0.Add(-time.Second)
	for _, v := range values {
		prime = append(prime, call(at, true, "abuser", v))
		at = at.Add(time.Microsecond)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	zv := rand.NewZipf(rng, 1.1, 1, keyspace-1)
	zr := rand.NewZipf(rng, 1.1, 1, uint64(len(routes)-1))
	for i := range n {
		at := t0.Add(time.Duration(i) * 20 * time.Microsecond)
		v, r, m := values[zv.Uint64()], routes[zr.Uint64()], methods[rng.IntN(len(methods))]
		switch k := rng.IntN(3); {
		case rng.Float64() < 0.2:
			calls = append(calls, call(at, false, "abuser", v))
		case k == 0:
			calls = append(calls, call(at, true, "client", v))
		case k == 1:
			calls = append(calls, call(at, true, "client", v, "route", r))
		default:
			calls = append(calls, call(at, true, "client", v, "route", r, "method", m))
		}
	}
	return prime, calls
}

// BenchmarkObserveCallZipf feeds a default Tracker the load tool's mixed
// traffic: a long tail of client buckets seen once or twice, a fifth of the
// calls denied on abuser buckets.
func BenchmarkObserveCallZipf(b *testing.B) {
	const n = 1 << 16
	t0 := clocktest.Start
	prime, calls := zipfCalls(b, n, t0)
	tr := limitspage.NewTracker(limitspage.TrackerOptions{})
	for _, c := range prime {
		tr.ObserveCall(c)
	}
	for _, c := range calls { // reach the steady state
		tr.ObserveCall(c)
	}
	span := n * 20 * time.Microsecond
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c := calls[i%n]
		c.Start = c.Start.Add(time.Duration(1+i/n) * span)
		tr.ObserveCall(c)
		i++
	}
}
