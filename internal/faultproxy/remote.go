package faultproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// commandPath is the package of the proxy process, built with go build.
const commandPath = "github.com/ratelimitd/ratelimitd/internal/faultproxy/cmd/faultproxy"

// Remote is a Proxy run in a process of its own, controlled from this one:
// for a test whose own process is too busy to be a faithful network (a
// race-enabled client driving load beside the system under test, on a
// small machine, delays an in-process proxy's reads and writes by tens of
// milliseconds, which the system under test then sees as a slow server).
// Its methods are those of Proxy, each returning what went wrong with the
// process, and safe for concurrent use.
type Remote struct {
	proc   *proxyProcess
	id     string
	addr   string
	target string

	closeOnce sync.Once
	closeErr  error
}

// proxyProcess is the process that runs every Remote of this one, started
// with the first (see shared).
type proxyProcess struct {
	mu   sync.Mutex // one command at a time
	in   io.WriteCloser
	out  *bufio.Reader
	dead error // once set, every command fails with it
}

// shared is this process's proxy process. It lives as long as this
// process: it exits when its stdin, held here, closes.
var shared struct {
	once sync.Once
	proc *proxyProcess
	err  error
}

// StartRemote starts a proxy in front of target (as Start does) in the
// proxy process, which it builds (go build, so the go command must be on
// PATH and the working directory inside this module, as in go test) and
// starts the first time.
func StartRemote(target string) (*Remote, error) {
	proc, err := sharedProcess()
	if err != nil {
		return nil, err
	}
	answer, err := proc.do("start " + target)
	if err != nil {
		return nil, err
	}
	id, addr, ok := strings.Cut(answer, " ")
	if !ok {
		return nil, fmt.Errorf("faultproxy: start %s: answer %q: want ID ADDR", target, answer)
	}
	return &Remote{proc: proc, id: id, addr: addr, target: target}, nil
}

// Prepare builds and starts the proxy process now, if it is not running
// yet (StartRemote does on first use), so that a caller with a deadline
// for what follows does not spend it on the build: with a cold build
// cache, go build takes about 17 s on a quiet 2-core machine.
func Prepare() error {
	_, err := sharedProcess()
	return err
}

// sharedProcess is this process's proxy process, started the first time.
func sharedProcess() (*proxyProcess, error) {
	shared.once.Do(func() { shared.proc, shared.err = startProxyProcess() })
	return shared.proc, shared.err
}

// startProxyProcess builds the proxy command into a temporary directory,
// starts it and removes the directory (the running process keeps its
// file).
func startProxyProcess() (*proxyProcess, error) {
	dir, err := os.MkdirTemp("", "faultproxy-")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "faultproxy")
	if out, err := exec.Command("go", "build", "-o", bin, commandPath).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("faultproxy: go build %s: %v\n%s", commandPath, err, out)
	}
	cmd := exec.Command(bin)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("faultproxy: start %s: %w", bin, err)
	}
	go cmd.Wait() // reaped whenever it ends
	return &proxyProcess{in: in, out: bufio.NewReader(out)}, nil
}

// do sends one command and returns its answer after "ok ".
func (p *proxyProcess) do(command string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead != nil {
		return "", p.dead
	}
	line, err := func() (string, error) {
		if _, err := io.WriteString(p.in, command+"\n"); err != nil {
			return "", err
		}
		return p.out.ReadString('\n')
	}()
	if err != nil {
		p.dead = fmt.Errorf("faultproxy: the proxy process is gone (%q: %w)", command, err)
		return "", p.dead
	}
	line = strings.TrimSuffix(line, "\n")
	if msg, ok := strings.CutPrefix(line, "err "); ok {
		return "", errors.New(msg)
	}
	if line == "ok" {
		return "", nil
	}
	if rest, ok := strings.CutPrefix(line, "ok "); ok {
		return rest, nil
	}
	return "", fmt.Errorf("faultproxy: %q: answer %q", command, line)
}

// verb sends the command VERB [ARGS] for r's proxy.
func (r *Remote) verb(words ...string) (string, error) {
	return r.proc.do(r.id + " " + strings.Join(words, " "))
}

// Addr is the proxy's address (127.0.0.1:port), for clients to dial.
func (r *Remote) Addr() string { return r.addr }

// Port is the port of Addr.
func (r *Remote) Port() int {
	_, port, _ := net.SplitHostPort(r.addr)
	n, _ := strconv.Atoi(port)
	return n
}

// Target is the address the proxy forwards to.
func (r *Remote) Target() string { return r.target }

// Conns is Proxy.Conns.
func (r *Remote) Conns() (int, error) {
	answer, err := r.verb("conns")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(answer)
}

// Pass is Proxy.Pass.
func (r *Remote) Pass() error { _, err := r.verb("pass"); return err }

// Blackhole is Proxy.Blackhole.
func (r *Remote) Blackhole() error { _, err := r.verb("blackhole"); return err }

// Latency is Proxy.Latency.
func (r *Remote) Latency(d time.Duration) error { _, err := r.verb("latency", d.String()); return err }

// ResetPeer is Proxy.ResetPeer.
func (r *Remote) ResetPeer() error { _, err := r.verb("reset"); return err }

// Close is Proxy.Close: after the first, it does nothing and returns
// the first's error.
func (r *Remote) Close() error {
	r.closeOnce.Do(func() { _, r.closeErr = r.verb("close") })
	return r.closeErr
}
