// Package xdsconfig takes ratelimitd's descriptor config from an xDS
// management server, as envoyproxy/ratelimit does with CONFIG_TYPE
// GRPC_XDS_SOTW: a State-of-the-World ADS stream of RateLimitConfig
// resources (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig),
// one per domain, subscribed to by wildcard. Each push is converted to
// descriptor files, validated by config.Parse and applied, then ACKed; a
// domain that fails validation is refused alone, keeping its last version
// that loaded, and reported (see Client); a push that cannot be used at
// all is NACKed with the reason and changes nothing. docs/xds.md is the
// operator's page.
package xdsconfig

import (
	"time"

	"github.com/ratelimitd/ratelimitd/config"
)

// Defaults of Options.
const (
	DefaultNodeID = "default"
	// DefaultConnectRetryInterval is the first wait before dialling again
	// after a failed dial or a broken stream; the waits grow (with jitter)
	// up to DefaultMaxBackoff.
	DefaultConnectRetryInterval = time.Second
	DefaultMaxBackoff           = 30 * time.Second
	// DefaultMaxMessageBytes bounds one DiscoveryResponse.
	DefaultMaxMessageBytes = 16 << 20
)

// Options configure a Client. Only Addr is required.
type Options struct {
	// Addr is the management server's address, host:port.
	Addr string
	// NodeID and NodeMetadata identify this process in every
	// DiscoveryRequest (the server's snapshot cache is keyed on the id);
	// NodeID defaults to DefaultNodeID.
	NodeID       string
	NodeMetadata map[string]string
	// TLS, when set, dials over TLS: CAFile verifies the server (the
	// system roots when empty), CertFile and KeyFile are the client
	// certificate for mutual TLS, ServerName overrides the name checked
	// in the server's certificate (default: the host of Addr). The files
	// are read again for every new connection, so rotated certificates
	// are used from the next one on. The client speaks TLS 1.2 or 1.3.
	TLS *TLSFiles
	// Headers are extra gRPC metadata sent on the stream. Names are
	// lower-cased; reserved names (grpc-…, pseudo-headers) and binary
	// (…-bin) headers are refused by New.
	Headers map[string]string
	// ConnectRetryInterval is the shortest wait between attempts to
	// connect, MaxBackoff the longest: after n failures in a row the wait
	// is drawn at random from [max(ConnectRetryInterval, h/2), h] with
	// h = min(MaxBackoff, ConnectRetryInterval·2^(n+1)), and n starts over
	// after a stream on which the server sent a response. Defaults
	// DefaultConnectRetryInterval and DefaultMaxBackoff; a MaxBackoff
	// below ConnectRetryInterval counts as ConnectRetryInterval.
	ConnectRetryInterval, MaxBackoff time.Duration
	// MaxMessageBytes bounds a DiscoveryResponse (gRPC's
	// MaxCallRecvMsgSize): a larger one breaks the stream, is not applied
	// and is retried after the backoff. Default DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Limits bounds the config a push converts to (config.LoadOptions:
	// MaxTotalBytes, default config.DefaultMaxTotalBytes): a larger one is
	// NACKed with an error naming its size and the cap.
	Limits config.LoadOptions
	// OnRefused, when set, is called with the reason of each push the
	// client NACKs (once for a push the server sends again unchanged),
	// from the goroutine of Run.
	OnRefused func(err error)
}

// TLSFiles name the PEM files of the client's TLS.
type TLSFiles struct {
	CAFile, CertFile, KeyFile string
	ServerName                string
}

// Enabled reports whether o names a management server.
func (o Options) Enabled() bool { return o.Addr != "" }
