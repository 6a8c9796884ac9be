package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/redis/go-redis/v9"
)

// answer hands each call of the commands sent its answer; those whose
// callers gave up go to the late handler.
func (b *batcher) answer(sent []*envelope) {
	for _, e := range sent {
		e.answer(b.deliver)
	}
}

// envelope is one command of a pipeline: one call, or several Takes of
// take.lua as one call (their KEYS and ARGV concatenated, in order).
type envelope struct {
	scriptCall
	calls []*call
	// runs, of a merged command, says how many of calls each of its Takes
	// answers, in order: 1, or m > 1 for a group of m alike Takes
	// (alikeOf) sent once with its count ("*m", see take.lua) and
	// answered in one Take's slots.
	runs []int
	cmd  *redis.Cmd
}

// mergeMaxKeys bounds the buckets of one merged call: a script runs
// atomically and Redis serves no one else meanwhile, so a batch of large
// Takes is split into several calls, between which other clients' commands
// run (a Take of more buckets still goes whole, alone). A merged call of
// 512 buckets was seen to run 10-14 ms on a loaded machine, more than a
// whole Envoy budget; 128 keep one call to a few milliseconds. A group of
// alike Takes counts as one bucket: it is decided in one step.
const mergeMaxKeys = 128

// envelopes puts each call of batch in its command: alike Takes (one
// bucket, one spec, one now) together as one group, in the place of the
// first of them; the mergeable ones (Takes of take.lua, the only script
// that merges) together, up to mergeMaxKeys buckets a command; the others
// alone, but for a group, which needs one bucket and so is its own command
// on a Cluster too. A call left alone in its command runs its alone script
// when it has one. Moving a Take next to an alike one reorders only Takes
// that were sent at once, which Redis may run in any order anyway.
func envelopes(batch []*call) []*envelope {
	out := make([]*envelope, 0, len(batch))
	var merged *envelope
	for _, run := range alikeRuns(batch) {
		c := run[0]
		if !c.merge || c.asking {
			e := &envelope{scriptCall: c.scriptCall, calls: run}
			if len(run) > 1 {
				e.args = groupArgs(c.args, len(run))
				e.runs = []int{len(run)}
			}
			out = append(out, e)
			continue
		}
		if merged == nil || len(merged.keys)+len(c.keys) > mergeMaxKeys {
			merged = &envelope{scriptCall: scriptCall{script: c.script}}
			out = append(out, merged)
		}
		merged.keys = append(merged.keys, c.keys...)
		merged.args = mergedTakeArgs(merged.args, groupArgs(c.args, len(run)))
		merged.calls = append(merged.calls, run...)
		merged.runs = append(merged.runs, len(run))
	}
	for _, e := range out {
		if len(e.calls) == 1 && e.calls[0].alone != nil {
			e.script = e.calls[0].alone // nothing merged with it
		}
	}
	return out
}

// alikeRuns splits batch into runs of calls sent as one: each alike Take
// with the alike ones after it, the others one by one, in the order of
// each run's first call.
func alikeRuns(batch []*call) [][]*call {
	runs := make([][]*call, 0, len(batch))
	var first map[alike]int // → its run; none for a batch of one
	for _, c := range batch {
		if !c.groupable || c.asking || len(batch) == 1 {
			runs = append(runs, []*call{c})
			continue
		}
		if first == nil {
			first = make(map[alike]int, len(batch))
		}
		a := alikeOf(c)
		if i, ok := first[a]; ok {
			runs[i] = append(runs[i], c)
			continue
		}
		first[a] = len(runs)
		runs = append(runs, []*call{c})
	}
	return runs
}

// groupArgs are take.lua's ARGV for m alike Takes whose own are args (now,
// spec): args itself for one, else now, "*m", spec.
func groupArgs(args []any, m int) []any {
	if m == 1 {
		return args
	}
	return []any{args[0], "*" + strconv.Itoa(m), args[1]}
}

