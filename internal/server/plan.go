package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// plan is what a request asks of the store, descriptor by descriptor. The
// plan stage makes it; the stages after it add what they own, in the
// parts embedded here, each defined beside its stage.
type plan struct {
	// domain is the request's.
	domain string
	items  []item
	// descs are the request's descriptors as planned: the request's own,
	// but for those with a value longer than RequestLimits.MaxValueBytes,
	// copies with that value replaced by its stand-in (see longValue).
	descs []*ratelimitv3.RateLimitDescriptor
	// takes are the buckets to take from, each item's in a run starting at
	// item.first, one per limit of item.limits.
	takes      []limiter.Request
	leasePlan  // leases.go
	refundPlan // refund.go
	quotaPlan  // quota.go
}

// item is one request descriptor and the limits that apply to it.
type item struct {
	// rule is the matched rule, or one made for a request's limit override;
	// nil when no rule matched.
	rule *config.Rule
	// limited is false when nothing is taken for the descriptor: no rule,
	// an unlimited rule, or a rule another one replaces.
	limited  bool
	replaced bool
	// denyAll is set for a rule with requests_per_unit: 0 (and no
	// override): the descriptor is denied without asking the store.
	denyAll bool
	// limits are a limited rule's, or the override's one; their takes
	// start at plan.takes[first].
	limits []config.RateLimit
	first  int
	// configured is set when rule and limits come from the loaded config
	// (not from a limit override), so their protobuf parts can be cached.
	configured bool
	// overridden is set when limits is a limit override's: its bucket is
	// its own (config.Rule.AppendOverrideKey), never the rule's.
	overridden bool
	// shadow is set when the rule is a shadow rule: its own shadow_mode,
	// or every rule with Options.ShadowMode.
	shadow bool
	// invalidOverride is set when the descriptor's limit override was
	// invalid and the policy ignored it or denied (see invalidOverride).
	invalidOverride bool
	// quota is set for a quota-mode descriptor: its rule has quota_mode
	// (and no override replaced it), or QuotaModeAll makes every
	// descriptor one but those of unlimited rules, as in
	// envoyproxy/ratelimit (where a descriptor without a rule then counts
	// as a quota-mode descriptor that passes).
	quota bool
	// lease, when positive, says the descriptor holds or gives back a
	// lease of a concurrency rule: plan.leases[lease-1].
	lease int
	// hits is how many tokens the descriptor asks (see hitsOf).
	hits int64
}

// plan is the second stage: it matches each descriptor of the checked
// req to its rule under set, lists the buckets to take from and the
// leases to hold (planRequest, planLeases). A bad limit override (per
// Options.OnInvalidOverride) is INVALID_ARGUMENT; a caller gone while it
// matched gets its context's error.
func (s *Server) plan(ctx context.Context, set *config.Set, req *rlsv3.RateLimitRequest, now time.Time) (plan, error) {
	p, err := planRequest(ctx, set, req, s.waitCap(ctx, now), s.limits.MaxValueBytes, s.shadow, s.quota, s.onInvalid)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return plan{}, status.FromContextError(err).Err()
		}
		return plan{}, answerFor(codes.InvalidArgument, err)
	}
	planLeases(&p)
	return p, nil
}

