// Package faultproxy is a TCP proxy for tests on loopback that injects
// network faults between a client and a server, in the manner of
// toxiproxy's toxics but without a dependency: it can drop every byte
// while keeping connections open (a blackhole), delay every byte by a
// fixed latency, or reset every connection. A Proxy runs in the test's
// own process; a Remote runs one in a process of its own (cmd/faultproxy,
// controlled through its stdin and stdout; see Serve), for tests whose
// process is too busy to forward bytes on time.
//
// A fault is switched at any time and applies at once to the connections
// already open and to those accepted later. The proxy forwards chunks:
// what one read from a side returned, written whole to the other side.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// chunkSize is the largest chunk read from a side at once.
const chunkSize = 32 << 10

// queueLen is how many chunks a direction holds in flight before its
// reader stops reading (so a slow side pushes back, as TCP does).
const queueLen = 64

// dialTimeout bounds how long connecting to the target may take.
const dialTimeout = 2 * time.Second

// kind is the fault in force. Its zero value is invalid.
type kind int

const (
	pass kind = iota + 1
	blackhole
	latency
	reset
)

// fault is the fault in force, replaced (never changed) when a test
// switches it.
type fault struct {
	kind  kind
	delay time.Duration // for latency
}

// Proxy listens on a loopback port and forwards each connection it
// accepts to its target, through the fault in force (Pass at first). Its
// methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener

	fault atomic.Pointer[fault] // read per chunk; written under mu

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool

	ctx    context.Context // done when the proxy closes
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection
	once   sync.Once      // of Close
}

// Start listens on 127.0.0.1 at a free port and forwards every connection
// accepted there to target (a host:port), which need not be listening
// yet: it is dialled once per accepted connection. A connection whose
// dial fails is reset, as the target's own refusal would be. The caller
// must Close the proxy.
func Start(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen for %s: %w", target, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{target: target, ln: ln, conns: make(map[*conn]struct{}), ctx: ctx, cancel: cancel}
	p.fault.Store(&fault{kind: pass})
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address (127.0.0.1:port), for clients to dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the port of Addr.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Conns is the number of connections open now: accepted and not yet
// closed or reset.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Pass forwards bytes normally, in both directions, from now on: the
// default. Chunks that a latency fault is holding are still delivered at
// the time it set.
func (p *Proxy) Pass() { p.set(fault{kind: pass}) }

// Blackhole keeps every connection open, and accepts and connects new
// ones, but forwards no byte in either direction: every byte read from
// either side, or held back by a latency fault, is dropped (like
// toxiproxy's timeout toxic with a timeout of 0). After Pass, bytes read
// from then on are forwarded; the dropped ones are lost. A side that
// closes its end (EOF) is still passed on.
func (p *Proxy) Blackhole() { p.set(fault{kind: blackhole}) }

// Latency delays every chunk read from either side by d: it is written to
// the other side d after it was read, in order within each direction.
// The delay does not add up: chunks read a millisecond apart arrive a
// millisecond apart, so throughput is kept (up to 64 chunks held per
// direction: then the proxy stops reading that side, as a full TCP window
// would). A round trip through the proxy takes 2·d more. d ≤ 0 means Pass.
func (p *Proxy) Latency(d time.Duration) {
	if d <= 0 {
		p.Pass()
		return
	}
	p.set(fault{kind: latency, delay: d})
}

// ResetPeer resets every open connection, both to the client and to the
// target (SO_LINGER 0, then close: the peer gets a TCP RST, and its next
// read fails with ECONNRESET), and resets every connection accepted from
// now until Pass as soon as it is accepted, without dialling the target.
func (p *Proxy) ResetPeer() {
	for _, c := range p.set(fault{kind: reset}) {
		c.teardown(true)
	}
}

// set puts f in force and returns the open connections.
func (p *Proxy) set(f fault) []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault.Store(&f)
	open := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	return open
}

// Close stops listening, closes every connection (a plain close, not a
// reset) and returns once every goroutine of the proxy has ended. Close
// after the first does nothing and returns nil.
func (p *Proxy) Close() error {
	var err error
	p.once.Do(func() { err = p.close() })
	return err
}

func (p *Proxy) close() error {
	p.mu.Lock()
	p.closed = true
	open := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	for _, c := range open {
		c.teardown(false)
	}
	p.wg.Wait()
	if err != nil {
		return fmt.Errorf("faultproxy: close %s: %w", p.Addr(), err)
	}
	return nil
}

