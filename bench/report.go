package main

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// report is what the load and run commands print.
type report struct {
	Settings settings `json:"settings"`
	Results  []Result `json:"results"`
	// Summary is the run command's (nil for load).
	Summary *summary `json:"summary,omitempty"`
}

// summary is what the run command reads from its results beyond the
// table: the figures the performance targets compare, and the strict
// cells that had errors. summarize computes it.
type summary struct {
	// RedisP50VsScriptFloor is the p50 of ratelimitd on Redis over the
	// script floor's in the mixed load at one caller (0 when the run did
	// not measure both): the least a decision in Redis costs per call here
	// is the script floor's.
	RedisP50VsScriptFloor float64 `json:"redis_p50_vs_script_floor_c1,omitempty"`
	RedisP50us            float64 `json:"redis_p50_us_c1,omitempty"`
	ScriptFloorP50us      float64 `json:"script_floor_p50_us_c1,omitempty"`
	// ShortDeadline sets ratelimitd on Redis beside the floor in each
	// short-deadline cell.
	ShortDeadline []deadlineShares `json:"short_deadline,omitempty"`
	// FailedCells names each strict cell that had an error (see
	// failedCells); the run fails if there is any.
	FailedCells []string `json:"failed_cells,omitempty"`
	// AttackPairs set each attack cell beside its baseline (see
	// attackPairs); AttackShortfalls name those whose legitimate
	// throughput fell short (see attackShortfalls): the run fails if
	// there is any.
	AttackPairs      []attackPair `json:"attack,omitempty"`
	AttackShortfalls []string     `json:"attack_shortfalls,omitempty"`
}

// deadlineShares are the shares of calls answered with a decision within
// the client deadline of one short-deadline cell.
type deadlineShares struct {
	Case        string  `json:"case"`
	Concurrency int     `json:"concurrency"`
	TimeoutMs   float64 `json:"timeout_ms"`
	Redis       float64 `json:"redis_decided_share"`
	Floor       float64 `json:"floor_decided_share"`
}

// summarize computes the summary of a run's results: targets floor,
// script-floor and redis, as runMatrix names them.
func summarize(rs []Result) summary {
	var s summary
	find := func(cas, target string) (Result, bool) {
		i := slices.IndexFunc(rs, func(r Result) bool { return r.Case == cas && r.Target == target })
		if i < 0 {
			return Result{}, false
		}
		return rs[i], true
	}
	for _, r := range rs {
		if r.Target != "redis" {
			continue
		}
		switch {
		case r.Strict && r.Mix == MixMixed.String() && r.Concurrency == 1:
			if f, ok := find(r.Case, "script-floor"); ok && f.P50us > 0 {
				s.RedisP50VsScriptFloor = r.P50us / f.P50us
				s.RedisP50us, s.ScriptFloorP50us = r.P50us, f.P50us
			}
		case !r.Strict:
			if f, ok := find(r.Case, "floor"); ok {
				s.ShortDeadline = append(s.ShortDeadline, deadlineShares{
					Case: r.Case, Concurrency: r.Concurrency, TimeoutMs: r.TimeoutMs, Redis: r.DecidedShare, Floor: f.DecidedShare,
				})
			}
		}
	}
	s.FailedCells = failedCells(rs)
	s.AttackPairs = attackPairs(rs)
	s.AttackShortfalls = attackShortfalls(s.AttackPairs)
	return s
}

// failedCells names each strict result that had any error, in its
// measured phases or warm-ups (ErrorsTotal), as "CASE against TARGET: N
// error(s), first CODE".
func failedCells(rs []Result) []string {
	var cells []string
	for _, r := range rs {
		if !r.Strict || r.ErrorsTotal == 0 {
			continue
		}
		c := fmt.Sprintf("%s against %s: %d error(s)", r.Case, r.Target, r.ErrorsTotal)
		if code, _, ok := strings.Cut(r.FirstError, ":"); ok {
			c += ", first " + code
		}
		cells = append(cells, c)
	}
	return cells
}

// settings record how the results were measured.
type settings struct {
	DurationSec float64 `json:"duration_sec"`
	WarmupSec   float64 `json:"warmup_sec"`
	Rounds      int     `json:"rounds"`
	// AttackRounds is how many rounds the attack cells ran, when more
	// than Rounds (see matrixOptions.groupRounds).
	AttackRounds   int     `json:"attack_rounds,omitempty"`
	Conns          int     `json:"grpc_connections"`
	Keyspace       int     `json:"keyspace"`
	OverLimitShare float64 `json:"over_limit_share"`
	ZipfS          float64 `json:"zipf_s"`
	MaxRequests    int     `json:"max_requests"`
	TimeoutSec     float64 `json:"timeout_sec"`
	CPUs           int     `json:"cpus"`
	GoVersion      string  `json:"go_version"`
	OS             string  `json:"os"`
}

