package failover_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// nodeOf is the shard of the bucket named key, as a Redis Cluster would
// place it: keys "a…" on node n1, "b…" on n2, others on no node known yet.
func nodeOf(key string) string {
	switch {
	case strings.HasPrefix(key, "a"):
		return "n1"
	case strings.HasPrefix(key, "b"):
		return "n2"
	}
	return ""
}

// shardBackend is a hand-written limiter.Store over the shards nodeOf
// names: answer, which the test sets, gets the shards of each call's
// buckets and returns the call's error, or nil to let the in-memory
// buckets decide.
type shardBackend struct {
	fakeStore
	answer func(shards []string) error
}

func (b *shardBackend) set(answer func(shards []string) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.answer = answer
}

func (b *shardBackend) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	var shards []string
	for _, r := range reqs {
		if n := nodeOf(r.Key); !slices.Contains(shards, n) {
			shards = append(shards, n)
		}
	}
	b.mu.Lock()
	b.calls++
	answer := b.answer
	b.mu.Unlock()
	if answer != nil {
		if err := answer(shards); err != nil {
			return nil, fmt.Errorf("fake: %w", err)
		}
	}
	return b.mem.Take(ctx, now, reqs)
}

// failOn answers a call that touches any of nodes with a failure of each
// of them it touches (a *limiter.ShardError wrapping ErrUnavailable,
// joined when several), as redisstore does on a Cluster.
func failOn(nodes ...string) func([]string) error {
	return func(shards []string) error {
		var errs []error
		for _, n := range shards {
			if slices.Contains(nodes, n) {
				errs = append(errs, &limiter.ShardError{Shard: n, Err: fmt.Errorf("%w: connection refused", limiter.ErrUnavailable)})
			}
		}
		if len(errs) == 1 {
			return errs[0]
		}
		return errors.Join(errs...)
	}
}

// failWith answers every call with err.
func failWith(err error) func([]string) error {
	return func([]string) error { return err }
}

// nodes parses "n1,n2" (or "") into node names.
func nodes(list string) []string {
	if list == "" {
		return nil
	}
	return strings.Split(list, ",")
}

// roomy never runs out in these tests: the buckets decide, and admit.
var roomy = limiter.Limit{Count: 1000, Period: time.Second, Burst: 1000}

// shardReqs asks for one token of each bucket in keys ("a,b").
func shardReqs(keys string) []limiter.Request {
	var reqs []limiter.Request
	for _, k := range strings.Split(keys, ",") {
		reqs = append(reqs, limiter.Request{Key: k, Limit: roomy, Hits: 1})
	}
	return reqs
}

// shardRig is a Store over a shardBackend on a fake clock, recording what
// it reports. Its callbacks run on the test's goroutine (the Take's or
// Probe's).
type shardRig struct {
	t   *testing.T
	s   *failover.Store
	b   *shardBackend
	clk *clocktest.Clock

	shardChanges []string // OnShardChange: "n1:false"
	changes      []bool   // OnChange
	dropped      []string // OnShardDropped
	failures     []error  // OnBackendFailure
	fallbacks    []limiter.Fallback
	probes       map[string]int // ProbeShard calls
	wholeProbes  int            // Options.Probe calls
	probeErr     error          // what ProbeShard and Probe answer
	// probeMu guards what the callbacks record: Probe checks shards at
	// once, and their changes are reported from those checks.
	probeMu sync.Mutex
}

// newShardRig returns a rig whose Store has opts, with the rig's clock and
// callbacks (opts.Shard is left as given).
func newShardRig(t *testing.T, opts failover.Options) *shardRig {
	t.Helper()
	r := &shardRig{t: t, b: &shardBackend{fakeStore: newFakeStore()}, clk: clocktest.New(), probes: map[string]int{}}
	r.clk.Set(t0)
	opts.Now = r.clk.Now
	opts.OnShardChange = func(shard string, healthy bool, err error) {
		r.probeMu.Lock()
		defer r.probeMu.Unlock()
		if !healthy && err == nil {
			t.Errorf("OnShardChange(%q, false, nil), want the failure", shard)
		}
		r.shardChanges = append(r.shardChanges, fmt.Sprintf("%s:%v", shard, healthy))
	}
	opts.OnChange = func(healthy bool, err error) {
		r.probeMu.Lock()
		defer r.probeMu.Unlock()
		if !healthy && err == nil {
			t.Errorf("OnChange(false, nil), want the failure")
		}
		r.changes = append(r.changes, healthy)
	}
	opts.OnShardDropped = func(shard string) {
		r.probeMu.Lock()
		defer r.probeMu.Unlock()
		r.dropped = append(r.dropped, shard)
	}
	opts.OnBackendFailure = func(err error) {
		r.probeMu.Lock()
		defer r.probeMu.Unlock()
		r.failures = append(r.failures, err)
	}
	opts.OnFallback = func(cause limiter.Fallback) {
		r.probeMu.Lock()
		defer r.probeMu.Unlock()
		r.fallbacks = append(r.fallbacks, cause)
	}
	opts.ProbeShard = func(ctx context.Context, shard string) error {
		r.probeMu.Lock()
		defer r.probeMu.Unlock()
		r.probes[shard]++
		return r.probeErr
	}
	opts.Probe = func(ctx context.Context) error {
		r.probeMu.Lock()
		defer r.probeMu.Unlock()
		r.wholeProbes++
		return r.probeErr
	}
	s, err := failover.New(r.b, opts)
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	return r
}

