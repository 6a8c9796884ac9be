package redisstore_test

import (
	"context"
	"encoding/base64"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

func TestKeyGolden(t *testing.T) {
	s, err := redisstore.New(standaloneClientless{}, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ bucket, want string }{
		{"", "ratelimitd:{}"},
		{"a", "ratelimitd:{YQ}"},
		// config.Rule.AppendKey: "v1", then length-prefixed domain, key, value.
		{"v1\x0aai-gateway\x05model\x06gpt-4o", "ratelimitd:{djEKYWktZ2F0ZXdheQVtb2RlbAZncHQtNG8}"},
		{"{}\x00é", "ratelimitd:{e30Aw6k}"},
		{"\xff\xfe?>", "ratelimitd:{__4_Pg}"},
	} {
		if got := s.Key(tc.bucket); got != tc.want {
			t.Errorf("Key(%q) = %q, want %q", tc.bucket, got, tc.want)
		}
	}
	p, err := redisstore.New(standaloneClientless{}, redisstore.Options{Prefix: "rl:prod:"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Key("a"), "rl:prod:{YQ}"; got != want {
		t.Errorf("with Prefix rl:prod:, Key(%q) = %q, want %q", "a", got, want)
	}
}

// trickyBuckets are bucket names built to collide under naive encodings:
// separators, braces, NUL, unicode, prefixes of each other.
var trickyBuckets = []string{
	"", "a", "a:", ":a", "a:b", "a_b", "a", "ab", "a\x00", "\x00a", "\x00", "\x00\x00",
	"{", "}", "{}", "{a}", "a{b}c", "}{", "{{}}", "é", "e\u0301", "\u00e9\u0000", "日本",
	"v1\x01a\x03b_c", "v1\x03a_b\x01c", "+", "/", "-", "_", "=", "==", "YQ", "{YQ}",
}

func TestKeysNeverCollide(t *testing.T) {
	s, err := redisstore.New(standaloneClientless{}, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	buckets := append([]string(nil), trickyBuckets...)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(8))
		for i := range b {
			b[i] = "{}:_\x00a\xff"[rng.IntN(7)]
		}
		buckets = append(buckets, string(b))
	}
	seen := map[string]string{}
	for _, b := range buckets {
		k := s.Key(b)
		if prev, ok := seen[k]; ok && prev != b {
			t.Fatalf("Key(%q) = Key(%q) = %q", b, prev, k)
		}
		seen[k] = b
		// The key decodes back to the bucket, and its only braces are the
		// hash tag's.
		inner, ok := strings.CutPrefix(k, redisstore.DefaultPrefix+"{")
		inner, ok2 := strings.CutSuffix(inner, "}")
		if !ok || !ok2 || strings.ContainsAny(inner, "{}") {
			t.Fatalf("Key(%q) = %q: not prefix{base64}", b, k)
		}
		if dec, err := base64.RawURLEncoding.DecodeString(inner); err != nil || string(dec) != b {
			t.Fatalf("Key(%q) = %q decodes to %q, %v", b, k, dec, err)
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, opts := range []redisstore.Options{
		{Prefix: "a{b"},
		{Prefix: "}"},
		{Clock: redisstore.Clock(7)},
	} {
		if _, err := redisstore.New(standaloneClientless{}, opts); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", opts)
		}
	}
	if _, err := redisstore.New(nil, redisstore.Options{}); err == nil {
		t.Error("New(nil) succeeded, want an error")
	}
}

// TestSlotMatchesRedis compares the store's CRC16 slot with CLUSTER KEYSLOT.
func TestSlotMatchesRedis(t *testing.T) {
	c := cluster(t).Client()
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"", "a", "{", "}", "{}", "{}a", "a{}", "{a}", "x{a}y", "x{}{a}", "{a}{b}", "123456789", "ratelimitd:{}"}
	for _, b := range trickyBuckets {
		keys = append(keys, s.Key(b))
	}
	ctx := context.Background()
	slots := map[int]bool{}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		if got := redisstore.Slot(k); int64(got) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
		slots[redisstore.Slot(k)] = true
	}
	if len(slots) < len(keys)/2 {
		t.Errorf("%d keys fall in only %d slots: the hash tag does not spread them", len(keys), len(slots))
	}
}

// TestTagOfSlot: every slot has a tag, and a key with it hashes there.
func TestTagOfSlot(t *testing.T) {
	for s := range 16384 {
		if got := redisstore.Slot("ratelimitd:probe{" + redisstore.TagOfSlot(s) + "}"); got != s {
			t.Fatalf("TagOfSlot(%d) = %q, whose key hashes to slot %d", s, redisstore.TagOfSlot(s), got)
		}
	}
}
