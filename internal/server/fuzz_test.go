package server_test

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// fuzzReader hands out the fuzzer's bytes; past the end it gives zeros.
type fuzzReader struct{ data []byte }

func (r *fuzzReader) byte() byte {
	if len(r.data) == 0 {
		return 0
	}
	b := r.data[0]
	r.data = r.data[1:]
	return b
}

func (r *fuzzReader) bytes(n int) []byte {
	n = min(n, len(r.data))
	b := r.data[:n]
	r.data = r.data[n:]
	return b
}

func (r *fuzzReader) uint32() uint32 {
	var b [4]byte
	copy(b[:], r.bytes(4))
	return binary.LittleEndian.Uint32(b[:])
}

// str returns a string from vocab when the next byte is below 64, else the
// next (byte − 64) raw bytes: any bytes at all, NUL and invalid UTF-8 too.
func (r *fuzzReader) str(vocab []string) string {
	b := r.byte()
	if b < 64 {
		return vocab[int(b)%len(vocab)]
	}
	return string(r.bytes(int(b) - 64))
}

var (
	fuzzKeys   = []string{"model", "client", "plan", "ip", "shadow", "internal", "", "color"}
	fuzzValues = []string{"gpt-4o", "llama", "free", "trial", "10.0.0.66", "", "acme"}
)

// Flags of a descriptor in the fuzz encoding.
const (
	fuzzHits     = 1 << iota // a hits_addend follows
	fuzzOverride             // a limit override follows
	fuzzMult                 // the override has a unit_multiplier
	fuzzNegative             // is_negative_hits
)

// fuzzRequest builds a request from the fuzzer's bytes: a descriptor count,
// then per descriptor an entry count, the entries (key, value) and a flags
// byte saying what else follows.
func fuzzRequest(domain string, data []byte, hits uint32) *rlsv3.RateLimitRequest {
	r := &fuzzReader{data: data}
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for range r.byte() % 10 {
		d := &ratelimitv3.RateLimitDescriptor{}
		for range r.byte() % 6 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: r.str(fuzzKeys), Value: r.str(fuzzValues)})
		}
		flags := r.byte()
		if flags&fuzzHits != 0 {
			// Small counts mostly, any uint32 sometimes, shifted up to 2^63.
			d.HitsAddend = wrapperspb.UInt64(uint64(r.uint32()) << (r.byte() % 32))
		}
		if flags&fuzzOverride != 0 {
			o := &ratelimitv3.RateLimitDescriptor_RateLimitOverride{
				RequestsPerUnit: r.uint32(),
				Unit:            typev3.RateLimitUnit(r.byte() % 10), // includes UNKNOWN and undefined values
			}
			if flags&fuzzMult != 0 {
				o.UnitMultiplier = wrapperspb.UInt32(r.uint32())
			}
			d.Limit = o
		}
		d.IsNegativeHits = flags&fuzzNegative != 0
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// fuzzEncode is fuzzRequest's inverse for seeds: descriptors of key-value
// pairs, written raw, with flags byte 0.
func fuzzEncode(descs ...[]string) []byte {
	b := []byte{byte(len(descs))}
	for _, kv := range descs {
		b = append(b, byte(len(kv)/2))
		for _, s := range kv {
			b = append(b, byte(64+len(s)))
			b = append(b, s...)
		}
		b = append(b, 0)
	}
	return b
}

// switchable serves the Server of the current fuzz input, so that one gRPC
// server serves them all.
type switchable struct {
	rlsv3.UnimplementedRateLimitServiceServer
	srv atomic.Pointer[server.Server]
}

func (s *switchable) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.srv.Load().ShouldRateLimit(ctx, req)
}

// checkAnswer fails unless the answer to req is one Envoy can use: an
// InvalidArgument or Unavailable error, or one status per descriptor with
// OK and OVER_LIMIT codes only.
func checkAnswer(t *testing.T, how string, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse, err error) {
	t.Helper()
	valid := func(c rlsv3.RateLimitResponse_Code) bool {
		return c == rlsv3.RateLimitResponse_OK || c == rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if err != nil {
		if c := status.Code(err); c != codes.InvalidArgument && c != codes.Unavailable {
			t.Fatalf("%s: error %v, want InvalidArgument or Unavailable", how, err)
		}
		return
	}
	if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
		t.Fatalf("%s: %d statuses for %d descriptors", how, len(resp.GetStatuses()), len(req.GetDescriptors()))
	}
	if !valid(resp.GetOverallCode()) {
		t.Fatalf("%s: overall code %v", how, resp.GetOverallCode())
	}
	for i, st := range resp.GetStatuses() {
		if !valid(st.GetCode()) {
			t.Fatalf("%s: statuses[%d].code %v", how, i, st.GetCode())
		}
	}
}