// at sets the clock to d after t0.
func (r *shardRig) at(d time.Duration) { r.clk.Set(t0.Add(d)) }

// take asks for keys ("a,b") and checks the answer, in Allow mode: decided
// by the buckets (want FallbackNone), or allowed per the mode with want in
// every Decision's Fallback. It reports whether the call reached the
// backend.
func (r *shardRig) take(where, keys string, want limiter.Fallback) (reached bool) {
	r.t.Helper()
	calls := r.b.Calls()
	d, err := r.s.Take(context.Background(), t0, shardReqs(keys))
	if err != nil {
		r.t.Errorf("%s: Take(%q) = %v, want answered (cause %v)", where, keys, err, want)
		return r.b.Calls() > calls
	}
	for i := range d {
		if d[i].Fallback != want || (want != limiter.FallbackNone && !d[i].Allowed) {
			r.t.Errorf("%s: Take(%q)[%d] = %+v, want Fallback %v (allowed per the mode unless none)", where, keys, i, d[i], want)
		}
	}
	return r.b.Calls() > calls
}

// step is step i of a timeline: d after t0, with the nodes failing ("n1,n2",
// or ""), it asks for keys and checks the answer as take does. It returns
// the step's name for messages.
func (r *shardRig) step(i int, d time.Duration, failing, keys string, want limiter.Fallback) (where string) {
	r.t.Helper()
	r.at(d)
	r.b.set(failOn(nodes(failing)...))
	where = fmt.Sprintf("step %d (%v, failing %q)", i+1, d, failing)
	r.take(where, keys, want)
	return where
}

// perNode is the Options of most tests here: Allow mode, a breaker per
// node that opens after 3 failures over 20ms, for a second.
var perNode = failover.Options{Mode: failover.Allow, Shard: nodeOf, FailureThreshold: 3, FailingFor: 20 * time.Millisecond, OpenFor: time.Second}

// TestShardIsolation: a failing node's breaker opens for its buckets
// alone, which are then answered per the mode without the backend, while
// the other node's keep reaching it; the backend is unhealthy only once
// every node's breaker has opened, and healthy again at the first node's
// recovery.
func TestShardIsolation(t *testing.T) {
	const ms = time.Millisecond
	type step struct {
		at          time.Duration // since t0
		failing     string        // the nodes failing, "n1,n2"
		keys        string        // the Take's buckets
		wantCause   limiter.Fallback
		wantCalls   int    // Takes that reached the backend, in all
		wantShard   string // OnShardChange calls so far
		wantChanges string // OnChange calls so far
		wantHealthy bool
	}
	none, failed, open := limiter.FallbackNone, limiter.FallbackBackendFailed, limiter.FallbackBreakerOpen
	steps := []step{
		{0, "n1", "a", failed, 1, "[]", "[]", true},
		{0, "n1", "b", none, 2, "[]", "[]", true},
		{10 * ms, "n1", "a", failed, 3, "[]", "[]", true},
		{20 * ms, "n1", "a", failed, 4, "[n1:false]", "[]", true}, // 3 failures over 20ms: n1 opens until 1020ms
		{21 * ms, "n1", "a", open, 4, "[n1:false]", "[]", true},
		{21 * ms, "n1", "a,b", open, 4, "[n1:false]", "[]", true},
		{21 * ms, "n1", "b,a", open, 4, "[n1:false]", "[]", true},
		{21 * ms, "n1", "b", none, 5, "[n1:false]", "[]", true},
		{30 * ms, "n1,n2", "b", failed, 6, "[n1:false]", "[]", true},
		{40 * ms, "n1,n2", "b", failed, 7, "[n1:false]", "[]", true},
		{50 * ms, "n1,n2", "b", failed, 8, "[n1:false n2:false]", "[false]", false}, // n2 opens until 1050ms
		{51 * ms, "n1,n2", "b", open, 8, "[n1:false n2:false]", "[false]", false},
		{51 * ms, "n1,n2", "a", open, 8, "[n1:false n2:false]", "[false]", false},
		{1019 * ms, "", "a", open, 8, "[n1:false n2:false]", "[false]", false},
		{1020 * ms, "", "a", none, 9, "[n1:false n2:false n1:true]", "[false true]", true}, // n1's probe succeeds
		{1020 * ms, "", "b", open, 9, "[n1:false n2:false n1:true]", "[false true]", true},
		{1050 * ms, "", "b", none, 10, "[n1:false n2:false n1:true n2:true]", "[false true]", true},
		{1050 * ms, "", "a,b", none, 11, "[n1:false n2:false n1:true n2:true]", "[false true]", true},
	}
	r := newShardRig(t, perNode)
	for i, st := range steps {
		where := r.step(i, st.at, st.failing, st.keys, st.wantCause)
		if got := r.b.Calls(); got != st.wantCalls {
			t.Errorf("%s: Take(%q): %d backend calls in all, want %d", where, st.keys, got, st.wantCalls)
		}
		if got := fmt.Sprint(r.shardChanges); got != st.wantShard {
			t.Errorf("%s: Take(%q): OnShardChange calls %s, want %s", where, st.keys, got, st.wantShard)
		}
		if got := fmt.Sprint(r.changes); got != st.wantChanges {
			t.Errorf("%s: Take(%q): OnChange calls %s, want %s", where, st.keys, got, st.wantChanges)
		}
		if got := r.s.Healthy(); got != st.wantHealthy {
			t.Errorf("%s: after Take(%q), Healthy() = %v, want %v", where, st.keys, got, st.wantHealthy)
		}
	}
}

