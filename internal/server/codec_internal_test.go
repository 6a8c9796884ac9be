package server

import (
	"bytes"
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
		if got := escapeBytes([]byte(tc.in)); got != tc.want {
			t.Errorf("escapeBytes(%q) = %q, want %q", tc.in, got, tc.want)
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
