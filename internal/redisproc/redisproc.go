// Package redisproc starts throwaway redis-server processes: each on
// 127.0.0.1 at a free port, in a directory of the caller's, persisting
// nothing, ready once it answers PING. The Redis test kit
// (internal/redistest) and the bench start theirs here; it does not depend
// on package testing.
package redisproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultReadyTimeout is the default of Options.ReadyTimeout.
const DefaultReadyTimeout = 10 * time.Second

// bindAttempts is how many free ports Start tries before giving up: a port
// found free may be taken by another process before the server binds it.
const bindAttempts = 5

// logLines is how many of the server's last log lines are kept for errors.
const logLines = 20

// Options says how to start a redis-server. Dir is required; the zero value
// of every other field means its default.
type Options struct {
	// Bin is the redis-server binary, a path or a name looked up on PATH.
	// Default "redis-server".
	Bin string
	// Dir is the server's working directory (it writes nothing there but
	// what its arguments ask for: a cluster's nodes.conf, say).
	Dir string
	// Conf is a config file, given before every argument (as redis-server
	// wants it), or "" for none. A sentinel needs one it can rewrite.
	Conf string
	// Args follow the defaults (bind 127.0.0.1, no save, no AOF, no
	// daemon, no protected mode, the port). In each, "{bus}" is replaced by
	// a second free port (for --cluster-port).
	Args []string
	// ReadyTimeout bounds how long the server may take to answer PING.
	// Default DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// Prepare, if set, is called on the command before it starts (to put
	// it in a process group of its own, say).
	Prepare func(*exec.Cmd)
}

// Server is one redis-server process. Its methods are safe for concurrent
// use.
type Server struct {
	// Addr is host:port of the server, for redis.Options.Addr.
	Addr string
	// Port is the port of Addr.
	Port int

	bin  string
	args []string // the whole command line after the binary
	opts Options

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	log    *Tail
}

// LookPath finds a Redis binary (redis-server, redis-cli) or says how to
// install it.
func LookPath(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found: install it (apt-get install -y redis-server)", name)
	}
	return p, nil
}

// Start starts a redis-server as opts says and waits until it answers
// PING. The caller must stop it (Kill or Terminate); its directory is the
// caller's to remove.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("redisproc: Options.Dir is required")
	}
	bin, err := LookPath(cmp.Or(opts.Bin, "redis-server"))
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range bindAttempts {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		s := &Server{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
			Port: ports[0],
			bin:  bin,
			args: commandLine(opts, ports[0], ports[1]),
			opts: opts,
		}
		if lastErr = s.start(ctx); lastErr == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, lastErr
		}
	}
	return nil, fmt.Errorf("redisproc: redis-server did not start after %d attempts: %w", bindAttempts, lastErr)
}

// commandLine is the arguments of a server on port, with bus for {bus}.
func commandLine(opts Options, port, bus int) []string {
	var args []string
	if opts.Conf != "" {
		args = append(args, opts.Conf) // redis-server wants the config file first
	}
	args = append(args,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", opts.Dir,
		"--daemonize", "no",
		"--protected-mode", "no",
	)
	for _, a := range opts.Args {
		args = append(args, strings.ReplaceAll(a, "{bus}", strconv.Itoa(bus)))
	}
	return args
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("redisproc: find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// start runs the process and waits until it answers PING.
func (s *Server) start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("redisproc: server %s already running", s.Addr)
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.opts.Dir
	log := NewTail(logLines)
	cmd.Stdout = log // redis-server logs to stdout
	cmd.Stderr = log
	if s.opts.Prepare != nil {
		s.opts.Prepare(cmd)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redisproc: start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited, s.log = cmd, exited, log

	timeout := s.opts.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	for {
		select {
		case <-exited:
			s.cmd = nil
			return fmt.Errorf("redisproc: redis-server on %s exited: %s", s.Addr, log)
		default:
		}
		// Dial first, and PING only once the port takes connections: a
		// dial that go-redis makes and fails is logged on the process's
		// stderr, where a bench's report goes.
		err := probeDial(ctx, s.Addr)
		if err == nil {
			if err = c.Ping(ctx).Err(); err == nil {
				return nil
			}
		}
		if ctx.Err() != nil {
			s.killLocked()
			return fmt.Errorf("redisproc: redis-server on %s did not answer PING within %v: %w: %s", s.Addr, timeout, err, log)
		}
		select {
		case <-exited:
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// probeDial reports whether addr takes a TCP connection within 100 ms.
func probeDial(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: 100 * time.Millisecond}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// Exited is closed once the process has exited (nil if it is not running).
func (s *Server) Exited() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	return s.exited
}

// Log returns the server's last lines of output, joined by " | ".
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return "(no output)"
	}
	return s.log.String()
}

// Kill kills the server (SIGKILL: no shutdown save, like a crash) and waits
// for it to exit. Its data is lost. Kill on a stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// killLocked kills the process and waits for it; s.mu is held.
func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Terminate asks the server to shut down (SIGTERM) and waits up to timeout
// for it to exit, then kills it and says so. Terminate on a stopped server
// does nothing.
func (s *Server) Terminate(timeout time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		s.cmd = nil
		return nil
	case <-time.After(timeout):
	}
	s.killLocked()
	return fmt.Errorf("redis-server on %s did not stop within %v of SIGTERM; killed", s.Addr, timeout)
}

// Restart starts a stopped server again on the same port with the same
// arguments, and waits until it answers PING. It starts empty, but a
// cluster node keeps its identity and slots (they live in nodes.conf in
// its directory). Restart on a running server kills it first.
func (s *Server) Restart(ctx context.Context) error {
	s.Kill()
	var err error
	for range bindAttempts { // the port may linger briefly
		if err = s.start(ctx); err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}
