package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

func TestCheckLoopback(t *testing.T) {
	for _, tt := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:8081", true},
		{"127.0.0.2:0", true},
		{"[::1]:8081", true},
		{"localhost:6379", true},
		{"10.0.0.1:8081", false},
		{"example.com:8081", false},
		{"0.0.0.0:8081", false},
		{":8081", false},
		{"127.0.0.1", false},
	} {
		if err := checkLoopback(tt.addr); (err == nil) != tt.ok {
			t.Errorf("checkLoopback(%q) = %v, want ok=%v", tt.addr, err, tt.ok)
		}
	}
}

// TestMixMatchesConfig checks that every request the mixes generate matches
// the rule meant for it in the config --write-config writes.
func TestMixMatchesConfig(t *testing.T) {
	set := servertest.ParseConfig(t, "bench.yaml", benchConfig)
	voc := newVocabulary(1000)
	mixed := newMixer(mixParams{mix: MixMixed, keyspace: 1000, overLimitShare: 0.2, zipfS: 1.1}, voc, 7)
	entriesSeen := map[int]int{}
	aimed := 0
	const calls = 5000
	for range calls {
		req, over := mixed.next()
		d := req.GetDescriptors()[0]
		entries := make([]config.Entry, 0, 3)
		for _, e := range d.GetEntries() {
			entries = append(entries, config.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		rule := set.Lookup(req.GetDomain(), entries)
		want := map[bool][]string{false: {"", "client", "client-route", "client-route-method"}, true: {"", "abuser"}}[over][len(entries)]
		if rule == nil || rule.Name != want {
			t.Fatalf("mixed request %v (aimed over: %v) matched %v, want rule %q", entries, over, rule, want)
		}
		entriesSeen[len(entries)]++
		if over {
			aimed++
		}
	}
	for n := 1; n <= 3; n++ {
		if entriesSeen[n] == 0 {
			t.Errorf("no mixed request had %d entries in %d calls", n, calls)
		}
	}
	if share := float64(aimed) / calls; share < 0.17 || share > 0.23 {
		t.Errorf("share aimed over the limit = %.3f, want about 0.2", share)
	}

	hot := newMixer(mixParams{mix: MixHot, keyspace: 1000, zipfS: 1.1}, voc, 7)
	req, over := hot.next()
	e := req.GetDescriptors()[0].GetEntries()
	if rule := set.Lookup(req.GetDomain(), []config.Entry{{Key: e[0].GetKey(), Value: e[0].GetValue()}}); !over || rule == nil || rule.Name != "hot" {
		t.Errorf("hot-key request matched %v (aimed over: %v), want rule hot", rule, over)
	}
}

func TestPercentiles(t *testing.T) {
	lat := make([]int64, 0, 1002)
	for i := 1000; i >= 1; i-- {
		lat = append(lat, int64(i)*1000) // 1µs … 1000µs
	}
	lat = append(lat, -1, -2) // a failed and a cut-off call
	p50, p99, p999, maxUs := percentiles(lat)
	if p50 != 500 || p99 != 990 || p999 != 999 || maxUs != 1000 {
		t.Errorf("percentiles = %v, %v, %v, %v; want 500, 990, 999, 1000", p50, p99, p999, maxUs)
	}
	if p50, _, _, _ := percentiles([]int64{-1}); p50 != 0 {
		t.Errorf("percentiles of no answered call: p50 = %v, want 0", p50)
	}
}

func TestRedisUsage(t *testing.T) {
	before, err := parseInfo("# Stats\r\ntotal_commands_processed:100\r\ntotal_reads_processed:50\r\n# Commandstats\r\ncmdstat_evalsha:calls=10,usec=5\r\ncmdstat_info:calls=1,usec=3\r\ncmdstat_ping:calls=1\r\n# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.000000\r\nused_cpu_sys_children:9.000000\r\n")
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseInfo("total_commands_processed:400\r\ntotal_reads_processed:72\r\ncmdstat_evalsha:calls=110,usec=5\r\ncmdstat_get:calls=100,usec=1\r\ncmdstat_info:calls=2,usec=3\r\ncmdstat_ping:calls=7\r\nused_cpu_sys:1.600000\r\nused_cpu_user:2.100000\r\n")
	if err != nil {
		t.Fatal(err)
	}
	u := usage(before, after, 200)
	// PINGs: 6, of which the second snapshot's is ours; INFO: 1, ours.
	if u.Scripts != 100 || u.Commands != 205 || u.ByCommand["ping"] != 5 || u.ByCommand["info"] != 0 ||
		u.RoundTrips != 20 || u.RoundTripsPerDecision != 0.1 || u.ScriptsPerDecision != 0.5 {
		t.Errorf("usage = %+v; want 100 scripts, 205 commands (5 of them the server's PINGs), 20 round trips (0.1 a decision), 0.5 scripts a decision", u)
	}
	if u.CPUMicros != 200000 || u.CPUMicrosPerDecision != 1000 {
		t.Errorf("usage = %+v; want 200000 µs of Redis CPU, 1000 µs a decision", u)
	}
	if _, err := parseInfo("# Stats\r\n"); err == nil {
		t.Error("parseInfo without counters: nil error")
	}
}

// serveInProcess serves srv on a loopback port until the test ends.
func serveInProcess(t *testing.T, srv rlsv3.RateLimitServiceServer) string {
	t.Helper()
	return servertest.Start(t, servertest.Options{RateLimit: srv}).Addr
}

func testLoadOptions(addr string, mix Mix) loadOptions {
	return loadOptions{
		addr: addr, concurrency: 4, duration: 300 * time.Millisecond, warmup: 50 * time.Millisecond,
		maxRequests: 100_000, timeout: time.Second, conns: 1, seed: 1, prime: true,
		mix: mixParams{mix: mix, keyspace: 500, overLimitShare: 0.3, zipfS: 1.1},
	}
}

func TestLoadAgainstFloor(t *testing.T) {
	o := testLoadOptions(serveInProcess(t, floorServer{}), MixMixed)
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	res, err := load(context.Background(), o, make([]int64, o.maxRequests))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if res.OK == 0 || res.OverLimit != 0 || res.Errors != 0 || res.P50us <= 0 || res.P99us < res.P50us {
		t.Errorf("load against the floor = %+v; want only OK answers and sane latencies", res)
	}
}

// TestLoadAgainstRedisFloors: the Redis floor answers OK after one PING
// per call, and the script floor after one run of its script per call
// (TIME, GET and SET: it reads Redis's clock and one bucket and writes
// it), as the load's Redis counters show; without Redis, neither answers
// OK.
func TestLoadAgainstRedisFloors(t *testing.T) {
	for _, tc := range []struct {
		name          string
		script        bool
		scripts, cmds float64 // per decision
	}{
		{"Redis floor", false, 0, 1},
		{"script floor", true, 1, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			c := srv.Client()
			f := floorServer{redis: c}
			if tc.script {
				f.script = redis.NewScript(gcraScript)
			}
			o := testLoadOptions(serveInProcess(t, f), MixMixed)
			o.redisAddr = srv.Addr
			if err := o.validate(); err != nil {
				t.Fatal(err)
			}
			res, err := load(context.Background(), o, make([]int64, o.maxRequests))
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if res.OK == 0 || res.OverLimit != 0 || res.Errors != 0 {
				t.Errorf("load = %+v; want only OK answers", res)
			}
			// Plus the counters' own PING and INFO (and the script's first
			// EVAL): a few hundredths a decision.
			near := func(got, want float64) bool { return got >= want && got <= want*1.05+0.01 }
			if u := res.Redis; u == nil || !near(u.RoundTripsPerDecision, 1) || !near(u.ScriptsPerDecision, tc.scripts) || !near(u.CommandsPerDecision, tc.cmds) {
				t.Errorf("Redis usage = %+v, want per decision 1 round trip, %v scripts, %v commands", res.Redis, tc.scripts, tc.cmds)
			}
			if tc.script {
				// Each call wrote its bucket (which, full again a
				// microsecond later, expires within a millisecond).
				info, err := c.Info(context.Background(), "commandstats").Result()
				if err != nil {
					t.Fatal(err)
				}
				m := regexp.MustCompile(`cmdstat_set:calls=(\d+)`).FindStringSubmatch(info)
				if m == nil {
					t.Fatalf("no SET in INFO commandstats:\n%s", info)
				}
				if sets, _ := strconv.ParseInt(m[1], 10, 64); sets < res.OK {
					t.Errorf("%d SETs for %d calls answered, want one each", sets, res.OK)
				}
			}

			srv.Stop()
			if _, err := f.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{}); status.Code(err) != codes.Unavailable {
				t.Errorf("with Redis stopped: %v, want Unavailable", err)
			}
		})
	}
}

