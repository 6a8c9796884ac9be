package main

// Overload process tests (issue 16): real ratelimitd processes and real
// redis-server processes under many callers with long deadlines. Queueing
// in ratelimitd is never a Redis failure; a Redis that stalls opens the
// breaker within its documented time and is answered, visibly, per the
// failure mode; calls of many descriptors are decided and charged exactly
// once; a mesh keeps its limit while other work holds the CPUs; and a
// replica says NOT_SERVING until Redis is ready.

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// wideConfig is runLoad's bucket (domain mesh, key k) at a rate no load
// here reaches: every call Redis decides is admitted, so an OVER_LIMIT
// answer can only be the failure mode's.
var wideConfig = "domain: mesh\ndescriptors:\n" + wideRule("k")

// scrape reads the process's /metrics.
func scrape(t *testing.T, p *proc) promText {
	t.Helper()
	code, body := servertest.Get(t, "http://"+p.httpAddr+"/metrics")
	if code != 200 {
		t.Fatalf("GET /metrics = %d", code)
	}
	return promText(body)
}

// promText is a /metrics body in the Prometheus text format.
type promText string

// sum is the sum of the samples of metric name (a full sample name, such as
// x_bucket or x_sum for a histogram) whose labels include every pair of
// labels ("k", "v", ...); found says whether there was any.
func (b promText) sum(name string, labels ...string) (total float64, found bool) {
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		got := map[string]string{}
		if rest[0] == '{' {
			var err error
			if got, rest, err = parseLabels(rest[1:]); err != nil {
				continue
			}
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			if v, ok := got[labels[i]]; !ok || v != labels[i+1] {
				match = false
			}
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			continue
		}
		total += v
		found = true
	}
	return total, found
}

// value is sum without found: an absent counter is 0.
func (b promText) value(name string, labels ...string) float64 {
	v, _ := b.sum(name, labels...)
	return v
}

// parseLabels parses `k="v",k2="v2"}` and returns the labels and what
// follows the closing brace.
func parseLabels(s string) (map[string]string, string, error) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, ", ")
		if strings.HasPrefix(s, "}") {
			return labels, s[1:], nil
		}
		eq := strings.Index(s, `="`)
		if eq < 0 {
			return nil, "", fmt.Errorf("no value in %q", s)
		}
		key := s[:eq]
		s = s[eq+2:]
		var v strings.Builder
		i := 0
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					v.WriteByte('\n')
				default:
					v.WriteByte(s[i])
				}
				continue
			}
			v.WriteByte(s[i])
		}
		if i == len(s) {
			return nil, "", fmt.Errorf("unterminated value in %q", s)
		}
		labels[key] = v.String()
		s = s[i+1:]
	}
}

// series lists the labelled samples of name, for messages.
func (b promText) series(name string) string {
	var out []string
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, name+"{") {
			out = append(out, strings.TrimSpace(strings.TrimPrefix(line, name)))
		}
	}
	if len(out) == 0 {
		if v, ok := b.sum(name); ok {
			return strconv.FormatFloat(v, 'g', -1, 64)
		}
		return "absent"
	}
	return strings.Join(out, " ")
}

// loadErrors is the number of calls of res that failed.
func loadErrors(res *loadResult) int {
	res.mu.Lock()
	defer res.mu.Unlock()
	n := 0
	for _, c := range res.errs {
		n += c
	}
	return n
}

