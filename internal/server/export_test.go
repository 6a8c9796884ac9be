package server

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// MustParse parses yaml as one descriptor file, test.yaml, failing t if
// it does not parse. It is here, in the package, so that the internal and
// the external tests share it.
func MustParse(t testing.TB, yaml string) *config.Set {
	t.Helper()
	return servertest.ParseConfig(t, "test.yaml", yaml)
}

// LeasePoolName is the pool that descriptor d of domain holds its lease
// in under the config in force, or "" if no concurrency rule matches.
func (s *Server) LeasePoolName(t testing.TB, domain string, d *ratelimitv3.RateLimitDescriptor) string {
	t.Helper()
	entries := toEntries(nil, d)
	r := s.Config().Lookup(domain, entries)
	if r == nil || r.Kind != config.KindConcurrency {
		return ""
	}
	return string(r.AppendPool(nil, entries))
}
