package config

import "encoding/binary"

// keyVersion starts every bucket key. Change it when the encoding or the
// meaning of a key changes, so that old buckets are not misread.
const keyVersion = "v1"

// AppendKey appends to dst the identity of the bucket that the request
// descriptor entries draw from under r, and returns the extended slice.
//
// The identity is the domain and every entry of the descriptor, each part
// written as its length (uvarint) then its bytes, so that no two different
// descriptors share a key whatever bytes their values hold ("a"+"b_c" and
// "a_b"+"c" differ). It does not contain the rate: editing a rule's rate
// keeps its buckets. It is the only place bucket keys are built.
func (r *Rule) AppendKey(dst []byte, entries []Entry) []byte {
	dst = append(dst, keyVersion...)
	dst = appendPart(dst, r.Domain)
	for _, e := range entries {
		dst = appendPart(dst, e.Key)
		dst = appendPart(dst, e.Value)
	}
	return dst
}

func appendPart(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}
