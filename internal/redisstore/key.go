package redisstore

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// DefaultPrefix starts every Redis key when Options.Prefix is empty.
const DefaultPrefix = "ratelimitd:"

// redisKey is the Redis key of the bucket named bucket: prefix, then the
// bucket's bytes in unpadded URL-safe base64 inside braces:
//
//	ratelimitd:{djEFYWktZ3c}
//
// The encoding is injective (base64 is, and the prefix is fixed), so two
// buckets never share a key whatever bytes they hold; and it never contains a
// brace, so the braces are the key's Redis Cluster hash tag and hold the
// whole bucket identity: buckets spread over all slots, and a bucket's slot
// depends only on its identity, not on the prefix. It is the only place keys
// are built.
func redisKey(prefix, bucket string) string {
	enc := base64.RawURLEncoding
	b := make([]byte, 0, len(prefix)+2+enc.EncodedLen(len(bucket)))
	b = append(b, prefix...)
	b = append(b, '{')
	b = enc.AppendEncode(b, []byte(bucket))
	b = append(b, '}')
	return string(b)
}

// checkPrefix reports whether prefix can start keys: a brace in it would
// take the hash tag away from the bucket identity.
func checkPrefix(prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("redisstore: Options.Prefix %q: must not contain '{' or '}' (they delimit the Redis Cluster hash tag)", prefix)
	}
	return nil
}

// slot is the Redis Cluster hash slot of key: CRC16/XMODEM of its hash tag
// (the bytes between the first '{' and the next '}', when not empty),
// otherwise of the whole key, modulo 16384. See
// https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/#hash-tags
func slot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return int(crc16(key) % 16384)
}

// tagOfSlot returns a hash tag whose slot is slot (0 ≤ slot < 16384): the
// smallest decimal number that hashes there.
func tagOfSlot(slot int) string {
	return strconv.Itoa(int(slotTags()[slot]))
}

// slotTags holds, for each slot, the smallest number whose decimal form
// hashes there: counting up covers every slot within some 200,000 numbers,
// a few milliseconds, once.
var slotTags = sync.OnceValue(func() *[16384]uint32 {
	var tags [16384]uint32
	var found [16384]bool
	for n, left := 0, len(tags); left > 0; n++ {
		if s := crc16(strconv.Itoa(n)) % 16384; !found[s] {
			tags[s], found[s] = uint32(n), true
			left--
		}
	}
	return &tags
})

// crc16 is CRC16/XMODEM (polynomial 0x1021, initial value 0), bit by bit.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