// TestLocalQueueingIsNoRedisFailure has two phases on one process in deny
// mode, under 64 callers with 2 s deadlines on a rule that never denies.
//
// Queueing: each batch is held 20 ms from its first call before it is
// sent (--test-batch-hold of the testhooks build, as a saturated CPU
// would delay it), four times --backend-timeout (5 ms). Redis is healthy:
// every call is decided by Redis, none is answered by the failure mode,
// the breaker never opens, and the queue-wait histogram shows the
// queueing. (A round trip Redis itself holds past --backend-timeout is
// counted as a backend timeout, queueing or not: on this busy machine,
// under the race detector, one in a thousand is.)
//
// Paused: CLIENT PAUSE stalls Redis for 1.5 s under the same load: the
// breaker opens within its documented time, calls are answered OVER_LIMIT
// by the failure mode within their deadline, counted as backend errors and
// failure-mode answers (the descriptor outcome failure_mode), never as the
// rule's over_limit.
func TestLocalQueueingIsNoRedisFailure(t *testing.T) {
	const (
		callers     = 64
		callTimeout = 2 * time.Second
		batchHold   = 20 * time.Millisecond
		timeout     = 5 * time.Millisecond // --backend-timeout
		pause       = 2500 * time.Millisecond
		// --redis-read-timeout, given: shorter than its default for a
		// shorter test, long enough that the queueing phase's round trips,
		// on a busy machine under the race detector (seen: 160 ms), do not
		// reach it.
		readTimeout  = 250 * time.Millisecond
		writeTimeout = 100 * time.Millisecond // redisstore.DefaultWriteTimeout
		failures     = 3                      // --breaker-failures' default
		failingFor   = timeout                // --breaker-failing-for's default
	)
	srv := redistest.Start(t)
	dir := writeConfig(t, map[string]string{"mesh.yaml": wideConfig})
	p := startHooksProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr, "--on-backend-failure", "deny",
		"--test-batch-hold", batchHold.String(), "--redis-batch-max", "128", // more than the callers: no batch fills before its hold
		"--backend-timeout", timeout.String(), "--redis-read-timeout", readTimeout.String())
	rule := []string{"domain", "mesh", "rule", "wide"}

	// Queueing.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	res := runLoad(ctx, t, []string{p.grpcAddr}, callers, callTimeout)
	cancel()
	m := scrape(t, p)
	calls := res.admitted.Load() + res.denied.Load() + int64(loadErrors(res))
	waitSum, waitCount := m.value("ratelimitd_redis_queue_wait_seconds_sum"), m.value("ratelimitd_redis_queue_wait_seconds_count")
	under10ms := m.value("ratelimitd_redis_queue_wait_seconds_bucket", "le", "0.01")
	var mean time.Duration
	var over10ms float64
	if waitCount > 0 {
		mean = time.Duration(waitSum / waitCount * float64(time.Second))
		over10ms = 1 - under10ms/waitCount
	}
	t.Logf("queueing: %d calls, %d admitted, %d denied, errors %v, slowest %v; %.0f coalesced calls queued %v on average, %.0f%% over 10 ms",
		calls, res.admitted.Load(), res.denied.Load(), res.errs, time.Duration(res.slowest.Load()).Round(time.Millisecond),
		waitCount, mean.Round(10*time.Microsecond), 100*over10ms)
	if n := loadErrors(res); n > 0 {
		t.Errorf("queueing, Redis healthy: %d of %d calls failed (%v), want 0", n, calls, res.errs)
	}
	if res.denied.Load() > 0 {
		t.Errorf("queueing, Redis healthy: %d calls denied on a rule no load reaches: answered by the failure mode", res.denied.Load())
	}
	if res.admitted.Load() < 1000 {
		t.Errorf("queueing: only %d calls admitted in 2 s by %d callers", res.admitted.Load(), callers)
	}
	for _, c := range []struct{ name, want string }{
		{"ratelimitd_failure_mode_answers_total", "no call answered by the failure mode"},
		{"ratelimitd_failure_mode_activations_total", "the failure mode never activated"},
		{"ratelimitd_redis_late_answers_total", "no caller gave up on a call"},
		{"ratelimitd_descriptor_over_limit_total", "the rule denied nothing"},
	} {
		if v := m.value(c.name); v != 0 {
			t.Errorf("queueing, Redis healthy: %s = %s, want %s", c.name, m.series(c.name), c.want)
		}
	}
	if v := m.value("ratelimitd_descriptor_requests_total", append(rule, "outcome", "failure_mode")...); v != 0 {
		t.Errorf("queueing, Redis healthy: %v descriptors with outcome failure_mode, want 0", v)
	}
	if strings.Contains(p.logs.String(), "backend failing") {
		t.Errorf("queueing, Redis healthy: the breaker opened:\n%s", p.logs)
	}
	// The queueing was real: without it this phase proves nothing.
	if waitCount == 0 || (mean < 5*time.Millisecond && over10ms < 0.25) {
		t.Errorf("queueing: %.0f coalesced calls, queued %v on average, %.0f%% over 10 ms; want a mean of at least 5 ms or a quarter over 10 ms (--test-batch-hold %v)",
			waitCount, mean, 100*over10ms, batchHold)
	}

	// Paused.
	overBefore := m.value("ratelimitd_descriptor_over_limit_total", rule...)
	// Before the breaker opens, a call costs at most one round trip, which
	// the read and write timeouts bound (retries included); it opens once
	// breaker-failures calls have failed for breaker-failing-for. A call in
	// a batch is first held.
	openBound := failures*(readTimeout+writeTimeout) + failingFor + batchHold
	slack := 400 * time.Millisecond // a busy machine's scheduling
	// After the pause, the breaker may have just reopened (a probe that
	// failed as the pause ended, 200 ms, then --breaker-open-for, 500 ms)
	// and is probed again within half of that: under a second, three on a
	// busy machine.
	recoverWithin := 3 * time.Second
	ctx, cancel = context.WithTimeout(context.Background(), pause+time.Second)
	defer cancel()
	after := rlsv3.NewRateLimitServiceClient(openConn(t, p.grpcAddr))
	done := make(chan pauseResult, 1)
	go func() {
		time.Sleep(200 * time.Millisecond) // the load is on
		done <- pauseRedis(srv, p, after, pause, recoverWithin)
	}()
	res = runLoad(ctx, t, []string{p.grpcAddr}, callers, callTimeout)
	pr := <-done
	if pr.err != nil {
		t.Fatalf("paused: %v", pr.err)
	}
	took, ok := pr.opened, pr.opened > 0
	m = scrape(t, p)
	calls = res.admitted.Load() + res.denied.Load() + int64(loadErrors(res))
	t.Logf("paused: %d calls, %d admitted, %d denied, errors %v, slowest %v; breaker open %v after CLIENT PAUSE (bound %v + %v)",
		calls, res.admitted.Load(), res.denied.Load(), res.errs, time.Duration(res.slowest.Load()).Round(time.Millisecond),
		took.Round(time.Millisecond), openBound, slack)
	t.Logf("paused: Redis decides again %v after the pause ended", pr.recovered.Round(time.Millisecond))
	t.Logf("paused: failure-mode answers %s; backend errors %s; late answers %v, late give-backs %v, pending %v",
		m.series("ratelimitd_failure_mode_answers_total"), m.series("ratelimitd_backend_errors_total"),
		m.value("ratelimitd_redis_late_answers_total"), m.value("ratelimitd_redis_late_give_backs_total"),
		m.value("ratelimitd_redis_pending_calls"))
	switch {
	case !ok:
		t.Errorf("paused: the breaker did not open during the %v pause (no \"backend failing\" logged)\n%s", pause, p.logs)
	case took > openBound+slack:
		t.Errorf("paused: the breaker opened %v after CLIENT PAUSE, want within %v (%d failures × (read %v + write %v) + failing-for %v + batch hold %v) + %v",
			took, openBound+slack, failures, readTimeout, writeTimeout, failingFor, batchHold, slack)
	}
	if n := loadErrors(res); n > 0 {
		t.Errorf("paused, deny mode: %d of %d calls failed (%v), want every call answered", n, calls, res.errs)
	}
	if slow := time.Duration(res.slowest.Load()); slow >= callTimeout/2 {
		t.Errorf("paused: the slowest call took %v, want well within its %v deadline (a round trip is bounded by %v)", slow, callTimeout, readTimeout+writeTimeout)
	}
	if res.denied.Load() == 0 {
		t.Errorf("paused, deny mode: no call answered OVER_LIMIT by the failure mode (admitted %d)", res.admitted.Load())
	}
	if v := m.value("ratelimitd_failure_mode_activations_total", "mode", "deny"); v < 1 {
		t.Errorf("paused: ratelimitd_failure_mode_activations_total{mode=\"deny\"} = %v, want at least 1", v)
	}
	if v := m.value("ratelimitd_backend_errors_total", "backend", "redis"); v == 0 {
		t.Errorf("paused: ratelimitd_backend_errors_total{backend=\"redis\"} = %s, want more than 0", m.series("ratelimitd_backend_errors_total"))
	}
	for _, cause := range []string{"backend_failed", "breaker_open"} {
		if v := m.value("ratelimitd_failure_mode_answers_total", "mode", "deny", "cause", cause); v == 0 {
			t.Errorf("paused: ratelimitd_failure_mode_answers_total{mode=\"deny\",cause=%q} = 0 (%s), want more than 0",
				cause, m.series("ratelimitd_failure_mode_answers_total"))
		}
	}
	// Every OVER_LIMIT was the failure mode's (the rule denies nothing),
	// and each is counted as such, once.
	fallbacks := m.value("ratelimitd_failure_mode_answers_total", "mode", "deny")
	outcomes := m.value("ratelimitd_descriptor_requests_total", append(rule, "outcome", "failure_mode")...)
	if denied := res.denied.Load() + pr.denied; float64(denied) != fallbacks || fallbacks != outcomes {
		t.Errorf("paused: %d calls answered OVER_LIMIT (%d of the load, %d after the pause), ratelimitd_failure_mode_answers_total %v, descriptor outcome failure_mode %v; want all three equal",
			denied, res.denied.Load(), pr.denied, fallbacks, outcomes)
	}
	if overAfter := m.value("ratelimitd_descriptor_over_limit_total", rule...); overAfter != overBefore {
		t.Errorf("paused: the rule's ratelimitd_descriptor_over_limit_total went from %v to %v: failure-mode answers counted as the rule's denials", overBefore, overAfter)
	}

	// Redis decides again soon after the pause.
	if pr.recovered == 0 {
		t.Errorf("paused: %v after the pause ended, calls still answered %s, want decided by Redis\n%s", recoverWithin, pr.last, p.logs)
	}
}