// TestGCRAScript: the script floor's script is a token bucket, not a
// PING in disguise: at 10 hits a second with a burst of 3, a fourth hit
// at once is denied and writes nothing, and the bucket expires once full.
func TestGCRAScript(t *testing.T) {
	c := redistest.Start(t).Client()
	ctx := context.Background()
	s := redis.NewScript(gcraScript)
	const interval, tolerance = "100000", "200000" // 10/s; burst 3 = 1 + 200 ms / 100 ms
	var got []int64
	for range 4 {
		n, err := s.Run(ctx, c, []string{"b"}, interval, tolerance).Int64()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
	}
	if want := []int64{1, 1, 1, 0}; !slices.Equal(got, want) {
		t.Errorf("admitted %v, want %v", got, want)
	}
	ttl, err := c.PTTL(ctx, "b").Result()
	if err != nil || ttl <= 200*time.Millisecond || ttl > 301*time.Millisecond {
		t.Errorf("bucket expires in %v, %v; want the 300 ms three hits take to refill", ttl, err)
	}
}

// TestFloorKey names the script floor's bucket after the domain and the
// first descriptor.
func TestFloorKey(t *testing.T) {
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "a", Value: "1"}, {Key: "b", Value: "2"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "c", Value: "3"}}},
	}}
	for _, tc := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{req, "floor:d|a=1|b=2"},
		{&rlsv3.RateLimitRequest{Domain: "d"}, "floor:d"},
	} {
		if got := floorKey(tc.req); got != tc.want {
			t.Errorf("floorKey(%v) = %q, want %q", tc.req, got, tc.want)
		}
	}
}

