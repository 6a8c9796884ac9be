// Package tlsreload serves TLS with a certificate, a key and optionally a
// client CA read from files, and re-reads them when they change, so that
// certificates can be rotated on disk without a restart.
//
// The files are read again at most once per check interval (default one
// second), on the handshake of a new connection: connections that are open
// keep the certificate they were made with. Files whose content is the same
// are not parsed again. A set of files that cannot be used (a key that does
// not match its certificate because only one of them has been replaced yet,
// a truncated PEM block, a certificate that has expired or is not valid
// yet) is reported once and the previous set stays in use; the next check
// tries again. A certificate that is not valid yet is taken once its time
// has come.
package tlsreload

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// DefaultCheckInterval is the default Options.CheckInterval.
const DefaultCheckInterval = time.Second

// Options configures a Reloader. CertFile and KeyFile are required; the
// zero value of every other field means its documented default.
type Options struct {
	// CertFile and KeyFile hold the server's PEM certificate chain and key.
	CertFile, KeyFile string
	// ClientCAFile, when set, holds the PEM certificates of the CAs that
	// sign client certificates: every client must then present a
	// certificate signed by one of them (mutual TLS). Empty means clients
	// are not asked for a certificate.
	ClientCAFile string
	// NextProtos are the ALPN protocols offered; default "h2" (gRPC).
	NextProtos []string
	// Now is the clock, for the check interval and for whether the
	// certificate is valid (between its NotBefore and NotAfter); default
	// time.Now.
	Now func() time.Time
	// CheckInterval is the least time between two reads of the files;
	// default DefaultCheckInterval (1 s).
	CheckInterval time.Duration
	// OnReload, when set, is called after changed files were loaded. It is
	// called during a handshake, so it must not block.
	OnReload func()
	// OnError, when set, is told why changed files could not be used (the
	// previous ones stay in use). It is called during a handshake, so it
	// must not block. A bad set of files is reported when it appears, not
	// again at each check while it stays (it is reported again if it comes
	// back after other files were read); a file that cannot be read is
	// reported once per error, until the files are read again.
	OnError func(error)
}

// Reloader holds the TLS configuration built from the files and rebuilds it
// when they change. It is safe for concurrent use.
type Reloader struct {
	opts Options

	mu       sync.Mutex
	checked  time.Time // when the files were last read
	good     files     // the files cfg was built from
	bad      *files    // the last files that could not be used, reported
	badRetry bool      // bad failed on the clock: build it again at each check
	readErr  string    // the last read error reported, until the files are read
	cfg      *tls.Config
}

// files is the content of the files at one time.
type files struct {
	cert, key, ca []byte
}

func (f files) equal(g files) bool {
	return bytes.Equal(f.cert, g.cert) && bytes.Equal(f.key, g.key) && bytes.Equal(f.ca, g.ca)
}

// New reads the files and returns a Reloader serving them; it fails if they
// cannot be read or used.
func New(opts Options) (*Reloader, error) {
	if opts.CertFile == "" || opts.KeyFile == "" {
		return nil, errors.New("tlsreload: both a certificate file and a key file are required")
	}
	if opts.NextProtos == nil {
		opts.NextProtos = []string{"h2"}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = DefaultCheckInterval
	}
	r := &Reloader{opts: opts}
	f, err := r.read()
	if err != nil {
		return nil, err
	}
	now := opts.Now()
	cfg, err := r.build(f, now)
	if err != nil {
		return nil, err
	}
	r.good, r.cfg, r.checked = f, cfg, now
	return r, nil
}

// ServerConfig returns the configuration to serve with (for gRPC,
// credentials.NewTLS(r.ServerConfig())). Each new connection gets the
// configuration built from the files as they were at the last check.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: r.opts.NextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.current(), nil
		},
	}
}

// current returns the configuration in use, after reading the files again
// if the check interval has passed (or the clock went back).
func (r *Reloader) current() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opts.Now()
	if now.Sub(r.checked) < r.opts.CheckInterval && !now.Before(r.checked) {
		return r.cfg
	}
	r.checked = now
	f, err := r.read()
	if err != nil {
		// No content to tell one failure from the next: the message does.
		if msg := err.Error(); msg != r.readErr {
			r.readErr = msg
			r.report(err)
		}
		return r.cfg
	}
	r.readErr = ""
	if f.equal(r.good) {
		// A good set read: a bad one coming back is news again.
		r.bad, r.badRetry = nil, false
		return r.cfg
	}
	seen := r.bad != nil && f.equal(*r.bad)
	if seen && !r.badRetry {
		return r.cfg
	}
	cfg, err := r.build(f, now)
	if err == nil {
		r.good, r.bad, r.badRetry, r.cfg = f, nil, false, cfg
		if r.opts.OnReload != nil {
			r.opts.OnReload()
		}
		return r.cfg
	}
	var ve *validityError
	r.bad, r.badRetry = &f, errors.As(err, &ve)
	if !seen {
		r.report(err)
	}
	return r.cfg
}

// report tells OnError, if set, about err.
func (r *Reloader) report(err error) {
	if r.opts.OnError != nil {
		r.opts.OnError(err)
	}
}

// read reads the files.
func (r *Reloader) read() (files, error) {
	var f files
	var err error
	if f.cert, err = os.ReadFile(r.opts.CertFile); err != nil {
		return files{}, fmt.Errorf("tls certificate: %w", err)
	}
	if f.key, err = os.ReadFile(r.opts.KeyFile); err != nil {
		return files{}, fmt.Errorf("tls key: %w", err)
	}
	if r.opts.ClientCAFile != "" {
		if f.ca, err = os.ReadFile(r.opts.ClientCAFile); err != nil {
			return files{}, fmt.Errorf("tls client CA: %w", err)
		}
	}
	return f, nil
}

// build makes the configuration for the files' content, if the certificate
// is valid at now.
func (r *Reloader) build(f files, now time.Time) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, fmt.Errorf("tls certificate %s and key %s: %w", r.opts.CertFile, r.opts.KeyFile, err)
	}
	leaf := cert.Leaf
	if leaf == nil { // GODEBUG x509keypairleaf=0
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("tls certificate %s: %w", r.opts.CertFile, err)
		}
	}
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return nil, &validityError{file: r.opts.CertFile, notBefore: leaf.NotBefore, notAfter: leaf.NotAfter, now: now}
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   r.opts.NextProtos,
		Certificates: []tls.Certificate{cert},
	}
	if r.opts.ClientCAFile != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(f.ca) {
			return nil, fmt.Errorf("tls client CA %s: no PEM certificate found", r.opts.ClientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// validityError is a certificate read outside its validity period. Unlike
// the other errors of a set of files it can pass with time alone (a
// certificate issued to start a little ahead, or a clock that was wrong).
type validityError struct {
	file                     string
	notBefore, notAfter, now time.Time
}

func (e *validityError) Error() string {
	state := "has expired"
	if e.now.Before(e.notBefore) {
		state = "is not valid yet"
	}
	return fmt.Sprintf("tls certificate %s %s: valid from %s to %s, and it is %s", e.file, state,
		e.notBefore.UTC().Format(time.RFC3339), e.notAfter.UTC().Format(time.RFC3339), e.now.UTC().Format(time.RFC3339))
}
