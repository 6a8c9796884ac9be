package redisstore_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

func TestDialRejects(t *testing.T) {
	for _, tc := range []struct {
		opts redisstore.ClientOptions
		want string // in the error
	}{
		{redisstore.ClientOptions{}, "exactly one of URL, SentinelMaster"},
		{redisstore.ClientOptions{URL: "redis://x", ClusterAddrs: []string{"y:1"}}, "exactly one of"},
		{redisstore.ClientOptions{URL: "redis://x", SentinelMaster: "m", SentinelAddrs: []string{"y:1"}}, "exactly one of"},
		{redisstore.ClientOptions{URL: "http://x"}, "URL"},
		{redisstore.ClientOptions{URL: "redis://x", TLSConfig: &tls.Config{}}, "rediss://"},
		{redisstore.ClientOptions{SentinelAddrs: []string{"y:1"}}, "SentinelMaster is empty"},
		{redisstore.ClientOptions{SentinelMaster: "m"}, "SentinelAddrs is empty"},
		{redisstore.ClientOptions{ClusterAddrs: []string{"y:1"}, DB: 2}, "DB 2"},
		{redisstore.ClientOptions{URL: "redis://x", ReadTimeout: -time.Second}, "ReadTimeout"},
		{redisstore.ClientOptions{URL: "redis://x", PoolSize: -1}, "PoolSize"},
		{redisstore.ClientOptions{URL: "redis://x", Password: "p"}, "Password is set with URL, which carries its own"},
		{redisstore.ClientOptions{URL: "redis://x", Username: "u"}, "Username is set with URL"},
		{redisstore.ClientOptions{URL: "redis://x", DB: 1}, "DB is set with URL"},
		{redisstore.ClientOptions{ClusterAddrs: []string{"y:1"}, SentinelPassword: "p"}, "SentinelPassword is set without SentinelMaster"},
		{redisstore.ClientOptions{URL: "redis://:s3cret@x:1y"}, `URL: parse "redis://:xxxxx@x:1y": invalid port`},
	} {
		c, err := redisstore.Dial(tc.opts)
		if err == nil {
			c.Close()
			t.Errorf("Dial(%+v) succeeded, want an error mentioning %q", tc.opts, tc.want)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Dial(%+v) = %v, want an error mentioning %q", tc.opts, err, tc.want)
		}
	}
}

// TestParseURLHidesThePassword: whatever is wrong with a URL, the error
// says it of the URL with its password replaced by xxxxx, even where
// url.Parse would quote a piece of the password; a good URL keeps its
// password.
func TestParseURLHidesThePassword(t *testing.T) {
	const secret = "s3cret"
	tests := []struct {
		url  string
		want string // in the error
	}{
		{"redis://:s3cretpw@redis:6379x/0", `parse "redis://:xxxxx@redis:6379x/0": invalid port ":6379x" after host`},
		{"rediss://user:s3cretpw@redis:6379/x", `invalid database number: "x"`},
		{"ftp://user:s3cretpw@redis:6379", `invalid URL scheme: ftp`},
		{"redis://:s3cretpw@redis:6379?pool_size=many", `invalid pool_size number`},
		{"redis://:s3cret@pw@redis:6379x", `parse "redis://:xxxxx@redis:6379x"`},
		{"redis://:s3cret/pw@redis:6379", `the password in redis://:xxxxx@redis:6379 cannot be parsed`},
		{"redis://:s3cret#pw@redis:6379", `the password in redis://:xxxxx@redis:6379 cannot be parsed`},
		{"redis://:s3cret%zz@redis:6379", `the password in redis://:xxxxx@redis:6379 cannot be parsed`},
		{"//:s3cretpw@redis:6379", `invalid URL scheme`},
		{":s3cretpw@redis:6379", `parse ":xxxxx@redis:6379": missing protocol scheme`},
		{"redis://user@redis:6379x", `parse "redis://user@redis:6379x": invalid port`},
	}
	for _, tt := range tests {
		_, err := redisstore.ParseURL(tt.url)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseURL(%q) = %v, want an error containing %q", tt.url, err, tt.want)
		} else if strings.Contains(err.Error(), secret) {
			t.Errorf("ParseURL(%q) = %v: contains the password", tt.url, err)
		}
	}
	o, err := redisstore.ParseURL("redis://rl:s3cret%2Fpw@redis:6379/2")
	if err != nil || o.Username != "rl" || o.Password != "s3cret/pw" || o.DB != 2 {
		t.Errorf("ParseURL of a good URL = %+v, %v; want user rl, password s3cret/pw, DB 2", o, err)
	}
}