// TestLoadAgainstServer drives the real handler with the written config:
// once primed, exactly the calls aimed over the limit are OVER_LIMIT.
func TestLoadAgainstServer(t *testing.T) {
	set := servertest.ParseConfig(t, "bench.yaml", benchConfig)
	srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(set)
	addr := serveInProcess(t, srv)

	res, err := load(context.Background(), testLoadOptions(addr, MixMixed), make([]int64, 100_000))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if res.OK == 0 || res.OverLimit == 0 || res.OverLimit != res.AimedOver || res.Errors != 0 {
		t.Errorf("mixed load = %d OK, %d OVER_LIMIT (%d aimed over), %d errors; want both kinds, OVER_LIMIT exactly the calls aimed over, no errors",
			res.OK, res.OverLimit, res.AimedOver, res.Errors)
	}
	res, err = load(context.Background(), testLoadOptions(addr, MixHot), make([]int64, 100_000))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if res.OK > 0 || res.OverLimit == 0 {
		t.Errorf("hot-key load = %d OK, %d OVER_LIMIT; want all OVER_LIMIT (the bucket was emptied in the warm-up)", res.OK, res.OverLimit)
	}
}

func TestMaxRequestsBoundsTheRun(t *testing.T) {
	o := testLoadOptions(serveInProcess(t, floorServer{}), MixMixed)
	o.duration, o.warmup, o.maxRequests = time.Minute, 0, 50
	start := time.Now()
	res, err := load(context.Background(), o, make([]int64, o.maxRequests))
	if err != nil {
		t.Fatal(err)
	}
	if res.Calls != 50 || !res.Capped || time.Since(start) > 20*time.Second {
		t.Errorf("load capped at 50 calls made %d calls (capped %v) in %v", res.Calls, res.Capped, time.Since(start))
	}
}

func TestRunRefusesRemoteAddresses(t *testing.T) {
	var stderr bytes.Buffer
	for _, args := range [][]string{
		{"load", "--addr", "192.0.2.1:8081"},
		{"load", "--addr", "127.0.0.1:8081", "--redis-addr", "192.0.2.1:6379"},
		{"floor", "--addr", "0.0.0.0:0"},
		{"floor", "--addr", "127.0.0.1:0", "--redis-addr", "192.0.2.1:6379"},
	} {
		err := run(context.Background(), args, &bytes.Buffer{}, &stderr)
		if err == nil || !strings.Contains(err.Error(), "not a loopback address") {
			t.Errorf("run(%q) = %v, want a loopback error", args, err)
		}
	}
}

func TestFloorCommandLogsItsAddress(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr := &lineWaiter{lines: make(chan []byte, 4)}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"floor", "--addr", "127.0.0.1:0"}, &bytes.Buffer{}, pr) }()
	select {
	case line := <-pr.lines:
		addr, ok := jsonReady(floorStartedMsg)(line)
		if !ok || checkLoopback(addr) != nil {
			t.Errorf("floor logged %s, want %q with a loopback grpc_addr", line, floorStartedMsg)
		}
	case err := <-done:
		t.Fatalf("floor returned before logging: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("floor did not log in 10s")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("floor after cancel = %v, want nil", err)
	}
}

