package config

import "encoding/binary"

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
	for i, e := range entries {
		dst = appendPart(dst, e.Key)
		if i < len(r.levels) && r.levels[i].shareThreshold {
			// share_threshold: every value the pattern matches shares the
			// bucket, named by the pattern (which itself matches it).
			dst = appendPart(dst, r.levels[i].value)
			continue
		}
		dst = appendPart(dst, e.Value)
	}
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
