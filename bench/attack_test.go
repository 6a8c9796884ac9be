package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// parseBenchConfigs parses bench.yaml and the attack config together, as
// the run command writes them into one directory.
func parseBenchConfigs(t *testing.T) *config.Set {
	t.Helper()
	set, err := config.Parse([]config.File{
		{Name: "bench.yaml", Data: []byte(benchConfig)},
		{Name: "bench-attack.yaml", Data: []byte(attackConfig())},
	})
	if err != nil {
		t.Fatalf("config.Parse(bench.yaml, bench-attack.yaml): %v", err)
	}
	return set
}

func lookup(set *config.Set, domain string, kv ...string) string {
	if r := set.Lookup(domain, servertest.Entries(kv...)); r != nil {
		return r.Name
	}
	return ""
}

// TestAttackConfig: the attack domain holds the 400 wildcard patterns and
// the pathological one at the client level, the level the mixed load's
// first entry is matched at; the mixed load on that domain still gets
// exactly bench.yaml's rules (no legitimate value matches a pattern), and
// the attackers' values match no pattern either, so both take the
// key-only client rule after trying every one.
func TestAttackConfig(t *testing.T) {
	set := parseBenchConfigs(t)
	cfg := attackConfig()
	if n := strings.Count(cfg, "name: wild-"); n != attackWildcards+1 {
		t.Errorf("attack config has %d wildcard rules, want %d and the pathological one", n, attackWildcards)
	}
	for _, tt := range []struct {
		value, want string
	}{
		{"x-mini0", "wild-mini-0"},
		{"anything-mini199", "wild-mini-199"},
		{"zazbzczd17z", "wild-abcd-17"},
		{"abcd199", "wild-abcd-199"},
		{strings.Repeat("a", attackPathologicalAs) + "b", "wild-pathological"},
		{"x-mini200", "client"}, // no 200th: 200 of each kind
		{"tenant-3", "client"},
	} {
		if got := lookup(set, attackDomain, "client", tt.value); got != tt.want {
			t.Errorf("Lookup(%s, client=%.40q) = rule %q, want %q", attackDomain, tt.value, got, tt.want)
		}
	}
	// bench.yaml's other rules stand in the attack domain as well.
	for _, kv := range [][]string{
		{"client", "tenant-3", "route", "/r", "method", "GET"},
		{"abuser", "tenant-3"}, {"hot", "key"}, {"model", "shared"},
	} {
		if got, want := lookup(set, attackDomain, kv...), lookup(set, "bench", kv...); got == "" || got != want {
			t.Errorf("Lookup(%s, %v) = rule %q, want %q as in bench.yaml", attackDomain, kv, got, want)
		}
	}
	for _, n := range []int{defaultAttackValueBytes, 1000, 7} {
		for i, v := range attackValues(n) {
			if len(v) != n {
				t.Errorf("attackValues(%d)[%d] has %d bytes", n, i, len(v))
			}
			if got := lookup(set, attackDomain, "client", v); got != "client" {
				t.Errorf("attackValues(%d)[%d] (%.12q…) matched rule %q, want the key-only client rule", n, i, v, got)
			}
		}
	}

	// The mixed load on the attack domain gets the rules it gets on the
	// bench domain.
	voc := newVocabulary(1000)
	p := mixParams{mix: MixMixed, keyspace: 1000, overLimitShare: 0.2, zipfS: 1.1, domain: attackDomain}
	m := newMixer(p, voc, 3)
	for range 2000 {
		req, _ := m.next()
		if req.GetDomain() != attackDomain {
			t.Fatalf("mixer with domain %q sent domain %q", attackDomain, req.GetDomain())
		}
		var kv []string
		for _, e := range req.GetDescriptors()[0].GetEntries() {
			kv = append(kv, e.GetKey(), e.GetValue())
		}
		got, want := lookup(set, attackDomain, kv...), lookup(set, benchDomain, kv...)
		if got == "" || got != want {
			t.Fatalf("mixed request %v: rule %q on %s, %q on %s; want the same rule", kv, got, attackDomain, want, benchDomain)
		}
	}
	if d := newMixer(mixParams{mix: MixMixed, keyspace: 10, zipfS: 1.1}, newVocabulary(10), 1).req.GetDomain(); d != benchDomain {
		t.Errorf("mixer without a domain sends %q, want %q", d, benchDomain)
	}
}

