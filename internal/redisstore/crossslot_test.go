package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

// faults is a go-redis hook that makes chosen script calls fail (unsent),
// or stall until their context is done or release is closed: a Redis node
// that errs or hangs, in front of a real one.
type faults struct {
	fail    func(args []any) bool
	stall   func(args []any) bool
	release chan struct{}
}

var errInjected = errors.New("injected failure")

func (f *faults) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (f *faults) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (f *faults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var send []redis.Cmder
		for _, c := range cmds {
			switch {
			case f.fail != nil && f.fail(c.Args()):
				c.SetErr(errInjected)
				continue
			case f.stall != nil && f.stall(c.Args()):
				select {
				case <-ctx.Done():
					c.SetErr(ctx.Err())
					continue
				case <-f.release:
				}
			}
			send = append(send, c)
		}
		if len(send) == 0 {
			return nil
		}
		return next(ctx, send)
	}
}

// runs reports whether args are those of an EVALSHA or EVAL of script
// (source, the text the Store sends) naming key.
func runs(args []any, script *redis.Script, source, key string) bool {
	if len(args) < 3 {
		return false
	}
	switch args[0] {
	case "evalsha":
		if args[1] != script.Hash() {
			return false
		}
	case "eval":
		if args[1] != source {
			return false
		}
	default:
		return false
	}
	n, ok := args[2].(int)
	return ok && 3+n <= len(args) && slices.Contains(args[3:3+n], any(key))
}

// TestTakeAcrossSlotsDenied: a Take whose slots are taken apart (a Ring
// shards by bucket) and that one slot denies answers that denial by its
// deadline, whatever becomes of the give-back and of the other slots; only
// a Take that no slot denied answers a failure as ErrUnavailable.
func TestTakeAcrossSlotsDenied(t *testing.T) {
	srv := redistest.Start(t)
	t0 := limitertest.T0
	l := limiter.Limit{Count: 1, Period: time.Minute, Burst: 1}
	check := limiter.Decision{Allowed: true, Remaining: 1}                       // a full bucket, checked
	denied := limiter.Decision{RetryAfter: time.Minute, ResetAfter: time.Minute} // an empty one
	unknown := limiter.Decision{Allowed: true}                                   // a slot that failed
	const deadline = 200 * time.Millisecond
	for _, tc := range []struct {
		name string
		// The Take is of a, b and c, one token each; b is empty, the
		// others full, unless noDenial (b is full too).
		keys     []string
		noDenial bool
		failTake string // the bucket whose take fails
		giveBack string // "fail" or "stall": what becomes of the give-back
		want     []limiter.Decision
		wantErr  error
		// Stats after the Take, and whether a is left spent.
		giveBackFailures, deniedWithFailures int64
		aSpent                               bool
	}{
		{name: "give-back succeeds", keys: []string{"a", "b"}, want: []limiter.Decision{check, denied}},
		{name: "give-back fails", keys: []string{"a", "b"}, giveBack: "fail",
			want: []limiter.Decision{check, denied}, giveBackFailures: 1, aSpent: true},
		{name: "give-back stalls past the deadline", keys: []string{"a", "b"}, giveBack: "stall",
			want: []limiter.Decision{check, denied}, giveBackFailures: 1, aSpent: true},
		{name: "another slot fails", keys: []string{"a", "b", "c"}, failTake: "c",
			want: []limiter.Decision{check, denied, unknown}, deniedWithFailures: 1},
		{name: "a slot fails and none denies", keys: []string{"a", "b", "c"}, noDenial: true, failTake: "c",
			wantErr: limiter.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": srv.Addr}})
			t.Cleanup(func() { ring.Close() })
			s, err := New(ring, Options{Prefix: prefixFor(t), Clock: CallerClock})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			ctx := context.Background()
			reqs := make([]limiter.Request, len(tc.keys))
			for i, k := range tc.keys {
				reqs[i] = limiter.Request{Key: k, Limit: l, Hits: 1}
			}
			if !tc.noDenial {
				if d, err := s.Take(ctx, t0, reqs[1:2]); err != nil || !d[0].Allowed {
					t.Fatalf("emptying b: Take = %+v, %v", d, err)
				}
			}

			f := &faults{release: make(chan struct{})}
			t.Cleanup(func() { close(f.release) }) // before s.Close and ring.Close
			giveBackSrc := clockSource + stateSource + commonSource + giveBackSource
			isGiveBack := func(args []any) bool { return runs(args, s.giveBack, giveBackSrc, s.Key("a")) }
			switch tc.giveBack {
			case "fail":
				f.fail = isGiveBack
			case "stall":
				f.stall = isGiveBack
			}
			if tc.failTake != "" {
				f.fail = func(args []any) bool {
					return runs(args, s.take, clockSource+stateSource+commonSource+singleSource+stepSource+takeSource, s.Key(tc.failTake))
				}
			}
			ring.AddHook(f)

			type answer struct {
				d   []limiter.Decision
				err error
			}
			done := make(chan answer, 1)
			start := time.Now()
			go func() {
				ctx, cancel := context.WithTimeout(ctx, deadline)
				defer cancel()
				d, err := s.Take(ctx, t0, reqs)
				done <- answer{d, err}
			}()
			var got answer
			select {
			case got = <-done:
			case <-time.After(deadline + 2*time.Second):
				t.Fatalf("Take with a %v deadline has not returned after %v", deadline, time.Since(start))
			}
			if elapsed := time.Since(start); elapsed > deadline+deadline/2 {
				t.Errorf("Take with a %v deadline returned after %v", deadline, elapsed)
			}
			switch {
			case tc.wantErr != nil:
				if !errors.Is(got.err, tc.wantErr) {
					t.Errorf("Take = %+v, %v; want an error wrapping %v", got.d, got.err, tc.wantErr)
				}
			case got.err != nil || !slices.Equal(got.d, tc.want):
				t.Errorf("Take = %+v, %v;\nwant %+v", got.d, got.err, tc.want)
			}
			st := s.Stats()
			if st.GiveBackFailures != tc.giveBackFailures || st.DeniedWithFailures != tc.deniedWithFailures {
				t.Errorf("Stats = %+v, want GiveBackFailures %d, DeniedWithFailures %d", st, tc.giveBackFailures, tc.deniedWithFailures)
			}
			n, err := ring.Exists(ctx, s.Key("a")).Result()
			if err != nil || (n == 1) != tc.aSpent {
				t.Errorf("EXISTS a = %d, %v; want spent %v", n, err, tc.aSpent)
			}
		})
	}
}

// runsOfPrefixFor counts prefixFor's prefixes, so that tests run again
// (-count) do not meet their earlier keys.
var runsOfPrefixFor atomic.Int64

// prefixFor is a key prefix unique to the test and this run of it.
func prefixFor(t *testing.T) string {
	return fmt.Sprintf("xs%d:%s:", runsOfPrefixFor.Add(1), t.Name())
}
