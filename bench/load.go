package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// loadOptions describe one load run. Zero fields are invalid; the flags
// give the defaults.
type loadOptions struct {
	addr        string
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	// maxRequests caps the calls of each phase (warm-up, measure), so every
	// loop is bounded in count as well as in time; it also sizes the
	// latency buffer.
	maxRequests int
	// timeout is each call's client deadline, the gRPC deadline the server
	// sees: a call not answered within it fails with DeadlineExceeded and
	// is an error. It also bounds a phase: no call starts after the phase
	// ends, so a phase lasts at most its duration plus timeout.
	timeout time.Duration
	conns   int
	seed    uint64
	mix     mixParams
	// redisAddr, when set, is the Redis the server uses: its INFO counters
	// are read before and after the measured phase.
	redisAddr string
	// prime spends every abuser bucket's token before the warm-up (see
	// prime); run primes each server once instead.
	prime bool
	// warnings, when set, receives what the run should not hide.
	warnings io.Writer
}

func (o loadOptions) warn(format string, args ...any) {
	if o.warnings != nil {
		fmt.Fprintf(o.warnings, "ratelimit-bench: "+format+"\n", args...)
	}
}

func (o loadOptions) validate() error {
	var errs []error
	if err := checkLoopback(o.addr); err != nil {
		errs = append(errs, fmt.Errorf("--addr: %w", err))
	}
	if o.redisAddr != "" {
		if err := checkLoopback(o.redisAddr); err != nil {
			errs = append(errs, fmt.Errorf("--redis-addr: %w", err))
		}
	}
	if o.concurrency < 1 || o.concurrency > 10_000 {
		errs = append(errs, fmt.Errorf("--concurrency %d: want 1 to 10000", o.concurrency))
	}
	if o.duration <= 0 {
		errs = append(errs, fmt.Errorf("--duration %v: want more than 0", o.duration))
	}
	if o.warmup < 0 {
		errs = append(errs, fmt.Errorf("--warmup %v: want 0 or more", o.warmup))
	}
	if o.maxRequests < 1 || o.maxRequests > 100_000_000 {
		errs = append(errs, fmt.Errorf("--max-requests %d: want 1 to 100000000", o.maxRequests))
	}
	if o.timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %v: want more than 0", o.timeout))
	}
	if o.conns < 1 || o.conns > 64 {
		errs = append(errs, fmt.Errorf("--conns %d: want 1 to 64", o.conns))
	}
	if o.mix.keyspace < 2 || o.mix.keyspace > 10_000_000 {
		errs = append(errs, fmt.Errorf("--keyspace %d: want 2 to 10000000", o.mix.keyspace))
	}
	if o.mix.overLimitShare < 0 || o.mix.overLimitShare > 1 {
		errs = append(errs, fmt.Errorf("--over-limit-share %v: want 0 to 1", o.mix.overLimitShare))
	}
	if o.mix.zipfS <= 1 {
		errs = append(errs, fmt.Errorf("--zipf-s %v: want more than 1", o.mix.zipfS))
	}
	return errors.Join(errs...)
}

// checkLoopback accepts host:port only when host is localhost or a
// loopback IP address.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q is not a loopback address (want 127.0.0.1, [::1] or localhost)", addr)
}

// defaultTimeout is the client deadline of each call unless --timeout
// says otherwise: long enough that a healthy server answers every call
// well within it, at every concurrency the run command uses.
const defaultTimeout = 2 * time.Second

// addLoadFlags registers the flags the load and run commands share: how
// long each load lasts and what it sends, but for --mix, which only load
// has (run sends every mix in turn).
func addLoadFlags(fs *flag.FlagSet, o *loadOptions) {
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to measure")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "how long to send unmeasured calls first")
	fs.IntVar(&o.maxRequests, "max-requests", 2_000_000, "most calls per phase (also sizes the latency buffer: 8 bytes a call)")
	fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "client deadline of each call (the gRPC deadline the server sees); a call not answered within it is an error")
	fs.IntVar(&o.conns, "conns", 1, "gRPC connections, shared round-robin by the workers")
	fs.Uint64Var(&o.seed, "seed", 1, "random seed of the mix")
	fs.IntVar(&o.mix.keyspace, "keyspace", 10_000, "distinct values of the first descriptor entry")
	fs.Float64Var(&o.mix.overLimitShare, "over-limit-share", 0.2, "share of calls aimed at exhausted rules")
	fs.Float64Var(&o.mix.zipfS, "zipf-s", 1.1, "Zipf exponent of value popularity (> 1)")
}