// accept accepts connections until the listener closes.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient failure (out of descriptors, say): try again
			// shortly rather than spin.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		c := newConn(p.ctx, nc.(*net.TCPConn))
		p.mu.Lock()
		switch {
		case p.closed:
			p.mu.Unlock()
			nc.Close()
			continue
		case p.fault.Load().kind == reset:
			p.mu.Unlock()
			c.teardown(true)
			continue
		}
		// Registered under mu, where ResetPeer and Close take their
		// snapshot: a connection is either in it or sees their fault.
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c)
	}
}

// serve dials the target for c, forwards both directions until both have
// ended, then closes c and forgets it.
func (p *Proxy) serve(c *conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()

	// A reset or Close during the dial ends it (c.ctx is done).
	ctx, cancel := context.WithTimeout(c.ctx, dialTimeout)
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		c.teardown(true) // as the target's refusal would
		return
	}
	if !c.setUpstream(up.(*net.TCPConn)) {
		return // reset or closed during the dial
	}

	var wg sync.WaitGroup
	for _, dir := range []struct{ src, dst *net.TCPConn }{{c.client, c.upstream}, {c.upstream, c.client}} {
		queue := make(chan chunk, queueLen)
		wg.Add(2)
		go func() {
			defer wg.Done()
			p.read(c, dir.src, queue)
		}()
		go func() {
			defer wg.Done()
			p.write(c, dir.dst, queue)
		}()
	}
	wg.Wait()
	c.teardown(false)
}

// chunk is what one read returned, or the end of the stream (eof).
type chunk struct {
	data []byte
	due  time.Time // when to write it
	eof  bool
}

// read reads src until EOF or an error, and queues each chunk for the
// other side unless a blackhole drops it. EOF is queued too; an error
// (the peer reset, say) resets both sides.
func (p *Proxy) read(c *conn, src *net.TCPConn, queue chan<- chunk) {
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			now := time.Now()
			f := p.fault.Load()
			if f.kind != blackhole && f.kind != reset {
				ch := chunk{data: append([]byte(nil), buf[:n]...), due: now}
				if f.kind == latency {
					ch.due = now.Add(f.delay)
				}
				select {
				case queue <- ch:
				case <-c.done:
					return
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				select {
				case queue <- chunk{eof: true}:
				case <-c.done:
				}
			} else {
				c.teardown(true)
			}
			return
		}
	}
}

// write writes each queued chunk to dst when it is due, unless a
// blackhole is in force then; at EOF it closes dst for writing.
func (p *Proxy) write(c *conn, dst *net.TCPConn, queue <-chan chunk) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		var ch chunk
		select {
		case ch = <-queue:
		case <-c.done:
			return
		}
		if ch.eof {
			dst.CloseWrite()
			return
		}
		if wait := time.Until(ch.due); wait > 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait) // Go ≥ 1.23: no stale tick to drain
			}
			select {
			case <-timer.C:
			case <-c.done:
				return
			}
		}
		if k := p.fault.Load().kind; k == blackhole || k == reset {
			continue
		}
		if _, err := dst.Write(ch.data); err != nil {
			c.teardown(true)
			return
		}
	}
}

// conn is one proxied connection: the client's side and, once dialled,
// the target's.
type conn struct {
	client *net.TCPConn
	// ctx is done once the connection is torn down or the proxy closes;
	// done is ctx.Done().
	ctx    context.Context
	cancel context.CancelFunc
	done   <-chan struct{}

	mu       sync.Mutex
	upstream *net.TCPConn // nil until dialled
	down     bool         // torn down
}

func newConn(parent context.Context, client *net.TCPConn) *conn {
	ctx, cancel := context.WithCancel(parent)
	return &conn{client: client, ctx: ctx, cancel: cancel, done: ctx.Done()}
}

// setUpstream records the target's side, or closes it and reports false
// if c was torn down meanwhile.
func (c *conn) setUpstream(up *net.TCPConn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		up.Close()
		return false
	}
	c.upstream = up
	return true
}

// teardown closes both sides, with a TCP RST if reset, and ends the
// connection's goroutines. Only the first call does anything.
func (c *conn) teardown(reset bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return
	}
	c.down = true
	c.cancel()
	for _, s := range []*net.TCPConn{c.client, c.upstream} {
		if s == nil {
			continue
		}
		if reset {
			s.SetLinger(0)
		}
		s.Close()
	}
}
