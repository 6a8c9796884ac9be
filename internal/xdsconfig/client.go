package xdsconfig

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/tlsreload"
)

// TypeURL is the type of the resources the client subscribes to
// (go-control-plane's resource.RateLimitConfigType).
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// maxNACKBytes bounds the error_detail message of a NACK. config.Parse
// already reports at most 100 problems; this keeps long values in them
// from making a NACK of megabytes.
const maxNACKBytes = 64 << 10

// Status is what the client has done so far.
type Status struct {
	// Version is the version_info of the config last applied; "" before
	// the first.
	Version string
	// Connected is true while a stream to the management server is open.
	Connected bool
	// Applied is true once a config has been applied; it stays true while
	// disconnected (the last good config stays in use).
	Applied bool
	// LastError is why the last connection attempt or stream failed; ""
	// while connected.
	LastError string
	// LastNACK is the error_detail of the latest push if it was refused;
	// "" before any refusal and again once a later push is applied.
	LastNACK string
	// Updated is when Version was applied (the zero time before).
	Updated time.Time
	// NACKs counts the pushes refused, a push sent again after its NACK
	// included.
	NACKs uint64
	// Refused lists, sorted by domain, the domains of the latest push
	// applied that could not be loaded (the rest of it was); nil when
	// every domain loaded.
	Refused []Refusal
	// Refusals counts the domains refused, each content of a domain once
	// (the same resources pushed again do not count again).
	Refusals uint64
}

// Client keeps ratelimitd's descriptor config in step with an xDS
// management server: it holds one ADS stream open, converts each push of
// RateLimitConfig resources to descriptor files (see File), checks them
// with config.Parse and hands the Set to apply before it ACKs.
//
// One bad resource never freezes the others: a domain whose resources
// cannot be converted or loaded is refused on its own, the rest of the
// push is applied and ACKed, and the refused domain keeps the last config
// of it that loaded (none if it never did: config.Set.Refused then says
// so). Each refusal is logged once at warning level (the same content
// pushed again only at debug level), counted, and listed in
// Status.Refused. A push that cannot be used at all (a resource of
// another type or that does not decode, so that its domain is unknown, or
// a push over Options.Limits' total size) is NACKed with the reason and
// changes nothing. When the stream breaks or cannot be opened, the client
// waits (see Options.ConnectRetryInterval) and dials again; the last
// applied config stays in use, and apply is never called because of a
// disconnect. Run serves; Status is safe to call from any goroutine.
type Client struct {
	opts  Options
	apply func(*config.Set, string)
	log   *slog.Logger
	node  *corev3.Node
	md    metadata.MD

	// session runs one connection until it breaks and reports whether
	// the server sent anything; Run's retry loop is tested with another.
	session func(ctx context.Context) (responded bool, err error)
	// random draws the jitter of the waits, in [0, 1).
	random func() float64

	// Used by the goroutine of Run only.
	acked       string // version_info of the last ACK
	appliedHash string // config.Set.Hash and refusals of the last config applied
	nacked      string // pushKey of the last push NACKed, "" after an ACK
	// good are the files in force per domain (FileName), for a domain
	// refused later to keep; refused are the refusals of the last push
	// applied, by domain key, with the content refused.
	good        map[string][]config.File
	refused     map[string]refusalState
	nackRepeats int         // NACKs of that same push since, for their wait
	lastTLS     *tls.Config // the last TLS configuration read from the files
	errLog      repeatLog

	running atomic.Bool
	mu      sync.Mutex
	st      Status
}

// refusalState is a domain refused: the content refused and since when.
type refusalState struct {
	sum   string
	since time.Time
}