// runLoad is the load command: one run against --addr, one result.
func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o loadOptions
	var mix string
	var asJSON bool
	fs := flag.NewFlagSet("ratelimit-bench load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8081", "gRPC address of the RateLimitService (loopback only)")
	fs.StringVar(&o.redisAddr, "redis-addr", "", "the server's Redis (loopback only): report commands and round trips per decision")
	fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	fs.IntVar(&o.concurrency, "concurrency", 64, "calls in flight at once (one goroutine each)")
	fs.BoolVar(&o.prime, "prime", true, "first spend the token of every abuser bucket (one call per keyspace value), so over-limit traffic is over the limit from the start")
	fs.StringVar(&mix, "mix", "mixed", "traffic: mixed, or hot-key (every call on one exhausted bucket)")
	addLoadFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	var err error
	if o.mix.mix, err = parseMix(mix); err != nil {
		return usageError{fmt.Errorf("--mix: %w", err)}
	}
	if err := o.validate(); err != nil {
		return usageError{err}
	}
	o.warnings = stderr
	lat := make([]int64, o.maxRequests)
	res, err := load(ctx, o, lat)
	if err != nil {
		return err
	}
	res.Target = o.addr
	rep := report{Settings: settingsOf(o, 1), Results: []Result{res}}
	if asJSON {
		return writeJSON(stdout, rep)
	}
	return writeTable(stdout, rep)
}

// Result is what one load run measured. Latencies are in microseconds.
type Result struct {
	// Case and Target say what was measured: the mix and concurrency, and
	// the server (floor, memory, redis, or an address).
	Case        string `json:"case"`
	Target      string `json:"target"`
	Mix         string `json:"mix"`
	Concurrency int    `json:"concurrency"`
	// Seconds is the measured time, from the first call to the last answer.
	Seconds float64 `json:"seconds"`
	// Calls is how many calls completed (answered or failed).
	Calls           int64   `json:"calls"`
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	P50us           float64 `json:"p50_us"`
	P99us           float64 `json:"p99_us"`
	P999us          float64 `json:"p999_us"`
	MaxUs           float64 `json:"max_us"`
	OK              int64   `json:"ok"`
	OverLimit       int64   `json:"over_limit"`
	// AimedOver counts calls the mix aimed at exhausted rules.
	AimedOver int64 `json:"aimed_over"`
	// TimeoutMs is each call's client deadline, in milliseconds.
	TimeoutMs float64 `json:"timeout_ms"`
	// DecidedShare is the share of Calls answered with a decision (OK or
	// OVER_LIMIT, gRPC OK), hence within the client deadline: 1 when
	// there was no error, 0 when there were no calls.
	DecidedShare float64 `json:"decided_share"`
	// Errors counts the calls that failed: any gRPC error, the client's
	// own deadline (DeadlineExceeded) included; ErrorKind splits them by
	// gRPC code.
	Errors    int64            `json:"errors"`
	ErrorKind map[string]int64 `json:"error_codes,omitempty"`
	// FirstError is the first error seen ("Code: message", at most
	// maxErrorLen bytes): of the measured phase, else of the warm-up (or,
	// in a median, of another round).
	FirstError string `json:"first_error,omitempty"`
	// WarmupErrors counts the errors of the unmeasured warm-up.
	WarmupErrors int64 `json:"warmup_errors"`
	// ErrorsTotal counts every error of the cell: its measured phase and
	// warm-up, and in a median (see median) those of every round. It is
	// the count the run command's exit status is decided by.
	ErrorsTotal int64 `json:"errors_total"`
	// Strict reports that any error in this cell fails the run command
	// (see failedCells): every cell with the long client deadline. The
	// short-deadline cells are not strict: calls may miss a deadline of
	// 20 ms on a loaded machine, and DecidedShare measures how many did.
	Strict bool `json:"strict,omitempty"`
	// Capped reports that --max-requests ended the phase before --duration.
	Capped bool `json:"capped,omitempty"`
	// Attack is what the attackers did beside this run's legitimate load
	// (nil but in an attack cell: see attack.go); Baseline names the case
	// it is compared with, on the same target, and AttackMinRatio the
	// least share of the baseline's throughput that passes.
	Attack         *AttackUsage `json:"attack,omitempty"`
	Baseline       string       `json:"baseline_case,omitempty"`
	AttackMinRatio float64      `json:"attack_min_ratio,omitempty"`
	// RoundRatios, in an attack cell, are each round's throughput over its
	// baseline's in the same round, in round order (the two run one after
	// the other in every round): the attack pair's ratio is their median.
	RoundRatios []float64   `json:"round_ratios,omitempty"`
	Redis       *RedisUsage `json:"redis,omitempty"`
	// Floor ratios, set when a floor was measured in the same run.
	ThroughputVsFloor float64 `json:"throughput_vs_floor,omitempty"`
	P50VsFloor        float64 `json:"p50_vs_floor,omitempty"`
	P99VsFloor        float64 `json:"p99_vs_floor,omitempty"`
}

