package server

import (
	"math"
	"slices"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// answerOptions are the Options that shape an answer.
type answerOptions struct {
	retryAfter  RetryAfter
	headers     RateLimitHeaders
	headerNames HeaderNames // of RateLimitHeadersIncumbent
	metadata    DynamicMetadata
	descMeta    DescriptorMetadata
}

// responseUnits maps config's units to Envoy's.
var responseUnits = map[config.Unit]rlsv3.RateLimitResponse_RateLimit_Unit{
	config.Second: rlsv3.RateLimitResponse_RateLimit_SECOND,
	config.Minute: rlsv3.RateLimitResponse_RateLimit_MINUTE,
	config.Hour:   rlsv3.RateLimitResponse_RateLimit_HOUR,
	config.Day:    rlsv3.RateLimitResponse_RateLimit_DAY,
	config.Week:   rlsv3.RateLimitResponse_RateLimit_WEEK,
	config.Month:  rlsv3.RateLimitResponse_RateLimit_MONTH,
	config.Year:   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// Dynamic metadata keys, read by access logs under
// envoy.filters.http.ratelimit.
const (
	metaMatched      = "ratelimitd.matched"       // rules that matched, in descriptor order
	metaDeniedBy     = "ratelimitd.denied_by"     // rules that denied
	metaShadowDenied = "ratelimitd.shadow_denied" // shadow-mode rules that would have denied
	metaExceedsBurst = "ratelimitd.exceeds_burst" // rules asked for more than their burst
	metaWaited       = "ratelimitd.waited"        // rules whose tokens the request waited for
	metaQueueFull    = "ratelimitd.queue_full"    // rules denied because too many requests waited
	metaQuotaOver    = "ratelimitd.quota_over"    // quota-mode rules over their limit in an admitted answer
)

// buildResponse turns a plan and the store's decisions (one per plan.takes)
// into Envoy's answer; queueFull[k], when set, says take k could not wait
// because too many requests already waited on its bucket. cache holds the
// read-only protobuf parts of the loaded config's rules. It is pure: the
// same inputs give the same answer. A one-rule answer carries its
// dynamic_metadata pre-encoded in its unknown fields, not in
// DynamicMetadata (see setMetadata); on the wire the two are the same.
func buildResponse(req *rlsv3.RateLimitRequest, p plan, decisions []limiter.Decision, queueFull []bool, opts answerOptions, cache *protoCache) *rlsv3.RateLimitResponse {
	resp := newResponse(len(p.items))
	sum := setStatuses(resp, p, decisions, queueFull, cache)
	resp.ResponseHeadersToAdd = responseHeaders(resp.Statuses, sum, opts)
	if opts.headers == RateLimitHeadersIETF {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, ietfHeaders(p, resp.Statuses, sum)...)
	}
	setMetadata(resp, p, sum, opts.metadata, cache, incumbentMetadata(req, p, resp.Statuses, opts.descMeta, cache))
	return resp
}

// summary is what an answer's statuses say of it as a whole, for its
// headers and its metadata.
type summary struct {
	// matched and denied count the descriptors that matched a rule, and
	// that denied the request.
	matched, denied int
	// denier is the status that denied with the longest wait, retry; least
	// the enforced (not shadow) status with the least remaining. Each is
	// -1 when there is none.
	retry         time.Duration
	denier, least int
	// The rules of descriptors that would have denied in shadow mode, that
	// asked for more than their burst, that waited for their tokens, that
	// were denied because too many requests waited, and that were in quota
	// mode and over their limit in an admitted answer.
	shadow, exceeds, waited, full, quotaOver []*config.Rule
}

// setStatuses sets resp's overall code and one status per item of p, from
// the store's decisions (see buildResponse), and sums them up.
func setStatuses(resp *rlsv3.RateLimitResponse, p plan, decisions []limiter.Decision, queueFull []bool, cache *protoCache) summary {
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	sum := summary{denier: -1, least: -1}
	// Quota-mode descriptors deny only together (see quota.go); the one
	// that would pass soonest says when to retry.
	quotaDeny := quotaDenied(&p, decisions)
	quotaDenier, quotaRetry := -1, time.Duration(0)
	for i, it := range p.items {
		st := resp.Statuses[i]
		st.Code = rlsv3.RateLimitResponse_OK
		if it.rule != nil {
			sum.matched++
		}
		if it.rule != nil && it.rule.Kind == config.KindUnlimited && !it.limited && !it.replaced {
			// As envoyproxy/ratelimit answers an unlimited rule.
			st.LimitRemaining = math.MaxUint32
		}
		var (
			allowed bool
			wait    time.Duration // denied: until it would pass; admitted: until full
			limit   *config.RateLimit
		)
		switch {
		case it.denyAll:
			// Its one limit has no bucket: "0 per unit", retried after a unit.
			limit = &it.rule.Limits[0]
			wait = time.Duration(limit.UnitMultiplier) * limit.Unit.Duration()
		case it.limited:
			j := pickLimit(decisions[it.first : it.first+len(it.limits)])
			d := decisions[it.first+j]
			limit = &it.limits[j]
			st.LimitRemaining = clampUint32(d.Remaining)
			allowed, wait = d.Allowed, d.ResetAfter
			if !d.Allowed {
				wait = d.RetryAfter
			}
			if d.ExceedsBurst {
				// Retrying cannot help; say how long a full bucket takes.
				wait = limit.Limit.FillTime()
				sum.exceeds = append(sum.exceeds, it.rule)
			}
			if d.Wait > 0 {
				sum.waited = append(sum.waited, it.rule)
			}
			if !d.Allowed && queueFull != nil && queueFull[it.first+j] {
				sum.full = append(sum.full, it.rule)
			}
		case it.lease > 0:
			lt := &p.leases[it.lease-1]
			allowed, wait, limit = lt.status(st)
			if lt.waited {
				sum.waited = append(sum.waited, it.rule)
			}
			if lt.full {
				sum.full = append(sum.full, it.rule)
			}
		default:
			continue
		}
		if it.configured {
			st.CurrentLimit = cache.currentLimit(it.rule, limit)
		} else {
			st.CurrentLimit = currentLimit(it.rule, limit)
		}
		st.DurationUntilReset.Seconds = ceilSeconds(wait)
		// The headers speak for enforced rules only: a shadow rule must not
		// change what clients see.
		if !it.shadow && (sum.least < 0 || st.LimitRemaining < resp.Statuses[sum.least].LimitRemaining) {
			sum.least = i
		}
		switch {
		case allowed:
		case it.shadow:
			sum.shadow = append(sum.shadow, it.rule)
		case it.quota && !quotaDeny:
			// Tolerated: another quota-mode descriptor passed.
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			sum.quotaOver = append(sum.quotaOver, it.rule)
		case it.quota:
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			sum.denied++
			if quotaDenier < 0 || wait < quotaRetry {
				quotaDenier, quotaRetry = i, wait
			}
		default:
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			sum.denied++
			if sum.denier < 0 || wait > sum.retry {
				sum.denier, sum.retry = i, wait
			}
		}
	}
	if quotaDenier >= 0 && (sum.denier < 0 || quotaRetry > sum.retry) {
		sum.denier, sum.retry = quotaDenier, quotaRetry
	}
	for i, st := range resp.Statuses {
		if st.CurrentLimit == nil {
			resp.Statuses[i].DurationUntilReset = nil
		}
	}
	return sum
}

// responseHeaders are the headers an answer with these statuses adds:
// Retry-After (and Cache-Control: no-store) when it denies and
// opts.retryAfter says so, and the draft-03 X-RateLimit-* headers (or the
// incumbent's three) of the status that denied with the longest wait, else
// of the enforced one with the least remaining, when opts.headers says so.
// Nil when none.
func responseHeaders(statuses []*rlsv3.RateLimitResponse_DescriptorStatus, sum summary, opts answerOptions) []*corev3.HeaderValue {
	var headers []*corev3.HeaderValue
	over := sum.denied > 0 // the answer is OVER_LIMIT
	if over && opts.retryAfter == RetryAfterSend {
		headers = append(headers,
			&corev3.HeaderValue{Key: "retry-after", Value: strconv.FormatInt(max(1, ceilSeconds(sum.retry)), 10)},
			noStore)
	}
	if pick := sum.least; pick >= 0 && (opts.headers == RateLimitHeadersDraft03 || opts.headers == RateLimitHeadersIncumbent) {
		if over {
			pick = sum.denier
		}
		if opts.headers == RateLimitHeadersIncumbent {
			headers = append(headers, incumbentHeaders(statuses[pick], opts.headerNames)...)
		} else {
			headers = append(headers, rateLimitHeaders(statuses[pick])...)
		}
	}
	return headers
}

// incumbentHeaders are envoyproxy/ratelimit's three headers for one status,
// named by names: the limit's count, the remaining, and the seconds until
// reset. (The incumbent's reset is the end of the unit's fixed window; a
// token bucket has none, and the seconds until it is full again are the
// status's duration_until_reset.)
func incumbentHeaders(st *rlsv3.RateLimitResponse_DescriptorStatus, names HeaderNames) []*corev3.HeaderValue {
	return []*corev3.HeaderValue{
		{Key: names.Limit, Value: strconv.FormatUint(uint64(st.GetCurrentLimit().GetRequestsPerUnit()), 10)},
		{Key: names.Remaining, Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
		{Key: names.Reset, Value: strconv.FormatInt(st.DurationUntilReset.GetSeconds(), 10)},
	}
}

// setMetadata sets the dynamic metadata of resp, an answer to p with its
// statuses set, as mode asks: none, or the rules that matched, denied, and
// did anything of note (see the meta… keys).
func setMetadata(resp *rlsv3.RateLimitResponse, p plan, sum summary, mode DynamicMetadata, cache *protoCache, incumbent map[string]*structpb.Value) {
	extra := len(sum.shadow) + len(sum.exceeds) + len(sum.waited) + len(sum.full) + len(sum.quotaOver) // beyond matched and denied
	switch {
	case sum.matched == 0, mode == DynamicMetadataOff, mode == DynamicMetadataNotable && sum.denied+extra == 0:
		if incumbent != nil {
			resp.DynamicMetadata = &structpb.Struct{Fields: incumbent}
		}
	case incumbent != nil:
		// The incumbent's keys go beside ours, in one Struct built here.
		fields := ourMetadata(resp, p, sum, cache)
		for k, v := range incumbent {
			fields[k] = v
		}
		resp.DynamicMetadata = &structpb.Struct{Fields: fields}
	case len(p.items) == 1 && p.items[0].configured && extra == 0:
		// The common answers: one rule, admitted or denied. Their metadata
		// goes pre-encoded, as the answer's unknown fields: gRPC marshals
		// every answer, and marshaling the Struct (a map) cost about 0.5 µs
		// of a one-status answer's 1.35 µs, against 0.1 µs for the same
		// bytes copied. protobuf-go writes unknown fields verbatim after
		// the known ones, so the wire carries the same message and every
		// client decodes dynamic_metadata as before. In process, though,
		// such an answer has a nil DynamicMetadata: a reader before the
		// wire must decode it from resp.ProtoReflect().GetUnknown().
		//
		// The bytes are shared by concurrent answers, read-only. In
		// protobuf-go v1.36 (internal/impl), SetUnknown stores the slice
		// as given, without a copy; Size only adds its length and Marshal
		// only appends it to its output. Only decoding or merging into an
		// answer (UnmarshalOptions.Merge, proto.Merge) appends to it, and
		// the slice is clipped, so that append copies (protoCache.alone).
		if a := cache.alone(p.items[0].rule, sum.denied > 0); a.wire != nil {
			resp.ProtoReflect().SetUnknown(a.wire)
		} else {
			resp.DynamicMetadata = a.meta
		}
	default:
		resp.DynamicMetadata = &structpb.Struct{Fields: ourMetadata(resp, p, sum, cache)}
	}
}

// ourMetadata is the ratelimitd.* keys of an answer (see setMetadata).
func ourMetadata(resp *rlsv3.RateLimitResponse, p plan, sum summary, cache *protoCache) map[string]*structpb.Value {
	rules := make([]*config.Rule, 0, sum.matched)
	var deniedBy []*config.Rule
	for i, it := range p.items {
		if it.rule != nil {
			rules = append(rules, it.rule)
		}
		if resp.Statuses[i].Code == rlsv3.RateLimitResponse_OVER_LIMIT && !(it.quota && resp.OverallCode == rlsv3.RateLimitResponse_OK) {
			deniedBy = append(deniedBy, it.rule)
		}
	}
	// An override's rule is made per call: no cached names then.
	configured := !slices.ContainsFunc(p.items, func(it item) bool { return it.rule != nil && !it.configured })
	fields := make(map[string]*structpb.Value, 2)
	for _, f := range []struct {
		key   string
		rules []*config.Rule
	}{{metaMatched, rules}, {metaDeniedBy, deniedBy}, {metaShadowDenied, sum.shadow}, {metaExceedsBurst, sum.exceeds}, {metaWaited, sum.waited}, {metaQueueFull, sum.full}, {metaQuotaOver, sum.quotaOver}} {
		if len(f.rules) > 0 {
			fields[f.key] = cache.list(f.rules, configured)
		}
	}
	return fields
}

// noStore keeps caches from replaying a 429; shared, read-only.
var noStore = &corev3.HeaderValue{Key: "cache-control", Value: "no-store"}

// newResponse allocates an answer with n statuses, each with its
// duration, in as few allocations as it can.
func newResponse(n int) *rlsv3.RateLimitResponse {
	if n == 1 {
		b := &struct {
			resp rlsv3.RateLimitResponse
			ptrs [1]*rlsv3.RateLimitResponse_DescriptorStatus
			st   rlsv3.RateLimitResponse_DescriptorStatus
			dur  durationpb.Duration
		}{}
		b.st.DurationUntilReset = &b.dur
		b.ptrs[0] = &b.st
		b.resp.Statuses = b.ptrs[:]
		return &b.resp
	}
	resp := &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	durs := make([]durationpb.Duration, n)
	for i := range sts {
		sts[i].DurationUntilReset = &durs[i]
		resp.Statuses[i] = &sts[i]
	}
	return resp
}

// pickLimit chooses which of a descriptor's limits its status reports: the
// one that denied with the longest wait, else the one with the least left.
func pickLimit(ds []limiter.Decision) int {
	pick := 0
	for j, d := range ds[1:] {
		p := ds[pick]
		switch {
		case p.Allowed && !d.Allowed,
			!p.Allowed && !d.Allowed && d.RetryAfter > p.RetryAfter,
			p.Allowed && d.Allowed && d.Remaining < p.Remaining:
			pick = j + 1
		}
	}
	return pick
}

// currentLimit is Envoy's view of limit l of rule r; its name is the
// limit's, else the rule's.
func currentLimit(r *config.Rule, l *config.RateLimit) *rlsv3.RateLimitResponse_RateLimit {
	name := l.Name
	if name == "" {
		name = r.Name
	}
	cl := &rlsv3.RateLimitResponse_RateLimit{
		Name:            name,
		RequestsPerUnit: clampUint32(l.Limit.Count),
		Unit:            responseUnits[l.Unit],
	}
	if l.UnitMultiplier > 1 {
		cl.UnitMultiplier = wrapperspb.UInt32(clampUint32(l.UnitMultiplier))
	}
	return cl
}

// rateLimitHeaders are the draft-03 X-RateLimit-* headers for one status.
func rateLimitHeaders(st *rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	cl := st.GetCurrentLimit()
	window := int64(max(1, cl.GetUnitMultiplier().GetValue()))
	for u, ru := range responseUnits {
		if ru == cl.GetUnit() {
			window *= int64(u.Duration() / time.Second)
		}
	}
	policy := strconv.FormatUint(uint64(cl.GetRequestsPerUnit()), 10)
	limit := policy + ", " + policy + ";w=" + strconv.FormatInt(window, 10)
	if cl.GetUnit() == rlsv3.RateLimitResponse_RateLimit_UNKNOWN {
		// A concurrency limit: so many at once, over no window.
		limit = policy
	}
	if cl.GetName() != "" {
		limit += `;name="` + cl.GetName() + `"`
	}
	return []*corev3.HeaderValue{
		{Key: "x-ratelimit-limit", Value: limit},
		{Key: "x-ratelimit-remaining", Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
		{Key: "x-ratelimit-reset", Value: strconv.FormatInt(st.DurationUntilReset.GetSeconds(), 10)},
	}
}

// ceilSeconds rounds d up to whole seconds: Envoy truncates nanos, and a
// client told to come back early is denied again.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return s
}

func clampUint32(v int64) uint32 {
	return uint32(max(0, min(v, math.MaxUint32)))
}