// New checks opts and returns a client that calls apply with every config
// the server pushes that is valid, with the push's version_info; apply is
// called from the goroutine of Run, one call at a time, before the push
// is ACKed, and must not block for long (it holds up the stream). log
// receives connection events and refusals (nil: discard).
//
// New fails on options that cannot work: no Addr, negative durations or
// sizes, a header name gRPC does not accept, a client certificate without
// its key, TLS files that cannot be read now.
func New(opts Options, apply func(set *config.Set, version string), log *slog.Logger) (*Client, error) {
	if opts.Addr == "" {
		return nil, errors.New("xdsconfig: no management server address (Options.Addr)")
	}
	if apply == nil {
		return nil, errors.New("xdsconfig: apply is nil")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.NodeID == "" {
		opts.NodeID = DefaultNodeID
	}
	if opts.ConnectRetryInterval < 0 || opts.MaxBackoff < 0 || opts.MaxMessageBytes < 0 {
		return nil, fmt.Errorf("xdsconfig: negative ConnectRetryInterval (%v), MaxBackoff (%v) or MaxMessageBytes (%d)",
			opts.ConnectRetryInterval, opts.MaxBackoff, opts.MaxMessageBytes)
	}
	if opts.ConnectRetryInterval == 0 {
		opts.ConnectRetryInterval = DefaultConnectRetryInterval
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = max(DefaultMaxBackoff, opts.ConnectRetryInterval)
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.ConnectRetryInterval)
	if opts.MaxMessageBytes == 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	c := &Client{opts: opts, apply: apply, log: log, random: rand.Float64}
	for k, v := range opts.Headers {
		if err := checkHeader(k, v); err != nil {
			return nil, fmt.Errorf("xdsconfig: header %q: %w", k, err)
		}
	}
	if len(opts.Headers) > 0 {
		c.md = metadata.New(opts.Headers)
	}
	fields := make(map[string]*structpb.Value, len(opts.NodeMetadata))
	for k, v := range opts.NodeMetadata {
		fields[k] = structpb.NewStringValue(v)
	}
	c.node = &corev3.Node{Id: opts.NodeID, Metadata: &structpb.Struct{Fields: fields}, UserAgentName: "ratelimitd"}
	if t := opts.TLS; t != nil {
		if (t.CertFile == "") != (t.KeyFile == "") {
			return nil, errors.New("xdsconfig: TLS.CertFile and TLS.KeyFile go together (the client certificate and its key)")
		}
		if _, err := c.transport(); err != nil {
			return nil, fmt.Errorf("xdsconfig: %w", err)
		}
	}
	c.session = c.connect
	return c, nil
}

// checkHeader refuses what gRPC would refuse on every stream: names that
// are empty, reserved ("grpc-…", pseudo-headers) or not lower-case-able
// header tokens, and values with control characters.
func checkHeader(k, v string) error {
	name := strings.ToLower(k)
	switch {
	case name == "":
		return errors.New("empty name")
	case strings.HasPrefix(name, "grpc-") || strings.HasPrefix(name, ":"):
		return errors.New("reserved name")
	case strings.HasSuffix(name, "-bin"):
		return errors.New("binary headers are not supported")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("name has %q (want letters, digits, '-', '_' or '.')", c)
		}
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return errors.New("value has a control character")
		}
	}
	return nil
}

// Status returns what the client has done so far.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

