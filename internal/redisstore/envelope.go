package redisstore

import (
	"errors"
	"fmt"

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

// envelope is one command of a pipeline: one call, or several mergeable
// Takes as one take.lua call (their KEYS and ARGV concatenated, in order).
type envelope struct {
	scriptCall
	calls []*call
	cmd   *redis.Cmd
}

// mergeMaxKeys bounds the buckets of one merged call: a script runs
// atomically and Redis serves no one else meanwhile, so a batch of large
// Takes is split into several calls, between which other clients' commands
// run (a Take of more buckets still goes whole, alone). A merged call of
// 512 buckets was seen to run 10-14 ms on a loaded machine, more than a
// whole Envoy budget; 128 keep one call to a few milliseconds.
const mergeMaxKeys = 128

// envelopes puts each call of batch in its command: the mergeable ones
// (Takes of take.lua, the only script that merges) together, up to
// mergeMaxKeys buckets a command, the others alone. A call left alone in
// its command runs its alone script when it has one.
func envelopes(batch []*call) []*envelope {
	out := make([]*envelope, 0, len(batch))
	var merged *envelope
	for _, c := range batch {
		if !c.merge || c.asking {
			out = append(out, &envelope{scriptCall: c.scriptCall, calls: []*call{c}})
			continue
		}
		if merged == nil || len(merged.keys)+len(c.keys) > mergeMaxKeys {
			merged = &envelope{scriptCall: scriptCall{script: c.script}}
			out = append(out, merged)
		}
		merged.keys = append(merged.keys, c.keys...)
		merged.args = mergedTakeArgs(merged.args, c.args)
		merged.calls = append(merged.calls, c)
	}
	for _, e := range out {
		if len(e.calls) == 1 && e.calls[0].alone != nil {
			e.script = e.calls[0].alone // nothing merged with it
		}
	}
	return out
}

// answer hands each call of e its answer through deliver: e's own, or,
// merged, its Take's slots of the flat array take.lua answers (one per
// request: its key), as a one-Take call would get them.
func (e *envelope) answer(deliver func(*call, *redis.Cmd)) {
	if len(e.calls) == 1 {
		deliver(e.calls[0], e.cmd)
		return
	}
	slots, err := e.cmd.Slice()
	if err == nil {
		want := 0
		for _, c := range e.calls {
			want += takeSlots(len(c.keys))
		}
		if len(slots) != want {
			err = fmt.Errorf("take script returned %d values for %d Takes, want %d", len(slots), len(e.calls), want)
		}
	}
	for _, c := range e.calls {
		if err != nil {
			deliver(c, errCmd(c.ctx, err))
			continue
		}
		n := takeSlots(len(c.keys))
		cmd := redis.NewCmd(c.ctx)
		cmd.SetVal(slots[:n:n])
		slots = slots[n:]
		deliver(c, cmd)
	}
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
