package daemon

import (
	"context"
	"encoding/base64"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// leaseRefresh is how often the daemon reads the pools it remembers again
// (Server.RefreshLeasePools) and sweeps the memory store's expired leases:
// the in-flight gauge and the /limits page are at most this stale for a
// pool no call reaches, and a lease that expired unreleased is counted
// within it.
const leaseRefresh = 10 * time.Second

// refreshLeases refreshes the server's pools, then sweeps the memory
// store (whose expired leases no refresh reached are counted unlabelled).
func (d *Daemon) refreshLeases(now time.Time) {
	ctx, cancel := context.WithTimeout(d.stopping, leaseRefresh)
	defer cancel()
	d.srv.RefreshLeasePools(ctx)
	if m, ok := d.backend.Leases().(*limiter.MemoryLeases); ok {
		d.obs.leases.SweptExpired(m.Sweep(now))
	}
}

// WatchLeases implements backend: one PSUBSCRIBE to every pool's channel
// (on a Cluster, any node hears every PUBLISH). go-redis resubscribes after
// a broken connection by itself; messages sent meanwhile are lost, which
// the waiters' own retries at RetryAfter cover.
func (b *redisBackend) WatchLeases(ctx context.Context, released func(pool string)) {
	channelPrefix := strings.TrimSuffix(b.store.LeaseChannel(""), "}")
	ps := b.client.PSubscribe(ctx, b.store.LeaseChannelPattern())
	defer ps.Close()
	msgs := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			if pool, ok := poolOfChannel(channelPrefix, m.Channel); ok {
				released(pool)
			}
		}
	}
}

// poolOfChannel is the pool whose LeaseChannel is channel: prefix (the
// channel of the empty pool without its closing brace), the pool in
// unpadded URL-safe base64, "}".
func poolOfChannel(prefix, channel string) (string, bool) {
	rest, ok := strings.CutPrefix(channel, prefix)
	if !ok {
		return "", false
	}
	enc, ok := strings.CutSuffix(rest, "}")
	if !ok {
		return "", false
	}
	pool, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return "", false
	}
	return string(pool), true
}
