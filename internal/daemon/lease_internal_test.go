package daemon

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// TestPoolOfChannel: the subscriber reads back the pool of every
// LeaseChannel, whatever bytes the pool and the prefix hold, and nothing
// from channels that are not a pool's.
func TestPoolOfChannel(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	for _, prefix := range []string{"", "ratelimitd:", `a*b?[c]\:`} {
		st, err := redisstore.New(c, redisstore.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		channelPrefix := strings.TrimSuffix(st.LeaseChannel(""), "}")
		for _, pool := range []string{"", "pool", "p1\x02ai\x05model{}", strings.Repeat("\xff", 300)} {
			got, ok := poolOfChannel(channelPrefix, st.LeaseChannel(pool))
			if !ok || got != pool {
				t.Errorf("prefix %q: poolOfChannel(LeaseChannel(%q)) = %q, %v", prefix, pool, got, ok)
			}
		}
		for _, other := range []string{st.Key("pool"), prefix + "lease-waiting{cG9vbA}", channelPrefix + "!!}", channelPrefix + "cG9vbA"} {
			if got, ok := poolOfChannel(channelPrefix, other); ok {
				t.Errorf("prefix %q: poolOfChannel(%q) = %q, want no pool", prefix, other, got)
			}
		}
		st.Close()
	}
}