// phaseCounts are the shared counters of one phase.
type phaseCounts struct {
	next      atomic.Int64 // calls started; also the index into the latency buffer
	ok        atomic.Int64
	over      atomic.Int64
	aimedOver atomic.Int64
	errs      errorTally
}

// errorTally counts failed calls by gRPC code and keeps the first error,
// as errorSample gives it. The zero value is empty and ready to use; it is
// safe for concurrent use.
type errorTally struct {
	mu    sync.Mutex
	codes map[codes.Code]int64
	first string
}

// add counts err.
func (e *errorTally) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.codes == nil {
		e.codes = map[codes.Code]int64{}
	}
	e.codes[status.Code(err)]++
	if e.first == "" {
		e.first = errorSample(err)
	}
}

// counts returns the errors counted by code name (nil if none), their
// total and the first.
func (e *errorTally) counts() (kinds map[string]int64, total int64, first string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for c, n := range e.codes {
		if kinds == nil {
			kinds = map[string]int64{}
		}
		kinds[c.String()] += n
		total += n
	}
	return kinds, total, e.first
}

// maxErrorLen bounds Result.FirstError, in bytes.
const maxErrorLen = 200

// errorSample describes err as "Code: message", cut to maxErrorLen bytes
// (at a rune boundary, with "…").
func errorSample(err error) string {
	st := status.Convert(err)
	return truncate(st.Code().String()+": "+st.Message(), maxErrorLen)
}