// planRequest matches each descriptor of a checked request to its rule and
// lists the buckets to take from. maxWait caps every limit's max_wait; a
// value longer than maxValue bytes is matched as it is, then replaced by
// its stand-in (see longValue) for everything after: its bucket, the
// override's path, and what observers see.
// With shadowAll every rule is a shadow rule (Options.ShadowMode). It
// stops, returning ctx's error, when ctx ends between two descriptors: a
// caller that has gone buys no more matching (each descriptor's costs at
// most config.MaxScanBytes per wildcard pattern). An invalid limit
// override is handled per onInvalid (see invalidOverride).
func planRequest(ctx context.Context, set *config.Set, req *rlsv3.RateLimitRequest, maxWait time.Duration, maxValue int, shadowAll bool, quotaMode QuotaMode, onInvalid InvalidOverride) (plan, error) {
	domain := req.GetDomain()
	descs := req.GetDescriptors()
	p := plan{domain: domain, items: make([]item, len(descs)), descs: descs}
	var eb [8]config.Entry // most descriptors have few entries: no allocation
	entries := eb[:0]
	replacing, copied := false, false
	for i, d := range descs {
		if err := ctx.Err(); err != nil {
			return plan{}, err
		}
		entries = toEntries(entries[:0], d)
		it := item{rule: set.Lookup(domain, entries), hits: hitsOf(req, d)}
		if long := shortenValues(d, maxValue); long != nil {
			if !copied {
				p.descs, copied = slices.Clone(descs), true
			}
			p.descs[i], d = long, long
			entries = toEntries(entries[:0], d)
		}
		it.configured = it.rule != nil
		if it.rule != nil {
			it.limited = it.rule.Kind == config.KindLimited
			it.denyAll = it.rule.Kind == config.KindDenyAll
			if it.limited {
				it.limits = it.rule.Limits
			}
			replacing = replacing || len(it.rule.Replaces) > 0
		}
		// As in envoyproxy/ratelimit, an override on a domain the config
		// does not know is ignored (on a known domain, it applies even
		// where no rule matched).
		if o := d.GetLimit(); o != nil && set.HasDomain(domain) {
			if err := it.override(domain, entries, o); err != nil {
				if err := invalidOverride(onInvalid, &it, domain, i, err); err != nil {
					return plan{}, err
				}
			}
		}
		it.shadow = it.rule != nil && (it.rule.ShadowMode || shadowAll)
		unlimited := it.rule != nil && it.rule.Kind == config.KindUnlimited && !it.limited
		it.quota = quotaMode == QuotaModeAll && !unlimited || it.configured && it.rule.QuotaMode && (it.limited || it.denyAll)
		p.items[i] = it
	}
	if replacing {
		markReplaced(p.items)
	}
	// A descriptor denied outright denies the request: the others are only
	// checked, so that they report their state and spend nothing. A
	// quota-mode one denies it when every quota-mode descriptor is denied
	// outright.
	checkOnly, quotaDenied := false, 0
	for i := range p.items {
		it := &p.items[i]
		if it.replaced && quotaMode != QuotaModeAll {
			it.quota = false
		}
		outright := it.denyAll && !it.replaced && !it.shadow
		if it.quota {
			p.quotas++
			if outright {
				quotaDenied++
			}
			continue
		}
		checkOnly = checkOnly || outright
	}
	checkOnly = checkOnly || p.quotas > 0 && quotaDenied == p.quotas
	if p.tolerant() {
		maxWait = 0 // see quotaPlan
	}
	var kb [256]byte // keys are built here, then copied into their string
	key := kb[:0]
	for i, d := range p.descs {
		it := &p.items[i]
		if !it.limited {
			continue
		}
		entries = toEntries(entries[:0], d)
		if p.takes == nil {
			n := len(it.limits) + len(descs) - i - 1
			p.takes = make([]limiter.Request, 0, n)
		}
		it.first = len(p.takes)
		for j, l := range it.limits {
			if it.overridden {
				key = it.rule.AppendOverrideKey(key[:0], entries, l.Limit)
			} else {
				key = it.rule.AppendKey(key[:0], j, entries)
			}
			// In a tolerant plan, a quota-mode take that is denied must not
			// deny the others: quotaVerdict decides.
			r := limiter.Request{Key: string(key), Limit: l.Limit, Hits: it.hits, Shadow: it.shadow || it.quota && p.tolerant()}
			if d.GetIsNegativeHits() {
				refund := r
				p.refunds = append(p.refunds, refund)
				p.refundable = append(p.refundable, l.Counts == config.Tokens)
				r.Hits = 0
			}
			if checkOnly && !r.Charge() {
				r.Hits = 0
			}
			// A shadow rule never holds a request: it only reports.
			if r.Hits > 0 && l.MaxWait > 0 && maxWait > 0 && !it.shadow {
				r.MaxWait = min(l.MaxWait, maxWait)
			}
			p.takes = append(p.takes, r)
		}
	}
	return p, nil
}

// shortenValues returns nil when no value of d is longer than max bytes,
// else a copy of d whose long values are replaced by their stand-ins.
func shortenValues(d *ratelimitv3.RateLimitDescriptor, max int) *ratelimitv3.RateLimitDescriptor {
	var short *ratelimitv3.RateLimitDescriptor
	for j, e := range d.GetEntries() {
		if len(e.GetValue()) <= max {
			continue
		}
		if short == nil {
			short = proto.CloneOf(d)
		}
		short.Entries[j].Value = longValue(e.GetValue())
	}
	return short
}