// TestFailuresCountAgainstTheShardsNamed: a Take spanning n1 and n2 whose
// error names some shards counts against those alone, the others of the
// call being released; one that names none counts against both. After 21
// such Takes over 20ms (FailureThreshold 3, FailingFor 20ms), a shard that
// counted them is open; one that did not is closed, and one more failure
// leaves it closed (had it counted them, that failure would open it).
func TestFailuresCountAgainstTheShardsNamed(t *testing.T) {
	shardErr := func(n string) error {
		return &limiter.ShardError{Shard: n, Err: fmt.Errorf("%w: connection reset", limiter.ErrUnavailable)}
	}
	tests := []struct {
		name        string
		err         error
		wantOpen    string // the shards open after the Takes
		wantShard   string // OnShardChange calls
		wantHealthy bool
	}{
		{"names n2", shardErr("n2"), "n2", "[n2:false]", true},
		{"names n1", shardErr("n1"), "n1", "[n1:false]", true},
		{"names n2, wrapped", fmt.Errorf("take 2 buckets: %w", shardErr("n2")), "n2", "[n2:false]", true},
		{"names both, joined", errors.Join(shardErr("n1"), shardErr("n2")), "n1,n2", "[n1:false n2:false]", false},
		{"names a shard outside the call (a redirect)", shardErr("n3"), "", "[n3:false]", true},
		{"names none", fmt.Errorf("%w: connection refused", limiter.ErrUnavailable), "n1,n2", "[n1:false n2:false]", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newShardRig(t, perNode)
			r.b.set(failWith(tt.err))
			for i := range 21 {
				r.at(time.Duration(i) * time.Millisecond)
				where := fmt.Sprintf("call %d (%v)", i+1, time.Duration(i)*time.Millisecond)
				if !r.take(where, "a,b", limiter.FallbackBackendFailed) {
					t.Errorf("%s: Take(%q) did not reach the backend, want it to (no breaker open yet)", where, "a,b")
				}
			}
			if got := fmt.Sprint(r.shardChanges); got != tt.wantShard {
				t.Errorf("after 21 Takes: OnShardChange calls %s, want %s", got, tt.wantShard)
			}
			if got := r.s.Healthy(); got != tt.wantHealthy {
				t.Errorf("after 21 Takes: Healthy() = %v, want %v", got, tt.wantHealthy)
			}
			r.at(21 * time.Millisecond)
			for _, c := range []struct{ node, key string }{{"n1", "a"}, {"n2", "b"}} {
				r.b.set(failOn(c.node))
				where := fmt.Sprintf("%s at 21ms", c.node)
				if slices.Contains(nodes(tt.wantOpen), c.node) {
					if r.take(where, c.key, limiter.FallbackBreakerOpen) {
						t.Errorf("%s: Take(%q) reached the backend, want %s's breaker open", where, c.key, c.node)
					}
					continue
				}
				r.take(where, c.key, limiter.FallbackBackendFailed) // one more failure
				if !r.take(where, c.key, limiter.FallbackBackendFailed) {
					t.Errorf("%s: Take(%q) after one more failure did not reach the backend: %s had counted the Takes that did not name it", where, c.key, c.node)
				}
			}
		})
	}
}

