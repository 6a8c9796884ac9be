// Package redistest starts throwaway Redis servers for tests: a standalone
// server, a cluster of masters, a cluster of masters with replicas (some
// behind fault proxies) that fails over, moves slots and grows, a master
// watched by a sentinel, or a master, its replica and three sentinels that
// fail over. Every
// server listens on a free loopback port, keeps its files in its own
// temporary directory, persists nothing, and is killed when the test ends.
// Nothing here touches a Redis it did not start.
//
// It needs redis-server (and redis-cli for clusters) on PATH; without them
// the test fails loudly with the install hint rather than being skipped.
// The processes are started by internal/redisproc, which the bench shares.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redisproc"
)

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = redisproc.DefaultReadyTimeout

// Server is one redis-server process on 127.0.0.1. Its methods are safe for
// concurrent use.
type Server struct {
	// Addr is host:port of the server, for redis.Options.Addr.
	Addr string
	// Port is the port of Addr.
	Port int

	dir  string // temporary directory, the server's working dir
	proc *redisproc.Server

	clients clients
}

// Start starts a standalone redis-server and registers its shutdown with
// t.Cleanup. It fails the test if redis-server is missing or does not start.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := NewServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// NewServer starts a standalone redis-server. The caller must Close it; in
// tests prefer Start. It is meant for a server shared by a whole test binary
// (started lazily, closed in TestMain).
func NewServer() (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	s, err := startServer(dir, "", nil)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// startServer starts redis-server in dir with an optional config file and
// extra arguments; extra may contain "{bus}", replaced by a second free port
// (the cluster bus).
func startServer(dir, conf string, extra []string) (*Server, error) {
	p, err := redisproc.Start(context.Background(), redisproc.Options{Dir: dir, Conf: conf, Args: extra})
	if err != nil {
		return nil, err
	}
	return &Server{Addr: p.Addr, Port: p.Port, dir: dir, proc: p}, nil
}

// Client returns a new client of the server, closed when the server is.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	s.clients.add(c)
	return c
}

// Stop kills the server (SIGKILL: no shutdown save, like a crash). Its data
// is lost. Stop on a stopped server does nothing.
func (s *Server) Stop() {
	s.proc.Kill()
}

// Restart starts a stopped server again on the same port, empty, and waits
// until it answers PING. A cluster node keeps its identity and slots (they
// live in nodes.conf). Restart on a running server stops it first.
func (s *Server) Restart() error {
	return s.proc.Restart(context.Background())
}

// Close stops the server, closes the clients handed out, and removes its
// directory.
func (s *Server) Close() error {
	clients := s.clients.take()
	s.proc.Kill()
	return errors.Join(clients.close(), os.RemoveAll(s.dir))
}

// clients are the clients a Server or Cluster handed out, closed with it.
// Its methods are safe for concurrent use.
type clients struct {
	mu   sync.Mutex
	list []io.Closer
}

func (cs *clients) add(c io.Closer) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.list = append(cs.list, c)
}

// take returns the clients handed out so far and forgets them.
func (cs *clients) take() *clients {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	list := cs.list
	cs.list = nil
	return &clients{list: list}
}

// close closes the clients, ignoring those already closed.
func (cs *clients) close() error {
	var errs []error
	for _, c := range cs.list {
		if err := c.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func lastLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

// Cluster is a Redis Cluster of masters without replicas, all on 127.0.0.1.
type Cluster struct {
	// Addrs are the masters' addresses, for redis.ClusterOptions.Addrs.
	Addrs []string
	// Nodes are the masters (for fault tests: Stop, Restart).
	Nodes []*Server

	clients clients
}

// StartCluster starts a cluster of masters (at least 3, as redis-cli
// requires), shares the 16384 slots among them, waits until every node
// reports cluster_state:ok, and registers its shutdown with t.Cleanup.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	c, err := NewCluster(masters)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// NewCluster is StartCluster without a test: the caller must Close it.
func NewCluster(masters int) (*Cluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("redistest: cluster of %d masters: redis-cli --cluster create needs at least 3", masters)
	}
	cli, err := redisproc.LookPath("redis-cli")
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for i := range masters {
		dir, err := os.MkdirTemp("", fmt.Sprintf("redistest-cluster%d-", i))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("redistest: %w", err)
		}
		s, err := startServer(dir, "", []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000",
			"--cluster-port", "{bus}",
		})
		if err != nil {
			os.RemoveAll(dir)
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w: %s", err, lastLines(string(out)))
	}
	if err := c.waitOK(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// waitOK waits until every node says cluster_state:ok and knows every other.
func (c *Cluster) waitOK(ctx context.Context) error {
	for _, n := range c.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: n.Addr})
		for {
			info, err := rc.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r", len(c.Nodes))) {
				break
			}
			if ctx.Err() != nil {
				rc.Close()
				return fmt.Errorf("redistest: cluster node %s not ok: %v %q", n.Addr, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
		rc.Close()
	}
	return nil
}

// Client returns a new cluster client, closed when the cluster is.
func (c *Cluster) Client() *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	c.clients.add(cc)
	return cc
}

// Close stops every node and closes the clients handed out.
func (c *Cluster) Close() error {
	errs := []error{c.clients.take().close()}
	for _, n := range c.Nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}
