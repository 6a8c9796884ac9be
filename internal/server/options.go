package server

import (
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// RetryAfter says whether OVER_LIMIT answers carry a Retry-After header.
// The zero value is invalid.
type RetryAfter int

const (
	// RetryAfterSend adds Retry-After (whole seconds, rounded up, at least 1)
	// and Cache-Control: no-store to OVER_LIMIT answers. Most deployed Envoys
	// do not emit Retry-After themselves.
	RetryAfterSend RetryAfter = iota + 1
	// RetryAfterOmit leaves Retry-After to Envoy (enable_retry_after_header).
	RetryAfterOmit
)

// RateLimitHeaders says which rate-limit headers the service adds itself,
// if any. The zero value is invalid.
type RateLimitHeaders int

const (
	// RateLimitHeadersOff leaves them to Envoy
	// (enable_x_ratelimit_headers), which picks the limit with the least
	// remaining, even if it is not the one that denied.
	RateLimitHeadersOff RateLimitHeaders = iota + 1
	// RateLimitHeadersDraft03 adds X-RateLimit-Limit, -Remaining and -Reset
	// (draft 03) computed from the limit that denied, or when admitted from
	// the one with the least remaining.
	RateLimitHeadersDraft03
	// RateLimitHeadersIETF adds RateLimit-Policy and RateLimit
	// (draft-ietf-httpapi-ratelimit-headers-11) of the same limit as
	// draft 03 picks, rate or concurrency alike (see ietf.go).
	RateLimitHeadersIETF
	// RateLimitHeadersIncumbent adds the three headers envoyproxy/ratelimit
	// adds with LIMIT_RESPONSE_HEADERS_ENABLED, named by
	// Options.RateLimitHeaderNames (RateLimit-Limit, -Remaining and -Reset
	// by default): the limit's count, its remaining and the seconds until
	// its reset (the status's duration_until_reset), of the same limit as
	// draft 03 picks.
	RateLimitHeadersIncumbent
)

// DefaultRateLimitHeaderNames are the names RateLimitHeadersIncumbent
// gives its headers by default: envoyproxy/ratelimit's defaults.
func DefaultRateLimitHeaderNames() HeaderNames {
	return HeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}
}

// HeaderNames name the headers of RateLimitHeadersIncumbent: each a valid
// HTTP header field name.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

// Validate reports the first name that is not an HTTP header field name.
func (n HeaderNames) Validate() error {
	for _, h := range []struct{ field, name string }{{"limit", n.Limit}, {"remaining", n.Remaining}, {"reset", n.Reset}} {
		if !httpguts.ValidHeaderFieldName(h.name) {
			return fmt.Errorf("the %s header's name %q is not an HTTP header name", h.field, h.name)
		}
	}
	return nil
}

// DynamicMetadata says which answers carry dynamic_metadata naming the
// rules involved (for Envoy's access logs). Envoy turns it into request
// metadata on every answer that carries it, which costs both sides a few
// microseconds per call. The zero value is invalid.
type DynamicMetadata int

const (
	// DynamicMetadataAll puts it on every answer in which a rule matched:
	// the rules that matched, and those that denied, would have denied
	// (shadow), were asked for more than their burst, waited or shed, and
	// quota-mode rules over their limit in an admitted answer.
	DynamicMetadataAll DynamicMetadata = iota + 1
	// DynamicMetadataNotable puts it only on answers where more happened
	// than a plain admission: a denial, a shadow denial, a request above
	// the burst, a wait, a full queue or a quota-mode rule over its limit.
	// It is the default: Envoy decodes the metadata of every answer that
	// carries it.
	DynamicMetadataNotable
	// DynamicMetadataOff never sends it.
	DynamicMetadataOff
)

// QuotaMode says which descriptors are quota-mode descriptors, as
// envoyproxy/ratelimit's QUOTA_MODE setting does. A request is denied when
// a descriptor that is not in quota mode is over its limit, or when every
// one of its quota-mode descriptors is; a quota-mode descriptor over its
// limit in an admitted request answers OVER_LIMIT in its own status. The
// zero value is invalid.
type QuotaMode int

const (
	// QuotaModePerRule: the descriptors whose rule sets quota_mode.
	QuotaModePerRule QuotaMode = iota + 1
	// QuotaModeAll: every descriptor but those of unlimited rules,
	// including those no rule matched (which pass), as the incumbent's
	// QUOTA_MODE=true does.
	QuotaModeAll
)

// DescriptorMetadata says what an answer's dynamic metadata carries of
// envoyproxy/ratelimit's own keys (beside the ratelimitd.* keys, which
// Options.DynamicMetadata governs). The zero value is invalid.
type DescriptorMetadata int

const (
	// DescriptorMetadataPassed puts the merged metadata of the
	// descriptors that passed under "metadata", on every answer where one
	// of them has metadata in the config.
	DescriptorMetadataPassed DescriptorMetadata = iota + 1
	// DescriptorMetadataIncumbent puts on every answer the keys the
	// incumbent sets with RESPONSE_DYNAMIC_METADATA=true: "domain",
	// "descriptors" (each descriptor's "entries" as "key=value" strings,
	// its "limit" override as text and its "hitsAddend"), the request's
	// "hitsAddend" when not 0, and "metadata" as with
	// DescriptorMetadataPassed.
	DescriptorMetadataIncumbent
	// DescriptorMetadataOff sends none of them.
	DescriptorMetadataOff
)

