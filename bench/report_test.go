package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// TestFailedCells: a strict cell fails with any error, in a round not
// shown or a warm-up as well; a short-deadline cell never does.
func TestFailedCells(t *testing.T) {
	for _, tt := range []struct {
		name string
		r    Result
		want []string
	}{
		{"clean", Result{Case: "mixed c=64", Target: "redis", Strict: true}, nil},
		{"measured errors", Result{Case: "mixed c=256", Target: "redis", Strict: true, Errors: 2608, ErrorsTotal: 2608,
			FirstError: "Unavailable: backend unavailable: waiting for a batched call"}, []string{"mixed c=256 against redis: 2608 error(s), first Unavailable"}},
		{"warm-up only", Result{Case: "mixed c=1024", Target: "memory", Strict: true, WarmupErrors: 1, ErrorsTotal: 1,
			FirstError: "DeadlineExceeded: context deadline exceeded"}, []string{"mixed c=1024 against memory: 1 error(s), first DeadlineExceeded"}},
		{"short deadline", Result{Case: "mixed c=256 20ms deadline", Target: "redis", Errors: 900, ErrorsTotal: 900, FirstError: "DeadlineExceeded: x"}, nil},
	} {
		if got := failedCells([]Result{tt.r}); !slices.Equal(got, tt.want) {
			t.Errorf("%s: failedCells = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestSummarize: the c=1 ratio of ratelimitd on Redis to the script
// floor, and each short-deadline cell's shares side by side, are read from
// the right rows and no other.
func TestSummarize(t *testing.T) {
	rs := []Result{
		{Case: "mixed c=1", Mix: "mixed", Concurrency: 1, Target: "floor", Strict: true, P50us: 80},
		{Case: "mixed c=1", Mix: "mixed", Concurrency: 1, Target: "script-floor", Strict: true, P50us: 300},
		{Case: "mixed c=1", Mix: "mixed", Concurrency: 1, Target: "redis", Strict: true, P50us: 315},
		{Case: "hot-key c=1", Mix: "hot-key", Concurrency: 1, Target: "script-floor", Strict: true, P50us: 100},
		{Case: "hot-key c=1", Mix: "hot-key", Concurrency: 1, Target: "redis", Strict: true, P50us: 900},
		{Case: "mixed c=64 20ms deadline", Mix: "mixed", Concurrency: 64, TimeoutMs: 20, Target: "floor", DecidedShare: 1},
		{Case: "mixed c=64 20ms deadline", Mix: "mixed", Concurrency: 64, TimeoutMs: 20, Target: "redis", DecidedShare: 0.9995},
		{Case: "mixed c=256 20ms deadline", Mix: "mixed", Concurrency: 256, TimeoutMs: 20, Target: "redis", DecidedShare: 0.95},
		{Case: "mixed c=256 20ms deadline", Mix: "mixed", Concurrency: 256, TimeoutMs: 20, Target: "floor", DecidedShare: 0.97},
	}
	s := summarize(rs)
	if s.RedisP50VsScriptFloor != 1.05 || s.RedisP50us != 315 || s.ScriptFloorP50us != 300 {
		t.Errorf("summarize: c=1 p50 %v ÷ %v = %v, want 315 ÷ 300 = 1.05", s.RedisP50us, s.ScriptFloorP50us, s.RedisP50VsScriptFloor)
	}
	want := []deadlineShares{
		{Case: "mixed c=64 20ms deadline", Concurrency: 64, TimeoutMs: 20, Redis: 0.9995, Floor: 1},
		{Case: "mixed c=256 20ms deadline", Concurrency: 256, TimeoutMs: 20, Redis: 0.95, Floor: 0.97},
	}
	if !slices.Equal(s.ShortDeadline, want) {
		t.Errorf("summarize: short deadline = %+v, want %+v", s.ShortDeadline, want)
	}
	wantSummaryLines(t, s,
		"mixed c=1: p50 of ratelimitd on Redis ÷ the script floor's = 1.05 (315µs ÷ 300µs)",
		"mixed c=64 20ms deadline: calls answered with a decision within 20ms: ratelimitd on Redis 99.95%, floor 100.00%",
		"mixed c=256 20ms deadline: calls answered with a decision within 20ms: ratelimitd on Redis 95.00%, floor 97.00%",
		"errors in strict cells: none",
	)
	if s := summarize(rs[:1]); s.RedisP50VsScriptFloor != 0 || s.ShortDeadline != nil {
		t.Errorf("summarize of the floor alone = %+v, want nothing", s)
	}
}

// wantSummaryLines fails t unless writeSummary prints each of lines, as
// a whole line, for s.
func wantSummaryLines(t *testing.T, s summary, lines ...string) {
	t.Helper()
	var b bytes.Buffer
	writeSummary(&b, s)
	for _, line := range lines {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("writeSummary printed\n%s\nwant the line %q", b.String(), line)
		}
	}
}

func TestErrorsCell(t *testing.T) {
	for _, tt := range []struct {
		r    Result
		want string
	}{
		{Result{}, "0"},
		{Result{Errors: 3, ErrorsTotal: 3, ErrorKind: map[string]int64{"Unavailable": 2, "DeadlineExceeded": 1}}, "3 (DeadlineExceeded:1,Unavailable:2)"},
		{Result{Errors: 0, ErrorsTotal: 4}, "0 total 4"},
		{Result{Errors: 1, ErrorsTotal: 5, ErrorKind: map[string]int64{"Internal": 1}}, "1 (Internal:1) total 5"},
	} {
		if got := errorsCell(tt.r); got != tt.want {
			t.Errorf("errorsCell(%+v) = %q, want %q", tt.r, got, tt.want)
		}
	}
}

// TestPercent: shares round down, so 100.00% means every call.
func TestPercent(t *testing.T) {
	for _, tt := range []struct {
		share float64
		want  string
	}{
		{1, "100.00%"},
		{0.99999, "99.99%"},
		{0.9995, "99.95%"},
		{0.999, "99.90%"},
		{68707.0 / 68710, "99.99%"},
		{0.5, "50.00%"},
		{0, "0.00%"},
	} {
		if got := percent(tt.share); got != tt.want {
			t.Errorf("percent(%v) = %q, want %q", tt.share, got, tt.want)
		}
	}
	if got := shareString(Result{}); got != "-" {
		t.Errorf("shareString of no calls = %q, want -", got)
	}
}

func TestTruncate(t *testing.T) {
	for _, tt := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"abcdefghijk", 10, "abcdefg…"}, // … is 3 bytes
		{"ab€€€", 8, "ab€…"},            // never half a rune
		{"ab€€€", 7, "ab…"},
	} {
		got := truncate(tt.s, tt.n)
		if got != tt.want || len(got) > tt.n {
			t.Errorf("truncate(%q, %d) = %q (%d bytes), want %q", tt.s, tt.n, got, len(got), tt.want)
		}
	}
}

// TestHeaderNamesAttackRounds: when the attack cells ran more rounds than
// the others, the table's first line says so.
func TestHeaderNamesAttackRounds(t *testing.T) {
	for _, tt := range []struct {
		attackRounds int
		want         string
	}{
		{0, "median of 3 round(s); "},
		{5, "median of 3 round(s) (attack cells: 5); "},
	} {
		var b bytes.Buffer
		rep := report{Settings: settings{DurationSec: 5, WarmupSec: 1, Rounds: 3, AttackRounds: tt.attackRounds, Conns: 1}}
		if err := writeTable(&b, rep); err != nil {
			t.Fatal(err)
		}
		if first, _, _ := strings.Cut(b.String(), "\n"); !strings.Contains(first, tt.want) {
			t.Errorf("attack rounds %d: header %q, want it to contain %q", tt.attackRounds, first, tt.want)
		}
	}
}