// answer hands each call of e its answer through deliver: e's own, or,
// merged, its Take's slots of the flat array take.lua answers (one per
// request: its key), as a one-Take call would get them; a group's calls
// each get the slots it would have got alone (see groupSlots).
func (e *envelope) answer(deliver func(*call, *redis.Cmd)) {
	if len(e.calls) == 1 {
		deliver(e.calls[0], e.cmd)
		return
	}
	runs := e.runs
	if runs == nil { // merged with no group: a Take a call
		runs = make([]int, len(e.calls))
		for i := range runs {
			runs[i] = 1
		}
	}
	slots, err := e.cmd.Slice()
	if err == nil {
		want, i := 0, 0
		for _, m := range runs {
			want += takeSlots(len(e.calls[i].keys))
			i += m
		}
		if len(slots) != want {
			err = fmt.Errorf("take script returned %d values for %d Takes, want %d", len(slots), len(runs), want)
		}
	}
	i := 0
	for _, m := range runs {
		run := e.calls[i : i+m]
		i += m
		if err != nil {
			for _, c := range run {
				deliver(c, errCmd(c.ctx, err))
			}
			continue
		}
		n := takeSlots(len(run[0].keys))
		mine := slots[:n:n]
		slots = slots[n:]
		if m == 1 {
			deliver(run[0], answerCmd(run[0], mine))
			continue
		}
		each, gerr := groupSlots(mine, run)
		for j, c := range run {
			if gerr != nil {
				deliver(c, errCmd(c.ctx, gerr))
			} else {
				deliver(c, answerCmd(c, each[j]))
			}
		}
	}
}

// answerCmd is c's answer holding slots.
func answerCmd(c *call, slots []any) *redis.Cmd {
	cmd := redis.NewCmd(c.ctx)
	cmd.SetVal(slots)
	return cmd
}

// groupSlots works out, from take.lua's answer to a group of alike Takes
// (now, how many were admitted, the state before the first), the slots
// each of run would have got decided alone, one after the other, in
// order: each one's state before it is what limiter.DecideAll left of the
// one before. The count must agree with the script's, as decodeTake checks
// a Take's admission. An error reply in the first slot is every call's.
func groupSlots(slots []any, run []*call) ([][]any, error) {
	each := make([][]any, len(run))
	if _, ok := slots[0].(error); ok {
		for j := range each {
			each[j] = slots
		}
		return each, nil
	}
	var v [4]int64
	for i := range v {
		x, ok := slots[i].(int64)
		if !ok {
			return nil, fmt.Errorf("take script returned %T, not an integer", slots[i])
		}
		v[i] = x
	}
	now := time.UnixMicro(v[0])
	state := limiter.State{TAT: v[2], Frac: v[3]}
	admitted := int64(0)
	for j, c := range run {
		_, next, allowed := limiter.DecideAll(now, c.take, []limiter.State{state})
		ok := int64(0)
		if allowed {
			ok, admitted = 1, admitted+1
		}
		each[j] = []any{v[0], ok, state.TAT, state.Frac}
		state = limiter.State{TAT: next[0].TAT, Frac: next[0].Frac}
	}
	if admitted != v[1] {
		return nil, fmt.Errorf("take script admitted %d of %d alike Takes where limiter.DecideAll admits %d, from the state %d:%d at %d µs",
			v[1], len(run), admitted, v[2], v[3], v[0])
	}
	return each, nil
}

// roundTripErr is the outcome of the round trip that answered cmd: nil
// when Redis answered it, else its error (a timeout, a broken connection,
// or an error reply such as READONLY or OOM, which say Redis cannot
// decide). A Cluster's redirect (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) wraps
// limiter.ErrTryAgain: the node answered, promptly, for a slot it does
// not serve now, which is no failure of its own.
func roundTripErr(cmd *redis.Cmd) error {
	err := cmd.Err()
	switch {
	case err == nil || errors.Is(err, redis.Nil):
		return nil
	case redirectOf(err).kind != notRedirected:
		return fmt.Errorf("%w: %w", limiter.ErrTryAgain, err)
	}
	return err
}