// recordingServer answers every call (or fails it with code, if set) and
// records each request's domain, key and value length; it closes reached
// when it has seen n calls.
type recordingServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	inner   rlsv3.RateLimitServiceServer
	code    codes.Code
	n       int
	reached chan struct{}
	mu      sync.Mutex
	seen    []string // "domain key len"
	values  map[string]bool
}

func (s *recordingServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	e := req.GetDescriptors()[0].GetEntries()[0]
	s.mu.Lock()
	s.seen = append(s.seen, req.GetDomain()+" "+e.GetKey()+" "+strconv.Itoa(len(e.GetValue())))
	s.values[e.GetValue()] = true
	if len(s.seen) == s.n {
		close(s.reached)
	}
	s.mu.Unlock()
	if s.code != codes.OK {
		return nil, status.Error(s.code, "refused by the test")
	}
	return s.inner.ShouldRateLimit(ctx, req)
}

// TestAttackers drives a real server with the attackers: every call is
// the attack domain's client key with a value of the set length (both
// values in turn), each is counted once as decided or as an error by its
// code, and the count cap holds exactly.
func TestAttackers(t *testing.T) {
	set := parseBenchConfigs(t)
	real, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	real.SetConfig(set)
	for _, tt := range []struct {
		name string
		code codes.Code
	}{
		{"answered", codes.OK},
		{"refused", codes.Unavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const maxCalls = 24
			rec := &recordingServer{inner: real, code: tt.code, n: maxCalls, reached: make(chan struct{}), values: map[string]bool{}}
			addr := serveInProcess(t, rec)
			o := attackOptions{clients: 4, rate: 400, valueBytes: defaultAttackValueBytes, timeout: 5 * time.Second,
				limit: time.Minute, maxCalls: maxCalls}
			a, err := startAttack(context.Background(), addr, o)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-rec.reached:
			case <-time.After(time.Minute):
				t.Fatalf("the server saw %d calls in a minute, want %d", len(rec.seen), maxCalls)
			}
			u := a.stop()
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.seen) != maxCalls || u.Calls != maxCalls {
				t.Errorf("server saw %d calls, attackers counted %d; want exactly the cap, %d", len(rec.seen), u.Calls, maxCalls)
			}
			want := attackDomain + " client " + strconv.Itoa(defaultAttackValueBytes)
			for _, s := range rec.seen {
				if s != want {
					t.Fatalf("server saw a call %q, want %q", s, want)
				}
			}
			if len(rec.values) != 2 {
				t.Errorf("attackers sent %d distinct values, want both of attackValues", len(rec.values))
			}
			if u.Decided+u.Errors != u.Calls || u.Clients != 4 || u.ValueBytes != defaultAttackValueBytes || u.TargetRate != 400 {
				t.Errorf("usage = %+v; want every call decided or an error, and the options", u)
			}
			if tt.code == codes.OK {
				if u.Errors != 0 || u.Decided != maxCalls {
					t.Errorf("usage = %+v; want %d decided, no error", u, maxCalls)
				}
				return
			}
			if u.Decided != 0 || u.ErrorKind["Unavailable"] != maxCalls || u.FirstError != "Unavailable: refused by the test" {
				t.Errorf("usage = %+v; want %d Unavailable errors, the first sampled", u, maxCalls)
			}
		})
	}
	if _, err := startAttack(context.Background(), "192.0.2.1:8081", attackOptions{clients: 1, rate: 1, valueBytes: 1, timeout: time.Second, limit: time.Second, maxCalls: 1}); err == nil ||
		!strings.Contains(err.Error(), "not a loopback address") {
		t.Errorf("startAttack on a remote address = %v, want a loopback error", err)
	}
}