// truncate cuts s to at most n bytes, ending it with "…" if it was cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := max(0, n-len(ellipsis))
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// load dials o.addr and runs a warm-up phase then a measured one; lat (at
// least o.maxRequests long) receives the measured latencies.
func load(ctx context.Context, o loadOptions, lat []int64) (Result, error) {
	conns := make([]rlsv3.RateLimitServiceClient, o.conns)
	for i := range conns {
		cc, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return Result{}, fmt.Errorf("dial %s: %w", o.addr, err)
		}
		defer cc.Close()
		conns[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	voc := newVocabulary(o.mix.keyspace)
	if o.prime && o.mix.mix == MixMixed {
		failed, err := prime(ctx, conns[0], o.mix.domainName(), voc, min(o.concurrency, 16))
		if err != nil {
			return Result{}, err
		}
		if failed > 0 {
			o.warn("priming: %d of %d abuser calls failed; those buckets admit one call each", failed, len(voc.values))
		}
	}
	mixers := make([]*mixer, o.concurrency)
	for i := range mixers {
		mixers[i] = newMixer(o.mix, voc, o.seed*1_000_003+uint64(i))
	}

	var warm Result
	if o.warmup > 0 {
		var err error
		if warm, err = runPhase(ctx, o, conns, mixers, o.warmup, nil); err != nil {
			return Result{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	var redis *redisCounters
	var before redisSnapshot
	if o.redisAddr != "" {
		var err error
		if redis, err = newRedisCounters(o.redisAddr); err != nil {
			return Result{}, err
		}
		defer redis.close()
		if before, err = redis.snapshot(ctx); err != nil {
			return Result{}, err
		}
	}
	counts, err := runPhase(ctx, o, conns, mixers, o.duration, lat)
	if err != nil {
		return Result{}, err
	}
	res := counts
	res.WarmupErrors = warm.Errors
	res.ErrorsTotal = res.Errors + res.WarmupErrors
	if res.FirstError == "" {
		res.FirstError = warm.FirstError
	}
	if redis != nil {
		after, err := redis.snapshot(ctx)
		if err != nil {
			return Result{}, err
		}
		u := usage(before, after, res.OK+res.OverLimit)
		res.Redis = &u
	}
	return res, nil
}

// runPhase runs the workers for d (or until o.maxRequests calls have
// started, or ctx is done), each call with the client deadline o.timeout,
// and summarizes the phase; lat nil means a warm-up whose latencies are
// not kept. A call that fails for any reason but ctx is an error.
func runPhase(ctx context.Context, o loadOptions, conns []rlsv3.RateLimitServiceClient, mixers []*mixer, d time.Duration, lat []int64) (Result, error) {
	var pc phaseCounts
	limit := int64(o.maxRequests)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for w, m := range mixers {
		client := conns[w%len(conns)]
		wg.Go(func() {
			// Each call has its own deadline, so one that hangs keeps its
			// worker at most o.timeout, and no call starts after end.
			for time.Now().Before(end) && ctx.Err() == nil {
				i := pc.next.Add(1) - 1
				if i >= limit {
					return
				}
				req, aimed := m.next()
				t := time.Now()
				callCtx, cancel := context.WithTimeout(ctx, o.timeout)
				resp, err := client.ShouldRateLimit(callCtx, req)
				cancel()
				el := time.Since(t)
				if err != nil {
					if lat != nil {
						lat[i] = -1
					}
					if ctx.Err() != nil {
						return // the run was stopped: not the server's fault
					}
					pc.errs.add(err)
					continue
				}
				if lat != nil {
					lat[i] = int64(el)
				}
				if aimed {
					pc.aimedOver.Add(1)
				}
				switch resp.GetOverallCode() {
				case rlsv3.RateLimitResponse_OVER_LIMIT:
					pc.over.Add(1)
				default:
					pc.ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	res := Result{
		Mix:         o.mix.mix.String(),
		Concurrency: o.concurrency,
		Seconds:     elapsed.Seconds(),
		OK:          pc.ok.Load(),
		OverLimit:   pc.over.Load(),
		AimedOver:   pc.aimedOver.Load(),
		Capped:      pc.next.Load() >= limit,
		TimeoutMs:   float64(o.timeout) / float64(time.Millisecond),
	}
	res.ErrorKind, res.Errors, res.FirstError = pc.errs.counts()
	res.Calls = res.OK + res.OverLimit + res.Errors
	res.ErrorsTotal = res.Errors
	if res.Calls > 0 {
		res.DecidedShare = float64(res.OK+res.OverLimit) / float64(res.Calls)
	}
	res.DecisionsPerSec = float64(res.OK+res.OverLimit) / elapsed.Seconds()
	if lat != nil {
		started := min(pc.next.Load(), limit)
		res.P50us, res.P99us, res.P999us, res.MaxUs = percentiles(lat[:started])
	}
	return res, nil
}

// percentiles sorts the answered calls' latencies (negative entries are
// failed calls) in place and returns p50, p99, p99.9 and the
// maximum in microseconds, by nearest rank.
func percentiles(lat []int64) (p50, p99, p999, maxUs float64) {
	slices.Sort(lat)
	i, _ := slices.BinarySearch(lat, 0)
	ok := lat[i:]
	if len(ok) == 0 {
		return 0, 0, 0, 0
	}
	rank := func(p float64) float64 {
		k := int(p*float64(len(ok))+0.999999999) - 1
		k = max(0, min(k, len(ok)-1))
		return float64(ok[k]) / 1e3
	}
	return rank(0.50), rank(0.99), rank(0.999), float64(ok[len(ok)-1]) / 1e3
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}