// TestTryAgainIsNoFailure: a backend that asks for the call again later
// (limiter.ErrTryAgain: a slot mid-move, a cluster failing over), however
// long, is answered per the mode with FallbackTryAgain, and counts
// against no breaker nor as a backend failure; a real failure after 50 of
// them is the first of its outage.
func TestTryAgainIsNoFailure(t *testing.T) {
	tryAgain := fmt.Errorf("%w: TRYAGAIN Multiple keys request during rehashing of slot", limiter.ErrTryAgain)
	tests := []struct {
		name string
		mode failover.Mode
		keys string
		err  error
		fail error // a real failure of the same call
	}{
		{"wrapped, allow", failover.Allow, "a", fmt.Errorf("CLUSTERDOWN: %w", limiter.ErrTryAgain), failOn("n1")([]string{"n1"})},
		{"in a ShardError, allow", failover.Allow, "a", &limiter.ShardError{Shard: "n1", Err: tryAgain}, failOn("n1")([]string{"n1"})},
		{"in a ShardError, deny", failover.Deny, "a", &limiter.ShardError{Shard: "n1", Err: tryAgain}, failOn("n1")([]string{"n1"})},
		{"in a ShardError, error", failover.Error, "a", &limiter.ShardError{Shard: "n1", Err: tryAgain}, failOn("n1")([]string{"n1"})},
		{"in a ShardError, on a Take spanning both", failover.Allow, "a,b", &limiter.ShardError{Shard: "n2", Err: tryAgain}, limiter.ErrUnavailable},
		{"naming no shard, on a Take spanning both", failover.Allow, "a,b", tryAgain, limiter.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newShardRig(t, failover.Options{Mode: tt.mode, Shard: nodeOf, FailureThreshold: 3, FailingFor: 20 * time.Millisecond, OpenFor: time.Second})
			r.b.set(failWith(tt.err))
			const n = 50
			for i := range n {
				r.at(time.Duration(i) * 10 * time.Millisecond)
				calls := r.b.Calls()
				d, err := r.s.Take(context.Background(), t0, shardReqs(tt.keys))
				if r.b.Calls() != calls+1 {
					t.Fatalf("call %d: Take(%q) did not reach the backend, want every call to (no breaker open)", i+1, tt.keys)
				}
				switch tt.mode {
				case failover.Error:
					if d != nil || !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, limiter.ErrTryAgain) {
						t.Errorf("call %d: Take(%q) = %+v, %v; want the failure mode's error wrapping ErrTryAgain", i+1, tt.keys, d, err)
					}
				default:
					if err != nil || len(d) == 0 {
						t.Fatalf("call %d: Take(%q) = %+v, %v; want answered per the mode", i+1, tt.keys, d, err)
					}
					for j := range d {
						if d[j].Fallback != limiter.FallbackTryAgain || d[j].Allowed != (tt.mode == failover.Allow) {
							t.Errorf("call %d: Take(%q)[%d] = %+v, want %v per the mode, Fallback %v", i+1, tt.keys, j, d[j], tt.mode, limiter.FallbackTryAgain)
						}
					}
				}
			}
			if len(r.failures) != 0 || len(r.shardChanges) != 0 || len(r.changes) != 0 || !r.s.Healthy() {
				t.Errorf("after %d Takes asked again: OnBackendFailure %v, OnShardChange %v, OnChange %v, Healthy() %v; want none, none, none, true",
					n, r.failures, r.shardChanges, r.changes, r.s.Healthy())
			}
			if want := slices.Repeat([]limiter.Fallback{limiter.FallbackTryAgain}, n); !slices.Equal(r.fallbacks, want) {
				t.Errorf("after %d Takes asked again: OnFallback calls %v, want %d × %v", n, r.fallbacks, n, limiter.FallbackTryAgain)
			}
			// Had they counted, this failure (the 51st over 500ms) would
			// open the breaker, and the next call would not reach the
			// backend.
			r.at(n * 10 * time.Millisecond)
			r.b.set(failWith(tt.fail))
			r.s.Take(context.Background(), t0, shardReqs(tt.keys))
			calls := r.b.Calls()
			r.s.Take(context.Background(), t0, shardReqs(tt.keys))
			if r.b.Calls() != calls+1 || len(r.failures) != 2 {
				t.Errorf("two failures after them: Take(%q) reached the backend %v, OnBackendFailure called %d times; want true, 2", tt.keys, r.b.Calls() == calls+1, len(r.failures))
			}
		})
	}
}

// TestTakeJudgesDeadlines: a call the backend held (or whose round trip it
// was queued behind the backend held) for Timeout is the backend's
// failure, whether or not the store still awaits its answer (Pending);
// less is this process's overload, counted against nothing.
func TestTakeJudgesDeadlines(t *testing.T) {
	const timeout = 10 * time.Millisecond
	tests := []struct {
		name      string
		err       *limiter.DeadlineError
		inShard   bool // wrapped in a *limiter.ShardError naming n1
		wantCause limiter.Fallback
	}{
		{"in flight past Timeout, pending", &limiter.DeadlineError{InFlight: timeout + time.Millisecond, Pending: true}, false, limiter.FallbackBackendFailed},
		{"in flight Timeout, pending", &limiter.DeadlineError{InFlight: timeout, Pending: true}, false, limiter.FallbackBackendFailed},
		{"in flight Timeout, not pending", &limiter.DeadlineError{InFlight: timeout}, false, limiter.FallbackBackendFailed},
		{"in flight past Timeout, pending, in a ShardError", &limiter.DeadlineError{InFlight: timeout + time.Millisecond, Pending: true}, true, limiter.FallbackBackendFailed},
		{"in flight 1ns under Timeout, pending", &limiter.DeadlineError{InFlight: timeout - time.Nanosecond, Pending: true}, false, limiter.FallbackOverloaded},
		{"in flight 1ms, pending", &limiter.DeadlineError{InFlight: time.Millisecond, Pending: true}, false, limiter.FallbackOverloaded},
		{"unsent, behind a round trip stalled Timeout", &limiter.DeadlineError{Queued: timeout, Stalled: timeout}, false, limiter.FallbackBackendFailed},
		{"unsent, behind a round trip stalled 1ns under Timeout", &limiter.DeadlineError{Queued: timeout, Stalled: timeout - time.Nanosecond}, false, limiter.FallbackOverloaded},
		{"in flight 1ms, behind a round trip stalled Timeout", &limiter.DeadlineError{InFlight: time.Millisecond, Stalled: timeout}, false, limiter.FallbackBackendFailed},
		{"queued 1s, never sent, nothing ahead", &limiter.DeadlineError{Queued: time.Second}, false, limiter.FallbackOverloaded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			de := *tt.err
			de.Err = context.DeadlineExceeded
			var err error = &de
			if tt.inShard {
				err = &limiter.ShardError{Shard: "n1", Err: err}
			}
			r := newShardRig(t, failover.Options{Mode: failover.Allow, Shard: nodeOf, Timeout: timeout, FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second})
			r.take("before", "b", limiter.FallbackNone) // n2 known and healthy
			r.b.set(failWith(fmt.Errorf("take: %w", err)))
			r.take("first", "a", tt.wantCause)
			counted := tt.wantCause == limiter.FallbackBackendFailed
			if got := len(r.failures) == 1; got != counted {
				t.Errorf("Take(%q) with %v: OnBackendFailure called %d times, want counted %v", "a", &de, len(r.failures), counted)
			}
			want := limiter.FallbackOverloaded // not counted: the backend is asked again
			if counted {
				want = limiter.FallbackBreakerOpen
			}
			r.take("second", "a", want)
			if got, wantShard := fmt.Sprint(r.shardChanges), map[bool]string{true: "[n1:false]", false: "[]"}[counted]; got != wantShard {
				t.Errorf("Take(%q) with %v: OnShardChange calls %s, want %s", "a", &de, got, wantShard)
			}
			if !r.s.Healthy() {
				t.Errorf("Take(%q) with %v: Healthy() = false, want true (n2 closed)", "a", &de)
			}
		})
	}
}

