package redisstore

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of ClientOptions. A rate-limit check sits in the path of every
// request Envoy forwards, and Envoy waits for it only briefly (its ratelimit
// filter times out after 20ms by default, then fails open or closed as
// configured). A Redis that does not answer within these limits is treated
// as down at once, rather than piling up waiting requests.
const (
	// DefaultDialTimeout bounds opening a connection: a loopback or in-zone
	// Redis connects in well under a millisecond, TLS in a few.
	DefaultDialTimeout = 250 * time.Millisecond
	// DefaultReadTimeout bounds waiting for a reply: a Redis that holds a
	// round trip this long is failing it. The scripts run in microseconds,
	// but a Redis starved of CPU by its neighbours was seen to take 10-98 ms
	// for one merged call of 128 buckets, and a pipeline holds several:
	// the bound is for a Redis that has stopped, not for one that is slow.
	DefaultReadTimeout = 500 * time.Millisecond
	// DefaultWriteTimeout bounds sending a command.
	DefaultWriteTimeout = 100 * time.Millisecond
	// DefaultPoolTimeout bounds waiting for a free connection when all
	// PoolSize are busy: better to fail one request than to queue them.
	DefaultPoolTimeout = 50 * time.Millisecond
	// DefaultPoolSize is the most connections a server's pool opens. A
	// fault holds, until the read timeout, a round trip for each of the
	// two senders of batches and up to maxDetached (8) they went on
	// without, and as many again once a probe finds the server answering
	// (see maxDetached); beside them go a call sent directly, give-backs,
	// leases, the breaker's probe and, on a Cluster, the slot map's
	// reloads: about 24 at the worst. go-redis's default, 10 a P, was 10
	// here (the process starts on one P): a black hole filled it, and the
	// probes after the fault waited for a connection until the read
	// timeout freed one, so Redis decided again only 0.55 s after the
	// fault ended (in about one run in five of the fault suite).
	DefaultPoolSize = 32
	// DefaultMaxIdleConns is how many idle connections a server's pool
	// keeps; one given back beyond them is closed (more may be in use, up
	// to PoolSize). A server's calls use a few at once: one for each of
	// the two senders of batches, one for a call sent directly when none
	// is in flight, one for a give-back, a lease or the breaker's probe.
	// After a fault the senders go on while the round trips the fault
	// held keep their connections until the read timeout (see
	// maxDetached), so the pool grows by their number; this bound gives
	// the growth back once the fault is over. (With 8, the fault suite
	// once saw 15 connections to a master before a black hole and 20
	// after; with 4, 15-21 before and 15-18 after, in 8 runs.)
	DefaultMaxIdleConns = 4
)

// ClientOptions says how to reach Redis. Exactly one of URL, SentinelMaster
// (with SentinelAddrs) or ClusterAddrs must be set. Zero durations and sizes
// mean the defaults. Fields that do not apply to the chosen kind of server
// (Username, Password or DB with a URL, which carries its own; the Sentinel
// credentials without Sentinels) are an error rather than ignored.
type ClientOptions struct {
	// URL of a standalone server: redis://[user:password@]host:port[/db],
	// or rediss:// for TLS (see redis.ParseURL for the query options). No
	// error of Dial or ParseURL contains its password.
	URL string

	// SentinelMaster is the name under which Sentinels monitor the master;
	// SentinelAddrs are the Sentinels' host:port addresses.
	SentinelMaster string
	SentinelAddrs  []string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels.
	SentinelUsername string
	SentinelPassword string

	// ClusterAddrs are seed host:port addresses of a Redis Cluster; the
	// client discovers the other nodes.
	ClusterAddrs []string

	// Username and Password authenticate to the Sentinel-managed master or
	// to the cluster nodes (a URL carries its own).
	Username string
	Password string
	// DB selects the database of a Sentinel-managed master (a URL carries
	// its own; clusters have only 0).
	DB int

	// PoolSize is the most connections per server. Default the URL's
	// pool_size, else DefaultPoolSize.
	PoolSize int
	// DialTimeout, ReadTimeout, WriteTimeout and PoolTimeout default to the
	// URL's dial_timeout, read_timeout, write_timeout and pool_timeout if
	// given, else to DefaultDialTimeout, DefaultReadTimeout,
	// DefaultWriteTimeout and DefaultPoolTimeout. A context deadline shorter
	// than these wins.
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	PoolTimeout  time.Duration

	// TLSConfig, when set, makes every connection use TLS with it. With URL
	// it requires the rediss:// scheme (which alone enables TLS with
	// defaults).
	TLSConfig *tls.Config
}

