package config

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestAppendOverrideKeyGolden pins the key of a limit override and of a
// refund ledger, and shows that an override never names the rule's bucket,
// a group's, or another override's.
func TestAppendOverrideKeyGolden(t *testing.T) {
	set := parseOne(t, keysFile)
	user := []Entry{{"user", "poison"}}
	group := []Entry{{"model", "gpt-4o"}, {"client", "ann"}}
	year := limiter.Limit{Count: 1, Period: 365 * 24 * time.Hour, Burst: 1}
	second := limiter.Limit{Count: 2, Period: time.Second, Burst: 2}
	ru, rg := set.Lookup("llm", user), set.Lookup("llm", group)
	tests := []struct {
		got, want string
	}{
		{fmt.Sprintf("%q", ru.AppendOverrideKey(nil, user, year)), `"v1\x03llm\x04user\x06poison\x00\boverride\x121/31536000000000us"`},
		{fmt.Sprintf("%q", ru.AppendOverrideKey(nil, user, second)), `"v1\x03llm\x04user\x06poison\x00\boverride\v2/1000000us"`},
		{fmt.Sprintf("%q", rg.AppendOverrideKey(nil, group, second)), `"v1\x03llm\x05model\x06gpt-4o\x06client\x03ann\x00\boverride\v2/1000000us"`},
		{fmt.Sprintf("%q", AppendLedgerKey(nil, ru.AppendKey(nil, 0, user))), `"l1\x12v1\x03llm\x04user\x06poison"`},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("key = %s, want %s (these keys live in Redis)", tt.got, tt.want)
		}
	}
	keys := map[string]string{
		"rule":                  string(ru.AppendKey(nil, 0, user)),
		"override 1/year":       string(ru.AppendOverrideKey(nil, user, year)),
		"override 2/s":          string(ru.AppendOverrideKey(nil, user, second)),
		"group":                 string(rg.AppendKey(nil, 0, group)),
		"override of the group": string(rg.AppendOverrideKey(nil, group, second)),
	}
	seen := map[string]string{}
	for name, k := range keys {
		if other, dup := seen[k]; dup {
			t.Errorf("%s and %s share the key %q", name, other, k)
		}
		seen[k] = name
	}
	buf := make([]byte, 0, 128)
	if n := testing.AllocsPerRun(100, func() { buf = ru.AppendOverrideKey(buf[:0], user, year) }); n != 0 {
		t.Errorf("AppendOverrideKey into a buffer: %v allocations, want none", n)
	}
}