// TestFloorRunsWithRuntimeTuning: an idle tuned floor goes to one P, as an
// idle ratelimitd does (runtimetune.StartProcs), and gives the default back
// when it stops.
func TestFloorRunsWithRuntimeTuning(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" || runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs the runtime's default GOMAXPROCS, at least 2")
	}
	procs := runtime.GOMAXPROCS(0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"floor", "--addr", "127.0.0.1:0", "--runtime-tuning"}, &bytes.Buffer{}, io.Discard)
	}()
	// Real time: the tuner reads the scheduler's latencies every 250 ms and
	// goes to one P after a second of them. GOMAXPROCS and the GC percent
	// are the process's, so no test of this package may run in parallel
	// with this one (none calls t.Parallel).
	deadline := time.Now().Add(10 * time.Second)
	seen := runtime.GOMAXPROCS(0)
	for seen != 1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		seen = runtime.GOMAXPROCS(0)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("floor after cancel = %v, want nil", err)
	}
	if seen != 1 {
		t.Errorf("an idle tuned floor kept GOMAXPROCS at %d for 10s, want 1", seen)
	}
	if got := runtime.GOMAXPROCS(0); got != procs {
		t.Errorf("GOMAXPROCS after the floor stopped = %d, want the default %d", got, procs)
	}
}

type lineWaiter struct{ lines chan []byte }

func (w *lineWaiter) Write(p []byte) (int, error) {
	for _, l := range bytes.Split(bytes.TrimSpace(p), []byte("\n")) {
		if json.Valid(l) {
			w.lines <- bytes.Clone(l)
		}
	}
	return len(p), nil
}

func TestChildrenAreStopped(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	var cs children
	if _, _, err := cs.start(context.Background(), "sleep", sleep, []string{"60"}, nil); err != nil {
		t.Fatal(err)
	}
	c := cs.list[0].(*child)
	start := time.Now()
	if err := cs.stopAll(); err != nil {
		t.Errorf("stopAll: %v", err)
	}
	select {
	case <-c.exited:
	default:
		t.Error("sleep still running after stopAll")
	}
	if time.Since(start) > stopTimeout {
		t.Errorf("stopAll took %v: SIGTERM was not enough", time.Since(start))
	}
}

// TestMixNames checks that every Mix parses back from its name, and that
// nothing else parses.
func TestMixNames(t *testing.T) {
	for _, tt := range []struct {
		mix  Mix
		name string // as --mix takes it and the results print it
	}{{MixMixed, "mixed"}, {MixHot, "hot-key"}} {
		if got := tt.mix.String(); got != tt.name {
			t.Errorf("Mix(%d).String() = %q, want %q", tt.mix, got, tt.name)
		}
		if got, err := parseMix(tt.name); err != nil || got != tt.mix {
			t.Errorf("parseMix(%q) = %v, %v; want %v", tt.name, got, err, tt.mix)
		}
	}
	for _, name := range []string{"", "hot", "invalid", "Mixed"} {
		if m, err := parseMix(name); err == nil {
			t.Errorf("parseMix(%q) = %v, want an error", name, m)
		}
	}
}

// TestCommandFlags checks --help (the usage, and success) and that --mix
// belongs to load only.
func TestCommandFlags(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string // "" for success
		wantOut string // in stderr
	}{
		{[]string{"load", "--help"}, "", "-mix"},
		{[]string{"floor", "--help"}, "", "-script"},
		{[]string{"floor", "--script"}, "--script needs --redis-addr", ""},
		{[]string{"run", "--help"}, "", "-hot-key"},
		{[]string{"run", "--mix", "mixed"}, "flag provided but not defined: -mix", ""},
		{[]string{"load", "--addr", "127.0.0.1:1", "--mix", "hot"}, `unknown mix "hot"`, ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, &stdout, &stderr)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("run(%q) = %v, want nil", tt.args, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("run(%q) = %v, want an error containing %q", tt.args, err, tt.wantErr)
			}
			if !strings.Contains(stderr.String(), tt.wantOut) {
				t.Errorf("run(%q) printed %q, want it to contain %q", tt.args, stderr.String(), tt.wantOut)
			}
			if tt.wantErr == "" && stdout.Len() > 0 {
				t.Errorf("run(%q) printed %q on stdout, want only the usage on stderr", tt.args, stdout.String())
			}
		})
	}
}