// TestAttackCells: by default one baseline and one attacked cell at c=64
// per ratelimitd backend, back to back, strict, on the attack domain, the
// attackers bounded in time and count; none with --attack=false or
// without a ratelimitd target.
func TestAttackCells(t *testing.T) {
	all := []target{{name: "floor"}, {name: "tuned-floor"}, {name: "memory"}, {name: "redis-floor"}, {name: "script-floor"}, {name: "redis"}}
	o, err := parseMatrixFlags([]string{"--duration", "3s"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	cells := attackCells(o, all)
	type row struct {
		name, baseline string
		target         int
		attacked       bool
	}
	want := []row{
		{"attack-baseline c=64", "", 2, false}, {"attack c=64 4×48/s", "attack-baseline c=64", 2, true},
		{"attack-baseline c=64", "", 5, false}, {"attack c=64 4×48/s", "attack-baseline c=64", 5, true},
	}
	if len(cells) != len(want) {
		t.Fatalf("attackCells = %d cells, want %d", len(cells), len(want))
	}
	for i, c := range cells {
		w := want[i]
		if c.name != w.name || c.baseline != w.baseline || len(c.targets) != 1 || c.targets[0] != w.target || (c.attack != nil) != w.attacked || c.interleave != w.attacked ||
			c.kind != cellStrict || c.domain != attackDomain || c.conc != 64 || c.mix != MixMixed {
			t.Errorf("cell %d = %+v, want %+v, strict, mixed at c=64 on %s", i, c, w, attackDomain)
		}
		if a := c.attack; a != nil {
			// 1 s warm-up + 3 s + two 2 s deadlines; 192 calls a second over it.
			if a.clients != 4 || a.rate != 192 || a.valueBytes != 60<<10 || a.timeout != 2*time.Second ||
				a.limit != 8*time.Second || a.maxCalls != 192*8+4 || c.minRatio != 0.8 {
				t.Errorf("cell %d attackers = %+v, min ratio %v; want 4 clients, 192/s, 60 KiB, bounded by 8 s and 1540 calls, 0.8", i, *a, c.minRatio)
			}
		}
	}
	off, err := parseMatrixFlags([]string{"--attack=false"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if cs := attackCells(off, all); cs != nil {
		t.Errorf("attackCells with --attack=false = %d cells, want none", len(cs))
	}
	if cs := attackCells(o, all[:2]); cs != nil {
		t.Errorf("attackCells without ratelimitd = %d cells, want none", len(cs))
	}
	o, err = parseMatrixFlags([]string{"--attack-clients", "2", "--attack-rate", "50", "--attack-concurrency", "16", "--attack-min-ratio", "0.5"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if cs := attackCells(o, all[:3]); len(cs) != 2 || cs[1].name != "attack c=16 2×25/s" || cs[1].attack.rate != 50 || cs[1].minRatio != 0.5 || cs[0].name != "attack-baseline c=16" {
		t.Errorf("attackCells with flags = %+v, want the baseline and attack c=16 2×25/s at min ratio 0.5", cs)
	}
}

func TestAttackFlagsRefused(t *testing.T) {
	_, err := parseMatrixFlags([]string{"--attack-clients", "0", "--attack-rate", "0", "--attack-value-bytes", "600000",
		"--attack-min-ratio", "1.5", "--attack-concurrency", "0", "--attack-rounds", "0"}, new(bytes.Buffer))
	for _, w := range []string{"--attack-clients 0", "--attack-rate 0", "--attack-value-bytes 600000", "--attack-min-ratio 1.5", "--attack-concurrency 0", "--attack-rounds 0"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("parseMatrixFlags = %v, want it to name %q", err, w)
		}
	}
}

// TestGroupRounds: a group with an attack cell runs --attack-rounds rounds
// when that is more than --rounds; any other group, --rounds.
func TestGroupRounds(t *testing.T) {
	plain := []cell{{name: "mixed c=64"}}
	attacked := []cell{{name: "attack-baseline c=64"}, {name: "attack c=64 4×48/s", attack: &attackOptions{}, interleave: true}}
	for _, tt := range []struct {
		rounds, attackRounds int
		group                []cell
		want                 int
	}{
		{3, 5, plain, 3},
		{3, 5, attacked, 5},
		{7, 5, attacked, 7},
		{1, 1, attacked, 1},
	} {
		o := matrixOptions{rounds: tt.rounds, attackRounds: tt.attackRounds}
		if got := o.groupRounds(tt.group); got != tt.want {
			t.Errorf("--rounds %d --attack-rounds %d, group %s: %d rounds, want %d", tt.rounds, tt.attackRounds, tt.group[len(tt.group)-1].name, got, tt.want)
		}
	}
	o, err := parseMatrixFlags(nil, new(bytes.Buffer))
	if err != nil || o.attackRounds != 5 {
		t.Errorf("default --attack-rounds = %d (%v), want 5", o.attackRounds, err)
	}
}

// TestAttackPairs: each attacked result is set beside its own target's
// baseline; the ratio passes at the minimum and above, fails below it or
// without a baseline; attackers' errors never fail it, legitimate errors
// fail the cell as strict errors do.
func TestAttackPairs(t *testing.T) {
	atk := func(errs int64) *AttackUsage {
		u := &AttackUsage{Clients: 4, ValueBytes: 60 << 10, TargetRate: 192, Calls: 770, Decided: 770 - errs, Errors: errs, CallsPerSec: 191.5}
		if errs > 0 {
			u.ErrorKind = map[string]int64{"DeadlineExceeded": errs}
			u.FirstError = "DeadlineExceeded: context deadline exceeded"
		}
		return u
	}
	const base, hit = "attack-baseline c=64", "attack c=64 4×48/s"
	rs := []Result{
		{Case: base, Target: "memory", Strict: true, DecisionsPerSec: 1000},
		{Case: hit, Target: "memory", Strict: true, DecisionsPerSec: 800, Attack: atk(5), Baseline: base, AttackMinRatio: 0.8},
		{Case: base, Target: "redis", Strict: true, DecisionsPerSec: 500},
		{Case: hit, Target: "redis", Strict: true, DecisionsPerSec: 399, Attack: atk(0), Baseline: base, AttackMinRatio: 0.8,
			Errors: 2, ErrorsTotal: 2, FirstError: "Unavailable: backend unavailable"},
		{Case: hit, Target: "elsewhere", Strict: true, DecisionsPerSec: 100, Attack: atk(0), Baseline: base, AttackMinRatio: 0.8},
		// Measured by the matrix: the rounds' own ratios decide, not the
		// medians' (0.75 here).
		{Case: base, Target: "paired", Strict: true, DecisionsPerSec: 1000},
		{Case: hit, Target: "paired", Strict: true, DecisionsPerSec: 750, Attack: atk(0), Baseline: base, AttackMinRatio: 0.8,
			RoundRatios: []float64{0.95, 0.78, 0.9}},
		{Case: base, Target: "paired-low", Strict: true, DecisionsPerSec: 1000},
		{Case: hit, Target: "paired-low", Strict: true, DecisionsPerSec: 900, Attack: atk(0), Baseline: base, AttackMinRatio: 0.8,
			RoundRatios: []float64{0.79, 0.95, 0.7}},
	}
	pairs := attackPairs(rs)
	type got struct {
		target      string
		base, ratio float64
		pass        bool
	}
	want := []got{{"memory", 1000, 0.8, true}, {"redis", 500, 0.798, false}, {"elsewhere", 0, 0, false},
		{"paired", 1000, 0.9, true}, {"paired-low", 1000, 0.79, false}}
	if len(pairs) != len(want) {
		t.Fatalf("attackPairs = %d pairs, want %d", len(pairs), len(want))
	}
	for i, p := range pairs {
		g := got{p.Target, p.BasePerS, p.Ratio, p.Pass}
		if g != want[i] {
			t.Errorf("pair %d = %+v, want %+v", i, g, want[i])
		}
	}
	s := summarize(rs)
	wantShort := []string{
		"attack c=64 4×48/s against redis: legitimate throughput 0.79 of the baseline's (want at least 0.80)",
		"attack c=64 4×48/s against elsewhere: no baseline throughput (attack-baseline c=64) to compare with",
		"attack c=64 4×48/s against paired-low: legitimate throughput 0.79 of the baseline's (want at least 0.80)",
	}
	if strings.Join(s.AttackShortfalls, "\n") != strings.Join(wantShort, "\n") {
		t.Errorf("shortfalls = %q, want %q", s.AttackShortfalls, wantShort)
	}
	if len(s.FailedCells) != 1 || s.FailedCells[0] != "attack c=64 4×48/s against redis: 2 error(s), first Unavailable" {
		t.Errorf("failed cells = %q, want the attacked redis cell's legitimate errors alone", s.FailedCells)
	}
	wantSummaryLines(t, s,
		"attack c=64 4×48/s against memory: legitimate 800 decisions/s under attack ÷ 1000 baseline = 0.80 (want ≥ 0.80): ok; 0 legitimate error(s); attackers: 4 × 60 KiB values, 770 calls (191.5/s of 192/s), 765 decided, 5 (DeadlineExceeded:5) error(s), first DeadlineExceeded: context deadline exceeded",
		"attack c=64 4×48/s against redis: legitimate 399 decisions/s under attack ÷ 500 baseline = 0.79 (want ≥ 0.80): TOO LOW; 2 legitimate error(s); attackers: 4 × 60 KiB values, 770 calls (191.5/s of 192/s), 770 decided, 0 error(s)",
		"attack c=64 4×48/s against paired: legitimate 750 decisions/s under attack, 1000 baseline (median rounds); under attack ÷ baseline round by round 0.95, 0.78, 0.90, median 0.90 (want ≥ 0.80): ok; 0 legitimate error(s); attackers: 4 × 60 KiB values, 770 calls (191.5/s of 192/s), 770 decided, 0 error(s)",
		"attack cells below their minimum: "+strings.Join(wantShort, "; "),
	)
}

// TestFinishAttack: a shortfall fails the run (exit 1, named), or with
// --allow-errors is reported on stderr; a clean pair passes; the JSON
// carries the pairs.
func TestFinishAttack(t *testing.T) {
	const base, hit = "attack-baseline c=64", "attack c=64 4×48/s"
	pair := func(attacked float64) []Result {
		return []Result{
			{Case: base, Target: "memory", Strict: true, Calls: 10, DecidedShare: 1, DecisionsPerSec: 1000},
			{Case: hit, Target: "memory", Strict: true, Calls: 10, DecidedShare: 1, DecisionsPerSec: attacked,
				Attack:   &AttackUsage{Clients: 4, Calls: 9, Decided: 3, Errors: 6, ErrorKind: map[string]int64{"DeadlineExceeded": 6}},
				Baseline: base, AttackMinRatio: 0.8},
		}
	}
	const named = "attack c=64 4×48/s against memory: legitimate throughput 0.42 of the baseline's"
	for _, tt := range []struct {
		name        string
		attacked    float64
		allowErrors bool
		wantExit    int
		wantStderr  bool
	}{
		{"within", 950, false, 0, false},
		{"below", 420, false, 1, false},
		{"below allowed", 420, true, 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, asJSON := range []bool{false, true} {
				var stdout, stderr bytes.Buffer
				err := matrixOptions{allowErrors: tt.allowErrors, asJSON: asJSON}.finish(report{Results: pair(tt.attacked)}, &stdout, &stderr)
				if got := exitCode(err); got != tt.wantExit {
					t.Fatalf("finish = %v: exit status %d, want %d", err, got, tt.wantExit)
				}
				if tt.wantExit != 0 && !strings.Contains(err.Error(), named) {
					t.Errorf("finish = %v, want it to name %q", err, named)
				}
				if strings.Contains(stderr.String(), named) != tt.wantStderr {
					t.Errorf("stderr = %q, want a warning naming the shortfall: %v", stderr.String(), tt.wantStderr)
				}
				if !asJSON {
					continue
				}
				var rep report
				if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
					t.Fatalf("JSON output: %v", err)
				}
				if rep.Summary == nil || len(rep.Summary.AttackPairs) != 1 || rep.Summary.AttackPairs[0].Attackers.Errors != 6 ||
					(len(rep.Summary.AttackShortfalls) > 0) != (tt.attacked < 800) {
					t.Errorf("JSON summary = %+v, want the pair with its attackers' 6 errors and a shortfall iff below", rep.Summary)
				}
			}
		})
	}
}

// TestCellGroups: an interleaved cell joins the group of the cell before
// it, and a group's cells alternate their order round by round.
func TestCellGroups(t *testing.T) {
	o, err := parseMatrixFlags([]string{"--concurrency", "1,64", "--hot-key=false"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	all := []target{{name: "floor"}, {name: "memory"}, {name: "redis"}}
	var got []string
	for _, g := range cellGroups(matrixCells(o, all)) {
		var names []string
		for _, c := range g {
			names = append(names, c.name+" "+all[c.targets[0]].name)
		}
		got = append(got, strings.Join(names, " + "))
	}
	want := []string{
		"mixed c=1 floor", "mixed c=64 floor",
		"attack-baseline c=64 memory + attack c=64 4×48/s memory",
		"attack-baseline c=64 redis + attack c=64 4×48/s redis",
		"mixed c=64 20ms deadline floor", "mixed c=256 20ms deadline floor",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("cellGroups =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, tt := range []struct {
		n, r int
		want string
	}{
		{2, 0, "[0 1]"}, {2, 1, "[1 0]"}, {2, 2, "[0 1]"}, {1, 1, "[0]"}, {3, 1, "[2 1 0]"},
	} {
		if got := fmt.Sprint(roundOrder(tt.n, tt.r)); got != tt.want {
			t.Errorf("roundOrder(%d, %d) = %s, want %s", tt.n, tt.r, got, tt.want)
		}
	}
}