// Run connects to the management server and keeps the config up to date
// until ctx is done, then returns nil. Connection failures are not errors
// of Run: it logs them, records them in Status and tries again, after a
// wait that starts at Options.ConnectRetryInterval and doubles, with
// jitter, up to Options.MaxBackoff; the wait starts over after a stream
// on which the server sent a response. Run may be called once at a time:
// a second call while one runs returns an error at once.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("xdsconfig: Run is already running")
	}
	defer c.running.Store(false)
	failures := 0
	for {
		responded, err := c.session(ctx)
		if err != nil && !responded && c.opts.TLS != nil {
			err = c.explain(ctx, err)
		}
		c.mu.Lock()
		c.st.Connected = false
		if ctx.Err() == nil && err != nil {
			c.st.LastError = err.Error()
		}
		c.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if responded {
			failures = 0
		}
		wait := retryWait(c.opts.ConnectRetryInterval, c.opts.MaxBackoff, failures, c.random())
		failures++
		c.errLog.report(c.log, err, wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// connect runs one connection: dial, open the stream, subscribe, answer
// every push, until the stream breaks or ctx is done.
func (c *Client) connect(ctx context.Context) (responded bool, err error) {
	creds, err := c.transport()
	if err != nil {
		return false, err
	}
	conn, err := grpc.NewClient(c.opts.Addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.opts.MaxMessageBytes)),
		grpc.WithUserAgent("ratelimitd-xds"),
	)
	if err != nil {
		return false, fmt.Errorf("xDS server %s: %w", c.opts.Addr, err)
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if c.md != nil {
		sctx = metadata.NewOutgoingContext(sctx, c.md)
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return false, fmt.Errorf("xDS server %s: open stream: %w", c.opts.Addr, err)
	}
	c.mu.Lock()
	c.st.Connected, c.st.LastError = true, ""
	c.mu.Unlock()
	c.errLog.connected(c.log, c.opts.Addr)
	return c.serve(sctx, stream)
}

// adsStream is the client side of an ADS stream.
type adsStream interface {
	Send(*discoveryv3.DiscoveryRequest) error
	Recv() (*discoveryv3.DiscoveryResponse, error)
}

// serve subscribes on an open stream and answers every push until the
// stream breaks or ctx is done.
//
// go-control-plane's snapshot cache answers a NACK by sending the refused
// snapshot again at once (envoyproxy/go-control-plane#962), which would
// make a loop as fast as the two can parse. So when a push is the very
// push refused last (same version, same bytes), its NACK is sent after a
// wait that grows like the reconnect backoff, from ConnectRetryInterval
// to MaxBackoff. The server cannot push a corrected snapshot before it
// has the answer, so a correction reaches the client at most one such
// wait late.
func (c *Client) serve(ctx context.Context, stream adsStream) (responded bool, err error) {
	if err := stream.Send(c.request("", nil)); err != nil {
		return false, fmt.Errorf("xDS server %s: subscribe: %w", c.opts.Addr, err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return responded, fmt.Errorf("xDS server %s: stream: %w", c.opts.Addr, err)
		}
		responded = true
		req, again := c.handle(resp)
		if again {
			wait := retryWait(c.opts.ConnectRetryInterval, c.opts.MaxBackoff, c.nackRepeats, c.random())
			c.nackRepeats++
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return responded, ctx.Err()
			case <-t.C:
			}
		}
		if err := stream.Send(req); err != nil {
			return responded, fmt.Errorf("xDS server %s: answer version %q: %w", c.opts.Addr, resp.GetVersionInfo(), err)
		}
	}
}

// transport returns the credentials of the next connection. The TLS files
// are read again for every connection, so that rotated certificates are
// used from the next one on; files that cannot be used (half-written
// during a rotation) leave the previous ones in use, with a warning.
func (c *Client) transport() (credentials.TransportCredentials, error) {
	t := c.opts.TLS
	if t == nil {
		return insecure.NewCredentials(), nil
	}
	cfg, err := tlsreload.ClientConfig("xds-tls", t.CAFile, t.CertFile, t.KeyFile)
	if err != nil {
		if c.lastTLS == nil {
			return nil, err
		}
		c.log.Warn("xDS TLS files cannot be used; keeping the previous ones", "err", err)
		cfg = c.lastTLS
	}
	cfg.ServerName = t.ServerName
	c.lastTLS = cfg
	return credentials.NewTLS(cfg.Clone()), nil
}

// request is the DiscoveryRequest that answers the response of nonce
// (none for the first request of a stream): an ACK when detail is nil,
// else a NACK. version_info is always the last version ACKed, as the xDS
// protocol asks.
func (c *Client) request(nonce string, detail *status.Status) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{
		VersionInfo:   c.acked,
		Node:          c.node,
		TypeUrl:       TypeURL,
		ResponseNonce: nonce,
		ErrorDetail:   detail,
	}
}

