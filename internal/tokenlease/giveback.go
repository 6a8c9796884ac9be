package tokenlease

import (
	"context"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// giveBack queues reqs to be refunded to the store, without waiting. A
// full queue drops them, and a failed refund leaves them: the tokens stay
// spent, stricter, never looser. Once Close has stopped the returner, a
// give-back (of a Take still in flight then) is refunded here.
func (l *Leaser) giveBack(reqs []limiter.Request) {
	if len(reqs) == 0 {
		return
	}
	l.mu.Lock()
	if l.draining {
		l.mu.Unlock()
		l.refund(reqs)
		return
	}
	select {
	case l.returns <- reqs:
	default:
		l.stats.Dropped++
	}
	l.mu.Unlock()
}

// returner refunds the queued give-backs, each within giveBackTimeout,
// until Close has stopped run (whose last sweep may still queue some);
// then what is queued, and from then on giveBack refunds them itself.
func (l *Leaser) returner() {
	defer close(l.returned)
	for {
		select {
		case reqs := <-l.returns:
			l.refund(reqs)
		case <-l.done:
			l.mu.Lock()
			l.draining = true // no give-back is queued any more
			l.mu.Unlock()
			for {
				select {
				case reqs := <-l.returns:
					l.refund(reqs)
				default:
					return
				}
			}
		}
	}
}

// refund gives reqs back to the store, within giveBackTimeout.
func (l *Leaser) refund(reqs []limiter.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
	defer cancel()
	if err := l.store.(limiter.Refunder).Refund(ctx, l.opts.Now(), reqs); err != nil {
		l.mu.Lock()
		l.stats.Dropped++
		l.mu.Unlock()
	}
}
