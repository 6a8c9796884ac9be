// Package xdsconfig takes ratelimitd's descriptor config from an xDS
// management server, as envoyproxy/ratelimit does with CONFIG_TYPE
// GRPC_XDS_SOTW: a State-of-the-World ADS stream of RateLimitConfig
// resources (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig),
// one per domain, subscribed to by wildcard. Each push is converted to
// descriptor files, validated by config.Parse and applied as a whole, then
// ACKed; a push that fails validation is NACKed with the loader's message
// and changes nothing.
package xdsconfig

import "time"

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
	// in the server's certificate. The files are re-read when they change.
	TLS *TLSFiles
	// Headers are extra gRPC metadata sent on the stream.
	Headers map[string]string
	// ConnectRetryInterval is the first wait between attempts to connect;
	// MaxBackoff the longest. Defaults DefaultConnectRetryInterval and
	// DefaultMaxBackoff.
	ConnectRetryInterval, MaxBackoff time.Duration
	// MaxMessageBytes bounds a DiscoveryResponse; default
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
}

// TLSFiles name the PEM files of the client's TLS.
type TLSFiles struct {
	CAFile, CertFile, KeyFile string
	ServerName                string
}

// Enabled reports whether o names a management server.
func (o Options) Enabled() bool { return o.Addr != "" }
