package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The hostile-matching cells (issue 21): legitimate mixed load on a domain
// whose first level, the one every legitimate call's first entry (client)
// is matched at, also holds attackWildcards leading-'*' patterns and one
// pathological pattern; once alone (the baseline), once beside attackers
// that send that same key with values of Envoy's default header limit. The
// run fails when the legitimate throughput under attack falls below
// defaultAttackMinRatio of the baseline's.
const (
	// attackDomain is the domain of the attack cells' calls, legitimate
	// and hostile; its rules are attackConfig's.
	attackDomain = "bench-attack"
	// attackWildcards is how many leading-'*' patterns the attack config
	// puts beside the client level: half "*-miniN", half "*a*b*c*dN*".
	attackWildcards = 400
	// attackPathologicalAs is the run of 'a' in the pathological pattern
	// "*aaa…ab".
	attackPathologicalAs = 4000
	// defaultAttackValueBytes is the attackers' value length: 60 KiB,
	// Envoy's default limit on request headers, so what a client can make
	// Envoy send by default.
	defaultAttackValueBytes = 60 << 10
	// defaultAttackClients and defaultAttackRate are the attack of the
	// issue: four clients, 192 calls a second in all.
	defaultAttackClients = 4
	defaultAttackRate    = 192.0
	// defaultAttackMinRatio is the least legitimate throughput under
	// attack, as a share of the baseline's, that passes.
	defaultAttackMinRatio = 0.80
	// attackMaxInFlight bounds each attacker's outstanding calls: a tick
	// that finds this many unanswered is skipped (and counted), so a
	// server that stops answering costs the attacker memory bounded by it.
	attackMaxInFlight = 64
)

// attackConfig is the descriptor file of attackDomain: bench.yaml's rules
// (benchConfig's descriptors, as they stand) with attackWildcards wildcard
// descriptors and the pathological pattern beside the key-only client
// descriptor, at the level the mixed load's first entry walks. No
// legitimate value ("tenant-N") matches a pattern, so the legitimate calls
// pay for trying every one and then take the key-only rule, as the
// attackers' values do.
func attackConfig() string {
	var b strings.Builder
	b.WriteString(`# Written by ratelimit-bench for its attack cells (see bench/attack.go):
# the rules of bench.yaml, and beside the client level the wildcard
# patterns of issue 21 that no legitimate value matches.
domain: ` + attackDomain + `
descriptors:
`)
	// bench.yaml's top-level descriptors list is the rest of its file.
	_, rules, _ := strings.Cut(benchConfig, "\ndescriptors:\n")
	b.WriteString(rules)
	wild := func(value, name string) {
		fmt.Fprintf(&b, "  - key: client\n    value: %q\n    rate_limit: {unit: second, requests_per_unit: 1000000, name: %s}\n", value, name)
	}
	for i := range attackWildcards / 2 {
		n := strconv.Itoa(i)
		wild("*-mini"+n, "wild-mini-"+n)
		wild("*a*b*c*d"+n+"*", "wild-abcd-"+n)
	}
	wild("*"+strings.Repeat("a", attackPathologicalAs)+"b", "wild-pathological")
	return b.String()
}

// writeAttackConfig writes attackConfig as DIR/bench-attack.yaml.
func writeAttackConfig(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write attack config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bench-attack.yaml"), []byte(attackConfig()), 0o644); err != nil {
		return fmt.Errorf("write attack config: %w", err)
	}
	return nil
}

// attackValues are the two values the attackers take turns sending, each
// n bytes long, each a miss for every pattern of attackConfig that costs
// an unbounded matcher the most: all 'a' (the pathological pattern's run
// of 'a' without its 'b'; "*a*b*c*dN*" finds its 'a' and seeks 'b' to the
// end), and "abcd" repeated ("*a*b*c*dN*" finds a, b and c at once and
// seeks "dN" to the end). Neither ends in "-miniN".
func attackValues(n int) [2]string {
	return [2]string{strings.Repeat("a", n), strings.Repeat("abcd", n/4+1)[:n]}
}

// attackOptions describe the attackers of an attack cell. Zero fields are
// invalid; the run command's flags give the defaults.
type attackOptions struct {
	clients    int     // attackers, each on a gRPC connection of its own
	rate       float64 // calls a second, all attackers together
	valueBytes int     // length of each call's descriptor value
	timeout    time.Duration
	// limit bounds the attack in time (after it, no call starts);
	// maxCalls bounds it in count (all attackers together).
	limit    time.Duration
	maxCalls int64
}