// pauseResult is what pauseRedis saw.
type pauseResult struct {
	err error
	// opened is when, after CLIENT PAUSE, "backend failing" was logged;
	// 0 if not during the pause.
	opened time.Duration
	// recovered is when, after the pause ended, a call of rls was answered
	// OK (by Redis: the rule denies nothing); 0 if not within the bound,
	// last then being the last answer.
	recovered time.Duration
	last      string
	// denied counts the calls of rls answered OVER_LIMIT (by the failure
	// mode) until then.
	denied int64
}

// pauseRedis stalls srv for pause (CLIENT PAUSE … ALL), watches p's logs
// for the breaker opening meanwhile, then calls rls on a bucket of its own
// until Redis decides again, for at most within after the pause ends.
func pauseRedis(srv *redistest.Server, p *proc, rls rlsv3.RateLimitServiceClient, pause, within time.Duration) pauseResult {
	var r pauseResult
	if err := srv.Client().Do(context.Background(), "CLIENT", "PAUSE", strconv.Itoa(int(pause.Milliseconds())), "ALL").Err(); err != nil {
		r.err = fmt.Errorf("CLIENT PAUSE: %w", err)
		return r
	}
	at := time.Now()
	for time.Since(at) < pause {
		if r.opened == 0 && strings.Contains(p.logs.String(), "backend failing") {
			r.opened = time.Since(at)
		}
		time.Sleep(2 * time.Millisecond)
	}
	end := at.Add(pause)
	req := servertest.Request("mesh", servertest.Desc("k", "after-the-pause"))
	for time.Since(end) < within {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := rls.ShouldRateLimit(ctx, req)
		cancel()
		if err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			r.recovered = max(time.Since(end), 1)
			return r
		}
		if err == nil {
			r.denied++
		}
		r.last = fmt.Sprintf("%v %v", resp.GetOverallCode(), err)
		time.Sleep(5 * time.Millisecond)
	}
	return r
}

