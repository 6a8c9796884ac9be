package daemon

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// backend is where buckets are kept, and what the daemon needs to know of
// it. Implementations are safe for concurrent use.
type backend interface {
	// Store is the limiter.Store calls are decided with.
	Store() limiter.Store
	// Leases keeps the lease pools of concurrency limits.
	Leases() limiter.LeaseStore
	// WatchLeases calls released with each pool whose lease another
	// replica released while someone may wait (the store's pub/sub), until
	// ctx is done; a backend no other replica shares returns at once.
	WatchLeases(ctx context.Context, released func(pool string))
	// Name labels metrics and log lines: memory, redis, redis-sentinel or
	// redis-cluster.
	Name() string
	// Prepare readies the backend for calls (scripts loaded, connections
	// open); gRPC health says SERVING only once it has succeeded (see
	// Daemon.awaitBackend).
	Prepare(context.Context) error
	// Ready reports whether the backend can decide calls now (/readyz).
	Ready(context.Context) error
	// Healthy reports whether it is taken to be working: false while its
	// circuit breaker is open, until a call or a Probe succeeds.
	Healthy() bool
	// FailureMode is what is answered while it is not healthy; 0 for a
	// backend that cannot fail.
	FailureMode() failover.Mode
	// Probe tries the backend if its circuit breaker is open and due a
	// probe (failover.Store.Probe), so that a replica that no call reaches
	// still finds it working again.
	Probe(context.Context) error
	// Sweep drops idle buckets kept in this process.
	Sweep(time.Time)
	// Collectors are its own metrics, for /metrics.
	Collectors() []prometheus.Collector
	// Close releases it.
	Close() error
}

// memoryBackend keeps buckets in this process: one replica's limits.
type memoryBackend struct {
	store  *limiter.MemoryStore
	leases *limiter.MemoryLeases
}

func newMemoryBackend() memoryBackend {
	return memoryBackend{store: limiter.NewMemoryStore(limiter.MemoryOptions{}), leases: limiter.NewMemoryLeases(limiter.MemoryOptions{})}
}

func (m memoryBackend) Store() limiter.Store                      { return m.store }
func (m memoryBackend) Leases() limiter.LeaseStore                { return m.leases }
func (m memoryBackend) WatchLeases(context.Context, func(string)) {}
func (m memoryBackend) Name() string                              { return "memory" }
func (m memoryBackend) Prepare(context.Context) error             { return nil }
func (m memoryBackend) Ready(context.Context) error               { return nil }
func (m memoryBackend) Healthy() bool                             { return true }
func (m memoryBackend) FailureMode() failover.Mode                { return 0 }
func (m memoryBackend) Probe(context.Context) error               { return nil }
func (m memoryBackend) Sweep(now time.Time)                       { m.store.Sweep(now) }
func (m memoryBackend) Collectors() []prometheus.Collector        { return nil }
func (m memoryBackend) Close() error                              { return nil }