// TestObserve: what the backend did with a call no caller waited for
// counts against the shard it was on (or the shard its error names):
// answered within Timeout, a success that closes the open breaker;
// answered at Timeout or later, or still unanswered then, a failure; an
// overload, a try-again or an invalid request, nothing.
func TestObserve(t *testing.T) {
	const timeout = 10 * time.Millisecond
	unavailable := fmt.Errorf("%w: connection reset", limiter.ErrUnavailable)
	tests := []struct {
		name         string
		open         bool // n1's breaker opened by a failed Take first
		shard        string
		held         time.Duration
		err          error
		wantOpen     string // the shards open after it
		wantFailures int    // OnBackendFailure calls of Observe
		wantShard    string // OnShardChange calls, in all
	}{
		{"answered under Timeout closes the open breaker", true, "n1", timeout - time.Nanosecond, nil, "", 0, "[n1:false n1:true]"},
		{"answered under Timeout, closed breaker", false, "n1", time.Millisecond, nil, "", 0, "[]"},
		{"answered under Timeout on n2 leaves n1 open", true, "n2", time.Millisecond, nil, "n1", 0, "[n1:false]"},
		{"answered at Timeout: a failure", false, "n1", timeout, nil, "n1", 1, "[n1:false]"},
		{"answered at Timeout keeps the breaker open", true, "n1", timeout, nil, "n1", 1, "[n1:false]"},
		{"unanswered, pending, in flight Timeout", false, "n1", timeout,
			&limiter.DeadlineError{InFlight: timeout, Pending: true, Err: context.DeadlineExceeded}, "n1", 1, "[n1:false]"},
		{"unanswered, pending, in flight 1ns under Timeout: overload", false, "n1", timeout - time.Nanosecond,
			&limiter.DeadlineError{InFlight: timeout - time.Nanosecond, Pending: true, Err: context.DeadlineExceeded}, "", 0, "[]"},
		{"unsent, stalled Timeout", false, "n1", timeout,
			&limiter.DeadlineError{Stalled: timeout, Err: context.DeadlineExceeded}, "n1", 1, "[n1:false]"},
		{"an error", false, "n1", time.Millisecond, unavailable, "n1", 1, "[n1:false]"},
		{"an error naming n2", false, "n1", time.Millisecond, &limiter.ShardError{Shard: "n2", Err: unavailable}, "n2", 1, "[n2:false]"},
		// Sent 200ms ago, before n2 last answered (the setup's Take, 100ms
		// ago): a black hole's round trip failing at the read timeout.
		{"an error of a round trip sent before the last success", false, "n2", 200 * time.Millisecond, unavailable, "", 1, "[]"},
		{"try again", false, "n1", time.Millisecond, &limiter.ShardError{Shard: "n1", Err: fmt.Errorf("%w: TRYAGAIN", limiter.ErrTryAgain)}, "", 0, "[]"},
		{"an invalid request", false, "n1", time.Millisecond, fmt.Errorf("%w: hits", limiter.ErrInvalidRequest), "", 0, "[]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newShardRig(t, failover.Options{Mode: failover.Allow, Shard: nodeOf, Timeout: timeout, FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second})
			r.take("setup", "b", limiter.FallbackNone)
			if tt.open {
				r.b.set(failOn("n1"))
				r.take("setup", "a", limiter.FallbackBackendFailed)
				r.b.set(nil)
			}
			before := len(r.failures)
			r.at(100 * time.Millisecond) // the setup's calls were at t0
			r.s.Observe(tt.shard, tt.held, tt.err)
			call := fmt.Sprintf("Observe(%q, %v, %v)", tt.shard, tt.held, tt.err)
			if got := len(r.failures) - before; got != tt.wantFailures {
				t.Errorf("%s: OnBackendFailure called %d times, want %d", call, got, tt.wantFailures)
			}
			if got := fmt.Sprint(r.shardChanges); got != tt.wantShard {
				t.Errorf("%s: OnShardChange calls %s, want %s", call, got, tt.wantShard)
			}
			for _, c := range []struct{ node, key string }{{"n1", "a"}, {"n2", "b"}} {
				want := limiter.FallbackNone
				if slices.Contains(nodes(tt.wantOpen), c.node) {
					want = limiter.FallbackBreakerOpen
				}
				r.take(call+", then", c.key, want)
			}
		})
	}
}

