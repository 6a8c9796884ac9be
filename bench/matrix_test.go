package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseMatrixFlags: the defaults are the matrix make bench runs (the
// mixed load up to 1,024 callers with 2 s deadlines; 20 ms deadline cells
// at 64 and 256; strict), and bad lists are refused with every problem.
func TestParseMatrixFlags(t *testing.T) {
	for _, tt := range []struct {
		args         []string
		concs        []int
		shortConcs   []int
		timeout      time.Duration
		shortTimeout time.Duration
		allowErrors  bool
		wantErr      []string // each in the error; nil for success
	}{
		{args: nil, concs: []int{1, 4, 16, 64, 256, 1024}, shortConcs: []int{64, 256}, timeout: 2 * time.Second, shortTimeout: 20 * time.Millisecond},
		{args: []string{"--concurrency", " 4, 8 ,4", "--short-concurrency", "", "--timeout", "5s", "--allow-errors"},
			concs: []int{4, 8}, timeout: 5 * time.Second, shortTimeout: 20 * time.Millisecond, allowErrors: true},
		{args: []string{"--short-concurrency", "1024", "--short-timeout", "50ms"},
			concs: []int{1, 4, 16, 64, 256, 1024}, shortConcs: []int{1024}, timeout: 2 * time.Second, shortTimeout: 50 * time.Millisecond},
		{args: []string{"--concurrency", "1,x,0,10001"}, wantErr: []string{`--concurrency: "x"`, `--concurrency: "0"`, `--concurrency: "10001"`}},
		{args: []string{"--concurrency", ""}, wantErr: []string{"--concurrency: want at least one"}},
		{args: []string{"--short-concurrency", "64,-1", "--short-timeout", "0s"}, wantErr: []string{`--short-concurrency: "-1"`, "--short-timeout 0s: want more than 0"}},
		{args: []string{"--timeout", "0s"}, wantErr: []string{"--timeout 0s: want more than 0"}},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			o, err := parseMatrixFlags(tt.args, io.Discard)
			if tt.wantErr != nil {
				var usage usageError
				if !errors.As(err, &usage) {
					t.Fatalf("parseMatrixFlags(%q) = %v, want a usage error", tt.args, err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("parseMatrixFlags(%q) = %v, want it to contain %q", tt.args, err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("parseMatrixFlags(%q) = %v", tt.args, err)
			}
			if !slices.Equal(o.concurrencies, tt.concs) || !slices.Equal(o.shortConcs, tt.shortConcs) ||
				o.load.timeout != tt.timeout || o.shortTimeout != tt.shortTimeout || o.allowErrors != tt.allowErrors {
				t.Errorf("parseMatrixFlags(%q) = concurrencies %v, short %v, timeout %v, short timeout %v, allow errors %v; want %v, %v, %v, %v, %v",
					tt.args, o.concurrencies, o.shortConcs, o.load.timeout, o.shortTimeout, o.allowErrors,
					tt.concs, tt.shortConcs, tt.timeout, tt.shortTimeout, tt.allowErrors)
			}
		})
	}
}

// TestMatrixCells: with the default flags every strict cell runs against
// every target with the 2 s deadline, but ratelimitd with leases (in the
// hot-admitted cells only, and at one caller beside the floor, memory and
// Redis), the attack cells (a baseline and
// an attacked run at c=64, back to back, against each ratelimitd alone),
// and the short-deadline cells against the floor and ratelimitd on Redis
// alone; without Redis there are none.
func TestMatrixCells(t *testing.T) {
	o, err := parseMatrixFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	all := []target{{name: "floor"}, {name: "tuned-floor"}, {name: "memory"}, {name: "redis-floor"}, {name: "script-floor"}, {name: "redis"}}
	type row struct {
		name    string
		conc    int
		timeout time.Duration
		kind    cellKind
		targets []int
	}
	every := []int{0, 1, 2, 3, 4, 5}
	// rows is the mixed load's six cells against targets, then more.
	rows := func(targets []int, more ...[]row) []row {
		var rs []row
		for _, c := range []int{1, 4, 16, 64, 256, 1024} {
			rs = append(rs, row{fmt.Sprintf("mixed c=%d", c), c, 2 * time.Second, cellStrict, targets})
		}
		return append(rs, slices.Concat(more...)...)
	}
	attacks := []row{
		{"attack-baseline c=64", 64, 2 * time.Second, cellStrict, []int{2}},
		{"attack c=64 4×48/s", 64, 2 * time.Second, cellStrict, []int{2}},
		{"attack-baseline c=64", 64, 2 * time.Second, cellStrict, []int{5}},
		{"attack c=64 4×48/s", 64, 2 * time.Second, cellStrict, []int{5}},
	}
	shortDeadlines := []row{
		{"mixed c=64 20ms deadline", 64, 20 * time.Millisecond, cellShortDeadline, []int{0, 5}},
		{"mixed c=256 20ms deadline", 256, 20 * time.Millisecond, cellShortDeadline, []int{0, 5}},
	}
	for _, tt := range []struct {
		name    string
		targets []target
		want    []row
	}{
		{"memory and redis", all, rows(every, []row{
			{"hot-key c=64", 64, 2 * time.Second, cellStrict, every},
			{"hot-admitted c=64", 64, 2 * time.Second, cellStrict, every},
		}, attacks, shortDeadlines)},
		{"memory, redis and redis-leases", append(slices.Clone(all), target{name: "redis-leases"}), rows(every, []row{
			{"hot-key c=64", 64, 2 * time.Second, cellStrict, every},
			{"hot-admitted c=64", 64, 2 * time.Second, cellStrict, []int{0, 1, 2, 3, 4, 5, 6}},
			{"hot-admitted c=1", 1, 2 * time.Second, cellStrict, []int{0, 2, 5, 6}},
		}, attacks, shortDeadlines)},
		{"memory only", all[:3], rows(every[:3], []row{
			{"hot-key c=64", 64, 2 * time.Second, cellStrict, every[:3]},
			{"hot-admitted c=64", 64, 2 * time.Second, cellStrict, every[:3]},
		}, attacks[:2])},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []row
			for _, c := range matrixCells(o, tt.targets) {
				got = append(got, row{c.name, c.conc, c.timeout, c.kind, c.targets})
			}
			if len(got) != len(tt.want) {
				t.Fatalf("matrixCells = %d cells %v, want %d %v", len(got), got, len(tt.want), tt.want)
			}
			for i := range got {
				g, w := got[i], tt.want[i]
				if g.name != w.name || g.conc != w.conc || g.timeout != w.timeout || g.kind != w.kind || !slices.Equal(g.targets, w.targets) {
					t.Errorf("cell %d = %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

// TestMedianKeepsEveryRoundsErrors: the median is one round's figures, but
// the errors of the other rounds stay in ErrorsTotal (what the exit status
// reads) and a first error is found wherever one was.
func TestMedianKeepsEveryRoundsErrors(t *testing.T) {
	for _, tt := range []struct {
		name      string
		rounds    []Result
		wantDPS   float64
		wantTotal int64
		wantFirst string
		wantShare float64
	}{
		{"no errors", []Result{
			{DecisionsPerSec: 3, DecidedShare: 1}, {DecisionsPerSec: 1, DecidedShare: 1}, {DecisionsPerSec: 2, DecidedShare: 1},
		}, 2, 0, "", 1},
		{"errors in another round and a warm-up", []Result{
			{DecisionsPerSec: 3, DecidedShare: 0.9, Errors: 10, ErrorsTotal: 10, FirstError: "Unavailable: a"},
			{DecisionsPerSec: 2, DecidedShare: 1, ErrorsTotal: 1, WarmupErrors: 1, FirstError: "DeadlineExceeded: b"},
			{DecisionsPerSec: 1, DecidedShare: 0.99, Errors: 5, ErrorsTotal: 5, FirstError: "Internal: c"},
		}, 2, 16, "DeadlineExceeded: b", 0.99},
		{"errors only outside the median round", []Result{
			{DecisionsPerSec: 1, DecidedShare: 0.5, Errors: 4, ErrorsTotal: 4, FirstError: "Unavailable: a"},
			{DecisionsPerSec: 2, DecidedShare: 1},
			{DecisionsPerSec: 3, DecidedShare: 1},
		}, 2, 4, "Unavailable: a", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := median(tt.rounds)
			if m.DecisionsPerSec != tt.wantDPS || m.ErrorsTotal != tt.wantTotal || m.FirstError != tt.wantFirst || m.DecidedShare != tt.wantShare {
				t.Errorf("median = %v decisions/s, %d errors in all, first %q, decided %v; want %v, %d, %q, %v",
					m.DecisionsPerSec, m.ErrorsTotal, m.FirstError, m.DecidedShare, tt.wantDPS, tt.wantTotal, tt.wantFirst, tt.wantShare)
			}
		})
	}
}

// TestGroupResults: a group's cells come out as their median runs; the
// cells with the floor get ratios to it, and an attacked cell the ratios of
// each round's run to its baseline's in that round, which can tell another
// story than the medians do (here the baseline's median round is a fast
// one: 1000 ÷ 1200 = 0.83, while round by round it is 0.90, 0.95, 0.67).
func TestGroupResults(t *testing.T) {
	targets := []target{{name: "floor"}, {name: "memory"}}
	mixed := cell{name: "mixed c=64", targets: []int{0, 1}}
	base := cell{name: "attack-baseline c=64", targets: []int{1}}
	hit := cell{name: "attack c=64 4×48/s", targets: []int{1}, baseline: base.name, interleave: true}
	// runs are c's rounds against its target t, as runMatrix records them.
	runs := func(c cell, t string, v ...float64) []Result {
		rs := make([]Result, len(v))
		for i, x := range v {
			rs[i] = Result{Case: c.name, Target: t, DecisionsPerSec: x, Baseline: c.baseline}
			if c.baseline != "" {
				rs[i].Attack = &AttackUsage{}
			}
		}
		return rs
	}
	got := groupResults([]cell{mixed}, [][][]Result{{runs(mixed, "floor", 100, 110, 90), runs(mixed, "memory", 80, 99, 60)}}, targets)
	if len(got) != 2 || got[0].DecisionsPerSec != 100 || got[0].ThroughputVsFloor != 0 ||
		got[1].DecisionsPerSec != 80 || got[1].ThroughputVsFloor != 0.8 || got[1].RoundRatios != nil {
		t.Errorf("mixed cell = %+v, want the floor's median 100 and memory's 80, 0.8 × the floor, no round ratios", got)
	}
	got = groupResults([]cell{base, hit}, [][][]Result{{runs(base, "memory", 1200, 900, 1500)}, {runs(hit, "memory", 1080, 855, 1000)}}, targets)
	want := []float64{0.9, 0.95, 1000.0 / 1500}
	if len(got) != 2 || got[0].DecisionsPerSec != 1200 || got[0].RoundRatios != nil ||
		got[1].DecisionsPerSec != 1000 || !slices.Equal(got[1].RoundRatios, want) {
		t.Fatalf("attack group = %+v, want the baseline's median 1200, then the attacked median 1000 with round ratios %v", got, want)
	}
	if p := attackPairs(got); len(p) != 1 || p[0].Ratio != 0.9 {
		t.Errorf("attack pair = %+v, want the median round ratio 0.9", p)
	}
}

// TestFinish: the run prints its report whatever happened, then fails
// (exit status 1, naming the cells on its last line) if a strict cell had
// an error, unless --allow-errors; errors in short-deadline cells never
// fail it.
func TestFinish(t *testing.T) {
	clean := []Result{
		{Case: "mixed c=64", Target: "floor", Strict: true, Calls: 10, DecidedShare: 1},
		{Case: "mixed c=64", Target: "redis", Strict: true, Calls: 10, DecidedShare: 1},
	}
	short := append(slices.Clone(clean), Result{Case: "mixed c=256 20ms deadline", Target: "redis",
		Calls: 10, DecidedShare: 0.5, Errors: 5, ErrorsTotal: 5, FirstError: "DeadlineExceeded: context deadline exceeded"})
	failing := append(slices.Clone(short),
		Result{Case: "mixed c=1024", Target: "redis", Strict: true, Calls: 10, Errors: 3, ErrorsTotal: 3, FirstError: "Unavailable: backend unavailable"},
		Result{Case: "hot-key c=64", Target: "memory", Strict: true, Calls: 10, ErrorsTotal: 1, WarmupErrors: 1, FirstError: "Internal: x"})
	wantCells := []string{"mixed c=1024 against redis: 3 error(s), first Unavailable", "hot-key c=64 against memory: 1 error(s), first Internal"}
	for _, tt := range []struct {
		name        string
		results     []Result
		asJSON      bool
		allowErrors bool
		wantExit    int
		wantStderr  bool // a warning naming the cells
	}{
		{"clean", clean, false, false, 0, false},
		{"misses in a short-deadline cell", short, false, false, 0, false},
		{"strict errors", failing, false, false, 1, false},
		{"strict errors as JSON", failing, true, false, 1, false},
		{"strict errors allowed", failing, false, true, 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := matrixOptions{asJSON: tt.asJSON, allowErrors: tt.allowErrors}
			var stdout, stderr bytes.Buffer
			err := o.finish(report{Results: tt.results}, &stdout, &stderr)
			if got := exitCode(err); got != tt.wantExit {
				t.Fatalf("finish = %v: exit status %d, want %d", err, got, tt.wantExit)
			}
			failed := tt.wantExit != 0 || tt.wantStderr
			for _, c := range wantCells {
				if tt.wantExit != 0 && !strings.Contains(err.Error(), c) {
					t.Errorf("finish = %v, want it to name %q", err, c)
				}
				if tt.wantStderr != strings.Contains(stderr.String(), c) {
					t.Errorf("stderr = %q, want a warning naming %q: %v", stderr.String(), c, tt.wantStderr)
				}
				if failed && !strings.Contains(stdout.String(), c) {
					t.Errorf("stdout does not name the failed cell %q:\n%s", c, stdout.String())
				}
			}
			if !failed && strings.Contains(stdout.String(), "error(s)") {
				t.Errorf("stdout names failed cells:\n%s", stdout.String())
			}
			if tt.asJSON {
				var rep report
				if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
					t.Fatalf("JSON output: %v", err)
				}
				if rep.Summary == nil || !slices.Equal(rep.Summary.FailedCells, wantCells) || rep.Results[len(rep.Results)-2].FirstError != "Unavailable: backend unavailable" {
					t.Errorf("JSON summary = %+v, want failed cells %q and the first errors", rep.Summary, wantCells)
				}
			} else if !strings.Contains(stdout.String(), "mixed c=64") {
				t.Errorf("stdout has no table:\n%s", stdout.String())
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{usageError{errors.New("bad flag")}, 2},
		{cellErrors{cells: []string{"mixed c=256 against redis: 1 error(s)"}}, 1},
		{errors.New("redis-server did not start"), 1},
	} {
		if got := exitCode(tt.err); got != tt.want {
			t.Errorf("exitCode(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}