// descriptorLoad is what callUnique counted.
type descriptorLoad struct {
	calls, okCalls, okDescriptors, denied atomic.Int64
	mu                                    sync.Mutex
	errs                                  map[codes.Code]int
}

// callUnique runs callers goroutines, each calling ShouldRateLimit in the
// domain "many" with descs descriptors of key k, until ctx ends or it has
// made maxCalls calls; every descriptor value is unique in the run (tag,
// caller, call, descriptor).
func callUnique(ctx context.Context, rls rlsv3.RateLimitServiceClient, tag string, callers, descs, maxCalls int, callTimeout time.Duration) *descriptorLoad {
	load := &descriptorLoad{errs: map[codes.Code]int{}}
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for j := 0; j < maxCalls && ctx.Err() == nil; j++ {
				req := servertest.Request("many")
				for d := range descs {
					req.Descriptors = append(req.Descriptors, servertest.Desc("k", fmt.Sprintf("%s-caller-%d-call-%d-desc-%d", tag, i, j, d)))
				}
				callCtx, cancel := context.WithTimeout(context.Background(), callTimeout)
				resp, err := rls.ShouldRateLimit(callCtx, req)
				cancel()
				load.calls.Add(1)
				switch {
				case err != nil:
					load.mu.Lock()
					load.errs[status.Code(err)]++
					load.mu.Unlock()
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					load.okCalls.Add(1)
					load.okDescriptors.Add(int64(descs))
				default:
					load.denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return load
}

// bucketKeys counts the keys under prefix in Redis, the probe's aside.
func bucketKeys(t *testing.T, srv *redistest.Server, prefix string) int {
	t.Helper()
	c := srv.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := 0
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		if iter.Val() != prefix+"probe" {
			n++
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN %s*: %v", prefix, err)
	}
	return n
}

// scriptsRun is how many script commands (EVALSHA and EVAL) Redis ran, from
// INFO commandstats.
func scriptsRun(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	return commandCalls(t, srv, "evalsha", "eval")
}

// evalsRun is how many EVALs (a script sent whole, after NOSCRIPT) Redis
// ran, from INFO commandstats.
func evalsRun(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	return commandCalls(t, srv, "eval")
}

// commandCalls is how many times Redis ran the commands cmds (lower case),
// from INFO commandstats.
func commandCalls(t *testing.T, srv *redistest.Server, cmds ...string) int {
	t.Helper()
	info, err := srv.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	n := 0
	for line := range strings.Lines(info) {
		for _, cmd := range cmds {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
				calls, _, _ := strings.Cut(rest, ",")
				v, err := strconv.Atoi(calls)
				if err != nil {
					t.Fatalf("INFO commandstats: %q: %v", line, err)
				}
				n += v
			}
		}
	}
	return n
}

// TestManyDescriptorsOnAHealthyRedis: calls of many descriptors, each a
// bucket of its own, are all decided on a healthy Redis, and the buckets
// in Redis afterwards are exactly those of the descriptors of the calls
// answered OK: none charged for a call that failed, none missing. A bucket
// of one token an hour lives an hour after its one Take (a bucket's key
// expires when it is full again), and a value used twice would be denied.
func TestManyDescriptorsOnAHealthyRedis(t *testing.T) {
	const callTimeout = 2 * time.Second
	dir := writeConfig(t, map[string]string{"many.yaml": `domain: many
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1, name: per-value}
`})
	for _, tt := range []struct {
		callers, descs int
	}{
		{16, 64},
		{64, 8},
	} {
		t.Run(fmt.Sprintf("%dx%d", tt.callers, tt.descs), func(t *testing.T) {
			srv := redistest.Start(t)
			p := startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr)
			rls := rlsClient(t, p.grpcAddr)
			// At most 400k buckets a case, whatever the machine's speed.
			maxCalls := 400_000 / (tt.callers * tt.descs)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			start := time.Now()
			load := callUnique(ctx, rls, "run", tt.callers, tt.descs, maxCalls, callTimeout)
			elapsed := time.Since(start)
			cancel()
			// One descriptor more than --max-descriptors is refused, and
			// charges nothing.
			most := server.DefaultRequestLimits().MaxDescriptors
			tooMany := callUnique(context.Background(), rls, "too-many", 1, most+1, 1, callTimeout)
			keys := bucketKeys(t, srv, "ratelimitd:")
			m := scrape(t, p)
			// What Redis ran beside what ratelimitd sent: more means a
			// script ran twice (a client retry).
			scripts := fmt.Sprintf("Redis ran %d scripts, ratelimitd sent %.0f", scriptsRun(t, srv), m.value("ratelimitd_redis_scripts_total"))
			t.Logf("%d callers × %d descriptors: %d calls in %v, %d OK (%d descriptors), %d denied, errors %v; %d bucket keys in Redis; %s; failure-mode answers %s, backend errors %s",
				tt.callers, tt.descs, load.calls.Load(), elapsed.Round(time.Millisecond), load.okCalls.Load(), load.okDescriptors.Load(),
				load.denied.Load(), load.errs, keys, scripts, m.series("ratelimitd_failure_mode_answers_total"),
				m.series("ratelimitd_backend_errors_total"))
			if len(load.errs) > 0 {
				t.Errorf("%d of %d calls failed on a healthy Redis: %v", load.calls.Load()-load.okCalls.Load()-load.denied.Load(), load.calls.Load(), load.errs)
			}
			if load.denied.Load() > 0 {
				t.Errorf("%d calls denied, each descriptor value being new (%s)", load.denied.Load(), scripts)
			}
			if load.okCalls.Load() < int64(tt.callers) {
				t.Errorf("only %d calls answered OK in %v", load.okCalls.Load(), elapsed)
			}
			if int64(keys) != load.okDescriptors.Load() {
				t.Errorf("%d bucket keys in Redis after %d descriptors were answered OK: want one key each (%s)", keys, load.okDescriptors.Load(), scripts)
			}
			if tooMany.errs[codes.InvalidArgument] != 1 {
				t.Errorf("a call of %d descriptors: OK %d, denied %d, errors %v; want InvalidArgument (--max-descriptors %d)",
					most+1, tooMany.okCalls.Load(), tooMany.denied.Load(), tooMany.errs, most)
			}
		})
	}
}

