package config

import (
	"encoding/binary"
	"strconv"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// keyVersion starts every bucket key. Change it when the encoding or the
// meaning of a key changes, so that old buckets are not misread.
const keyVersion = "v1"

// AppendKey appends to dst the identity of the bucket that the request
// descriptor entries draw from under r's limit number limit (an index into
// r.Limits), and returns the extended slice. It is the only place bucket
// keys are built.
//
// Every part is written as its length (uvarint) then its bytes, so that no
// two different identities share a key whatever bytes their values hold
// ("a"+"b_c" and "a_b"+"c" differ). The identity is:
//
//   - for a rule's own limit: the domain and every entry of the descriptor
//     (at a level with share_threshold, the key and the level's wildcard
//     pattern instead of the value, so that every value it matches shares
//     one bucket), then, only when the rule has several limits, an empty
//     part and the
//     limit's identity (its name, else what it counts and its period);
//   - for a quota group: the domain, an empty part, "group", the group's
//     name, then the entries of the rule's key-only levels (none when the
//     group is shared), so that exact and wildcard aliases share one bucket.
//
// An empty part cannot be an entry key (requests with an empty key are
// refused), so the three shapes never meet. The identity does not contain
// the rate: editing a rule's rate or burst keeps its buckets (an unnamed
// limit of a rule with several is known by its period, so changing its
// unit moves it to a new bucket; naming it avoids that).
func (r *Rule) AppendKey(dst []byte, limit int, entries []Entry) []byte {
	dst = append(dst, keyVersion...)
	dst = appendPart(dst, r.Domain)
	if limit < len(r.Limits) && r.Limits[limit].Group != "" {
		g := r.Limits[limit]
		dst = appendPart(dst, "")
		dst = appendPart(dst, "group")
		dst = appendPart(dst, g.Group)
		if !g.Shared {
			for i, e := range entries {
				if i < len(r.levels) && r.levels[i].keyOnly {
					dst = appendPart(dst, e.Key)
					dst = appendPart(dst, e.Value)
				}
			}
		}
		return dst
	}
	dst = r.appendEntries(dst, entries)
	if len(r.Limits) > 1 && limit < len(r.Limits) {
		id := r.Limits[limit].id
		if id == "" { // a Rule whose Limits were set outside this package
			id = r.Limits[limit].identity()
		}
		dst = appendPart(dst, "")
		dst = appendPart(dst, id)
	}
	return dst
}

func appendPart(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// appendEntries appends the parts of entries: each key, then its value, or
// at a level with share_threshold the level's pattern (so that every value
// it matches shares one bucket, named by the pattern, which itself matches
// it).
func (r *Rule) appendEntries(dst []byte, entries []Entry) []byte {
	for i, e := range entries {
		dst = appendPart(dst, e.Key)
		if i < len(r.levels) && r.levels[i].shareThreshold {
			dst = appendPart(dst, r.levels[i].value)
			continue
		}
		dst = appendPart(dst, e.Value)
	}
	return dst
}

// AppendOverrideKey appends to dst the identity of the bucket that the
// request descriptor entries draw from under a limit override l (Envoy's
// per-descriptor RateLimitOverride, applied to r: the rule the entries
// matched, or one made for the override) and returns the extended slice.
//
// An override has a bucket of its own, never one of r's: the identity is
// the domain and the entries, as for r's own limit (share_threshold
// included), then an empty part, "override", and the override's count and
// period ("5/1s"). Each distinct override of a descriptor therefore counts
// apart from the rule and from the others, as the limits of rate_limits:
// do, so that a request carrying a 1-a-year override cannot leave the
// rule's bucket owing a year. (envoyproxy/ratelimit keys its counters by
// the override's unit, so there too the rule's counter is untouched.) A
// quota group's bucket is not an override's either: the override keys by
// the entries. Unlike a rule's, an override's identity holds its rate, as
// nothing else names it.
func (r *Rule) AppendOverrideKey(dst []byte, entries []Entry, l limiter.Limit) []byte {
	dst = append(dst, keyVersion...)
	dst = appendPart(dst, r.Domain)
	dst = r.appendEntries(dst, entries)
	dst = appendPart(dst, "")
	dst = appendPart(dst, "override")
	var id [48]byte
	b := strconv.AppendInt(id[:0], l.Count, 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, l.Period.Microseconds(), 10)
	b = append(b, "us"...)
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// AppendLedgerKey appends to dst the identity of the refund ledger of the
// bucket whose identity is bucket (see AppendKey): what refunds may give
// back to it (see the server's refund policy). It starts "l1", never a
// bucket key's "v1", then holds bucket as one part, so no ledger shares a
// key with a bucket or another ledger.
func AppendLedgerKey(dst, bucket []byte) []byte {
	dst = append(dst, "l1"...)
	dst = binary.AppendUvarint(dst, uint64(len(bucket)))
	return append(dst, bucket...)
}
