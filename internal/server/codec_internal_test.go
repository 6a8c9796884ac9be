package server

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

func TestEscapeBytes(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{"é✓", "é✓"},
		{"a\xffb", `a\xffb`},
		{"\xe2\x9c", `\xe2\x9c`}, // a truncated ✓
		{"\x00\x7f", "\x00\x7f"},
	} {
		if got := string(escapeBytes([]byte("pre"), []byte(tc.in))); got != "pre"+tc.want {
			t.Errorf("escapeBytes(pre, %q) = %q, want %q", tc.in, got, "pre"+tc.want)
		}
		if got, want := len(tc.in)+3*invalidUTF8Bytes([]byte(tc.in)), len(tc.want); got != want {
			t.Errorf("len(%q) + 3*invalidUTF8Bytes = %d, want %d (the length of %q)", tc.in, got, want, tc.want)
		}
	}
}

// FuzzRequestCodec: whatever the bytes, the codec neither panics nor lets
// a string that is not UTF-8 through; what gRPC's codec decodes, it decodes
// the same.
func FuzzRequestCodec(f *testing.F) {
	valid, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "api@@", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k@@", Value: "v@@"}, {Key: "model", Value: "gpt"}}},
	}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add(bytes.ReplaceAll(valid, []byte("@@"), []byte("\xff\xfe")))
	f.Add([]byte{0x12, 0x05, 0x0a})
	// 40 bytes that are not UTF-8 escape to 160: the length prefix grows.
	f.Add(bytes.ReplaceAll(valid, []byte("@@"), bytes.Repeat([]byte{0xff}, 20)))
	plain := encoding.GetCodecV2("proto")
	codec := requestCodec{plain}
	f.Fuzz(func(t *testing.T, data []byte) {
		want := &rlsv3.RateLimitRequest{}
		werr := plain.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, want)
		got := &rlsv3.RateLimitRequest{}
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, got); err != nil {
			if werr == nil {
				t.Fatalf("codec refused what gRPC's decodes: %v", err)
			}
			return
		}
		md := got.ProtoReflect().Descriptor()
		if size, _, err := escapedSize(data, md, 0); err == nil {
			out, err := appendEscaped(nil, data, md, 0)
			if err != nil || len(out) != size || size > 4*len(data) {
				t.Fatalf("appendEscaped: %d bytes, %v; escapedSize %d, input %d", len(out), err, size, len(data))
			}
		}
		if werr == nil && !proto.Equal(got, want) {
			t.Fatalf("codec decoded %v, gRPC's %v", got, want)
		}
		for _, s := range append([]string{got.GetDomain()}, entryStrings(got)...) {
			if !utf8.ValidString(s) {
				t.Fatalf("decoded %q, not UTF-8", s)
			}
		}
	})
}

func entryStrings(req *rlsv3.RateLimitRequest) []string {
	var out []string
	for _, d := range req.GetDescriptors() {
		for _, e := range d.GetEntries() {
			out = append(out, e.GetKey(), e.GetValue())
		}
	}
	return out
}

// worstCaseRequest is a request whose strings are nearly all bytes that
// are not UTF-8: n descriptors of 4 entries whose values are 4,000 bytes of
// 0xff, 16,039 bytes each. Escaping makes each value 4 times as long. With
// 64 descriptors it is 1,026,501 bytes, near the default 1 MiB limit; with
// 261, 4,186,184 bytes, near maxEscapeSize.
func worstCaseRequest(t testing.TB, n int) []byte {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "api"}
	for range n {
		d := &ratelimitv3.RateLimitDescriptor{}
		for range 4 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: strings.Repeat("@", 4000)})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	wire, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.ReplaceAll(wire, []byte("@"), []byte("\xff"))
}

// unmarshalBytes is the bytes requestCodec.Unmarshal allocates, on
// average over a few calls, to decode data.
func unmarshalBytes(t testing.TB, data []byte) uint64 {
	t.Helper()
	codec := requestCodec{encoding.GetCodecV2("proto")}
	decode := func() {
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &rlsv3.RateLimitRequest{}); err != nil {
			t.Fatalf("Unmarshal(%d bytes): %v", len(data), err)
		}
	}
	decode() // warm up: pools, lazily built descriptors
	const calls = 5
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range calls {
		decode()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / calls
}

// TestEscapeAllocations: escaping a request whose strings are not UTF-8
// allocates a small multiple of its size (it was 58 times: 59 MB for the
// worst case below, inside the default 1 MiB message limit).
func TestEscapeAllocations(t *testing.T) {
	data := worstCaseRequest(t, 64)
	valid := bytes.ReplaceAll(data, []byte("\xff"), []byte("x"))
	largest := worstCaseRequest(t, 261)
	small, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client", Value: "c@@"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	small = bytes.ReplaceAll(small, []byte("@@"), []byte("\xff\xfe"))
	for _, tc := range []struct {
		name  string
		data  []byte
		check bool // allocates at most 12 times its size
	}{
		{"worst case", data, true},
		{"worst case near maxEscapeSize", largest, true},
		{"worst case made valid", valid, false},
		{"small", small, false},
		{"small made valid", bytes.ReplaceAll(small, []byte("\xff\xfe"), []byte("ok")), false},
	} {
		got := unmarshalBytes(t, tc.data)
		t.Logf("Unmarshal(%s, %d bytes) allocated %d bytes (%.1f times)", tc.name, len(tc.data), got, float64(got)/float64(len(tc.data)))
		if limit := 12 * uint64(len(tc.data)); tc.check && got > limit {
			t.Errorf("Unmarshal(%s, %d bytes) allocated %d bytes (%.1f times), want at most %d (12 times)",
				tc.name, len(tc.data), got, float64(got)/float64(len(tc.data)), limit)
		}
	}
}

// TestEscapeLimits: a request up to maxEscapeSize is escaped, however
// much it grows; a larger one is refused as gRPC's codec refuses it.
func TestEscapeLimits(t *testing.T) {
	codec := requestCodec{encoding.GetCodecV2("proto")}
	data := worstCaseRequest(t, 64)
	req := &rlsv3.RateLimitRequest{}
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, req); err != nil {
		t.Fatalf("Unmarshal(worst case): %v", err)
	}
	values := entryStrings(req)
	if want := strings.Repeat(`\xff`, 4000); len(values) != 2*64*4 || values[1] != want || values[len(values)-1] != want {
		t.Errorf("Unmarshal(worst case): %d strings, the last %.20q…, want 512, values %.20q…", len(values), values[len(values)-1], want)
	}

	// One value of \xff then n bytes, in a request of n + overhead bytes.
	wire := func(n int) []byte {
		req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "@" + strings.Repeat("v", n)}}},
		}}
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Replace(b, []byte("@"), []byte("\xff"), 1)
	}
	n := maxEscapeSize - (len(wire(1<<21)) - 1<<21) // length prefixes are 4 bytes long from 2 MiB to 256 MiB
	if got := len(wire(n)); got != maxEscapeSize {
		t.Fatalf("len(wire(%d)) = %d, want maxEscapeSize %d", n, got, maxEscapeSize)
	}
	for _, tc := range []struct {
		data []byte
		ok   bool
	}{{wire(n), true}, {wire(n + 1), false}} {
		err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.data)}, &rlsv3.RateLimitRequest{})
		if (err == nil) != tc.ok {
			t.Errorf("Unmarshal(%d bytes, maxEscapeSize %d): %v, want ok %v", len(tc.data), maxEscapeSize, err, tc.ok)
		}
	}
}