func TestDialDefaults(t *testing.T) {
	c, err := redisstore.Dial(redisstore.ClientOptions{URL: "rediss://u:p@localhost:6380/3?read_timeout=2s&protocol=3", TLSConfig: &tls.Config{MinVersion: tls.VersionTLS13}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	o := c.(*redis.Client).Options()
	if o.DialTimeout != redisstore.DefaultDialTimeout || o.ReadTimeout != 2*time.Second ||
		o.WriteTimeout != redisstore.DefaultWriteTimeout || o.PoolTimeout != redisstore.DefaultPoolTimeout {
		t.Errorf("timeouts dial %v read %v write %v pool %v, want the defaults but read 2s from the URL",
			o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout)
	}
	if o.Username != "u" || o.Password != "p" || o.DB != 3 || !o.ContextTimeoutEnabled || o.Protocol != 2 {
		t.Errorf("options %+v: want user u, password p, DB 3, context timeouts, RESP2 whatever the URL says", o)
	}
	if o.TLSConfig == nil || o.TLSConfig.MinVersion != tls.VersionTLS13 || o.TLSConfig.ServerName != "localhost" {
		t.Errorf("TLSConfig = %+v, want the given one with ServerName localhost", o.TLSConfig)
	}
}

// TestDialPoolSizes: a server's pool opens at most DefaultPoolSize
// connections (go-redis's 10 a P is 10 on one P, fewer than a fault
// holds) and keeps at most DefaultMaxIdleConns idle, unless the URL's
// query or ClientOptions say otherwise (ClientOptions win).
func TestDialPoolSizes(t *testing.T) {
	for _, tt := range []struct {
		name              string
		opts              redisstore.ClientOptions
		wantSize, wantIdl int
	}{
		{"URL", redisstore.ClientOptions{URL: "redis://localhost:6379"}, redisstore.DefaultPoolSize, redisstore.DefaultMaxIdleConns},
		{"URL's query", redisstore.ClientOptions{URL: "redis://localhost:6379?pool_size=7&max_idle_conns=2"}, 7, 2},
		{"options over the URL's query", redisstore.ClientOptions{URL: "redis://localhost:6379?pool_size=7", PoolSize: 5}, 5, redisstore.DefaultMaxIdleConns},
		{"Sentinel", redisstore.ClientOptions{SentinelMaster: "m", SentinelAddrs: []string{"localhost:26379"}}, redisstore.DefaultPoolSize, redisstore.DefaultMaxIdleConns},
		{"Cluster, options", redisstore.ClientOptions{ClusterAddrs: []string{"localhost:7000"}, PoolSize: 3}, 3, redisstore.DefaultMaxIdleConns},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := redisstore.Dial(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var size, idle int
			switch c := c.(type) {
			case *redis.Client:
				size, idle = c.Options().PoolSize, c.Options().MaxIdleConns
			case *redis.ClusterClient:
				size, idle = c.Options().PoolSize, c.Options().MaxIdleConns
			}
			if size != tt.wantSize || idle != tt.wantIdl {
				t.Errorf("pool size %d, max idle %d; want %d, %d", size, idle, tt.wantSize, tt.wantIdl)
			}
		})
	}
}

// takeOnce checks that a store over c answers a Take spanning several keys.
func takeOnce(t *testing.T, c redisstore.Client) {
	t.Helper()
	s := newStore(t, c, redisstore.ServerClock)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 2}
	reqs := []limiter.Request{{Key: "a", Limit: l, Hits: 1}, {Key: "b7", Limit: l, Hits: 2}}
	d, err := s.Take(context.Background(), time.Time{}, reqs)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	if !d[0].Allowed || d[0].Remaining != 1 || !d[1].Allowed || d[1].Remaining != 0 {
		t.Errorf("Take = %+v, want both admitted with 1 and 0 left", d)
	}
}

func TestDialSentinel(t *testing.T) {
	sn := redistest.StartSentinel(t, "rl-master")
	c, err := redisstore.Dial(redisstore.ClientOptions{SentinelMaster: sn.MasterName, SentinelAddrs: sn.SentinelAddrs})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := c.(*redis.Client).Options().Protocol; p != 2 {
		t.Errorf("Sentinel client protocol = %d, want RESP2", p)
	}
	takeOnce(t, c)
}

func TestDialCluster(t *testing.T) {
	c, err := redisstore.Dial(redisstore.ClientOptions{ClusterAddrs: cluster(t).Addrs[:1]})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Fatalf("Dial(ClusterAddrs) = %T, want *redis.ClusterClient", c)
	}
	if p := c.(*redis.ClusterClient).Options().Protocol; p != 2 {
		t.Errorf("cluster client protocol = %d, want RESP2", p)
	}
	takeOnce(t, c)
}
