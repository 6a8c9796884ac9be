package main

import (
	"context"
	"flag"
	"fmt"
)

// addAttackFlags registers the run command's flags of the attack cells.
func addAttackFlags(fs *flag.FlagSet, o *matrixOptions) {
	fs.BoolVar(&o.attack, "attack", true, "also run the attack cells: the mixed load on a domain with 400 wildcard rules beside its client level, alone and beside attackers sending 60 KiB values, against ratelimitd on each backend (--attack=false for none)")
	fs.IntVar(&o.attackConc, "attack-concurrency", 64, "concurrency of the legitimate load in the attack cells")
	fs.IntVar(&o.attackers.clients, "attack-clients", defaultAttackClients, "attackers, each on a gRPC connection of its own")
	fs.Float64Var(&o.attackers.rate, "attack-rate", defaultAttackRate, "calls a second of all attackers together, sent without waiting for answers (each attacker at most 64 unanswered)")
	fs.IntVar(&o.attackers.valueBytes, "attack-value-bytes", defaultAttackValueBytes, "length of each attacker call's descriptor value (60 KiB: Envoy's default header limit)")
	fs.Float64Var(&o.attackMinRatio, "attack-min-ratio", defaultAttackMinRatio, "least legitimate throughput under attack, as a share of the baseline's, that passes; below it the run fails")
	fs.IntVar(&o.attackRounds, "attack-rounds", defaultAttackRounds, "rounds of the attack cells when more than --rounds: the ratio judged is the median of the rounds' ratios")
}

// defaultAttackRounds is --attack-rounds: on the 2-CPU machine the bench
// was built on, one round's ratio of an attack pair moves by 0.1 to 0.3
// between rounds of unchanged code (0.82 to 1.21 in three runs of three
// rounds), so a median of three can fall below 0.80 with a true ratio
// near 0.90; a median of five does so less often.
const defaultAttackRounds = 5

// maxAttackValueBytes bounds --attack-value-bytes: under ratelimitd's
// default --max-message-bytes (1 MiB) with room for the rest of the
// request, so that the attackers' calls are matched, not refused whole.
const maxAttackValueBytes = 1 << 19

// validateAttack checks the attack flags (whether or not --attack).
func (o matrixOptions) validateAttack() []error {
	var errs []error
	a := o.attackers
	if o.attackConc < 1 || o.attackConc > 10_000 {
		errs = append(errs, fmt.Errorf("--attack-concurrency %d: want 1 to 10000", o.attackConc))
	}
	if a.clients < 1 || a.clients > 64 {
		errs = append(errs, fmt.Errorf("--attack-clients %d: want 1 to 64", a.clients))
	}
	if !(a.rate > 0 && a.rate <= 10_000) {
		errs = append(errs, fmt.Errorf("--attack-rate %v: want more than 0, at most 10000", a.rate))
	}
	if a.valueBytes < 1 || a.valueBytes > maxAttackValueBytes {
		errs = append(errs, fmt.Errorf("--attack-value-bytes %d: want 1 to %d", a.valueBytes, maxAttackValueBytes))
	}
	if !(o.attackMinRatio >= 0 && o.attackMinRatio <= 1) {
		errs = append(errs, fmt.Errorf("--attack-min-ratio %v: want 0 to 1", o.attackMinRatio))
	}
	if o.attackRounds < 1 || o.attackRounds > 100 {
		errs = append(errs, fmt.Errorf("--attack-rounds %d: want 1 to 100", o.attackRounds))
	}
	return errs
}

// attackCells are the attack cells of a run against targets, if o.attack:
// the mixed load at o.attackConc on attackDomain against ratelimitd on
// each backend (targets memory and redis), first alone (the baseline),
// then beside o.attackers. Both are strict, and each has one target; the
// attacked cell is interleaved with its baseline (round by round, in
// turn: see cellGroups), so that a shared machine's drift falls on both. The attackers are bounded in
// time by the cell's warm-up, duration and two client deadlines (each
// call's is o.load.timeout), and in count by their rate over that time.
func attackCells(o matrixOptions, targets []target) []cell {
	if !o.attack {
		return nil
	}
	a := o.attackers
	a.timeout = o.load.timeout
	a.limit = o.load.warmup + o.load.duration + 2*o.load.timeout
	a.maxCalls = int64(a.rate*a.limit.Seconds()) + int64(a.clients)
	var cells []cell
	for i, t := range targets {
		if t.name != "memory" && t.name != "redis" {
			continue
		}
		base := cell{
			name: fmt.Sprintf("attack-baseline c=%d", o.attackConc), mix: MixMixed, domain: attackDomain,
			conc: o.attackConc, timeout: o.load.timeout, kind: cellStrict, targets: []int{i},
		}
		attacked := base
		attacked.name = fmt.Sprintf("attack c=%d %d×%g/s", o.attackConc, a.clients, a.rate/float64(a.clients))
		attacked.attack, attacked.baseline, attacked.minRatio, attacked.interleave = &a, base.name, o.attackMinRatio, true
		cells = append(cells, base, attacked)
	}
	return cells
}

// loadCell runs load with lo, and beside it c's attackers if it has
// them, started before the warm-up and stopped after the measured phase.
func loadCell(ctx context.Context, c cell, lo loadOptions, lat []int64) (Result, error) {
	if c.attack == nil {
		return load(ctx, lo, lat)
	}
	atk, err := startAttack(ctx, lo.addr, *c.attack)
	if err != nil {
		return Result{}, err
	}
	res, err := load(ctx, lo, lat)
	u := atk.stop()
	if err != nil {
		return Result{}, err
	}
	res.Attack = &u
	return res, nil
}