// handle applies one push and returns its ACK or NACK, and whether it is
// a NACK of the same push as the NACK before.
func (c *Client) handle(resp *discoveryv3.DiscoveryResponse) (answer *discoveryv3.DiscoveryRequest, again bool) {
	version := resp.GetVersionInfo()
	ld, err := c.parse(resp)
	if err != nil {
		msg := nackMessage(err)
		key := pushKey(resp)
		again = key == c.nacked
		c.nacked = key
		if again {
			c.log.Debug("xDS config refused again (NACK)", "version", version)
		} else {
			c.nackRepeats = 0
			c.log.Warn("xDS config refused (NACK); the previous config stays in use",
				"version", version, "err", msg)
		}
		c.mu.Lock()
		c.st.LastNACK = msg
		c.st.NACKs++
		c.mu.Unlock()
		if c.opts.OnRefused != nil && !again {
			c.opts.OnRefused(err)
		}
		return c.request(resp.GetNonce(), &status.Status{Code: int32(codes.InvalidArgument), Message: msg}), again
	}
	c.nacked, c.nackRepeats = "", 0
	set := ld.set
	refusals := c.noteRefusals(version, ld.refused)
	applied := set.Hash()
	for _, r := range refusals {
		// What calls for a refused domain are answered depends on these.
		applied += fmt.Sprintf("\x00%q %v %q", r.Domain, r.Kept, r.Reason)
	}
	c.mu.Lock()
	same := c.st.Applied && c.st.Version == version && c.appliedHash == applied
	c.mu.Unlock()
	if !same {
		c.apply(set, version)
		c.log.Info("xDS config applied", "version", version, "domains", len(set.Domains()), "refused", len(refusals))
	}
	c.appliedHash = applied
	c.good = ld.good
	c.acked = version
	c.mu.Lock()
	if !same {
		c.st.Version, c.st.Applied, c.st.Updated = version, true, time.Now()
	}
	c.st.Refused = refusals
	c.st.LastNACK = ""
	c.mu.Unlock()
	return c.request(resp.GetNonce(), nil), false
}

// noteRefusals records the domains a push applied refused: each logged at
// warning level and counted when its content is refused for the first
// time, at debug level when the same content comes again; a domain that
// loads again is logged once. It returns them for Status.
func (c *Client) noteRefusals(version string, refused []refusedGroup) []Refusal {
	now := time.Now()
	next := make(map[string]refusalState, len(refused))
	var out []Refusal
	for _, r := range refused {
		st, seen := c.refused[r.g.key]
		if !seen || st.sum != r.g.sum {
			st = refusalState{sum: r.g.sum, since: now}
			c.mu.Lock()
			c.st.Refusals++
			c.mu.Unlock()
			c.log.Warn("xDS resource refused; the rest of the push is applied", "domain", r.g.name(), "version", version,
				"kept_previous", r.kept, "err", r.reason)
			if c.opts.OnRefused != nil {
				c.opts.OnRefused(fmt.Errorf("domain %s: %s", r.g.name(), r.reason))
			}
		} else {
			c.log.Debug("xDS resource refused again", "domain", r.g.name(), "version", version, "kept_previous", r.kept)
		}
		next[r.g.key] = st
		out = append(out, Refusal{Domain: r.g.name(), Reason: r.reason, Kept: r.kept, Since: st.since})
	}
	for key := range c.refused {
		if _, still := next[key]; !still {
			c.log.Info("xDS resource no longer refused", "domain", strings.TrimPrefix(key, "xds:"), "version", version)
		}
	}
	c.refused = next
	return out
}

