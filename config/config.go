// Package config reads ratelimitd's descriptor files into an immutable,
// validated Set, and finds the Rule that applies to a request descriptor.
//
// The format reads envoyproxy/ratelimit's YAML files unchanged (domain,
// nested descriptors with key, value, rate_limit, shadow_mode, quota_mode,
// replaces, detailed_metric, value_to_metric, share_threshold, metadata) and
// adds token-bucket fields (rate_limit.burst,
// rate_limit.unit_multiplier). docs/configuration.md is the reference.
//
// The package does no I/O beyond reading the files it is asked to load, and
// never logs.
package config

import (
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Unit is the unit of a rate, as Envoy's RateLimitResponse.RateLimit.Unit
// names them. The zero Unit is invalid.
type Unit int

// The units of a rate.
const (
	Second Unit = iota + 1
	Minute
	Hour
	Day
	Week
	Month // 30 days
	Year  // 365 days
)

// Duration returns the length of one unit. A month is 30 days and a year 365
// days, so that a rate per month or year refills evenly.
func (u Unit) Duration() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

// String returns the unit's name as written in the YAML ("second", …).
func (u Unit) String() string {
	switch u {
	case Second:
		return "second"
	case Minute:
		return "minute"
	case Hour:
		return "hour"
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return "invalid"
}

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key, Value string
}

// Rule is what a descriptor matched: a leaf of the descriptor tree that has
// a rate_limit. Rules are shared and must not be modified.
type Rule struct {
	// Domain is the domain the rule belongs to.
	Domain string
	// Path names the rule for people: the domain then each descriptor level,
	// "ai-gateway > model=gpt-4o > user" (a key-only level is its key).
	Path string
	// Name is rate_limit.name, or "" when the file gives none.
	Name string
	// Kind says what the rule does with a request: take from the buckets
	// of Limits, admit it, or deny it.
	Kind Kind
	// Limits are the rule's rates. For KindLimited, its buckets: its
	// rate_limit, each of its rate_limits, or its quota group's; a request
	// passes the rule only if every one has room. For KindDenyAll, one
	// limit with a zero Limit (no bucket) keeping the name, unit and
	// unit_multiplier as written, which Envoy is told (requests_per_unit 0)
	// and retries after. Empty for KindUnlimited.
	Limits []RateLimit
	// ShadowMode rules are evaluated and counted but never deny. It is the
	// shadow_mode of the rule's own descriptor: as in envoyproxy/ratelimit,
	// shadow_mode on a descriptor without a rate limit is accepted and
	// means nothing, and nested descriptors do not inherit it.
	ShadowMode bool
	// DetailedMetric asks for per-value metrics: detailed_metric of the
	// rule's own descriptor, likewise not inherited.
	DetailedMetric bool
	// QuotaMode is quota_mode of the rule's own descriptor (likewise not
	// inherited): as in envoyproxy/ratelimit, a request is denied by a
	// quota-mode rule only when every quota-mode rule of the request is
	// over its limit; a normal rule over its limit denies it alone.
	QuotaMode bool
	// Metadata is the metadata mapping of the rule's own descriptor, as
	// google.protobuf.Struct holds it: values are nil, bool, float64 (every
	// YAML number), string, []any or map[string]any. The server returns
	// it in the answer's dynamic metadata when the descriptor passes. Nil
	// when the descriptor has none. Shared: must not be modified.
	Metadata map[string]any
	// ValueToMetric reports whether a level of the rule's path that matches
	// more than one value (key-only or wildcard) sets value_to_metric, so
	// that StatKey holds request values (see StatKeyVaries).
	ValueToMetric bool
	// Replaces lists the names of rules this one replaces when both match
	// descriptors of one request.
	Replaces []string
	// Concurrency is the concurrency limit of a KindConcurrency rule
	// (Limits is then empty); nil for every other kind.
	Concurrency *Concurrency
	// File and Line locate the rule's descriptor in its file.
	File string
	Line int

	// levels describe each descriptor level down to the rule.
	levels []level
}

// level is one descriptor level on the path to a rule.
type level struct {
	key, value string // as written; value "" for a key-only level
	// keyOnly levels match any value, each with its own bucket; wild
	// levels have a '*' pattern as value.
	keyOnly, wild bool
	// shareThreshold (wild levels only) makes every value matching the
	// pattern share one bucket; valueToMetric puts the request's value in
	// the incumbent's stat key.
	shareThreshold, valueToMetric bool
}

// Kind is what a rule does with a request. The zero Kind is invalid.
type Kind int

const (
	// KindLimited rules take from their buckets (Rule.Limits).
	KindLimited Kind = iota + 1
	// KindUnlimited rules (unlimited: true) admit everything and keep no
	// bucket.
	KindUnlimited
	// KindDenyAll rules (requests_per_unit: 0, envoyproxy/ratelimit's way
	// to block a value) deny every request and keep no bucket.
	KindDenyAll
)

// String returns the kind's name: "limited", "unlimited" or "deny-all".
func (k Kind) String() string {
	switch k {
	case KindLimited:
		return "limited"
	case KindUnlimited:
		return "unlimited"
	case KindDenyAll:
		return "deny-all"
	case KindConcurrency:
		return "concurrency"
	}
	return "invalid"
}

// Label names r in metrics, pages, logs and Envoy's dynamic metadata: its
// name, else its descriptor path.
func (r *Rule) Label() string {
	if r.Name != "" {
		return r.Name
	}
	return r.Path
}

// Counts says what a limit counts, for metrics, pages and headers. The zero
// value is invalid.
type Counts int

const (
	// Requests is the default: one token per request.
	Requests Counts = iota + 1
	// Tokens counts what the request says it costs (hits_addend), such as
	// LLM tokens.
	Tokens
)

// String returns the name as written in the YAML.
func (c Counts) String() string {
	switch c {
	case Requests:
		return "requests"
	case Tokens:
		return "tokens"
	}
	return "invalid"
}

// RateLimit is one bucket shape of a rule: a rate_limit block, an item of
// rate_limits, or a quota group.
type RateLimit struct {
	// Name is the limit's name, or "" (a quota group's limit is named after
	// the group).
	Name string
	// Limit is the bucket: Count = requests_per_unit, Period =
	// unit_multiplier × unit, Burst = burst (default requests_per_unit),
	// MaxDebt = overdraft.max_debt.
	Limit limiter.Limit
	// Unit and UnitMultiplier are the rate as written, for Envoy's
	// current_limit.
	Unit           Unit
	UnitMultiplier int64
	// Counts says what a token stands for. Default Requests.
	Counts Counts
	// MaxWait, when positive, lets a request wait up to this long for its
	// tokens instead of being denied; MaxWaiters bounds how many may wait
	// on one bucket at once.
	MaxWait    time.Duration
	MaxWaiters int
	// Group is the quota group this limit belongs to, or "". Every rule
	// naming a group draws from one bucket per distinct value of its
	// key-only levels (so exact and wildcard aliases share one), or from
	// one bucket in all if Shared.
	Group  string
	Shared bool

	// id tells this limit's bucket apart from the other limits' of its
	// rule (identity), computed once when the rule gets its limits.
	id string
}

// Domain is one domain's descriptors, from one or more files.
type Domain struct {
	Name string
	// Files that define the domain.
	Files []string
	// Rules lists every rule of the domain in file order.
	Rules []*Rule
}
