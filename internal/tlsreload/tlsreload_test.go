package tlsreload_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/internal/tlsreload"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

// authority is a CA made for one test, whose certificates the tests
// write themselves.
type authority struct{ *xdstest.CA }

func newAuthority(t *testing.T, name string) authority {
	t.Helper()
	return authority{xdstest.NewCA(t, t.TempDir(), name)}
}

// issue returns a PEM certificate and key for name signed by a: a server
// certificate for 127.0.0.1 (and xdstest's names), or a client
// certificate, valid from an hour ago to an hour from now.
func (a authority) issue(t *testing.T, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	return a.IssuePEM(t, name, server, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
}

// setup holds a server's files and a running gRPC server that uses them.
type setup struct {
	dir              string
	cert, key, ca    string
	addr             string
	clock            *clocktest.Clock
	reloader         *tlsreload.Reloader
	mu               sync.Mutex
	reloads          int
	errs             []error
	serverCA, client authority
}

func (s *setup) write(t *testing.T, name string, data []byte) {
	t.Helper()
	// Written by rename, as tools and Kubernetes Secrets do.
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
}

// start writes a server certificate (CN serverName), a client CA unless
// mtls is false, and runs a gRPC health server with a Reloader on them.
func start(t *testing.T, mtls bool) *setup {
	t.Helper()
	dir := t.TempDir()
	s := &setup{
		dir: dir, cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"),
		clock:    clocktest.New(),
		serverCA: newAuthority(t, "server CA"), client: newAuthority(t, "client CA"),
	}
	// The clock starts at the real time, which the certificates are issued
	// for and the clients check them against.
	s.clock.Set(time.Now())
	certPEM, keyPEM := s.serverCA.issue(t, "server-1", true)
	s.write(t, s.cert, certPEM)
	s.write(t, s.key, keyPEM)
	opts := tlsreload.Options{
		CertFile: s.cert, KeyFile: s.key, Now: s.clock.Now,
		OnReload: func() { s.mu.Lock(); s.reloads++; s.mu.Unlock() },
		OnError:  func(err error) { s.mu.Lock(); s.errs = append(s.errs, err); s.mu.Unlock() },
	}
	if mtls {
		s.ca = filepath.Join(dir, "client-ca.crt")
		s.write(t, s.ca, s.client.PEM)
		opts.ClientCAFile = s.ca
	}
	r, err := tlsreload.New(opts)
	if err != nil {
		t.Fatalf("tlsreload.New: %v", err)
	}
	s.reloader = r
	s.addr = servertest.Start(t, servertest.Options{
		Register:      func(gs *grpc.Server) { healthpb.RegisterHealthServer(gs, health.NewServer()) },
		ServerOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(r.ServerConfig()))},
	}).Addr
	return s
}

// call makes a new connection (so a new handshake) and a health check on
// it, presenting clientCert if not nil; it returns the server
// certificate's common name.
func (s *setup) call(t *testing.T, clientCert *tls.Certificate) (string, error) {
	t.Helper()
	cfg := &tls.Config{RootCAs: s.serverCA.Pool(), MinVersion: tls.VersionTLS12}
	if clientCert != nil {
		cfg.Certificates = []tls.Certificate{*clientCert}
	}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return "", err
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		t.Fatalf("peer %v: no TLS certificate", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].Subject.CommonName, nil
}

// clientCert issues a client certificate for name, ready to present.
func (a authority) clientCert(t *testing.T, name string) *tls.Certificate {
	t.Helper()
	certPEM, keyPEM := a.issue(t, name, false)
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// TestWhoMayConnect checks who gets an answer from a server with and
// without a client CA.
func TestWhoMayConnect(t *testing.T) {
	mtls, plain := start(t, true), start(t, false)
	other := newAuthority(t, "another CA")
	tests := []struct {
		name   string
		server *setup
		client func() *tls.Certificate
		ok     bool
	}{
		{"mTLS: certificate from the client CA", mtls, func() *tls.Certificate { return mtls.client.clientCert(t, "envoy") }, true},
		{"mTLS: no certificate", mtls, func() *tls.Certificate { return nil }, false},
		{"mTLS: certificate from another CA", mtls, func() *tls.Certificate { return other.clientCert(t, "envoy") }, false},
		{"mTLS: the server's own certificate (another CA)", mtls, func() *tls.Certificate { return mtls.serverCA.clientCert(t, "envoy") }, false},
		{"TLS only: no certificate", plain, func() *tls.Certificate { return nil }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cn, err := tt.server.call(t, tt.client())
			if tt.ok && (err != nil || cn != "server-1") {
				t.Errorf("call = %q, %v; want an answer from server-1", cn, err)
			}
			if !tt.ok && err == nil {
				t.Errorf("call succeeded; want it refused")
			}
		})
	}
}