// RequestLimits bound what one request may ask, so that no caller can make
// the server use unbounded memory or time. Zero fields take the defaults.
//
// The defaults admit every request Envoy sends for the configs Envoy
// Gateway (EG) and Istio generate, with room (docs/security.md has the
// derivations); what bounds memory is the message size (the gRPC server's
// MaxRecvMsgSize): a request is decoded whole before these are checked, and
// everything done with it after is in proportion to its bytes. These bound
// the work per byte: descriptors looked up and buckets taken.
type RequestLimits struct {
	// MaxDomainBytes: default config.MaxDomainBytes (2,048; EG's longest
	// domain, a ListenerSet listener's name, is 889 bytes).
	MaxDomainBytes int
	// MaxDescriptors: default DefaultMaxDescriptors.
	MaxDescriptors int
	// MaxEntries bounds the entries of one descriptor; default
	// config.MaxDepth (2,048; EG sends one entry per match of a rule, up to
	// 1,157).
	MaxEntries int
	// MaxKeyBytes bounds an entry key; default config.MaxKeyBytes (1,024;
	// EG's longest, a route's, is 598 bytes).
	MaxKeyBytes int
	// MaxValueBytes bounds an entry value kept as it is; a longer one is
	// matched as it is, then stands as its first bytes, length and SHA-256;
	// default config.MaxValueBytes (4,096).
	MaxValueBytes int
	// MaxHits bounds hits_addend, per descriptor; default 1e9.
	MaxHits uint64
}

// DefaultMaxDescriptors is the default of RequestLimits.MaxDescriptors.
// Envoy sends one descriptor per rate limit of the route (and of its
// virtual host) whose actions all match, in one call per domain. EG makes
// one such rate limit per rule of a BackendTrafficPolicy, at most 256 a
// policy, and a route's policy may be merged with its Gateway's: 512 (a
// rule that lists methods makes one per method, and a request matches one
// of them unless they are inverted). Istio's rate limits are written by
// hand, one per action list. 1,024 leaves room; envoyproxy/ratelimit has no
// bound of its own.
const DefaultMaxDescriptors = 1024

// DefaultRequestLimits are the bounds of a zero RequestLimits.
func DefaultRequestLimits() RequestLimits { return RequestLimits{}.withDefaults() }

func (l RequestLimits) withDefaults() RequestLimits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	// The config's bounds, so that every rule it accepts can be matched.
	def(&l.MaxDomainBytes, config.MaxDomainBytes)
	def(&l.MaxDescriptors, DefaultMaxDescriptors)
	def(&l.MaxEntries, config.MaxDepth)
	def(&l.MaxKeyBytes, config.MaxKeyBytes)
	def(&l.MaxValueBytes, config.MaxValueBytes)
	if l.MaxHits == 0 {
		l.MaxHits = 1_000_000_000
	}
	l.MaxHits = min(l.MaxHits, limiter.MaxTokens)
	return l
}

// Options configures a Server. Store is required; the zero value of every
// other field means its documented default.
type Options struct {
	// Store keeps the buckets.
	Store limiter.Store
	// Now is the clock; default time.Now. A request is decided at the time
	// read when it arrives; later reads time its wait, its refund and its
	// duration.
	Now func() time.Time
	// Logger receives debug lines per request and warnings; default discards.
	Logger *slog.Logger
	// Limits bound the size of requests.
	Limits RequestLimits
	// RetryAfter defaults to RetryAfterSend.
	RetryAfter RetryAfter
	// RateLimitHeaders defaults to RateLimitHeadersOff.
	RateLimitHeaders RateLimitHeaders
	// RateLimitHeaderNames name RateLimitHeadersIncumbent's headers; an
	// empty field takes its name in DefaultRateLimitHeaderNames. Other
	// modes ignore it.
	RateLimitHeaderNames HeaderNames
	// DynamicMetadata defaults to DynamicMetadataNotable.
	DynamicMetadata DynamicMetadata
	// Observer, when set, learns the outcome of every call.
	Observer Observer
	// MaxWait caps every limit's max_wait: how long a call may be held for
	// reserved tokens. Default 5s.
	MaxWait time.Duration
	// ShadowMode makes every rule, limit overrides included, a shadow
	// rule: decided and counted, never denying (envoyproxy/ratelimit's
	// SHADOW_MODE).
	ShadowMode bool
	// QuotaMode defaults to QuotaModePerRule.
	QuotaMode QuotaMode
	// DescriptorMetadata defaults to DescriptorMetadataPassed.
	DescriptorMetadata DescriptorMetadata

	// Overdraft, when on, records every charge even when it overdraws
	// (see Overdraft). Default off.
	Overdraft Overdraft
	// Leases keeps the lease pools of concurrency rules; default a
	// limiter.MemoryLeases of this process. A store shared by replicas
	// wakes waiters elsewhere through Server.LeaseReleased.
	Leases limiter.LeaseStore
	// LeaseObserver, when set, learns of every lease call (metrics).
	LeaseObserver LeaseObserver
	// Refunds says what is_negative_hits may give back; default
	// RefundsTaken (RefundsUnbounded is envoyproxy/ratelimit's behaviour).
	Refunds RefundPolicy
	// OnInvalidOverride and OnOversizedRequest answer the requests Envoy
	// would let through on an error (see policy.go); default deny. A
	// request larger than MaxRequestBytes (0: no bound of the server's own)
	// is oversized when served through Register with Codec.
	OnInvalidOverride  InvalidOverride
	OnOversizedRequest OversizedRequest
	MaxRequestBytes    int
}
