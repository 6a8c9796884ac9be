package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// matrixOptions describe the run command.
type matrixOptions struct {
	load          loadOptions // addr, redisAddr and concurrency are set per cell
	concurrencies []int
	backends      []string // memory, redis, redis-leases
	hotKey        bool
	hotConc       int
	// shortTimeout is the client deadline of the short-deadline cells, at
	// the concurrencies shortConcs (none if empty).
	shortTimeout time.Duration
	shortConcs   []int
	rounds       int
	attackRounds int    // of the attack cells, if more than rounds
	ratelimitd   string // prebuilt binary; empty builds one
	goTool       string
	redisServer  string
	serverFlags  []string
	asJSON       bool
	// allowErrors reports errors in strict cells without failing the run.
	allowErrors bool
	// attack adds the attack cells (see attackCells): the legitimate mixed
	// load at attackConc, without and with attackers as attackers say,
	// against ratelimitd on each backend; the run fails when the attacked
	// throughput is below attackMinRatio of the baseline's.
	attack         bool
	attackConc     int
	attackers      attackOptions // clients, rate and valueBytes
	attackMinRatio float64
}

// target is one server the matrix loads.
type target struct {
	name      string // floor, tuned-floor, memory, redis-floor, script-floor, redis, redis-leases
	addr      string
	redisAddr string
}

