package tokenlease

import (
	"context"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// giveBack queues reqs to be refunded to the store, without waiting. A
// full queue drops them, and a failed refund leaves them: the tokens stay
// spent, stricter, never looser.
func (l *Leaser) giveBack(reqs []limiter.Request) {
	if len(reqs) == 0 {
		return
	}
	select {
	case l.returns <- reqs:
	default:
		l.mu.Lock()
		l.stats.Dropped++
		l.mu.Unlock()
	}
}

// returner refunds the queued give-backs, each within giveBackTimeout,
// until Close; then what is queued.
func (l *Leaser) returner() {
	defer close(l.returned)
	for {
		select {
		case reqs := <-l.returns:
			l.refund(reqs)
		case <-l.stop:
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