// TestObserveFailuresOpenAShard: failures observed outside calls open a
// shard's breaker as calls' do, FailureThreshold of them over FailingFor,
// and that shard's alone.
func TestObserveFailuresOpenAShard(t *testing.T) {
	const ms = time.Millisecond
	unavailable := fmt.Errorf("%w: i/o timeout", limiter.ErrUnavailable)
	steps := []struct {
		at        time.Duration
		held      time.Duration
		err       error
		wantShard string
	}{
		{0, ms, unavailable, "[]"},
		{10 * ms, 50 * ms, nil, "[]"}, // answered past Timeout
		{19 * ms, ms, unavailable, "[]"},
		{20 * ms, ms, unavailable, "[n1:false]"}, // 4 over 20ms
		{30 * ms, ms, unavailable, "[n1:false]"},
	}
	r := newShardRig(t, failover.Options{Mode: failover.Allow, Shard: nodeOf, Timeout: 10 * ms, FailureThreshold: 3, FailingFor: 20 * ms, OpenFor: time.Second})
	r.take("setup", "b", limiter.FallbackNone)
	for i, st := range steps {
		r.at(st.at)
		r.s.Observe("n1", st.held, st.err)
		if got := fmt.Sprint(r.shardChanges); got != st.wantShard {
			t.Errorf("step %d: Observe(%q, %v, %v) at %v: OnShardChange calls %s, want %s", i+1, "n1", st.held, st.err, st.at, got, st.wantShard)
		}
	}
	r.take("after", "a", limiter.FallbackBreakerOpen)
	r.take("after", "b", limiter.FallbackNone)
	if !r.s.Healthy() || len(r.changes) != 0 || len(r.failures) != len(steps) {
		t.Errorf("after: Healthy() = %v, OnChange %v, %d backend failures; want true (n2 closed), none, %d", r.s.Healthy(), r.changes, len(r.failures), len(steps))
	}
}

// TestProbeShards: Probe checks each shard's open breaker past OpenFor
// with ProbeShard (never Options.Probe, the whole backend's), which closes
// it or keeps it open another OpenFor, and drops the breakers of shards
// no call has asked for within 10s (a refused call asks), reporting
// OnShardDropped and the backend's health that leaves.
func TestProbeShards(t *testing.T) {
	const s = time.Second
	none, failed, open := limiter.FallbackNone, limiter.FallbackBackendFailed, limiter.FallbackBreakerOpen
	type step struct {
		at          time.Duration
		failing     string // the nodes failing, for Takes and probes
		op          string // "probe", or the keys of a Take
		wantCause   limiter.Fallback
		wantErr     bool   // from Probe
		wantProbes  string // ProbeShard calls, in all
		wantShard   string // OnShardChange calls, in all
		wantDropped string // OnShardDropped calls, in all
		wantChanges string // OnChange calls, in all
		wantHealthy bool
	}
	steps := []step{
		{0, "n1", "b", none, false, "map[]", "[]", "[]", "[]", true},
		{0, "n1", "a", failed, false, "map[]", "[n1:false]", "[]", "[]", true}, // n1 open until 1s
		{s / 2, "n1", "probe", none, false, "map[]", "[n1:false]", "[]", "[]", true},
		{s, "n1", "probe", none, true, "map[n1:1]", "[n1:false]", "[]", "[]", true}, // fails: open until 2s
		{s, "", "a", open, false, "map[n1:1]", "[n1:false]", "[]", "[]", true},
		{2 * s, "", "probe", none, false, "map[n1:2]", "[n1:false n1:true]", "[]", "[]", true},
		{2 * s, "", "a", none, false, "map[n1:2]", "[n1:false n1:true]", "[]", "[]", true},
		{2 * s, "", "probe", none, false, "map[n1:2]", "[n1:false n1:true]", "[]", "[]", true}, // closed: nothing to do
		// Both fail: open until 3s.
		{2 * s, "n1,n2", "a", failed, false, "map[n1:2]", "[n1:false n1:true n1:false]", "[]", "[]", true},
		{2 * s, "n1,n2", "b", failed, false, "map[n1:2]", "[n1:false n1:true n1:false n2:false]", "[]", "[false]", false},
		{3 * s, "n1,n2", "probe", none, true, "map[n1:3 n2:1]", "[n1:false n1:true n1:false n2:false]", "[]", "[false]", false},
		{3*s + s/2, "n1,n2", "b", open, false, "map[n1:3 n2:1]", "[n1:false n1:true n1:false n2:false]", "[]", "[false]", false},
		// n1 last asked for at 2s: kept at 12s, dropped just after.
		{12 * s, "n1,n2", "probe", none, true, "map[n1:4 n2:2]", "[n1:false n1:true n1:false n2:false]", "[]", "[false]", false},
		{12*s + 1, "n1,n2", "probe", none, false, "map[n1:4 n2:2]", "[n1:false n1:true n1:false n2:false]", "[n1]", "[false]", false},
		// n2, last asked for at 3.5s, dropped at 13.5s+1ns: no shard known.
		{13*s + s/2 + 1, "n1,n2", "probe", none, false, "map[n1:4 n2:2]", "[n1:false n1:true n1:false n2:false]", "[n1 n2]", "[false true]", true},
		// n1, dropped, is asked for again: closed.
		{13*s + s/2 + 1, "", "a", none, false, "map[n1:4 n2:2]", "[n1:false n1:true n1:false n2:false]", "[n1 n2]", "[false true]", true},
	}
	r := newShardRig(t, failover.Options{Mode: failover.Allow, Shard: nodeOf, FailureThreshold: 1, FailingFor: -1, OpenFor: s})
	for i, st := range steps {
		r.at(st.at)
		r.b.set(failOn(nodes(st.failing)...))
		r.probeErr = nil
		if st.failing != "" {
			r.probeErr = fmt.Errorf("ping: %w", limiter.ErrUnavailable)
		}
		call := fmt.Sprintf("step %d (%v, failing %q): Take(%q)", i+1, st.at, st.failing, st.op)
		if st.op == "probe" {
			call = fmt.Sprintf("step %d (%v, failing %q): Probe()", i+1, st.at, st.failing)
			if err := r.s.Probe(context.Background()); (err != nil) != st.wantErr {
				t.Errorf("%s = %v, want an error: %v", call, err, st.wantErr)
			}
		} else {
			r.take(call, st.op, st.wantCause)
		}
		if got := fmt.Sprint(r.probes); got != st.wantProbes {
			t.Errorf("%s: ProbeShard calls %s, want %s", call, got, st.wantProbes)
		}
		if got := fmt.Sprint(r.shardChanges); got != st.wantShard {
			t.Errorf("%s: OnShardChange calls %s, want %s", call, got, st.wantShard)
		}
		if got := fmt.Sprint(r.dropped); got != st.wantDropped {
			t.Errorf("%s: OnShardDropped calls %s, want %s", call, got, st.wantDropped)
		}
		if got := fmt.Sprint(r.changes); got != st.wantChanges {
			t.Errorf("%s: OnChange calls %s, want %s", call, got, st.wantChanges)
		}
		if got := r.s.Healthy(); got != st.wantHealthy {
			t.Errorf("%s: Healthy() = %v, want %v", call, got, st.wantHealthy)
		}
	}
	if r.wholeProbes != 0 {
		t.Errorf("Options.Probe called %d times, want 0: every breaker was a named shard's", r.wholeProbes)
	}
}