// runMatrix is the run command: it starts the floor and the tuned floor,
// ratelimitd on each backend and a throwaway redis-server, runs every cell
// of the matrix against each of them side by side (see matrixCells),
// prints the results with their ratios to the floor and a summary, and
// stops everything it started, also on error or Ctrl-C. Every backend it
// starts is healthy, so an error in a strict cell is a failure: runMatrix
// then returns a cellErrors naming the cells (after printing everything),
// unless --allow-errors.
func runMatrix(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	o, err := parseMatrixFlags(args, stderr)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "ratelimit-bench-")
	if err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	var procs children
	defer func() {
		if stopErr := procs.stopAll(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
	}()

	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary for the floor: %w", err)
	}
	rld := o.ratelimitd
	if rld == "" {
		rld = filepath.Join(tmp, "ratelimitd")
		fmt.Fprintf(stderr, "building ratelimitd into %s\n", tmp)
		build := exec.CommandContext(ctx, o.goTool, "build", "-o", rld, "github.com/ratelimitd/ratelimitd/cmd/ratelimitd")
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ratelimitd (run from the module, or pass --ratelimitd): %w\n%s", err, out)
		}
	}
	configDir := filepath.Join(tmp, "config")
	if _, err := writeConfig(configDir); err != nil {
		return err
	}
	if o.attack {
		if err := writeAttackConfig(configDir); err != nil {
			return err
		}
	}

	floorAddr, _, err := procs.start(ctx, "floor", self, []string{"floor", "--addr", "127.0.0.1:0"}, jsonReady(floorStartedMsg))
	if err != nil {
		return err
	}
	// The tuned floor: the floor with ratelimitd's runtime tuning; beside
	// it, ratelimitd's figures show the cost of the work alone.
	tunedAddr, _, err := procs.start(ctx, "floor (tuned)", self, []string{"floor", "--addr", "127.0.0.1:0", "--runtime-tuning"}, jsonReady(floorStartedMsg))
	if err != nil {
		return err
	}
	targets := []target{{name: "floor", addr: floorAddr}, {name: "tuned-floor", addr: tunedAddr}}
	serverArgs := func(extra ...string) []string {
		a := []string{"serve", "--config", configDir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json"}
		a = append(a, extra...)
		return append(a, o.serverFlags...)
	}
	// startRedisIn starts a redis-server of its own in a directory named
	// dir under tmp.
	startRedisIn := func(dir string) (string, error) {
		redisDir := filepath.Join(tmp, dir)
		if err := os.Mkdir(redisDir, 0o700); err != nil {
			return "", fmt.Errorf("redis directory: %w", err)
		}
		return procs.startRedis(ctx, o.redisServer, redisDir)
	}
	for _, be := range o.backends {
		switch be {
		case "memory":
			addr, _, err := procs.start(ctx, "ratelimitd (memory)", rld, serverArgs(), jsonReady("ratelimitd started"))
			if err != nil {
				return err
			}
			targets = append(targets, target{name: "memory", addr: addr})
		case "redis":
			redisAddr, err := startRedisIn("redis")
			if err != nil {
				return err
			}
			// The Redis floor: what one Redis round trip per call adds to
			// the floor, on the same Redis.
			floorRedisAddr, _, err := procs.start(ctx, "floor (redis)", self,
				[]string{"floor", "--addr", "127.0.0.1:0", "--redis-addr", redisAddr}, jsonReady(floorStartedMsg))
			if err != nil {
				return err
			}
			targets = append(targets, target{name: "redis-floor", addr: floorRedisAddr, redisAddr: redisAddr})
			// The script floor: what deciding each call alone in a Redis
			// script adds to the floor.
			floorScriptAddr, _, err := procs.start(ctx, "floor (script)", self,
				[]string{"floor", "--addr", "127.0.0.1:0", "--redis-addr", redisAddr, "--script"}, jsonReady(floorStartedMsg))
			if err != nil {
				return err
			}
			targets = append(targets, target{name: "script-floor", addr: floorScriptAddr, redisAddr: redisAddr})
			addr, _, err := procs.start(ctx, "ratelimitd (redis)", rld, serverArgs("--redis-url", "redis://"+redisAddr), jsonReady("ratelimitd started"))
			if err != nil {
				return err
			}
			targets = append(targets, target{name: "redis", addr: addr, redisAddr: redisAddr})
		case "redis-leases":
			// ratelimitd with --token-leases, on a redis-server of its
			// own: Redis's counters are a whole server's.
			redisAddr, err := startRedisIn("redis-leases")
			if err != nil {
				return err
			}
			addr, _, err := procs.start(ctx, "ratelimitd (redis, leases)", rld,
				serverArgs("--redis-url", "redis://"+redisAddr, "--token-leases"), jsonReady("ratelimitd started"))
			if err != nil {
				return err
			}
			targets = append(targets, target{name: "redis-leases", addr: addr, redisAddr: redisAddr})
		}
	}

	// Spend every abuser's token once per server and domain, so the mixed
	// load's over-limit share is over the limit from its first call.
	cells := matrixCells(o, targets)
	type primed struct{ target, domain string }
	done := map[primed]bool{}
	for _, c := range cells {
		for _, i := range c.targets {
			t := targets[i]
			lo := o.load
			lo.addr, lo.concurrency, lo.mix.domain = t.addr, 16, c.domain
			if done[primed{t.name, lo.mix.domainName()}] {
				continue
			}
			done[primed{t.name, lo.mix.domainName()}] = true
			failed, err := primeTarget(ctx, lo)
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			if failed > 0 {
				fmt.Fprintf(stderr, "ratelimit-bench: %s: priming %s: %d of %d abuser calls failed; those buckets admit one call each\n",
					t.name, lo.mix.domainName(), failed, lo.mix.keyspace)
			}
		}
	}

	lat := make([]int64, o.load.maxRequests) // one buffer, reused by every run
	rep := report{Settings: settingsOf(o.load, o.rounds)}
	if slices.ContainsFunc(cells, func(c cell) bool { return c.attack != nil }) && o.attackRounds > o.rounds {
		rep.Settings.AttackRounds = o.attackRounds
	}
	total := 0
	for _, group := range cellGroups(cells) {
		for _, c := range group {
			total += len(c.targets) * o.groupRounds(group)
		}
	}
	run := 0
	// Each group of cells (a cell and those after it marked interleave)
	// runs round by round, the group's cells in turn, so that cells meant
	// to be compared see the same drift of a shared machine.
	for _, group := range cellGroups(cells) {
		byCell := make([][][]Result, len(group))
		for i, c := range group {
			byCell[i] = make([][]Result, len(c.targets))
		}
		for r := range o.groupRounds(group) {
			for _, i := range roundOrder(len(group), r) {
				c := group[i]
				// Rotate the order each round so no target always goes first.
				for k := range c.targets {
					j := (k + r) % len(c.targets)
					t := targets[c.targets[j]]
					lo := o.load
					lo.addr, lo.redisAddr, lo.concurrency, lo.timeout = t.addr, t.redisAddr, c.conc, c.timeout
					lo.mix.mix, lo.mix.domain = c.mix, c.domain
					lo.seed = o.load.seed + uint64(r)
					lo.warnings = stderr
					run++
					fmt.Fprintf(stderr, "[%d/%d] %s against %s (%s)\n", run, total, c.name, t.name, t.addr)
					res, err := loadCell(ctx, c, lo, lat)
					if err != nil {
						return fmt.Errorf("%s against %s: %w", c.name, t.name, err)
					}
					res.Case, res.Target = c.name, t.name
					res.Strict = c.kind == cellStrict
					res.Baseline, res.AttackMinRatio = c.baseline, c.minRatio
					byCell[i][j] = append(byCell[i][j], res)
				}
			}
		}
		rep.Results = append(rep.Results, groupResults(group, byCell, targets)...)
	}
	return o.finish(rep, stdout, stderr)
}