// AttackUsage is what the attackers of one attack cell did, from their
// start before the legitimate load's warm-up to their stop after its
// measured phase. Their errors are theirs: they do not count among the
// legitimate calls' (Result.Errors) and do not fail the run.
type AttackUsage struct {
	Clients    int     `json:"clients"`
	ValueBytes int     `json:"value_bytes"`
	TargetRate float64 `json:"target_calls_per_sec"`
	Seconds    float64 `json:"seconds"`
	// Calls counts the calls sent; Decided those answered with a decision
	// (OK or OVER_LIMIT); Errors the rest, split by gRPC code in ErrorKind.
	Calls       int64            `json:"calls"`
	Decided     int64            `json:"decided"`
	Errors      int64            `json:"errors"`
	ErrorKind   map[string]int64 `json:"error_codes,omitempty"`
	FirstError  string           `json:"first_error,omitempty"`
	CallsPerSec float64          `json:"calls_per_sec"`
	// Skipped counts the ticks at which an attacker sent nothing because
	// attackMaxInFlight of its calls were unanswered.
	Skipped int64 `json:"skipped"`
}

// attack is a running set of attackers; stop ends it.
type attack struct {
	o       attackOptions
	start   time.Time
	cancel  context.CancelFunc
	tickers sync.WaitGroup // the attackers' loops
	calls   sync.WaitGroup // their calls in flight
	conns   []*grpc.ClientConn
	sent    atomic.Int64
	decided atomic.Int64
	skipped atomic.Int64
	errs    errorTally
}

// startAttack dials o.clients connections to addr and starts the
// attackers: each sends, every o.clients/o.rate seconds (staggered), one
// call of domain attackDomain with the single entry client=<one of
// attackValues>, without waiting for the last to be answered (at most
// attackMaxInFlight unanswered), each with the client deadline o.timeout,
// until stop, o.limit or ctx is done, or o.maxCalls calls have been sent
// by all of them together (never more).
func startAttack(ctx context.Context, addr string, o attackOptions) (*attack, error) {
	if err := checkLoopback(addr); err != nil {
		return nil, fmt.Errorf("attack: %w", err)
	}
	a := &attack{o: o}
	for range o.clients {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			a.closeConns()
			return nil, fmt.Errorf("attack: dial %s: %w", addr, err)
		}
		a.conns = append(a.conns, cc)
	}
	values := attackValues(o.valueBytes)
	ctx, a.cancel = context.WithTimeout(ctx, o.limit)
	interval := time.Duration(float64(o.clients) / o.rate * float64(time.Second))
	a.start = time.Now()
	for i, cc := range a.conns {
		client := rlsv3.NewRateLimitServiceClient(cc)
		offset := interval * time.Duration(i) / time.Duration(o.clients)
		a.tickers.Go(func() { a.run(ctx, client, values, i, offset, interval) })
	}
	return a, nil
}

