package main

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// benchDomain is the domain of every request and of the descriptor file.
const benchDomain = "bench"

// benchConfig is the descriptor file the mixes expect, config/bench.yaml,
// which says what each rule is for. --write-config writes it.
//
//go:embed config/bench.yaml
var benchConfig string

// writeConfig writes benchConfig as DIR/bench.yaml and returns its path.
func writeConfig(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("write config: %w", err)
	}
	path := filepath.Join(dir, "bench.yaml")
	if err := os.WriteFile(path, []byte(benchConfig), 0o644); err != nil {
		return "", fmt.Errorf("write config: %w", err)
	}
	return path, nil
}

// Mix names the traffic a load sends. The zero value is invalid.
type Mix int

const (
	// MixMixed is the realistic mix: one descriptor per request. Most have
	// 1–3 entries (client, then route, then method; the client drawn
	// Zipf-like from the keyspace, routes Zipf-like from 16, methods
	// uniformly from 4) and are admitted; a share (overLimitShare) is
	// [abuser=<value drawn Zipf-like from the keyspace>], whose buckets are
	// exhausted once primed.
	MixMixed Mix = iota + 1
	// MixHot sends every request to one exhausted bucket (hot=key): the
	// over-limit hot key.
	MixHot
	// MixHotAdmitted sends every request to one bucket that admits them
	// all (model=shared, a million a second): the hot bucket of an LLM
	// fleet, one model's global limit in front of every request.
	MixHotAdmitted
)

// mixNames are the names of the mixes, as --mix takes them and results
// show them, in the order of the Mix constants.
var mixNames = []struct {
	mix  Mix
	name string
}{
	{MixMixed, "mixed"},
	{MixHot, "hot-key"},
	{MixHotAdmitted, "hot-admitted"},
}

func (m Mix) String() string {
	for _, n := range mixNames {
		if n.mix == m {
			return n.name
		}
	}
	return "invalid"
}

// parseMix returns the Mix named s.
func parseMix(s string) (Mix, error) {
	for _, n := range mixNames {
		if n.name == s {
			return n.mix, nil
		}
	}
	return 0, fmt.Errorf("unknown mix %q (want mixed, hot-key or hot-admitted)", s)
}

// mixParams shape a Mix.
type mixParams struct {
	mix            Mix
	keyspace       int     // distinct first-entry values
	overLimitShare float64 // of requests sent to exhausted rules
	zipfS          float64 // Zipf exponent, > 1
	// domain is the requests' domain; "" means benchDomain.
	domain string
}

// domainName is the requests' domain.
func (p mixParams) domainName() string {
	if p.domain == "" {
		return benchDomain
	}
	return p.domain
}

// vocabulary is the read-only set of values the mixers draw from, built
// once so that generating a request allocates nothing.
type vocabulary struct {
	values  []string
	routes  []string
	methods []string
}

func newVocabulary(keyspace int) *vocabulary {
	v := &vocabulary{
		values:  make([]string, keyspace),
		routes:  make([]string, 16),
		methods: []string{"GET", "POST", "PUT", "DELETE"},
	}
	for i := range v.values {
		v.values[i] = "tenant-" + strconv.Itoa(i)
	}
	for i := range v.routes {
		v.routes[i] = "/api/v1/resource" + strconv.Itoa(i)
	}
	return v
}

// mixer generates one worker's requests. It reuses a single request
// message: gRPC has marshalled it by the time ShouldRateLimit returns. It is
// not safe for concurrent use.
type mixer struct {
	p       mixParams
	voc     *vocabulary
	rng     *rand.Rand
	values  *rand.Zipf
	routes  *rand.Zipf
	req     *rlsv3.RateLimitRequest
	desc    *ratelimitv3.RateLimitDescriptor
	entries [3]*ratelimitv3.RateLimitDescriptor_Entry
}

func newMixer(p mixParams, voc *vocabulary, seed uint64) *mixer {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	m := &mixer{
		p:      p,
		voc:    voc,
		rng:    rng,
		values: rand.NewZipf(rng, p.zipfS, 1, uint64(len(voc.values)-1)),
		routes: rand.NewZipf(rng, p.zipfS, 1, uint64(len(voc.routes)-1)),
		desc:   &ratelimitv3.RateLimitDescriptor{},
	}
	for i := range m.entries {
		m.entries[i] = &ratelimitv3.RateLimitDescriptor_Entry{}
	}
	m.req = &rlsv3.RateLimitRequest{Domain: p.domainName(), Descriptors: []*ratelimitv3.RateLimitDescriptor{m.desc}}
	switch p.mix {
	case MixHot:
		m.entries[0].Key, m.entries[0].Value = "hot", "key"
		m.desc.Entries = m.entries[:1]
	case MixHotAdmitted:
		m.entries[0].Key, m.entries[0].Value = "model", "shared"
		m.desc.Entries = m.entries[:1]
	}
	return m
}

// next returns the next request (the same message, rewritten) and whether
// it was aimed at an exhausted rule.
func (m *mixer) next() (req *rlsv3.RateLimitRequest, aimedOver bool) {
	switch m.p.mix {
	case MixHot:
		return m.req, true
	case MixHotAdmitted:
		return m.req, false
	}
	n := 1 + m.rng.IntN(3)
	aimedOver = m.rng.Float64() < m.p.overLimitShare
	m.entries[0].Key = "client"
	if aimedOver {
		m.entries[0].Key = "abuser"
		n = 1
	}
	m.entries[0].Value = m.voc.values[m.values.Uint64()]
	m.entries[1].Key, m.entries[1].Value = "route", m.voc.routes[m.routes.Uint64()]
	m.entries[2].Key, m.entries[2].Value = "method", m.voc.methods[m.rng.IntN(len(m.voc.methods))]
	m.desc.Entries = m.entries[:n]
	return m.req, aimedOver
}

// prime spends the single token of every abuser bucket of domain (one call per
// keyspace value, from conc goroutines), so that the traffic aimed over the
// limit is over it from the first measured call. It is best effort: a call
// that fails is retried twice, then counted in failed. It is bounded by the
// keyspace, the retries and ctx (at most a minute).
func prime(ctx context.Context, client rlsv3.RateLimitServiceClient, domain string, voc *vocabulary, conc int) (failed int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var next, fails atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			entry := &ratelimitv3.RateLimitDescriptor_Entry{Key: "abuser"}
			req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{entry}},
			}}
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(voc.values) {
					return
				}
				entry.Value = voc.values[i]
				for try := 0; ; try++ {
					if _, err := client.ShouldRateLimit(ctx, req); err == nil {
						break
					}
					if try == 2 || ctx.Err() != nil {
						fails.Add(1)
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return fails.Load(), fmt.Errorf("prime: %w", err)
	}
	return fails.Load(), nil
}