// groupResults sums up a group of cells measured round by round: byCell[i][j]
// are cell i's runs against its target j, in round order. Each is its
// median run, with its ratios to the floor's (when the cell has the floor)
// and, in a cell with a baseline in the group, its round ratios to it.
func groupResults(group []cell, byCell [][][]Result, targets []target) []Result {
	var out []Result
	for i, c := range group {
		var floor Result
		base := slices.IndexFunc(group, func(b cell) bool { return c.baseline != "" && b.name == c.baseline })
		for j, rs := range byCell[i] {
			m := median(rs)
			if base >= 0 {
				if k := slices.Index(group[base].targets, c.targets[j]); k >= 0 {
					m.RoundRatios = roundRatios(rs, byCell[base][k])
				}
			}
			if targets[c.targets[j]].name == "floor" {
				floor = m
			} else {
				m.withRatios(floor)
			}
			out = append(out, m)
		}
	}
	return out
}

// finish summarizes rep's results and prints the report (a table, or JSON
// with --json) on stdout. If a strict cell had errors it then returns a
// cellErrors naming them, or with --allow-errors says so on stderr and
// returns nil.
func (o matrixOptions) finish(rep report, stdout, stderr io.Writer) error {
	sum := summarize(rep.Results)
	rep.Summary = &sum
	var err error
	if o.asJSON {
		err = writeJSON(stdout, rep)
	} else {
		err = writeTable(stdout, rep)
	}
	if err != nil || len(sum.FailedCells)+len(sum.AttackShortfalls) == 0 {
		return err
	}
	failed := cellErrors{cells: append(slices.Clone(sum.FailedCells), sum.AttackShortfalls...)}
	if o.allowErrors {
		fmt.Fprintf(stderr, "ratelimit-bench: --allow-errors: %v\n", failed)
		return nil
	}
	return failed
}

// cellErrors is the run command's error when strict cells had errors;
// cells name them, as failedCells does.
type cellErrors struct{ cells []string }

func (e cellErrors) Error() string {
	return fmt.Sprintf("%d cell(s) against a healthy backend failed (--allow-errors reports them without failing): %s",
		len(e.cells), strings.Join(e.cells, "; "))
}

func parseMatrixFlags(args []string, stderr io.Writer) (matrixOptions, error) {
	var o matrixOptions
	var conc, shortConc, backends, serverFlags string
	fs := flag.NewFlagSet("ratelimit-bench run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addLoadFlags(fs, &o.load)
	fs.StringVar(&conc, "concurrency", "1,4,16,64,256,1024", "comma-separated concurrencies of the mixed load")
	fs.StringVar(&backends, "backends", "memory,redis,redis-leases", "comma-separated ratelimitd backends: memory, redis, redis-leases (Redis with --token-leases, on a Redis of its own: only in the hot-admitted cells, where a bucket is busy enough to lease)")
	fs.BoolVar(&o.hotKey, "hot-key", true, "also run the over-limit hot key (every call on one exhausted bucket)")
	fs.IntVar(&o.hotConc, "hot-concurrency", 64, "concurrency of the hot-key case")
	fs.DurationVar(&o.shortTimeout, "short-timeout", 20*time.Millisecond, "client deadline of the short-deadline cells (Envoy's default timeout)")
	fs.StringVar(&shortConc, "short-concurrency", "64,256", "comma-separated concurrencies of the short-deadline cells (the mixed load against the floor and ratelimitd on Redis, each call with --short-timeout; their errors are shown but do not fail the run); empty for none")
	fs.BoolVar(&o.allowErrors, "allow-errors", false, "exit 0 even when a strict cell had errors (they are still shown)")
	fs.IntVar(&o.rounds, "rounds", 1, "runs of each cell; the median is reported")
	fs.StringVar(&o.ratelimitd, "ratelimitd", "", "ratelimitd binary to run (default: go build it into a temporary directory)")
	fs.StringVar(&o.goTool, "go", "go", "go command used to build ratelimitd")
	fs.StringVar(&o.redisServer, "redis-server", "redis-server", "redis-server binary")
	addAttackFlags(fs, &o)
	fs.StringVar(&serverFlags, "server-flags", "", "extra flags for every ratelimitd, space-separated")
	fs.BoolVar(&o.asJSON, "json", false, "print JSON instead of a table")
	if err := fs.Parse(args); err != nil {
		return o, usageError{err}
	}
	if fs.NArg() > 0 {
		return o, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	var errs []error
	var err error
	if o.concurrencies, err = parseConcurrencies("--concurrency", conc); err != nil {
		errs = append(errs, err)
	} else if len(o.concurrencies) == 0 {
		errs = append(errs, errors.New("--concurrency: want at least one"))
	}
	if o.shortConcs, err = parseConcurrencies("--short-concurrency", shortConc); err != nil {
		errs = append(errs, err)
	}
	if o.shortTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--short-timeout %v: want more than 0 (--short-concurrency '' runs no short-deadline cell)", o.shortTimeout))
	}
	for _, s := range strings.Split(backends, ",") {
		switch s = strings.TrimSpace(s); s {
		case "memory", "redis", "redis-leases":
			if !slices.Contains(o.backends, s) {
				o.backends = append(o.backends, s)
			}
		default:
			errs = append(errs, fmt.Errorf("--backends: unknown backend %q (want memory, redis or redis-leases)", s))
		}
	}
	if o.hotConc < 1 || o.hotConc > 10_000 {
		errs = append(errs, fmt.Errorf("--hot-concurrency %d: want 1 to 10000", o.hotConc))
	}
	if o.rounds < 1 || o.rounds > 100 {
		errs = append(errs, fmt.Errorf("--rounds %d: want 1 to 100", o.rounds))
	}
	errs = append(errs, o.validateAttack()...)
	o.serverFlags = strings.Fields(serverFlags)
	// Validate the shared load options with placeholders for the per-cell ones.
	check := o.load
	check.addr, check.concurrency = "127.0.0.1:1", 1
	if err := check.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return o, usageError{err}
	}
	return o, nil
}