// nackMessage is err as a NACK's error_detail: valid UTF-8 (a proto3
// string must be), cut on a character boundary at maxNACKBytes.
func nackMessage(err error) string {
	msg := strings.ToValidUTF8(err.Error(), "\uFFFD")
	if len(msg) <= maxNACKBytes {
		return msg
	}
	cut := maxNACKBytes
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

// pushKey identifies a push by its type and its resources, whatever
// their order: go-control-plane builds each response from a map, so the
// same snapshot sent again comes reordered. A resource that decodes is
// taken as its deterministic encoding (as contentSum does), one that does
// not as its type and bytes. The version is left out: the same resources
// under another version are the same push, refused for the same reason.
func pushKey(resp *discoveryv3.DiscoveryResponse) string {
	parts := make([][]byte, 0, len(resp.GetResources())+1)
	for _, a := range resp.GetResources() {
		rc := new(rlsconfv3.RateLimitConfig)
		if a.GetTypeUrl() == TypeURL && proto.Unmarshal(a.GetValue(), rc) == nil {
			if b, err := (proto.MarshalOptions{Deterministic: true}).Marshal(rc); err == nil {
				parts = append(parts, append([]byte("r"), b...))
				continue
			}
		}
		raw := append([]byte("x"), a.GetTypeUrl()...)
		raw = binary.AppendUvarint(raw, uint64(len(a.GetValue())))
		parts = append(parts, append(raw, a.GetValue()...))
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(resp.GetTypeUrl())))])
	h.Write([]byte(resp.GetTypeUrl()))
	return sumParts(h, parts)
}

// parse converts a push and loads it (see load): every resource must be
// a RateLimitConfig that decodes, else the push is refused as a whole.
func (c *Client) parse(resp *discoveryv3.DiscoveryResponse) (domainLoad, error) {
	if resp.GetTypeUrl() != TypeURL {
		return domainLoad{}, fmt.Errorf("response of type %s, subscribed to %s only", resp.GetTypeUrl(), TypeURL)
	}
	rcs := make([]*rlsconfv3.RateLimitConfig, 0, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		if a.GetTypeUrl() != TypeURL {
			return domainLoad{}, fmt.Errorf("resource %d: type %s, want %s", i, a.GetTypeUrl(), TypeURL)
		}
		rc := new(rlsconfv3.RateLimitConfig)
		if err := proto.Unmarshal(a.GetValue(), rc); err != nil {
			return domainLoad{}, fmt.Errorf("resource %d: decode RateLimitConfig: %w", i, err)
		}
		rcs = append(rcs, rc)
	}
	ld, err := load(rcs, c.good, c.opts.Limits)
	if (err != nil || len(ld.refused) > 0) && c.log.Enabled(context.Background(), slog.LevelDebug) {
		for _, rc := range rcs {
			if f, ferr := File(rc); ferr == nil {
				c.log.Debug("xDS resource as descriptor YAML", "file", FileName(rc), "yaml", string(f.Data))
			}
		}
	}
	return ld, err
}

// repeatLog logs connection failures at warning level when they change or
// once a minute, and the same failure in between at debug level only, so
// that a server that is down for an hour does not fill the log.
type repeatLog struct {
	last       string
	at         time.Time
	suppressed int
}

const repeatEvery = time.Minute

func (r *repeatLog) report(log *slog.Logger, err error, wait time.Duration) {
	msg := "stream ended"
	if err != nil {
		msg = err.Error()
	}
	now := time.Now()
	if key := withoutDigits(msg); key == r.last && now.Sub(r.at) < repeatEvery {
		r.suppressed++
		log.Debug("xDS connection failed again", "err", msg, "retry_in", wait)
		return
	}
	log.Warn("xDS connection failed; the last config stays in use", "err", msg, "retry_in", wait,
		"repeats_not_logged", r.suppressed)
	r.last, r.at, r.suppressed = withoutDigits(msg), now, 0
}

// withoutDigits is msg with each run of digits replaced by "#", so that
// failures that differ only in an ephemeral port or a byte count count as
// the same failure.
func withoutDigits(msg string) string {
	var b strings.Builder
	digits := false
	for _, r := range msg {
		if '0' <= r && r <= '9' {
			if !digits {
				b.WriteByte('#')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
	}
	return b.String()
}

// connected logs a stream that opened and forgets the last failure.
func (r *repeatLog) connected(log *slog.Logger, addr string) {
	log.Info("xDS stream open", "addr", addr)
	r.last, r.suppressed = "", 0
}
