package redisstore_test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/limitertest"
)

// One standalone server and one 3-master cluster serve the whole test
// binary; every test uses its own key prefix. They start on first use and
// stop in TestMain.
var shared struct {
	serverOnce, clusterOnce sync.Once
	server                  *redistest.Server
	cluster                 *redistest.Cluster
	serverErr, clusterErr   error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.server != nil {
		shared.server.Close()
	}
	if shared.cluster != nil {
		shared.cluster.Close()
	}
	os.Exit(code)
}

func standalone(t testing.TB) *redistest.Server {
	t.Helper()
	shared.serverOnce.Do(func() { shared.server, shared.serverErr = redistest.NewServer() })
	if shared.serverErr != nil {
		t.Fatal(shared.serverErr)
	}
	return shared.server
}

func cluster(t testing.TB) *redistest.Cluster {
	t.Helper()
	shared.clusterOnce.Do(func() { shared.cluster, shared.clusterErr = redistest.NewCluster(3) })
	if shared.clusterErr != nil {
		t.Fatal(shared.clusterErr)
	}
	return shared.cluster
}

// TestConformance runs limiter's conformance tables, pre-paid and
// post-paid, on both servers.
func TestConformance(t *testing.T) {
	onBothServers(t, func(t *testing.T, newClient func() redis.UniversalClient) {
		c := newClient()
		newStore := func(t *testing.T) limiter.Store { return newStore(t, c, redisstore.CallerClock) }
		t.Run("prepaid", func(t *testing.T) { limitertest.RunStoreTests(t, newStore) })
		t.Run("postpaid", func(t *testing.T) { limitertest.RunPostpaidTests(t, newStore) })
	})
}

// onBothServers runs f as two subtests, standalone and cluster, on the
// shared standalone server and on the shared cluster: each call of
// newClient returns a new client of that server, with connections of its
// own, closed with the server.
func onBothServers(t *testing.T, f func(t *testing.T, newClient func() redis.UniversalClient)) {
	t.Helper()
	t.Run("standalone", func(t *testing.T) {
		f(t, func() redis.UniversalClient { return standalone(t).Client() })
	})
	t.Run("cluster", func(t *testing.T) {
		f(t, func() redis.UniversalClient { return cluster(t).Client() })
	})
}

// prefixes counts the prefixes handed out, so that tests run again
// (-count) do not meet their earlier keys.
var prefixes atomic.Int64

// prefix is a key prefix unique to the test and this run of it.
func prefix(t testing.TB) string {
	name := strings.NewReplacer("{", "(", "}", ")").Replace(t.Name())
	return fmt.Sprintf("test%d:%s:", prefixes.Add(1), name)
}

// newStore returns a Store over c with the test's prefix.
// callerClockStore is a Store on a standalone server of its own, deciding
// at the now it is given (exact values).
func callerClockStore(t testing.TB) *redisstore.Store {
	t.Helper()
	return newStore(t, standalone(t).Client(), redisstore.CallerClock)
}

func newStore(t testing.TB, c redisstore.Client, clock redisstore.Clock) *redisstore.Store {
	t.Helper()
	return newStoreOpts(t, c, redisstore.Options{Clock: clock})
}

// newStoreOpts returns a Store over c made with opts and the test's prefix.
func newStoreOpts(t testing.TB, c redisstore.Client, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	opts.Prefix = prefix(t)
	s, err := redisstore.New(c, opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// replicas returns two Stores on the standalone server with one prefix
// and the server's clock, as two ratelimitd replicas sharing a Redis.
func replicas(t *testing.T) []*redisstore.Store {
	t.Helper()
	return replicasOf(t, 2, func() redis.UniversalClient { return standalone(t).Client() })
}

// replicasOf returns n Stores, each over a client newClient returns, with
// the test's prefix (one for all) and the server's clock: n ratelimitd
// replicas sharing a Redis. They are closed when the test ends.
func replicasOf(t *testing.T, n int, newClient func() redis.UniversalClient) []*redisstore.Store {
	t.Helper()
	p := prefix(t)
	stores := make([]*redisstore.Store, n)
	for i := range stores {
		s, err := redisstore.New(newClient(), redisstore.Options{Prefix: p})
		if err != nil {
			t.Fatalf("New(Prefix %q): %v", p, err)
		}
		t.Cleanup(func() { s.Close() })
		stores[i] = s
	}
	return stores
}

var (
	_ redisstore.Client = (*redis.Client)(nil)
	_ redisstore.Client = (*redis.ClusterClient)(nil)
	_ redisstore.Client = (*redis.Ring)(nil)
	_ redisstore.Client = redis.UniversalClient(nil)
)

// standaloneClientless is a Client for tests that never reach Redis.
type standaloneClientless struct{ redis.Scripter }