// TestUnsharded: with no Options.Shard, one breaker serves every bucket:
// failures on any keys open it for all, Healthy turns false, OnChange
// reports it once, and no shard is reported.
func TestUnsharded(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name string
		err  error
	}{
		{"an error", fmt.Errorf("%w: connection refused", limiter.ErrUnavailable)},
		{"a deadline the backend held", &limiter.DeadlineError{InFlight: 10 * ms, Pending: true, Err: context.DeadlineExceeded}},
		{"an error naming a shard", &limiter.ShardError{Shard: "n1", Err: limiter.ErrUnavailable}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newShardRig(t, failover.Options{Mode: failover.Allow, Timeout: 10 * ms, FailureThreshold: 3, FailingFor: 20 * ms, OpenFor: time.Second})
			r.take("setup", "a,b", limiter.FallbackNone)
			r.b.set(failWith(tt.err))
			for i, keys := range []string{"a", "b", "c"} {
				r.at(time.Duration(i) * 10 * ms)
				r.take(fmt.Sprintf("failure %d", i+1), keys, limiter.FallbackBackendFailed)
			}
			if r.s.Healthy() || fmt.Sprint(r.changes) != "[false]" || len(r.shardChanges) != 0 {
				t.Errorf("after 3 failures over 20ms: Healthy() = %v, OnChange %v, OnShardChange %v; want false, [false], none", r.s.Healthy(), r.changes, r.shardChanges)
			}
			r.b.set(nil)
			for _, keys := range []string{"a", "b", "c", "a,b"} {
				r.take("open", keys, limiter.FallbackBreakerOpen)
			}
			r.at(time.Second + 20*ms)
			r.take("probe", "b", limiter.FallbackNone)
			if !r.s.Healthy() || fmt.Sprint(r.changes) != "[false true]" {
				t.Errorf("after the probe succeeded: Healthy() = %v, OnChange %v; want true, [false true]", r.s.Healthy(), r.changes)
			}
		})
	}
}

// TestTheOtherShardsOfAFailedCallAreReleased: a failure that names n2
// neither fails nor succeeds n1, though n1's bucket was in the call: n1's
// count of failures goes on (a success would restart it) and its
// half-open probe is given back for the next call (a success would close
// it).
func TestTheOtherShardsOfAFailedCallAreReleased(t *testing.T) {
	const ms = time.Millisecond
	steps := []struct {
		at        time.Duration
		failing   string
		keys      string
		wantCause limiter.Fallback
		wantShard string // OnShardChange calls so far
	}{
		{0, "n1", "a", limiter.FallbackBackendFailed, "[]"},
		{10 * ms, "n1", "a", limiter.FallbackBackendFailed, "[]"},
		{15 * ms, "n2", "a,b", limiter.FallbackBackendFailed, "[]"},
		{20 * ms, "n1", "a", limiter.FallbackBackendFailed, "[n1:false]"},                    // n1's third failure over 20ms
		{1020 * ms, "n2", "a,b", limiter.FallbackBackendFailed, "[n1:false]"},                // n1's probe, released
		{1020 * ms, "", "a", limiter.FallbackNone, "[n1:false n1:true]"},                     // the next call probes
		{1020 * ms, "n2", "b", limiter.FallbackBackendFailed, "[n1:false n1:true n2:false]"}, // n2: 3 failures (15ms, 1020ms twice)
	}
	r := newShardRig(t, perNode)
	for i, st := range steps {
		where := r.step(i, st.at, st.failing, st.keys, st.wantCause)
		if got := fmt.Sprint(r.shardChanges); got != st.wantShard {
			t.Errorf("%s: Take(%q): OnShardChange calls %s, want %s", where, st.keys, got, st.wantShard)
		}
	}
}

