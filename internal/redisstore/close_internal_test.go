package redisstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestACallSubmittedAsItClosesIsAnswered: calls submitted while the
// batcher closes are each answered once, by Redis or with errClosed, and
// none is left behind in the queue, where no sender would take it: once
// every caller has its answer, nothing is pending or queued. (The race is
// a narrow one, a call that passed submit's look at stop going into the
// queue after close emptied it, so the test closes many batchers under
// load.)
func TestACallSubmittedAsItClosesIsAnswered(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: answered by the hook
	c.AddHook(answerPipelines{})
	t.Cleanup(func() { c.Close() })
	sc := scriptCall{script: redis.NewScript("return 1"), keys: []string{"k"}}
	const rounds, callers = 2000, 32
	deadline := time.Now().Add(20 * time.Second)
	for round := 0; round < rounds && time.Now().Before(deadline); round++ {
		var stats counters
		b := newBatcher(c, 2, time.Millisecond, &stats).start()
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				<-start
				b.await(context.Background(), b.submit(context.Background(), time.Time{}, sc))
			})
		}
		wg.Go(func() {
			<-start
			b.close()
		})
		close(start)
		wg.Wait()
		if p, q := stats.pending.Load(), b.queued.Load(); p != 0 || q != 0 {
			t.Fatalf("round %d: every caller answered and the batcher closed, yet %d calls pending and %d queued, want none", round, p, q)
		}
	}
}

// answerPipelines is a client hook that answers every command of a
// pipeline with 1, without sending it.
type answerPipelines struct{}

func (answerPipelines) DialHook(next redis.DialHook) redis.DialHook { return next }

func (answerPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (answerPipelines) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(_ context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if c, ok := cmd.(*redis.Cmd); ok {
				c.SetVal(int64(1))
			}
		}
		return nil
	}
}
