// Package xdstest runs an xDS management server for tests, built the way
// Envoy Gateway and Envoy AI Gateway build theirs: go-control-plane's
// pkg/server/v3 with a State-of-the-World snapshot cache keyed on the node
// id, serving RateLimitConfig resources over ADS on a free loopback port,
// optionally with mutual TLS (TLS 1.3 minimum, client certificates
// required and verified, as EG's internal/crypto/cert_load.go does). It
// records every DiscoveryRequest the clients send, so that tests can wait
// for the ACK of a version or for a NACK and read what the client said.
//
// Like EG's server it pushes a snapshot that a client NACKed again right
// away (envoyproxy/go-control-plane#962): a client under test sees the
// refused version until the test sets a new snapshot.
//
// Its certificate authority (NewCA, NewCerts) serves the other TLS tests
// too: those of the certificate reloader issue from it.
package xdstest

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// WaitTimeout bounds every Wait… method: what a test waits before it
// fails, not a bound it asserts. A resource of 16,256 descriptors took 16 s
// to load and ACK under the race detector beside make test's other
// packages on 2 cores.
const WaitTimeout = 60 * time.Second

// Options configure a Server. The zero value serves plaintext.
type Options struct {
	// TLS, when set, serves mutual TLS with these files: the server's
	// certificate and key, and the CA that client certificates must be
	// signed by. NewCerts writes a set.
	TLS *Certs
}

// Request is one DiscoveryRequest a client sent, with what the server knew
// about its stream.
type Request struct {
	Stream        int64 // the server's id of the stream; new per connection
	NodeID        string
	NodeMetadata  map[string]string // string values of Node.metadata
	TypeURL       string
	ResourceNames []string
	Version       string // version_info
	Nonce         string // response_nonce
	// Error is error_detail.message; a request with an error_detail is a
	// NACK (Error may still be "" if the client sent an empty message).
	Error  string
	IsNACK bool
	// Headers are the gRPC metadata of the stream.
	Headers metadata.MD
	// ClientCert is the common name of the client certificate of the
	// stream's connection; "" without TLS.
	ClientCert string
}

// IsACK reports whether r acknowledges a response (it has a nonce and no
// error_detail).
func (r Request) IsACK() bool { return r.Nonce != "" && !r.IsNACK }

// Server is a running management server. Its methods are safe for
// concurrent use; the Wait… methods and SetSnapshot fail the test they
// were started with.
type Server struct {
	t     testing.TB
	addr  string
	cache cachev3.SnapshotCache
	xds   serverv3.Server // one for the server's life, so stream ids stay unique across Restart
	tls   *tls.Config

	mu       sync.Mutex
	gs       *grpc.Server
	reqs     []Request
	streams  map[int64]streamInfo
	changed  chan struct{} // closed and replaced at each new request
	nackSeen int           // requests scanned by WaitForNACK so far
}

type streamInfo struct {
	headers metadata.MD
	cert    string
}

// Start starts a server on a free loopback port and stops it when the
// test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	s := &Server{
		t:       t,
		cache:   cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		streams: make(map[int64]streamInfo),
		changed: make(chan struct{}),
	}
	if opts.TLS != nil {
		cfg, err := opts.TLS.ServerConfig()
		if err != nil {
			t.Fatalf("xdstest: %v", err)
		}
		s.tls = cfg
	}
	s.xds = serverv3.NewServer(context.Background(), s.cache, serverv3.CallbackFuncs{
		StreamOpenFunc:    s.onOpen,
		StreamRequestFunc: s.onRequest,
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("xdstest: listen: %v", err)
	}
	s.addr = lis.Addr().String()
	s.serve(lis)
	t.Cleanup(s.Stop)
	return s
}

// Addr is the server's host:port; it stays the same across Restart.
func (s *Server) Addr() string { return s.addr }

func (s *Server) serve(lis net.Listener) {
	var opts []grpc.ServerOption
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	gs := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, s.xds)
	s.mu.Lock()
	s.gs = gs
	s.mu.Unlock()
	go gs.Serve(lis) //nolint:errcheck // returns when stopped
}

func (s *Server) onOpen(ctx context.Context, id int64, _ string) error {
	var info streamInfo
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		info.headers = md.Copy()
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			info.cert = ti.State.PeerCertificates[0].Subject.CommonName
		}
	}
	s.mu.Lock()
	s.streams[id] = info
	s.mu.Unlock()
	return nil
}