// TestRotation replaces the server certificate and the client CA on disk
// and checks that new connections see them once the check interval has
// passed, and that a broken rotation keeps the previous files in use.
func TestRotation(t *testing.T) {
	s := start(t, true)
	client := s.client.clientCert(t, "envoy")
	mustSee := func(step, want string, cert *tls.Certificate) {
		t.Helper()
		cn, err := s.call(t, cert)
		if err != nil || cn != want {
			t.Fatalf("%s: call = %q, %v; want server %q", step, cn, err, want)
		}
	}
	mustSee("before rotation", "server-1", client)

	certPEM, keyPEM := s.serverCA.issue(t, "server-2", true)
	s.write(t, s.cert, certPEM)
	s.write(t, s.key, keyPEM)
	s.clock.Advance(500 * time.Millisecond)
	mustSee("rotated, within the check interval", "server-1", client)
	s.clock.Advance(500 * time.Millisecond)
	mustSee("rotated, check interval passed", "server-2", client)

	// Only the certificate replaced (its key not yet): keep server-2.
	cert3, key3 := s.serverCA.issue(t, "server-3", true)
	s.write(t, s.cert, cert3)
	s.clock.Advance(time.Second)
	mustSee("certificate without its key", "server-2", client)
	s.clock.Advance(time.Second)
	mustSee("certificate without its key, again", "server-2", client)
	s.mu.Lock()
	if len(s.errs) != 1 || !strings.Contains(s.errs[0].Error(), "private key does not match") {
		t.Errorf("OnError got %v, want one key mismatch", s.errs)
	}
	s.mu.Unlock()
	s.write(t, s.key, key3)
	s.clock.Advance(time.Second)
	mustSee("key written too", "server-3", client)

	// A new client CA: its clients get in, the old CA's no longer do.
	ca2 := newAuthority(t, "client CA 2")
	s.write(t, s.ca, ca2.PEM)
	s.clock.Advance(time.Second)
	mustSee("new client CA", "server-3", ca2.clientCert(t, "envoy"))
	if _, err := s.call(t, client); err == nil {
		t.Error("client of the old CA still accepted after the CA rotation")
	}
	s.mu.Lock()
	if s.reloads != 3 {
		t.Errorf("OnReload called %d times, want 3", s.reloads)
	}
	s.mu.Unlock()
}

func TestNewRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	ca := newAuthority(t, "ca")
	certPEM, keyPEM := ca.issue(t, "server", true)
	_, otherKey := ca.issue(t, "other", true)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key, wrongKey := write("c.pem", certPEM), write("k.pem", keyPEM), write("k2.pem", otherKey)
	expiredPEM, expiredKeyPEM := ca.IssuePEM(t, "old", true, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
	expired, expiredKey := write("expired.pem", expiredPEM), write("expired-key.pem", expiredKeyPEM)
	futurePEM, futureKeyPEM := ca.IssuePEM(t, "new", true, time.Now().Add(time.Hour), time.Now().Add(2*time.Hour))
	future, futureKey := write("future.pem", futurePEM), write("future-key.pem", futureKeyPEM)
	notPEM := write("ca.pem", []byte("not a certificate"))
	tests := []struct {
		name string
		opts tlsreload.Options
		want string
	}{
		{"no key", tlsreload.Options{CertFile: cert}, "both a certificate file and a key file"},
		{"missing cert", tlsreload.Options{CertFile: filepath.Join(dir, "none"), KeyFile: key}, "no such file"},
		{"key of another certificate", tlsreload.Options{CertFile: cert, KeyFile: wrongKey}, "private key does not match"},
		{"client CA not PEM", tlsreload.Options{CertFile: cert, KeyFile: key, ClientCAFile: notPEM}, "no PEM certificate"},
		{"missing client CA", tlsreload.Options{CertFile: cert, KeyFile: key, ClientCAFile: filepath.Join(dir, "none")}, "client CA"},
		{"expired certificate", tlsreload.Options{CertFile: expired, KeyFile: expiredKey}, "has expired"},
		{"certificate not valid yet", tlsreload.Options{CertFile: future, KeyFile: futureKey}, "is not valid yet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tlsreload.New(tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// served returns the common name of the certificate that a handshake now
// gets (after the Reloader's check, if one is due).
func (s *setup) served(t *testing.T) string {
	t.Helper()
	cfg, err := s.reloader.ServerConfig().GetConfigForClient(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatalf("GetConfigForClient: %v", err)
	}
	leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.Subject.CommonName
}

// counts returns how many times OnReload and OnError were called, and the
// last error.
func (s *setup) counts() (reloads, errs int, last error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) > 0 {
		last = s.errs[len(s.errs)-1]
	}
	return s.reloads, len(s.errs), last
}

// step is one change on disk, a second on the clock, and what the next
// handshake must find.
type step struct {
	name        string
	change      func()
	advance     time.Duration // default a second: one check
	wantCN      string
	wantReloads int
	wantErrs    int    // OnError calls so far
	wantErr     string // in the last error, if any
}

func (s *setup) walk(t *testing.T, steps []step) {
	t.Helper()
	for _, st := range steps {
		if st.change != nil {
			st.change()
		}
		if st.advance == 0 {
			st.advance = time.Second
		}
		s.clock.Advance(st.advance)
		cn := s.served(t)
		reloads, errs, last := s.counts()
		if cn != st.wantCN || reloads != st.wantReloads || errs != st.wantErrs {
			t.Fatalf("%s: serving %q after %d reloads and %d errors (last %v); want %q, %d, %d",
				st.name, cn, reloads, errs, last, st.wantCN, st.wantReloads, st.wantErrs)
		}
		if st.wantErr != "" && (last == nil || !strings.Contains(last.Error(), st.wantErr)) {
			t.Fatalf("%s: last error %v, want one containing %q", st.name, last, st.wantErr)
		}
	}
}

// TestEachBadSetReportedOnce: a bad set of files is reported when it
// appears, not again while it stays, and a different bad set is reported
// even when it fails with the same message, with or without a good set
// read in between; so is a file that cannot be read.
func TestEachBadSetReportedOnce(t *testing.T) {
	s := start(t, false)
	cert1, err := os.ReadFile(s.cert)
	if err != nil {
		t.Fatal(err)
	}
	key1, err := os.ReadFile(s.key)
	if err != nil {
		t.Fatal(err)
	}
	certOnly := func(name string) func() {
		return func() {
			c, _ := s.serverCA.issue(t, name, true)
			s.write(t, s.cert, c)
		}
	}
	const mismatch = "private key does not match"
	s.walk(t, []step{
		{name: "certificate 2 without its key", change: certOnly("server-2"), wantCN: "server-1", wantErrs: 1, wantErr: mismatch},
		{name: "certificate 2 without its key, next check", wantCN: "server-1", wantErrs: 1},
		{name: "certificate 1 back", change: func() { s.write(t, s.cert, cert1) }, wantCN: "server-1", wantErrs: 1},
		{name: "certificate 3 without its key, after a good set", change: certOnly("server-3"), wantCN: "server-1", wantErrs: 2, wantErr: mismatch},
		{name: "certificate 4 without its key, right after 3", change: certOnly("server-4"), wantCN: "server-1", wantErrs: 3, wantErr: mismatch},
		{name: "certificate 4, next check", wantCN: "server-1", wantErrs: 3},
		{name: "certificate 1 back again", change: func() { s.write(t, s.cert, cert1) }, wantCN: "server-1", wantErrs: 3},
		{name: "key removed", change: func() { os.Remove(s.key) }, wantCN: "server-1", wantErrs: 4, wantErr: "no such file"},
		{name: "key still missing", wantCN: "server-1", wantErrs: 4},
		{name: "key back", change: func() { s.write(t, s.key, key1) }, wantCN: "server-1", wantErrs: 4},
		{name: "key removed again, after a good set", change: func() { os.Remove(s.key) }, wantCN: "server-1", wantErrs: 5, wantErr: "no such file"},
	})
}

// TestCertificateOutsideItsValidity: a new certificate that has expired or
// is not valid yet, by the Reloader's clock, is reported once and the
// previous one stays in use; one that is not valid yet is taken once it is.
func TestCertificateOutsideItsValidity(t *testing.T) {
	tests := []struct {
		name                string
		notBefore, notAfter time.Duration // from the clock's time
		wantErr             string
		later               step // after the clock has moved on
	}{
		{"expired", -2 * time.Hour, -time.Second, "has expired",
			step{name: "an hour later", advance: time.Hour, wantCN: "server-1", wantErrs: 1}},
		{"not valid yet", time.Minute, 2 * time.Hour, "is not valid yet",
			step{name: "once valid", advance: time.Minute, wantCN: "server-2", wantReloads: 1, wantErrs: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := start(t, false)
			now := s.clock.Now().Add(time.Second) // at the next check
			s.walk(t, []step{
				{name: "rotated", change: func() {
					c, k := s.serverCA.IssuePEM(t, "server-2", true, now.Add(tt.notBefore), now.Add(tt.notAfter))
					s.write(t, s.cert, c)
					s.write(t, s.key, k)
				}, wantCN: "server-1", wantErrs: 1, wantErr: tt.wantErr},
				{name: "next check", wantCN: "server-1", wantErrs: 1},
				tt.later,
			})
		})
	}
}
