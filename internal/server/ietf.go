package server

import (
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers-11,
// sections 3 and 4, read from github.com/ietf-wg-httpapi/ratelimit-headers
// draft-ietf-httpapi-ratelimit-headers.md@0669b82): two Structured Field
// Lists of one item each, for the limit that denied with the longest wait,
// or, when admitted, the enforced one with the least left (as draft 03's):
//
//	RateLimit-Policy: "o3-rps";q=10;w=1
//	RateLimit: "o3-rps";r=3;t=1
//
// The item is a String naming the policy: the limit's name, else the
// rule's (Rule.Label). RateLimit-Policy's q is requests_per_unit and w the
// period in seconds (unit × unit_multiplier). RateLimit's r is the
// remaining quota (limit_remaining) and t the seconds until more is
// available: duration_until_reset, on a denial the Retry-After estimate.
// A concurrency limit says q=max_in_flight;qu="concurrent-requests" (the
// draft's registered unit for it) and no w (it has no window); its r is
// the free slots, and its t is sent only on a denial: the time until the
// earliest held lease expires, when a slot frees at the latest unless a
// request ends sooner.

const (
	ietfPolicyHeader = "ratelimit-policy"
	ietfHeader       = "ratelimit"
)

// ietfHeaders are the RateLimit-Policy and RateLimit fields of an answer
// whose statuses are set (see setStatuses); nil when no enforced limit
// applied.
func ietfHeaders(p plan, statuses []*rlsv3.RateLimitResponse_DescriptorStatus, sum summary) []*corev3.HeaderValue {
	pick := sum.least
	over := sum.denied > 0
	if over {
		pick = sum.denier
	}
	if pick < 0 || pick >= len(p.items) {
		return nil
	}
	it, st := p.items[pick], statuses[pick]
	cl := st.GetCurrentLimit()
	if cl == nil {
		return nil
	}
	name := cl.GetName()
	if name == "" && it.rule != nil {
		name = it.rule.Label()
	}
	item := sfString(name)
	var policy, limit strings.Builder
	policy.WriteString(item)
	policy.WriteString(";q=")
	policy.WriteString(strconv.FormatUint(uint64(cl.GetRequestsPerUnit()), 10))
	limit.WriteString(item)
	limit.WriteString(";r=")
	limit.WriteString(strconv.FormatUint(uint64(st.GetLimitRemaining()), 10))
	reset := st.GetDurationUntilReset().GetSeconds()
	if it.lease > 0 {
		policy.WriteString(`;qu="concurrent-requests"`)
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			limit.WriteString(";t=")
			limit.WriteString(strconv.FormatInt(max(1, reset), 10))
		}
	} else {
		policy.WriteString(";w=")
		policy.WriteString(strconv.FormatInt(windowSeconds(cl), 10))
		if over {
			reset = max(1, reset)
		}
		limit.WriteString(";t=")
		limit.WriteString(strconv.FormatInt(reset, 10))
	}
	return []*corev3.HeaderValue{
		{Key: ietfPolicyHeader, Value: policy.String()},
		{Key: ietfHeader, Value: limit.String()},
	}
}

// windowSeconds is the period of cl in whole seconds, at least 1 (the
// draft's w is a positive Integer).
func windowSeconds(cl *rlsv3.RateLimitResponse_RateLimit) int64 {
	mult := int64(max(1, cl.GetUnitMultiplier().GetValue()))
	for u, ru := range responseUnits {
		if ru == cl.GetUnit() {
			return max(1, mult*int64(u.Duration()/time.Second))
		}
	}
	return 1
}

// sfString writes s as a Structured Field String (RFC 9651 section
// 3.3.3): printable ASCII between quotes, '"' and '\' escaped. Bytes a
// String cannot hold (controls, non-ASCII) and '%' are percent-encoded,
// so that distinct names stay distinct.
func sfString(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '%' || c < 0x20 || c > 0x7e:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
