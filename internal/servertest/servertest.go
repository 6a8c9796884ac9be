// Package servertest runs gRPC services inside a test's process: a real
// grpc.Server on a free loopback port and a client connection to it, built
// from the go-control-plane types Envoy's are generated from, both stopped
// when the test ends. Tests of the rate-limit service, its codec, tracing,
// reload and TLS share it rather than each setting up a server. Dial
// connects to a server a test runs otherwise (a daemon, a process), Get
// reads an HTTP endpoint of one, and DescriptorDir writes the descriptor
// files it loads.
package servertest

import (
	"net"
	"sync"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Options says what to serve and how. The zero value serves nothing over
// plain (insecure) connections.
type Options struct {
	// RateLimit, if set, is served as the RateLimitService.
	RateLimit rlsv3.RateLimitServiceServer
	// Register, if set, registers other services (health, say).
	Register func(*grpc.Server)
	// ServerOptions are for grpc.NewServer: a codec, credentials,
	// interceptors.
	ServerOptions []grpc.ServerOption
	// DialOptions are for the client connection, after insecure transport
	// credentials (which a later WithTransportCredentials replaces).
	DialOptions []grpc.DialOption
}

// Server is a running gRPC server and a client connection to it.
type Server struct {
	// Addr is the server's host:port on 127.0.0.1.
	Addr string
	// Conn is a client connection to Addr, made with Options.DialOptions.
	// It connects at the first call, so a test that dials its own (with
	// TLS, say) uses Addr and leaves Conn unused.
	Conn *grpc.ClientConn

	graceful func()
}

// Start serves what opts says on a free loopback port until the test ends
// (then it closes the connection and stops the server, ending calls still
// in progress). It fails the test if it cannot.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("servertest: listen: %v", err)
	}
	gs := grpc.NewServer(opts.ServerOptions...)
	if opts.RateLimit != nil {
		rlsv3.RegisterRateLimitServiceServer(gs, opts.RateLimit)
	}
	if opts.Register != nil {
		opts.Register(gs)
	}
	go gs.Serve(lis)
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts.DialOptions...)
	conn, err := grpc.NewClient(lis.Addr().String(), dial...)
	if err != nil {
		gs.Stop()
		t.Fatalf("servertest: grpc.NewClient: %v", err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
	})
	return &Server{Addr: lis.Addr().String(), Conn: conn, graceful: sync.OnceFunc(func() {
		conn.Close()
		gs.GracefulStop()
	})}
}

// Client is a RateLimitService client on s.Conn.
func (s *Server) Client() rlsv3.RateLimitServiceClient {
	return rlsv3.NewRateLimitServiceClient(s.Conn)
}

// GracefulStop closes s.Conn (its calls in progress end on the client's
// side) and stops the server once every handler in progress has returned,
// with its interceptors: a span they record has ended by then. It may be
// called before the test ends, and more than once.
func (s *Server) GracefulStop() { s.graceful() }

// Dial returns a client connection to addr with insecure transport
// credentials and then opts (a later WithTransportCredentials replaces
// them), closed when the test ends. Like grpc.NewClient it connects at the
// first call; it fails the test only if addr or opts are malformed.
func Dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		t.Fatalf("servertest: dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