func settingsOf(o loadOptions, rounds int) settings {
	return settings{
		DurationSec:    o.duration.Seconds(),
		WarmupSec:      o.warmup.Seconds(),
		Rounds:         rounds,
		Conns:          o.conns,
		Keyspace:       o.mix.keyspace,
		OverLimitShare: o.mix.overLimitShare,
		ZipfS:          o.mix.zipfS,
		MaxRequests:    o.maxRequests,
		TimeoutSec:     o.timeout.Seconds(),
		CPUs:           runtime.NumCPU(),
		GoVersion:      runtime.Version(),
		OS:             runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// tableErrorLen bounds the first error as the table shows it, in bytes.
const tableErrorLen = 100

// writeTable prints the report as an aligned table, then the summary if
// there is one. Ratios are to the floor measured in the same run; "-"
// where there is none. Every row shows its errors (see errorsCell), the
// share of calls answered with a decision, and the first error's code and
// message (last, unaligned).
func writeTable(w io.Writer, rep report) error {
	s := rep.Settings
	rounds := fmt.Sprintf("%d round(s)", s.Rounds)
	if s.AttackRounds > s.Rounds {
		rounds += fmt.Sprintf(" (attack cells: %d)", s.AttackRounds)
	}
	fmt.Fprintf(w, "%gs per cell after %gs warm-up, median of %s; %d gRPC connection(s); keyspace %d, Zipf s=%g, %.0f%% aimed over limit; client deadline %v a call unless the case names one; %d CPUs, %s\n",
		s.DurationSec, s.WarmupSec, rounds, s.Conns, s.Keyspace, s.ZipfS, 100*s.OverLimitShare,
		time.Duration(s.TimeoutSec*float64(time.Second)).Round(time.Microsecond), s.CPUs, s.GoVersion)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\ttarget\tdecisions/s\t×floor\tp50\t×floor\tp99\t×floor\tp99.9\tOK\tOVER_LIMIT\terrors\tdecided\tscripts/dec\tredis cmds/dec\tround trips/dec\tredis CPU µs/dec\t  first error")
	ratio := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	for _, r := range rep.Results {
		scripts, cmds, rts, cpu := "-", "-", "-", "-"
		if r.Redis != nil {
			cpu = strconv.FormatFloat(r.Redis.CPUMicrosPerDecision, 'f', 1, 64)
			scripts = strconv.FormatFloat(r.Redis.ScriptsPerDecision, 'f', 3, 64)
			cmds = strconv.FormatFloat(r.Redis.CommandsPerDecision, 'f', 3, 64)
			rts = strconv.FormatFloat(r.Redis.RoundTripsPerDecision, 'f', 3, 64)
		}
		capped := ""
		if r.Capped {
			capped = "*"
		}
		first := "-"
		if r.FirstError != "" {
			first = truncate(r.FirstError, tableErrorLen)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t  %s\n",
			r.Case, r.Target, r.DecisionsPerSec, capped, ratio(r.ThroughputVsFloor),
			durationString(r.P50us), ratio(r.P50VsFloor), durationString(r.P99us), ratio(r.P99VsFloor),
			durationString(r.P999us), r.OK, r.OverLimit, errorsCell(r), shareString(r), scripts, cmds, rts, cpu, first)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	if slices.ContainsFunc(rep.Results, func(r Result) bool { return r.Capped }) {
		fmt.Fprintln(w, "* --max-requests ended the phase before --duration")
	}
	if slices.ContainsFunc(rep.Results, func(r Result) bool { return r.ErrorsTotal > r.Errors }) {
		fmt.Fprintln(w, "total: the errors of the cell's warm-ups and of every round, where more than the round shown had")
	}
	if rep.Summary != nil {
		writeSummary(w, *rep.Summary)
	}
	return nil
}

// errorsCell is a result's errors as the table shows them: the count of
// the measured phase, its gRPC codes in a stable order, and the cell's
// total (see Result.ErrorsTotal) where more: "3 (DeadlineExceeded:1,
// Unavailable:2) total 7".
func errorsCell(r Result) string {
	s := strconv.FormatInt(r.Errors, 10)
	if len(r.ErrorKind) > 0 {
		var kinds []string
		for k, n := range r.ErrorKind {
			kinds = append(kinds, fmt.Sprintf("%s:%d", k, n))
		}
		slices.Sort(kinds)
		s += " (" + strings.Join(kinds, ",") + ")"
	}
	if r.ErrorsTotal > r.Errors {
		s += " total " + strconv.FormatInt(r.ErrorsTotal, 10)
	}
	return s
}

// shareString prints a result's decided share as a percentage rounded
// down to two decimals, so that it reads 100.00% only when every call was
// decided; "-" for a run without calls.
func shareString(r Result) string {
	if r.Calls == 0 {
		return "-"
	}
	return percent(r.DecidedShare)
}

// percent prints a share as a percentage rounded down to two decimals.
func percent(share float64) string {
	return strconv.FormatFloat(math.Floor(share*10_000+1e-6)/100, 'f', 2, 64) + "%"
}

// writeSummary prints the lines the targets are read from, the attack
// cells beside their baselines, and the cells that failed.
func writeSummary(w io.Writer, s summary) {
	if s.RedisP50VsScriptFloor > 0 {
		fmt.Fprintf(w, "mixed c=1: p50 of ratelimitd on Redis ÷ the script floor's = %.2f (%s ÷ %s)\n",
			s.RedisP50VsScriptFloor, durationString(s.RedisP50us), durationString(s.ScriptFloorP50us))
	}
	for _, d := range s.ShortDeadline {
		fmt.Fprintf(w, "%s: calls answered with a decision within %gms: ratelimitd on Redis %s, floor %s\n",
			d.Case, d.TimeoutMs, percent(d.Redis), percent(d.Floor))
	}
	for _, p := range s.AttackPairs {
		fmt.Fprintln(w, p)
	}
	if len(s.AttackShortfalls) > 0 {
		fmt.Fprintf(w, "attack cells below their minimum: %s\n", strings.Join(s.AttackShortfalls, "; "))
	}
	if len(s.FailedCells) == 0 {
		fmt.Fprintln(w, "errors in strict cells: none")
		return
	}
	fmt.Fprintf(w, "errors in strict cells: %s\n", strings.Join(s.FailedCells, "; "))
}
