package servertest

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/config"
)

// OutcomesConfig has, in domain api, a rule for each way a descriptor's
// outcome can go: blocked (requests_per_unit 0), trial (the same, in shadow
// mode), free (unlimited), a (100 a minute) and b (1 a minute). The tests
// of what the observers count (metrics, the /limits page) share it.
const OutcomesConfig = `
domain: api
descriptors:
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0, name: blocked}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0, name: trial}
  - key: free
    rate_limit: {unlimited: true, name: free}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 100, name: a}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1, name: b}
`

// WithHits is the descriptor key=value asking for hits tokens (its
// hits_addend set, so 0 is a check).
func WithHits(key, value string, hits uint64) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{
		Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
		HitsAddend: wrapperspb.UInt64(hits),
	}
}

// Desc is the descriptor of the entries kv, read as key, value, key,
// value, … in order (a last key without a value is left out), with no
// hits_addend: Desc("model", "gpt-4o", "client", "a").
func Desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// Entries is the config entries of kv, read as Desc reads it (key, value,
// key, value, …; a last key without a value is left out): what
// config.Set.Lookup takes for the descriptor Desc(kv...). It is nil
// without a pair.
func Entries(kv ...string) []config.Entry {
	var entries []config.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		entries = append(entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return entries
}

// Request is the RateLimitRequest of domain with descs, in order, and no
// hits_addend: Request("api", Desc("client", "a")) is one call of client a.
func Request(domain string, descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs}
}

// ParseConfig is the config of one descriptor file, name, holding yaml.
// It fails the test if yaml does not parse.
func ParseConfig(t testing.TB, name, yaml string) *config.Set {
	t.Helper()
	set, err := config.Parse([]config.File{{Name: name, Data: []byte(yaml)}})
	if err != nil {
		t.Fatalf("servertest: parse %s: %v", name, err)
	}
	return set
}
