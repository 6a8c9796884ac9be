package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/redisproc"
)

// startTimeout bounds how long a child may take to say it is ready.
const startTimeout = 30 * time.Second

// stopTimeout is how long a child has to exit after SIGTERM before SIGKILL.
const stopTimeout = 5 * time.Second

// child is a process started by run.
type child struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}   // closed once cmd has been waited for
	tail   *redisproc.Tail // its last lines of output
}

// children are the processes run started; stopAll stops them in reverse
// order of start. It is safe for concurrent use.
type children struct {
	mu   sync.Mutex
	list []process
}

// process is a child or a redis-server: Terminate sends it SIGTERM, waits
// up to timeout for it to exit, then kills it and says so.
type process interface {
	Terminate(timeout time.Duration) error
}

func (cs *children) add(p process) {
	cs.mu.Lock()
	cs.list = append(cs.list, p)
	cs.mu.Unlock()
}

// start starts bin with args. ready is called with each line of its
// output until it returns an address; start returns that address, or an
// error if the child exits or startTimeout passes first.
func (cs *children) start(ctx context.Context, name, bin string, args []string, ready func(line []byte) (string, bool)) (string, *child, error) {
	cmd := exec.Command(bin, args...)
	detach(cmd)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, exited: make(chan struct{}), tail: redisproc.NewTail(20)}
	cs.add(c)
	go func() {
		cmd.Wait()
		pw.Close()
		close(c.exited)
	}()
	addrc := make(chan string, 1)
	go func() {
		// Read every line until the child exits, so it never blocks on a
		// full pipe; remember the last few for error messages.
		sc := bufio.NewScanner(io.TeeReader(pr, c.tail))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := ready == nil
		for sc.Scan() {
			if !found {
				if addr, ok := ready(sc.Bytes()); ok {
					found = true
					addrc <- addr
				}
			}
		}
		io.Copy(io.Discard, pr)
	}()
	if ready == nil {
		return "", c, nil
	}
	select {
	case addr := <-addrc:
		return addr, c, nil
	case <-c.exited:
		return "", c, fmt.Errorf("%s exited before it was ready: %s", name, c.tail)
	case <-time.After(startTimeout):
		return "", c, fmt.Errorf("%s not ready after %v: %s", name, startTimeout, c.tail)
	case <-ctx.Done():
		return "", c, ctx.Err()
	}
}

// stopAll sends SIGTERM to every process still running, newest first,
// waits up to stopTimeout for each, then kills it.
func (cs *children) stopAll() error {
	cs.mu.Lock()
	list := cs.list
	cs.list = nil
	cs.mu.Unlock()
	var errs []error
	for i := len(list) - 1; i >= 0; i-- {
		errs = append(errs, list[i].Terminate(stopTimeout))
	}
	return errors.Join(errs...)
}

// Terminate implements process.
func (c *child) Terminate(timeout time.Duration) error {
	select {
	case <-c.exited:
		return nil
	default:
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		return nil
	case <-time.After(timeout):
	}
	c.cmd.Process.Kill()
	<-c.exited
	return fmt.Errorf("%s did not stop within %v of SIGTERM; killed", c.name, timeout)
}

// jsonReady returns a ready func that waits for a JSON log line with the
// message msg and returns its grpc_addr.
func jsonReady(msg string) func([]byte) (string, bool) {
	return func(line []byte) (string, bool) {
		var l struct {
			Msg      string `json:"msg"`
			GRPCAddr string `json:"grpc_addr"`
		}
		if json.Unmarshal(line, &l) != nil || l.Msg != msg || l.GRPCAddr == "" {
			return "", false
		}
		return l.GRPCAddr, true
	}
}

// startRedis starts a throwaway redis-server (see internal/redisproc) in
// dir, and returns its address once it answers PING.
func (cs *children) startRedis(ctx context.Context, bin, dir string) (string, error) {
	path, err := redisproc.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%w, or pass --redis-server", err)
	}
	s, err := redisproc.Start(ctx, redisproc.Options{Bin: path, Dir: dir, ReadyTimeout: startTimeout, Prepare: detach})
	if err != nil {
		return "", err
	}
	cs.add(s)
	return s.Addr, nil
}