// FuzzShouldRateLimit sends arbitrary requests: arbitrary domains, entries
// of arbitrary bytes (NUL, invalid UTF-8, the key separator), any
// hits_addend, overrides with any unit and multiplier. Each is answered by a
// fresh Server in process and, when protobuf can marshal it (strings must be
// UTF-8 on the wire), again through a real gRPC connection. The answer must
// be InvalidArgument or Unavailable, or one OK/OVER_LIMIT status per
// descriptor; both paths must agree on the error code; and the store must
// hold at most one bucket per descriptor (memory stays bounded).
func FuzzShouldRateLimit(f *testing.F) {
	set := server.MustParse(f, testConfig)
	now := clocktest.New().Now
	limits := server.RequestLimits{MaxDescriptors: 8, MaxEntries: 4, MaxKeyBytes: 100, MaxValueBytes: 150, MaxDomainBytes: 64, MaxHits: 1 << 20}

	sw := &switchable{}
	client := servertest.Start(f, servertest.Options{RateLimit: sw, ServerOptions: []grpc.ServerOption{server.Codec()}}).Client()

	f.Add("api", fuzzEncode([]string{"model", "gpt-4o"}), uint32(0))
	f.Add("api", fuzzEncode([]string{"model", "gpt-4o"}, []string{"model", "gpt-4o", "client", "acme"}, []string{"plan", "free"}), uint32(1))
	f.Add("api", fuzzEncode([]string{"plan", "free"}, []string{"plan", "trial"}, []string{"shadow", "x"}, []string{"internal", "x"}), uint32(3))
	f.Add("api", fuzzEncode([]string{"ip", "10.0.0.66"}, []string{"model", "llama"}), uint32(0))
	f.Add("api", fuzzEncode([]string{"model", "a\x00b"}, []string{"model", "\xff\xfe"}, []string{"client", "a|b:c"}), uint32(2))
	f.Add("ai-gateway", fuzzEncode([]string{"model", "claude-sonnet"}), uint32(1_000_000))
	// An override of 2 per hour with hits_addend 1, and one with a unit
	// multiplier of 3 minutes.
	f.Add("api", []byte{2, 1, 0, 0, fuzzHits | fuzzOverride, 1, 0, 0, 0, 0, 2, 0, 0, 0, 3,
		1, 1, 6, fuzzOverride | fuzzMult, 5, 0, 0, 0, 2, 3, 0, 0, 0}, uint32(0))
	f.Add("", []byte{}, uint32(0))

	f.Fuzz(func(t *testing.T, domain string, data []byte, hits uint32) {
		req := fuzzRequest(domain, data, hits)
		store := limiter.NewMemoryStore(limiter.MemoryOptions{Shards: 4})
		opts := server.Options{Store: store, Now: now, Limits: limits}
		if len(data)%2 == 1 {
			// Every descriptor in quota mode (settle's refunds), and the
			// incumbent's whole dynamic metadata.
			opts.QuotaMode, opts.DescriptorMetadata = server.QuotaModeAll, server.DescriptorMetadataIncumbent
		}
		srv, err := server.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		srv.SetConfig(set)

		resp, err := srv.ShouldRateLimit(context.Background(), req)
		checkAnswer(t, "in process", req, resp, err)
		if _, merr := proto.Marshal(req); merr == nil {
			sw.srv.Store(srv)
			wresp, werr := client.ShouldRateLimit(context.Background(), req)
			checkAnswer(t, "over gRPC", req, wresp, werr)
			if status.Code(werr) != status.Code(err) {
				t.Fatalf("in process: %v; over gRPC: %v; want the same code", err, werr)
			}
		}
		if n := store.Len(); n > len(req.GetDescriptors()) {
			t.Fatalf("store holds %d buckets after a request of %d descriptors", n, len(req.GetDescriptors()))
		}
	})
}