// TestJoinedErrorsAreJudgedPerShard: a Take spanning nodes fails with the
// errors of its nodes joined (redisstore's cluster Take does so); each
// node's error is its own, so a node's real failure counts against it
// whatever the other node's error says (asked again, or overloaded), and
// whatever the order of the join.
func TestJoinedErrorsAreJudgedPerShard(t *testing.T) {
	const timeout = 10 * time.Millisecond
	n1 := map[string]error{
		"asked again": &limiter.ShardError{Shard: "n1", Err: fmt.Errorf("%w: TRYAGAIN", limiter.ErrTryAgain)},
		"overloaded":  &limiter.ShardError{Shard: "n1", Err: &limiter.DeadlineError{Queued: time.Millisecond, Err: context.DeadlineExceeded}},
	}
	n2 := map[string]error{
		"down": &limiter.ShardError{Shard: "n2", Err: fmt.Errorf("%w: connection refused", limiter.ErrUnavailable)},
		"held": &limiter.ShardError{Shard: "n2", Err: &limiter.DeadlineError{InFlight: time.Second, Err: context.DeadlineExceeded}},
	}
	tests := []struct {
		name string
		err  error
	}{
		{"n1 asked again, n2 down", errors.Join(n1["asked again"], n2["down"])},
		{"n2 down, n1 asked again", errors.Join(n2["down"], n1["asked again"])},
		{"n1 overloaded, n2 held past Timeout", errors.Join(n1["overloaded"], n2["held"])},
		{"n2 held past Timeout, n1 overloaded", errors.Join(n2["held"], n1["overloaded"])},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newShardRig(t, failover.Options{Mode: failover.Allow, Shard: nodeOf, Timeout: timeout, FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second})
			r.b.set(failWith(tt.err))
			r.take("the joined failure", "a,b", limiter.FallbackBackendFailed)
			if got := fmt.Sprint(r.shardChanges); got != "[n2:false]" || len(r.failures) != 1 {
				t.Errorf("Take(%q) failing with %v: OnShardChange calls %s, %d backend failures; want [n2:false], 1", "a,b", tt.err, got, len(r.failures))
			}
		})
	}
}

// TestHealthyOnceEveryNodeFails: a bucket whose node was not known yet
// (Options.Shard returned "") made a breaker of the whole backend's; once
// no call has asked for it in a long while and every node's breaker is
// open, the backend is unhealthy.
func TestHealthyOnceEveryNodeFails(t *testing.T) {
	r := newShardRig(t, failover.Options{Mode: failover.Allow, Shard: nodeOf, FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second})
	r.take("at start", "c", limiter.FallbackNone)
	r.at(time.Hour)
	if err := r.s.Probe(context.Background()); err != nil {
		t.Fatalf("Probe() an hour later = %v, want nil (nothing open)", err)
	}
	r.b.set(failOn("n1", "n2"))
	r.take("an hour later", "a", limiter.FallbackBackendFailed)
	r.take("an hour later", "b", limiter.FallbackBackendFailed)
	// n2, first asked for after n1 opened, was healthy until it failed
	// (a new node makes the backend healthy again): false, true, false.
	if r.s.Healthy() || fmt.Sprint(r.changes) != "[false true false]" {
		t.Errorf("n1 and n2 open, Take(%q) an hour ago: Healthy() = %v, OnChange %v; want false, [false true false]", "c", r.s.Healthy(), r.changes)
	}
}

// TestDroppingAHealthyShardReportsTheFailure: when the idle shard Probe
// drops was the last healthy one, OnChange(false, err) carries the error
// of a shard still failing, as every report of a failure does.
func TestDroppingAHealthyShardReportsTheFailure(t *testing.T) {
	r := newShardRig(t, failover.Options{Mode: failover.Allow, Shard: nodeOf, FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second})
	r.take("at start", "b", limiter.FallbackNone)
	r.at(10*time.Second + 1)
	r.b.set(failOn("n1"))
	r.take("10s later", "a", limiter.FallbackBackendFailed)
	r.s.Probe(context.Background()) // drops n2; the rig's OnChange reports a nil error
	if r.s.Healthy() || fmt.Sprint(r.changes) != "[false]" || fmt.Sprint(r.dropped) != "[n2]" {
		t.Errorf("Probe() dropping n2 with n1 open: Healthy() = %v, OnChange %v, OnShardDropped %v; want false, [false], [n2]", r.s.Healthy(), r.changes, r.dropped)
	}
}