// openConn dials addr and waits until the connection is open (a health
// check answered), so that a load's clock does not run while it connects.
func openConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn := servertest.Dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check of %s: %v", addr, err)
	}
	return conn
}

// warnings returns p's log lines above info level.
func warnings(p *proc) string {
	var out []string
	for line := range strings.Lines(p.logs.String()) {
		if !strings.Contains(line, `"level":"INFO"`) && !strings.Contains(line, `"level":"DEBUG"`) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}

// burnCPU starts n busy processes (other work on the machine), killed when
// the test ends.
func burnCPU(t *testing.T, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start a CPU burner: %v", err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
}

// TestMeshUnderACPUBurner: three replicas on one Redis share one 100/s
// burst-20 bucket under 16 callers each, with 2 s deadlines and the
// default --backend-timeout, while two busy processes keep both cores
// busy. Every call is answered (a saturated CPU is no Redis failure), and
// the bucket admits at most rate·t + burst over the wall time of the load,
// and nearly all of it.
func TestMeshUnderACPUBurner(t *testing.T) {
	const (
		rate, burst = 100, 20
		replicas    = 3
		perReplica  = 16
		duration    = 5 * time.Second
	)
	srv := redistest.Start(t)
	dir := writeConfig(t, map[string]string{"mesh.yaml": meshConfig})
	var procs []*proc
	var clients []rlsv3.RateLimitServiceClient
	for range replicas {
		p := startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr)
		procs = append(procs, p)
		clients = append(clients, rlsv3.NewRateLimitServiceClient(openConn(t, p.grpcAddr)))
	}
	burnCPU(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	start := time.Now()
	res := meshLoad(ctx, clients, replicas*perReplica, 2*time.Second)
	elapsed := time.Since(start)
	admitted := res.admitted.Load()
	// Redis decides on its own clock, within the test's wall time of the
	// load: no slack.
	upper := rate*elapsed.Seconds() + burst
	lower := 0.95 * (rate*duration.Seconds() + burst)
	var fallbacks []string
	var sent float64
	for i, p := range procs {
		m := scrape(t, p)
		sent += m.value("ratelimitd_redis_scripts_total")
		fallbacks = append(fallbacks, fmt.Sprintf("replica %d: failure-mode answers %s, backend errors %s", i,
			m.series("ratelimitd_failure_mode_answers_total"), m.series("ratelimitd_backend_errors_total")))
	}
	// What Redis ran beside what the replicas sent: more means a script
	// ran twice (a client retry), whose first answer, lost, may have
	// taken a token no caller was told of.
	scripts := fmt.Sprintf("Redis ran %d scripts, the replicas sent %.0f", scriptsRun(t, srv), sent)
	t.Logf("%d calls in %v: %d admitted (bounds %.0f to %.0f), %d denied, errors %v, slowest %v; %s; %s",
		admitted+res.denied.Load()+int64(loadErrors(res)), elapsed.Round(time.Millisecond), admitted, lower, upper,
		res.denied.Load(), res.errs, time.Duration(res.slowest.Load()).Round(time.Millisecond), scripts, strings.Join(fallbacks, "; "))
	if n := loadErrors(res); n > 0 {
		var logs []string
		for i, p := range procs {
			logs = append(logs, fmt.Sprintf("replica %d:\n%s", i, warnings(p)))
		}
		t.Errorf("%d calls failed under the CPU burner with 2 s deadlines: %v, want 0 (%s)\n%s", n, res.errs, scripts, strings.Join(logs, "\n"))
	}
	if float64(admitted) > upper {
		t.Errorf("over-admitted: %d > rate·t + burst = %.0f (t = %v)", admitted, upper, elapsed)
	}
	if float64(admitted) < lower {
		t.Errorf("under-admitted: %d < 95%% of %d (%s)", admitted, rate*int(duration.Seconds())+burst, scripts)
	}
}

// TestNotServingUntilRedisIsReady: a replica in error mode that starts
// while Redis is down says NOT_SERVING on gRPC health until Redis is up
// and prepared, then SERVING within a few seconds; the first calls after
// that, with Envoy's 20 ms deadline, are all decided.
func TestNotServingUntilRedisIsReady(t *testing.T) {
	srv := redistest.Start(t)
	srv.Stop()
	dir := writeConfig(t, map[string]string{"mesh.yaml": wideConfig})
	// startProc returns once the first preparation failed ("backend not
	// ready" logged).
	p := startProc(t, "--config", dir, "--redis-url", "redis://"+srv.Addr, "--on-backend-failure", "error")
	conn := servertest.Dial(t, p.grpcAddr)
	hc := healthpb.NewHealthClient(conn)
	health := func() (map[string]healthpb.HealthCheckResponse_ServingStatus, bool) {
		t.Helper()
		got := map[string]healthpb.HealthCheckResponse_ServingStatus{}
		serving := true
		for _, name := range []string{"ratelimit", ""} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
			cancel()
			if err != nil {
				t.Fatalf("health check %q: %v", name, err)
			}
			got[name] = resp.GetStatus()
			serving = serving && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
		}
		return got, serving
	}
	// Down, and still down after a few more attempts to prepare (every
	// 250 ms).
	for _, wait := range []time.Duration{0, 600 * time.Millisecond} {
		time.Sleep(wait)
		got, _ := health()
		for name, st := range got {
			if st != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Errorf("Redis down for %v more: health %q = %v, want NOT_SERVING", wait, name, st)
			}
		}
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	for {
		got, serving := health()
		if serving {
			t.Logf("SERVING %v after Redis came back", time.Since(up).Round(time.Millisecond))
			break
		}
		if time.Since(up) > 3*time.Second {
			t.Fatalf("3 s after Redis came back: health %v, want SERVING\n%s", got, p.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// At once: 200 calls from 8 callers. The deadline is 250 ms, not
	// Envoy's 20 ms, so that a CPU this busy test machine gives to other
	// tests cannot fail them: what is tested is that none pays for the
	// backend's start (a dial, a script load), which the scripts' count
	// shows exactly: Redis never ran EVAL, the fallback of a script not
	// loaded yet.
	rls := rlsv3.NewRateLimitServiceClient(conn)
	var mu sync.Mutex
	errs := map[string]int{}
	var ok atomic.Int64
	var slowest atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 25 {
				req := servertest.Request("mesh", servertest.Desc("k", fmt.Sprintf("first-%d-%d", i, j)))
				ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
				start := time.Now()
				resp, err := rls.ShouldRateLimit(ctx, req)
				took := time.Since(start)
				cancel()
				raiseTo(&slowest, int64(took))
				switch {
				case err != nil:
					mu.Lock()
					errs[fmt.Sprintf("%v: %s", status.Code(err), status.Convert(err).Message())]++
					mu.Unlock()
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("first calls after SERVING: %d of 200 OK, slowest %v, errors %v", ok.Load(), time.Duration(slowest.Load()).Round(100*time.Microsecond), errs)
	if len(errs) > 0 {
		t.Errorf("first 200 calls after SERVING, 250 ms deadlines: errors %v, want none", errs)
	}
	if n := evalsRun(t, srv); n != 0 {
		t.Errorf("Redis ran EVAL %d times: a call found a script not loaded yet, want it loaded before SERVING", n)
	}
	if ok.Load() != 200 {
		t.Errorf("first 200 calls after SERVING: %d OK, want 200 (the rule denies nothing)", ok.Load())
	}
}