// parseConcurrencies parses a comma-separated list of concurrencies from 1
// to 10000, for the flag name; an empty list is none.
func parseConcurrencies(name, list string) ([]int, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var ns []int
	var errs []error
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 10_000 {
			errs = append(errs, fmt.Errorf("%s: %q is not a number from 1 to 10000", name, s))
			continue
		}
		if !slices.Contains(ns, n) {
			ns = append(ns, n)
		}
	}
	return ns, errors.Join(errs...)
}

// median returns the run with the median throughput, with p50, p99,
// p99.9 and the decided share replaced by their own medians across runs.
// Errors are not hidden by the choice of round: ErrorsTotal is the sum of
// every run's, and FirstError, if the median run had none, is the first
// of the earliest run that had one.
func median(rs []Result) Result {
	mid := func(f func(Result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return medianOf(v)
	}
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b Result) int {
		switch {
		case a.DecisionsPerSec < b.DecisionsPerSec:
			return -1
		case a.DecisionsPerSec > b.DecisionsPerSec:
			return 1
		}
		return 0
	})
	m := sorted[len(sorted)/2]
	m.P50us = mid(func(r Result) float64 { return r.P50us })
	m.P99us = mid(func(r Result) float64 { return r.P99us })
	m.P999us = mid(func(r Result) float64 { return r.P999us })
	m.DecidedShare = mid(func(r Result) float64 { return r.DecidedShare })
	m.ErrorsTotal = 0
	for _, r := range rs {
		m.ErrorsTotal += r.ErrorsTotal
		if m.FirstError == "" {
			m.FirstError = r.FirstError
		}
	}
	return m
}

// medianOf is the median of v (the upper one of an even count, as median
// picks its round). It sorts a copy.
func medianOf(v []float64) float64 {
	v = slices.Sorted(slices.Values(v))
	return v[len(v)/2]
}

// groupRounds is how many rounds group runs: --rounds, or, for a group
// with an attack cell, --attack-rounds if that is more (its pass or fail
// is a median of per-round ratios, each as noisy as a round).
func (o matrixOptions) groupRounds(group []cell) int {
	if slices.ContainsFunc(group, func(c cell) bool { return c.attack != nil }) {
		return max(o.rounds, o.attackRounds)
	}
	return o.rounds
}

// roundRatios are, round by round, the throughput of runs over that of
// base's run in the same round (0 where base decided nothing).
func roundRatios(runs, base []Result) []float64 {
	out := make([]float64, min(len(runs), len(base)))
	for r := range out {
		if b := base[r].DecisionsPerSec; b > 0 {
			out[r] = runs[r].DecisionsPerSec / b
		}
	}
	return out
}

// withRatios sets r's ratios to floor's figures.
func (r *Result) withRatios(floor Result) {
	if floor.DecisionsPerSec > 0 {
		r.ThroughputVsFloor = r.DecisionsPerSec / floor.DecisionsPerSec
	}
	if floor.P50us > 0 {
		r.P50VsFloor = r.P50us / floor.P50us
	}
	if floor.P99us > 0 {
		r.P99VsFloor = r.P99us / floor.P99us
	}
}

// durationString prints microseconds compactly: 87µs, 1.32ms.
func durationString(us float64) string {
	if us < 1000 {
		return strconv.FormatFloat(us, 'f', 0, 64) + "µs"
	}
	return strconv.FormatFloat(us/1000, 'f', 2, 64) + "ms"
}

// primeTarget runs prime against o.addr on a connection of its own.
func primeTarget(ctx context.Context, o loadOptions) (failed int64, err error) {
	cc, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, fmt.Errorf("dial %s: %w", o.addr, err)
	}
	defer cc.Close()
	return prime(ctx, rlsv3.NewRateLimitServiceClient(cc), o.mix.domainName(), newVocabulary(o.mix.keyspace), o.concurrency)
}
