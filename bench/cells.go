package main

import (
	"fmt"
	"slices"
	"time"
)

// cellKind says how a cell's errors count. The zero value is invalid.
type cellKind int

const (
	// cellStrict is a cell with the long client deadline (--timeout)
	// against a healthy backend: any error fails the run.
	cellStrict cellKind = iota + 1
	// cellShortDeadline is a cell with a short client deadline
	// (--short-timeout, Envoy's default 20 ms): on a loaded machine some
	// calls miss it, even against the floor. The share of calls answered
	// within it is the measure, set beside the floor's; its errors are
	// shown but do not fail the run.
	cellShortDeadline
)

// cell is one load the matrix runs against each of its targets in turn.
type cell struct {
	name    string // as the results show it: "mixed c=64", "mixed c=64 20ms deadline"
	mix     Mix
	domain  string // of the mix's calls; "" for benchDomain
	conc    int
	timeout time.Duration // each call's client deadline
	kind    cellKind
	targets []int // indices into the run's targets, the floor's first if it is one
	// attack, when set, runs attackers beside the load (see startAttack);
	// baseline names the cell its throughput is compared with, and
	// minRatio the least share of the baseline's that passes.
	attack   *attackOptions
	baseline string
	minRatio float64
	// interleave runs this cell's rounds in turn with the cell before it
	// (see cellGroups), as an attacked cell with its baseline.
	interleave bool
}

// cellGroups splits cells into groups: each cell with those after it that
// are marked interleave.
func cellGroups(cells []cell) [][]cell {
	var groups [][]cell
	for i, c := range cells {
		if c.interleave && i > 0 {
			groups[len(groups)-1] = append(groups[len(groups)-1], c)
			continue
		}
		groups = append(groups, []cell{c})
	}
	return groups
}

// roundOrder is the order in which round r runs the n cells of a group:
// forwards in even rounds, backwards in odd ones (A B, B A, A B …), so
// that no cell always runs first.
func roundOrder(n, r int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
		if r%2 == 1 {
			order[i] = n - 1 - i
		}
	}
	return order
}

// matrixCells lists the cells of a run against targets (the floor first):
// the mixed load at each of o.concurrencies and the hot key at o.hotConc
// (if o.hotKey), strict, against every target but redis-leases with the
// client deadline o.load.timeout, and the hot-admitted key at o.hotConc
// and at one caller against redis-leases too (the latter beside the
// floor, memory and redis only); then the attack cells (see attackCells, if o.attack);
// then the mixed load at each of o.shortConcs with the
// deadline o.shortTimeout against the floor and ratelimitd on Redis only
// (none without the Redis backend).
func matrixCells(o matrixOptions, targets []target) []cell {
	// Leases serve busy admitted buckets only: ratelimitd with them is
	// loaded in the hot-admitted cells alone. all is every other target;
	// oneCaller, those the one-caller hot-admitted cell sets beside it.
	leases := slices.IndexFunc(targets, func(t target) bool { return t.name == "redis-leases" })
	var all, oneCaller []int
	for i, t := range targets {
		switch t.name {
		case "redis-leases":
		case "floor", "memory", "redis":
			all, oneCaller = append(all, i), append(oneCaller, i)
		default:
			all = append(all, i)
		}
	}
	strict := func(mix Mix, conc int, targets []int) cell {
		return cell{name: fmt.Sprintf("%s c=%d", mix, conc), mix: mix, conc: conc, timeout: o.load.timeout, kind: cellStrict, targets: targets}
	}
	var cells []cell
	for _, c := range o.concurrencies {
		cells = append(cells, strict(MixMixed, c, all))
	}
	if o.hotKey {
		hotAdmitted := all
		if leases >= 0 {
			hotAdmitted = append(slices.Clone(all), leases)
		}
		cells = append(cells, strict(MixHot, o.hotConc, all), strict(MixHotAdmitted, o.hotConc, hotAdmitted))
		if leases >= 0 && o.hotConc != 1 {
			// One caller on the hot bucket: a leased answer's latency
			// beside the memory backend's.
			cells = append(cells, strict(MixHotAdmitted, 1, append(oneCaller, leases)))
		}
	}
	cells = append(cells, attackCells(o, targets)...)
	floor, redis := slices.IndexFunc(targets, func(t target) bool { return t.name == "floor" }),
		slices.IndexFunc(targets, func(t target) bool { return t.name == "redis" })
	if floor < 0 || redis < 0 {
		return cells
	}
	for _, c := range o.shortConcs {
		cells = append(cells, cell{
			name: fmt.Sprintf("%s c=%d %v deadline", MixMixed, c, o.shortTimeout), mix: MixMixed, conc: c,
			timeout: o.shortTimeout, kind: cellShortDeadline, targets: []int{floor, redis},
		})
	}
	return cells
}
