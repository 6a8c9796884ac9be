package server_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// benchConfig has generous rules (they never deny under a benchmark whose
// clock advances 1µs a call) on three keys, and one exhausted rule.
const benchConfig = `
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000, name: client}
    descriptors:
      - key: route
        rate_limit: {unit: second, requests_per_unit: 1000000, name: client-route}
  - key: route
    rate_limit: {unit: second, requests_per_unit: 1000000, name: route}
  - key: model
    value: gpt-4o
    rate_limit: {unit: second, requests_per_unit: 1000000, name: gpt-4o}
  - key: hot
    value: key
    rate_limit: {unit: hour, requests_per_unit: 1, name: hot}
`

// benchClock advances by one microsecond each time it is read, so buckets
// refill as they would under steady traffic. It is safe for concurrent use.
type benchClock struct{ us atomic.Int64 }

func (c *benchClock) Now() time.Time {
	return time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).Add(time.Duration(c.us.Add(1)) * time.Microsecond)
}

// benchServer is a server on the memory store and a benchClock, with
// benchConfig in force, that reports to obs (none if nil).
func benchServer(tb testing.TB, obs server.Observer) *server.Server {
	tb.Helper()
	srv, err := server.New(server.Options{
		Store:    limiter.NewMemoryStore(limiter.MemoryOptions{}),
		Now:      new(benchClock).Now,
		Observer: obs,
	})
	if err != nil {
		tb.Fatalf("server.New: %v", err)
	}
	srv.SetConfig(servertest.ParseConfig(tb, "bench.yaml", benchConfig))
	return srv
}

// handlerCases are the requests BenchmarkShouldRateLimit and
// BenchmarkMarshalAnswer send, with the answer each must get.
var handlerCases = []struct {
	name string
	req  *rlsv3.RateLimitRequest
	want rlsv3.RateLimitResponse_Code
}{
	{"one-descriptor", &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("client", "tenant-4711"),
	}}, rlsv3.RateLimitResponse_OK},
	{"three-descriptors", &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("client", "tenant-4711", "route", "/v1/chat/completions"),
		desc("route", "/v1/chat/completions"),
		desc("model", "gpt-4o"),
	}}, rlsv3.RateLimitResponse_OK},
	{"one-descriptor-over-limit", &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("hot", "key"),
	}}, rlsv3.RateLimitResponse_OVER_LIMIT},
	{"no-rule", &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("unknown", "x"),
	}}, rlsv3.RateLimitResponse_OK},
}

// benchHandler runs each of handlerCases as a sub-benchmark: the call and
// a check of its answer, then, unless nil, then on the answer.
func benchHandler(b *testing.B, then func(*rlsv3.RateLimitResponse) error) {
	for _, bm := range handlerCases {
		b.Run(bm.name, func(b *testing.B) {
			srv := benchServer(b, nil)
			ctx := context.Background()
			// One call first: it empties the hot bucket of the over-limit case.
			if _, err := srv.ShouldRateLimit(ctx, bm.req); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := srv.ShouldRateLimit(ctx, bm.req)
				if err != nil {
					b.Fatal(err)
				}
				if got := resp.GetOverallCode(); got != bm.want {
					b.Fatalf("ShouldRateLimit = %v, want %v", got, bm.want)
				}
				if then != nil {
					if err := then(resp); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkShouldRateLimit calls Server.ShouldRateLimit in-process on the
// memory store: the cost of a decision without gRPC's own (decoding,
// encoding, transport). The target is at most 10 allocations per
// single-descriptor decision.
func BenchmarkShouldRateLimit(b *testing.B) {
	benchHandler(b, nil)
}

// BenchmarkMarshalAnswer is BenchmarkShouldRateLimit plus the encoding
// gRPC does to every answer: what a decision costs up to the bytes on the
// wire, without the transport.
func BenchmarkMarshalAnswer(b *testing.B) {
	benchHandler(b, func(resp *rlsv3.RateLimitResponse) error {
		_, err := proto.Marshal(resp)
		return err
	})
}

// BenchmarkShouldRateLimitParallel is the one-descriptor case from every P
// at once, over 10,000 clients: what the server costs under concurrency.
func BenchmarkShouldRateLimitParallel(b *testing.B) {
	srv := benchServer(b, nil)
	ctx := context.Background()
	clients := make([]string, 10_000)
	for i := range clients {
		clients[i] = "tenant-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676%26))
	}
	var worker atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := int(worker.Add(1)) * 7919
		entry := &ratelimitv3.RateLimitDescriptor_Entry{Key: "client"}
		req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{entry}},
		}}
		for pb.Next() {
			i = (i + 1) % len(clients)
			entry.Value = clients[i]
			if _, err := srv.ShouldRateLimit(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// discardObserver is an Observer that keeps nothing.
type discardObserver struct{}

func (discardObserver) ObserveCall(server.Call) {}

// TestObservingAllocatesOnlyTheOutcomes: an observer costs a call one
// allocation, the slice of its descriptors' outcomes, whatever the
// answer (the guard's check once allocated on every call).
func TestObservingAllocatesOnlyTheOutcomes(t *testing.T) {
	allocs := func(obs server.Observer, req *rlsv3.RateLimitRequest) float64 {
		srv := benchServer(t, obs)
		return testing.AllocsPerRun(100, func() {
			if _, err := srv.ShouldRateLimit(context.Background(), req); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, tc := range handlerCases {
		without, with := allocs(nil, tc.req), allocs(discardObserver{}, tc.req)
		if with > without+1 {
			t.Errorf("%s: %v allocations a call with an observer, %v without; want at most one more", tc.name, with, without)
		}
	}
}
