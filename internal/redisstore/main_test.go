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

// prefixes counts the prefixes handed out, so that tests run again
// (-count) do not meet their earlier keys.
var prefixes atomic.Int64

// prefix is a key prefix unique to the test and this run of it.
func prefix(t testing.TB) string {
	name := strings.NewReplacer("{", "(", "}", ")").Replace(t.Name())
	return fmt.Sprintf("test%d:%s:", prefixes.Add(1), name)
}

// newStore returns a Store over c with the test's prefix.
func newStore(t testing.TB, c redisstore.Client, clock redisstore.Clock) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, redisstore.Options{Prefix: prefix(t), Clock: clock})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var (
	_ redisstore.Client = (*redis.Client)(nil)
	_ redisstore.Client = (*redis.ClusterClient)(nil)
	_ redisstore.Client = (*redis.Ring)(nil)
	_ redisstore.Client = redis.UniversalClient(nil)
)

// standaloneClientless is a Client for tests that never reach Redis.
type standaloneClientless struct{ redis.Scripter }
