package server_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// keyStore records the bucket keys it is asked for.
type keyStore struct {
	*limiter.MemoryStore
	mu   sync.Mutex
	keys []string
}

func (s *keyStore) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	s.mu.Lock()
	for _, r := range reqs {
		s.keys = append(s.keys, r.Key)
	}
	s.mu.Unlock()
	return s.MemoryStore.Take(ctx, now, reqs)
}

// entryValues is every observed entry's value in c, in order.
func entryValues(c server.Call) []string {
	var values []string
	for _, d := range c.Descriptors {
		for _, e := range d.Descriptor.GetEntries() {
			values = append(values, e.GetValue())
		}
	}
	return values
}

// TestLongValuesAreLimited: a value longer than MaxValueBytes (a client can
// put kilobytes in a header Envoy turns into a value) is limited like any
// other, each distinct value in its own bucket, rather than refused with
// INVALID_ARGUMENT, which Envoy lets through by default. It is matched as
// it is (a prefix rule still applies to it), while the bucket key and what
// observers see hold a bounded stand-in, and the caller's request is left
// as it was.
func TestLongValuesAreLimited(t *testing.T) {
	store := &keyStore{MemoryStore: limiter.NewMemoryStore(limiter.MemoryOptions{})}
	obs := &recorder[[]string]{keep: entryValues}
	c, _ := startServer(t, server.Options{Store: store, Observer: obs, Now: clocktest.New().Now,
		Limits: server.RequestLimits{MaxValueBytes: 100}}, server.MustParse(t, `
domain: api
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: team
    value: "red*"
    rate_limit: {unit: minute, requests_per_unit: 1}
`))
	// 5,121 bytes whose 64th byte starts a two-byte rune: the stand-in's
	// prefix must stop before it.
	long := "a" + strings.Repeat("é", 60) + strings.Repeat("x", 5000)
	other := "a" + strings.Repeat("é", 60) + strings.Repeat("y", 5000) // same first 64 bytes
	ask := func(key, value string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		req := request("api", desc(key, value))
		resp, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatalf("%s of %d bytes: %v", key, len(value), err)
		}
		return resp.GetOverallCode()
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
		if got := ask("client", long); got != want {
			t.Errorf("call %d with a long client: %v, want %v (2 a minute)", i+1, got, want)
		}
	}
	if got := ask("client", other); got != ok {
		t.Errorf("another long client: %v, want OK (a bucket of its own)", got)
	}
	if got := ask("client", long[:99]+"b"); got != ok {
		t.Errorf("a client of exactly MaxValueBytes: %v, want OK (its value as it is)", got)
	}
	// The prefix rule matches the whole value: 1 a minute, then denied.
	red := "red" + strings.Repeat("z", 300)
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, over} {
		if got := ask("team", red); got != want {
			t.Errorf("call %d with a long red team: %v, want %v (the red* rule, 1 a minute)", i+1, got, want)
		}
	}

	store.mu.Lock()
	defer store.mu.Unlock()
	for _, k := range store.keys {
		if len(k) > 200 || strings.Contains(k, "xxxxxxxx") {
			t.Errorf("bucket key of %d bytes holds the long value: %.80q…", len(k), k)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	values := slices.Concat(obs.calls...)
	for _, v := range values {
		if len(v) > 200 || !utf8.ValidString(v) {
			t.Errorf("observer saw a value of %d bytes (valid UTF-8: %v): %.80q…", len(v), utf8.ValidString(v), v)
		}
	}
	if len(values) == 0 || !strings.Contains(values[0], "5121 bytes, sha256:") {
		t.Errorf("observed %d values: want the stand-in of the long client first", len(values))
	}
}

// TestLongValuesLeaveTheRequestAlone: the server replaces long values in
// its own copy, never in the caller's request (an in-process caller may
// reuse it).
func TestLongValuesLeaveTheRequestAlone(t *testing.T) {
	srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), Now: clocktest.New().Now,
		Limits: server.RequestLimits{MaxValueBytes: 10}})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetConfig(server.MustParse(t, testConfig))
	long := strings.Repeat("c", 11)
	req := request("api", desc("model", "gpt-4o"), desc("client", long))
	if _, err := srv.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if got := req.GetDescriptors()[1].GetEntries()[0].GetValue(); got != long {
		t.Errorf("the request's value became %q", got)
	}
}
