package xdsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// probeTimeout bounds the TLS probe of a failed connection.
const probeTimeout = 3 * time.Second

// probeTLS finds out why a TLS connection that gRPC reported only as
// "broken pipe" or "EOF" failed. In TLS 1.3 the client finishes its side
// of the handshake before the server has checked the client certificate,
// so a server that refuses the certificate (EG requires one signed by its
// CA) tells it with an alert that gRPC does not surface. The probe makes
// one handshake with the same configuration and reads: a server that
// accepted the certificate speaks HTTP/2 first (its SETTINGS frame), one
// that refused it sends the alert, which is returned ("remote error: tls:
// certificate required"). nil means the probe saw nothing wrong.
func probeTLS(ctx context.Context, addr string, cfg *tls.Config) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	if cfg.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	d := tls.Dialer{Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	var opErr *net.OpError
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return nil // not a TLS problem; the connection error says it
	case err != nil:
		return err // the handshake failed
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := conn.SetReadDeadline(deadline); err != nil {
		return nil
	}
	var b [1]byte
	_, err = conn.Read(b[:])
	var alert tls.AlertError
	var netErr net.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &alert), isRemoteTLSError(err):
		return err
	case errors.As(err, &netErr) && netErr.Timeout():
		return nil
	}
	return nil
}

// isRemoteTLSError reports an alert from the peer, which crypto/tls
// returns as an unexported type whose message starts "remote error: tls:".
func isRemoteTLSError(err error) bool {
	const prefix = "remote error: tls:"
	return strings.HasPrefix(err.Error(), prefix)
}

// explain adds to err what probeTLS found, if anything.
func (c *Client) explain(ctx context.Context, err error) error {
	if msg := err.Error(); c.lastTLS == nil || ctx.Err() != nil || strings.Contains(msg, "tls:") || strings.Contains(msg, "x509:") {
		return err
	}
	if perr := probeTLS(ctx, c.opts.Addr, c.lastTLS); perr != nil {
		return fmt.Errorf("%w (TLS: %v)", err, perr)
	}
	return err
}