// TestWriteTable: one row per result, ratios to the floor ("-" for the
// floor itself and where Redis was not measured), durations in µs or ms,
// error kinds in a stable order with the cell's total where more, the
// decided share rounded down, the first error cut short in the last
// column, and the notes for a capped phase and for totals.
func TestWriteTable(t *testing.T) {
	const firstErr = "Unavailable: backend unavailable (failure mode error): redis take: backend unavailable: waiting for a batched call: context deadline exceeded"
	rep := report{
		Settings: settings{DurationSec: 5, WarmupSec: 1, Rounds: 3, Conns: 1, Keyspace: 10000, ZipfS: 1.1, OverLimitShare: 0.2, TimeoutSec: 2, CPUs: 2, GoVersion: "go1.x"},
		Results: []Result{
			{Case: "mixed c=64", Target: "floor", DecisionsPerSec: 27096, P50us: 2050, P99us: 6700, P999us: 9180, OK: 135531, Calls: 135531, DecidedShare: 1},
			{Case: "mixed c=64", Target: "redis", DecisionsPerSec: 13733.4, P50us: 427, P99us: 12110, P999us: 15270,
				OK: 55083, OverLimit: 13624, Errors: 3, ErrorKind: map[string]int64{"Unavailable": 2, "DeadlineExceeded": 1},
				Calls: 68710, DecidedShare: 68707.0 / 68710, ErrorsTotal: 7, FirstError: firstErr,
				ThroughputVsFloor: 0.507, P50VsFloor: 2.08, P99VsFloor: 1.81, Capped: true,
				Redis: &RedisUsage{ScriptsPerDecision: 0.0764, CommandsPerDecision: 1.03, RoundTripsPerDecision: 0.0761, CPUMicrosPerDecision: 18.34}},
		},
	}
	var b bytes.Buffer
	if err := writeTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("table has %d lines, want settings, header, 2 rows, the capped note and the total note:\n%s", len(lines), b.String())
	}
	var b5 bytes.Buffer
	rep5 := rep
	rep5.Settings.TimeoutSec = 0.005
	if err := writeTable(&b5, rep5); err != nil || !strings.Contains(b5.String(), "; client deadline 5ms a call unless") {
		t.Errorf("settings line with a 5 ms deadline = %q, %v; want it to say 5ms", strings.SplitN(b5.String(), "\n", 2)[0], err)
	}
	if want := "5s per cell after 1s warm-up, median of 3 round(s); 1 gRPC connection(s); keyspace 10000, Zipf s=1.1, 20% aimed over limit; client deadline 2s a call unless the case names one; 2 CPUs, go1.x"; lines[0] != want {
		t.Errorf("settings line = %q, want %q", lines[0], want)
	}
	if !strings.HasSuffix(lines[1], "redis CPU µs/dec  first error") || !strings.Contains(lines[1], " errors  decided ") {
		t.Errorf("header = %q, want errors, decided ... first error", lines[1])
	}
	for i, want := range [][]string{
		{"mixed c=64", "floor", "27096", "-", "2.05ms", "-", "6.70ms", "-", "9.18ms", "135531", "0", "0", "100.00%", "-", "-", "-", "-", "-"},
		{"mixed c=64", "redis", "13733*", "0.51", "427µs", "2.08", "12.11ms", "1.81", "15.27ms", "55083", "13624",
			"3", "(DeadlineExceeded:1,Unavailable:2)", "total", "7", "99.99%", "0.076", "1.030", "0.076", "18.3", truncate(firstErr, tableErrorLen)},
	} {
		if got := strings.Fields(lines[2+i]); !slices.Equal(got, strings.Fields(strings.Join(want, " "))) {
			t.Errorf("row %d = %q, want %q", i, got, want)
		}
	}
	if cut := truncate(firstErr, tableErrorLen); !strings.HasSuffix(lines[3], "  "+cut) || len(cut) > tableErrorLen || !strings.HasSuffix(cut, "…") {
		t.Errorf("row 1 = %q, want it to end with the first error cut to %d bytes with …", lines[3], tableErrorLen)
	}
	if lines[4] != "* --max-requests ended the phase before --duration" {
		t.Errorf("line 4 = %q, want the capped note", lines[4])
	}
	if !strings.HasPrefix(lines[5], "total: ") {
		t.Errorf("line 5 = %q, want the total note", lines[5])
	}
}