// longValue is what stands for a descriptor value too long to be kept as it
// is (a client can put kilobytes in a header that Envoy turns into a
// value): its first bytes, its length and its SHA-256. Rejecting the
// request instead would answer INVALID_ARGUMENT, which Envoy lets through
// by default, so a long header would slip past every limit; cutting the
// value short would put distinct values in one bucket. The stand-in keeps
// one bucket per distinct value, as the value itself would, in bounded
// space: keys, metric labels and pages never hold more than about 170
// bytes of it.
func longValue(v string) string {
	cut := min(len(v), 64)
	for cut > 0 && cut < len(v) && !utf8.RuneStart(v[cut]) { // v is UTF-8 (see Codec): cut between runes
		cut--
	}
	sum := sha256.Sum256([]byte(v))
	return fmt.Sprintf("%s…[%d bytes, sha256:%x]", v[:cut], len(v), sum)
}

func toEntries(dst []config.Entry, d *ratelimitv3.RateLimitDescriptor) []config.Entry {
	for _, e := range d.GetEntries() {
		dst = append(dst, config.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return dst
}

// hitsOf is how many tokens descriptor d takes: its own hits_addend when
// present (0 checks without taking), else the request's, where 0 means 1.
func hitsOf(req *rlsv3.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(h.GetValue())
	}
	return int64(max(req.GetHitsAddend(), 1))
}

// overrideUnits maps Envoy's units to config's.
var overrideUnits = map[typev3.RateLimitUnit]config.Unit{
	typev3.RateLimitUnit_SECOND: config.Second,
	typev3.RateLimitUnit_MINUTE: config.Minute,
	typev3.RateLimitUnit_HOUR:   config.Hour,
	typev3.RateLimitUnit_DAY:    config.Day,
	typev3.RateLimitUnit_MONTH:  config.Month,
	typev3.RateLimitUnit_YEAR:   config.Year,
}

// override applies a descriptor's limit override (from Envoy's route
// metadata): it replaces the configured limits with one rate, with a burst
// of one unit's worth, and applies even where no rule matched (as
// envoyproxy/ratelimit does). The override has a bucket of its own, keyed
// by its count and period (config.Rule.AppendOverrideKey): it never spends
// from, or writes, the rule's buckets.
func (it *item) override(domain string, entries []config.Entry, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) error {
	unit, ok := overrideUnits[o.GetUnit()]
	if !ok {
		return fmt.Errorf("unit %v is not a unit of time", o.GetUnit())
	}
	mult := int64(1)
	if m := o.GetUnitMultiplier(); m != nil {
		mult = int64(m.GetValue())
	}
	if mult < 1 {
		return fmt.Errorf("unit_multiplier must be at least 1")
	}
	if mult > int64(limiter.MaxFill/unit.Duration()) {
		return fmt.Errorf("unit_multiplier %d: %d %ss is longer than %v", mult, mult, unit, limiter.MaxFill)
	}
	if o.GetRequestsPerUnit() == 0 {
		return fmt.Errorf("requests_per_unit must be at least 1")
	}
	l := limiter.Limit{
		Count:  int64(o.GetRequestsPerUnit()),
		Period: time.Duration(mult) * unit.Duration(),
		Burst:  int64(o.GetRequestsPerUnit()),
	}
	if err := l.Validate(); err != nil {
		return err
	}
	rl := config.RateLimit{Limit: l, Unit: unit, UnitMultiplier: mult, Counts: config.Requests}
	if it.rule == nil {
		it.rule = &config.Rule{Domain: domain, Path: overridePath(domain, entries), Kind: config.KindLimited, Limits: []config.RateLimit{rl}}
	} else if len(it.limits) > 0 {
		rl.Name = it.limits[0].Name
	}
	it.limited, it.denyAll, it.limits, it.configured, it.overridden = true, false, []config.RateLimit{rl}, false, true
	return nil
}

func overridePath(domain string, entries []config.Entry) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range entries {
		fmt.Fprintf(&b, " > %s=%s", e.Key, e.Value)
	}
	b.WriteString(" (limit override)")
	return b.String()
}

// markReplaced drops the limit of every item whose rule another matched
// rule replaces (envoyproxy/ratelimit's `replaces`).
func markReplaced(items []item) {
	replaced := map[string]bool{}
	for _, it := range items {
		if it.rule != nil {
			for _, name := range it.rule.Replaces {
				replaced[name] = true
			}
		}
	}
	for i := range items {
		if r := items[i].rule; r != nil && r.Name != "" && replaced[r.Name] {
			items[i].limited, items[i].denyAll, items[i].replaced = false, false, true
		}
	}
}