// run is one attacker's loop.
func (a *attack) run(ctx context.Context, client rlsv3.RateLimitServiceClient, values [2]string, id int, offset, interval time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(offset):
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	inFlight := make(chan struct{}, attackMaxInFlight)
	for k := id; ; k++ {
		select {
		case <-ctx.Done():
			return
		default:
		}
		select {
		case inFlight <- struct{}{}:
			if a.sent.Add(1) > a.o.maxCalls {
				a.sent.Add(-1)
				<-inFlight
				return // the count cap: this attacker is done
			}
			req := &rlsv3.RateLimitRequest{Domain: attackDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client", Value: values[k%2]}}},
			}}
			a.calls.Go(func() {
				defer func() { <-inFlight }()
				// Not ctx: stop lets calls in flight finish, so that each
				// is counted as the server answered it.
				callCtx, cancel := context.WithTimeout(context.Background(), a.o.timeout)
				defer cancel()
				if _, err := client.ShouldRateLimit(callCtx, req); err != nil {
					a.errs.add(err)
					return
				}
				a.decided.Add(1)
			})
		default:
			a.skipped.Add(1)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// stop ends the attack, waits for its calls in flight (each at most its
// client deadline), closes its connections and returns what it did.
func (a *attack) stop() AttackUsage {
	a.cancel()
	a.tickers.Wait()
	elapsed := time.Since(a.start)
	a.calls.Wait()
	a.closeConns()
	u := AttackUsage{
		Clients: a.o.clients, ValueBytes: a.o.valueBytes, TargetRate: a.o.rate, Seconds: elapsed.Seconds(),
		Calls: a.sent.Load(), Decided: a.decided.Load(), Skipped: a.skipped.Load(),
	}
	u.ErrorKind, u.Errors, u.FirstError = a.errs.counts()
	if elapsed > 0 {
		u.CallsPerSec = float64(u.Calls) / elapsed.Seconds()
	}
	return u
}

func (a *attack) closeConns() {
	for _, cc := range a.conns {
		cc.Close()
	}
}

// attackPair sets one target's legitimate throughput under attack beside
// its baseline's.
type attackPair struct {
	Case     string  `json:"case"`
	Baseline string  `json:"baseline_case"`
	Target   string  `json:"target"`
	BasePerS float64 `json:"baseline_decisions_per_sec"`
	// AttackedPerS is the legitimate decisions a second under attack (the
	// median round's, as BasePerS is). RoundRatios are each round's
	// attacked throughput over its baseline's in the same round, and Ratio
	// their median: the two runs of a round run one after the other, so a
	// machine that speeds up or slows down between rounds moves both. A
	// result without them (one not measured by the matrix) has Ratio
	// AttackedPerS ÷ BasePerS. Ratio is 0 without a baseline.
	AttackedPerS float64     `json:"attacked_decisions_per_sec"`
	RoundRatios  []float64   `json:"round_ratios,omitempty"`
	Ratio        float64     `json:"ratio"`
	MinRatio     float64     `json:"min_ratio"`
	LegitErrors  int64       `json:"legitimate_errors"`
	Attackers    AttackUsage `json:"attackers"`
	// Pass is Ratio ≥ MinRatio; legitimate errors fail the cell as in any
	// strict cell (see failedCells), whatever the ratio.
	Pass bool `json:"pass"`
}

// attackPairs pairs each attacked result in rs with its baseline (the
// result of its Baseline case on the same target).
func attackPairs(rs []Result) []attackPair {
	var pairs []attackPair
	for _, r := range rs {
		if r.Attack == nil {
			continue
		}
		p := attackPair{Case: r.Case, Baseline: r.Baseline, Target: r.Target, AttackedPerS: r.DecisionsPerSec,
			RoundRatios: r.RoundRatios, MinRatio: r.AttackMinRatio, LegitErrors: r.ErrorsTotal, Attackers: *r.Attack}
		for _, b := range rs {
			if b.Case == r.Baseline && b.Target == r.Target && b.Attack == nil {
				p.BasePerS = b.DecisionsPerSec
				switch {
				case b.DecisionsPerSec == 0:
				case len(r.RoundRatios) > 0:
					p.Ratio = medianOf(r.RoundRatios)
				default:
					p.Ratio = r.DecisionsPerSec / b.DecisionsPerSec
				}
				break
			}
		}
		p.Pass = p.BasePerS > 0 && p.Ratio >= p.MinRatio
		pairs = append(pairs, p)
	}
	return pairs
}

// attackShortfalls names each pair whose ratio fell short (or that had no
// baseline), as "CASE against TARGET: legitimate throughput 0.42 of the
// baseline's (want at least 0.80)".
func attackShortfalls(pairs []attackPair) []string {
	var out []string
	for _, p := range pairs {
		switch {
		case p.Pass:
		case p.BasePerS == 0:
			out = append(out, fmt.Sprintf("%s against %s: no baseline throughput (%s) to compare with", p.Case, p.Target, p.Baseline))
		default:
			out = append(out, fmt.Sprintf("%s against %s: legitimate throughput %s of the baseline's (want at least %.2f)",
				p.Case, p.Target, ratioDown(p.Ratio), p.MinRatio))
		}
	}
	return out
}

// String is the pair's line in the summary.
func (p attackPair) String() string {
	verdict := "ok"
	if !p.Pass {
		verdict = "TOO LOW"
	}
	a := p.Attackers
	ratio := fmt.Sprintf("legitimate %.0f decisions/s under attack ÷ %.0f baseline = %s", p.AttackedPerS, p.BasePerS, ratioDown(p.Ratio))
	if len(p.RoundRatios) > 0 {
		rounds := make([]string, len(p.RoundRatios))
		for i, r := range p.RoundRatios {
			rounds[i] = ratioDown(r)
		}
		ratio = fmt.Sprintf("legitimate %.0f decisions/s under attack, %.0f baseline (median rounds); under attack ÷ baseline round by round %s, median %s",
			p.AttackedPerS, p.BasePerS, strings.Join(rounds, ", "), ratioDown(p.Ratio))
	}
	s := fmt.Sprintf("%s against %s: %s (want ≥ %.2f): %s; %d legitimate error(s); attackers: %d × %s values, %d calls (%.1f/s of %g/s), %d decided, %s error(s)",
		p.Case, p.Target, ratio, p.MinRatio, verdict, p.LegitErrors,
		a.Clients, byteSize(a.ValueBytes), a.Calls, a.CallsPerSec, a.TargetRate, a.Decided,
		errorsCell(Result{Errors: a.Errors, ErrorsTotal: a.Errors, ErrorKind: a.ErrorKind}))
	if a.Skipped > 0 {
		s += fmt.Sprintf(", %d tick(s) skipped (%d unanswered)", a.Skipped, attackMaxInFlight)
	}
	if a.FirstError != "" {
		s += ", first " + truncate(a.FirstError, tableErrorLen)
	}
	return s
}

// ratioDown prints a ratio rounded down to two decimals, so that one
// printed as the minimum is not below it.
func ratioDown(r float64) string {
	return strconv.FormatFloat(math.Floor(r*100+1e-9)/100, 'f', 2, 64)
}

// byteSize prints n bytes as KiB when whole: 60 KiB, 100 B.
func byteSize(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return strconv.Itoa(n>>10) + " KiB"
	}
	return strconv.Itoa(n) + " B"
}