func (s *Server) onRequest(id int64, req *discoveryv3.DiscoveryRequest) error {
	r := Request{
		Stream:        id,
		NodeID:        req.GetNode().GetId(),
		NodeMetadata:  stringFields(req.GetNode()),
		TypeURL:       req.GetTypeUrl(),
		ResourceNames: req.GetResourceNames(),
		Version:       req.GetVersionInfo(),
		Nonce:         req.GetResponseNonce(),
		IsNACK:        req.GetErrorDetail() != nil,
		Error:         req.GetErrorDetail().GetMessage(),
	}
	s.mu.Lock()
	info := s.streams[id]
	r.Headers, r.ClientCert = info.headers, info.cert
	s.reqs = append(s.reqs, r)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return nil
}

func stringFields(n *corev3.Node) map[string]string {
	out := make(map[string]string)
	for k, v := range n.GetMetadata().GetFields() {
		out[k] = v.GetStringValue()
	}
	return out
}

// SetSnapshot serves resources as version of the config for nodeID; every
// client of that node id gets it pushed.
func (s *Server) SetSnapshot(nodeID, version string, resources ...*rlsconfv3.RateLimitConfig) {
	s.t.Helper()
	items := make([]types.Resource, len(resources))
	for i, r := range resources {
		items[i] = r
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: items})
	if err != nil {
		s.t.Fatalf("xdstest: snapshot %q: %v", version, err)
	}
	if err := s.cache.SetSnapshot(context.Background(), nodeID, snap); err != nil {
		s.t.Fatalf("xdstest: set snapshot %q for %q: %v", version, nodeID, err)
	}
}

// Requests returns every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// WaitFor waits until a request for which match is true has arrived (at
// any time since Start) and returns the first such request; it fails the
// test after WaitTimeout.
func (s *Server) WaitFor(t testing.TB, what string, match func(Request) bool) Request {
	t.Helper()
	deadline := time.NewTimer(WaitTimeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		for _, r := range s.reqs {
			if match(r) {
				s.mu.Unlock()
				return r
			}
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("xdstest: no %s within %v; requests: %s", what, WaitTimeout, s.summary())
			return Request{}
		}
	}
}

// WaitForACK waits for a request that ACKs version and returns it.
func (s *Server) WaitForACK(t testing.TB, version string) Request {
	t.Helper()
	return s.WaitFor(t, "ACK of version "+version, func(r Request) bool { return r.IsACK() && r.Version == version })
}

// WaitForNACK waits for the next NACK, one not returned by an earlier
// WaitForNACK, and returns its error_detail message.
func (s *Server) WaitForNACK(t testing.TB) string {
	t.Helper()
	deadline := time.NewTimer(WaitTimeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		for i := s.nackSeen; i < len(s.reqs); i++ {
			if s.reqs[i].IsNACK {
				s.nackSeen = i + 1
				msg := s.reqs[i].Error
				s.mu.Unlock()
				return msg
			}
		}
		s.nackSeen = len(s.reqs)
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("xdstest: no NACK within %v; requests: %s", WaitTimeout, s.summary())
			return ""
		}
	}
}

// Streams returns how many streams have been opened.
func (s *Server) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

func (s *Server) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, r := range s.reqs {
		kind := "request"
		switch {
		case r.IsNACK:
			kind = "NACK(" + r.Error + ")"
		case r.IsACK():
			kind = "ACK"
		}
		b.WriteString("\n  stream " + strconv.FormatInt(r.Stream, 10) + " node " + r.NodeID + " " + kind + " version " + r.Version)
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// Stop stops the server, closing every stream; the snapshots and the
// requests seen are kept. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	gs := s.gs
	s.gs = nil
	s.mu.Unlock()
	if gs != nil {
		gs.Stop()
	}
}

// Restart serves again on the same address after Stop, with the same
// snapshots.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	var lis net.Listener
	var err error
	// The port was just closed; another process could take it, but on
	// loopback with SO_REUSEADDR (Go's default) rebinding succeeds.
	for range 50 {
		if lis, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("xdstest: listen again on %s: %v", s.addr, err)
	}
	s.serve(lis)
}