// Dial returns a client for the Redis that opts describes: a *redis.Client
// for a URL or Sentinel, a *redis.ClusterClient for a cluster. It does not
// connect yet (the first command does). The client respects context
// deadlines, dials once per attempt, and never retries a command: a take
// retried after a timeout or a broken connection may run twice on Redis,
// which charges its buckets twice and can deny a request Redis had
// admitted. (go-redis checks a pooled connection before it reuses it, so a
// restarted Redis costs no failed call.)
func Dial(opts ClientOptions) (redis.UniversalClient, error) {
	set := 0
	if opts.URL != "" {
		set++
	}
	if opts.SentinelMaster != "" || len(opts.SentinelAddrs) > 0 {
		set++
	}
	if len(opts.ClusterAddrs) > 0 {
		set++
	}
	if set != 1 {
		return nil, errors.New("redisstore: set exactly one of URL, SentinelMaster (with SentinelAddrs) or ClusterAddrs")
	}
	var errs []error
	if opts.URL != "" {
		for _, f := range []struct {
			name string
			set  bool
		}{{"Username", opts.Username != ""}, {"Password", opts.Password != ""}, {"DB", opts.DB != 0}} {
			if f.set {
				errs = append(errs, fmt.Errorf("redisstore: %s is set with URL, which carries its own: put it in the URL", f.name))
			}
		}
	}
	if opts.SentinelMaster == "" && (opts.SentinelUsername != "" || opts.SentinelPassword != "") {
		errs = append(errs, errors.New("redisstore: SentinelUsername or SentinelPassword is set without SentinelMaster"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"DialTimeout", opts.DialTimeout}, {"ReadTimeout", opts.ReadTimeout}, {"WriteTimeout", opts.WriteTimeout}, {"PoolTimeout", opts.PoolTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("redisstore: %s %v: must not be negative", d.name, d.v))
		}
	}
	if opts.PoolSize < 0 {
		errs = append(errs, fmt.Errorf("redisstore: PoolSize %d: must not be negative", opts.PoolSize))
	}
	dial := orDefault(opts.DialTimeout, DefaultDialTimeout)
	read := orDefault(opts.ReadTimeout, DefaultReadTimeout)
	write := orDefault(opts.WriteTimeout, DefaultWriteTimeout)
	pool := orDefault(opts.PoolTimeout, DefaultPoolTimeout)
	const (
		maxRetries    = -1 // none: go-redis's -1 (0 means its default, 3)
		dialerRetries = 1
		// RESP2: nothing here uses what RESP3 adds (push notifications,
		// client-side caching, maps and doubles), and on RESP3 go-redis
		// checks for pending push notifications before every reply it
		// reads, about 1.5% of the server's CPU under load. It wins over a
		// URL's protocol parameter.
		protocol = 2
	)

	// What Sentinel and Cluster clients share.
	common := func() *redis.UniversalOptions {
		return &redis.UniversalOptions{
			Username:              opts.Username,
			Password:              opts.Password,
			PoolSize:              cmp.Or(opts.PoolSize, DefaultPoolSize),
			DialTimeout:           dial,
			ReadTimeout:           read,
			WriteTimeout:          write,
			PoolTimeout:           pool,
			MaxIdleConns:          DefaultMaxIdleConns,
			ContextTimeoutEnabled: true,
			Protocol:              protocol,
			MaxRetries:            maxRetries,
			DialerRetries:         dialerRetries,
			TLSConfig:             opts.TLSConfig,
		}
	}

	switch {
	case opts.URL != "":
		o, err := ParseURL(opts.URL)
		if err != nil {
			errs = append(errs, fmt.Errorf("redisstore: URL: %w", err))
			return nil, errors.Join(errs...)
		}
		if opts.TLSConfig != nil {
			if o.TLSConfig == nil {
				errs = append(errs, errors.New("redisstore: TLSConfig is set but URL uses redis://: use rediss://"))
			} else {
				tc := opts.TLSConfig.Clone()
				if tc.ServerName == "" {
					tc.ServerName = o.TLSConfig.ServerName
				}
				o.TLSConfig = tc
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		// Options set here win over the URL's query, which wins over the
		// defaults.
		o.PoolSize = cmp.Or(opts.PoolSize, o.PoolSize, DefaultPoolSize)
		o.DialTimeout = pick(opts.DialTimeout, o.DialTimeout, dial)
		o.ReadTimeout = pick(opts.ReadTimeout, o.ReadTimeout, read)
		o.WriteTimeout = pick(opts.WriteTimeout, o.WriteTimeout, write)
		o.PoolTimeout = pick(opts.PoolTimeout, o.PoolTimeout, pool)
		if o.MaxIdleConns == 0 { // the URL's max_idle_conns wins
			o.MaxIdleConns = DefaultMaxIdleConns
		}
		o.ContextTimeoutEnabled = true
		o.Protocol = protocol
		o.MaxRetries = maxRetries
		o.DialerRetries = dialerRetries
		return redis.NewClient(o), nil

	case opts.SentinelMaster != "" || len(opts.SentinelAddrs) > 0:
		if opts.SentinelMaster == "" {
			errs = append(errs, errors.New("redisstore: SentinelAddrs is set but SentinelMaster is empty"))
		}
		if len(opts.SentinelAddrs) == 0 {
			errs = append(errs, fmt.Errorf("redisstore: SentinelMaster %q is set but SentinelAddrs is empty", opts.SentinelMaster))
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		u := common()
		u.Addrs, u.MasterName = opts.SentinelAddrs, opts.SentinelMaster
		u.SentinelUsername, u.SentinelPassword = opts.SentinelUsername, opts.SentinelPassword
		u.DB = opts.DB
		return redis.NewFailoverClient(u.Failover()), nil

	default:
		if opts.DB != 0 {
			errs = append(errs, fmt.Errorf("redisstore: DB %d: a cluster has only database 0", opts.DB))
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		u := common()
		u.Addrs = opts.ClusterAddrs
		return redis.NewClusterClient(u.Cluster()), nil
	}
}

// redactedPassword stands for a URL's password in error messages.
const redactedPassword = "xxxxx"

// ParseURL is redis.ParseURL, whose errors can quote the whole URL or a
// piece of it (url.Parse's "invalid port" does), with errors that never
// contain the URL's password: they describe the URL with its password
// replaced by "xxxxx". The options it returns carry the real password.
func ParseURL(raw string) (*redis.Options, error) {
	o, err := redis.ParseURL(raw)
	if err == nil {
		return o, nil
	}
	redacted, ok := redactURL(raw)
	if !ok {
		return nil, err // no password in raw, so none in err
	}
	if _, rerr := redis.ParseURL(redacted); rerr != nil {
		return nil, rerr // the same mistake, found in the URL without its password
	}
	// Only the password was wrong: say so without quoting any of it.
	return nil, fmt.Errorf("the password in %s cannot be parsed: percent-encode its reserved characters (%%40 for @, %%2F for /, %%25 for %%)", redacted)
}

// redactURL returns raw with the password of its userinfo replaced by
// "xxxxx", and whether it has a password, for a raw that may not parse. The
// password is taken to run from the first ':' after "scheme://" to the last
// '@', wherever that is, so a password with an unencoded '@', '/' or '#' is
// hidden whole (along with whatever else lies before that '@').
func redactURL(raw string) (string, bool) {
	start := 0
	if i := strings.Index(raw, "://"); i >= 0 {
		start = i + len("://")
	} else if strings.HasPrefix(raw, "//") {
		start = len("//")
	}
	at := strings.LastIndex(raw[start:], "@")
	if at < 0 {
		return raw, false
	}
	at += start
	colon := strings.Index(raw[start:at], ":")
	if colon < 0 {
		return raw, false // a user name alone
	}
	colon += start
	return raw[:colon+1] + redactedPassword + raw[at:], true
}

// pick returns the first non-zero duration.
func pick(ds ...time.Duration) time.Duration {
	for _, d := range ds {
		if d != 0 {
			return d
		}
	}
	return 0
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
