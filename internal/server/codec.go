package server

import (
	"errors"
	"fmt"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Codec is the gRPC server option ratelimitd's gRPC server needs: gRPC's
// own protobuf codec, except for a RateLimitRequest that is not valid
// UTF-8. Protobuf-go refuses such a request (proto3 strings must be UTF-8)
// and gRPC answers INTERNAL, which Envoy treats as a failure: with the
// default failure_mode_deny: false, the request passes unlimited. Envoy
// does send such bytes (a header value may hold bytes 0x80–0xFF, and
// Envoy's C++ protobuf does not check), so a client could slip past every
// limit by putting one in a header a descriptor is built from. Such a
// request is instead decoded with each byte that is not UTF-8 written as
// \xNN (so distinct values stay distinct, except from a value that spells
// \xNN itself, which then shares its bucket: stricter, never looser).
func Codec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(requestCodec{encoding.GetCodecV2("proto")})
}

// requestCodec wraps gRPC's protobuf codec (see Codec); valid messages go
// through it unchanged, on its buffers.
type requestCodec struct{ encoding.CodecV2 }

func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	req, ok := v.(*rlsv3.RateLimitRequest)
	if err == nil || !ok {
		return err
	}
	fixed, changed, ferr := escapeInvalidUTF8(nil, data.Materialize(), req.ProtoReflect().Descriptor())
	if ferr != nil || !changed {
		return err
	}
	proto.Reset(req)
	if err2 := proto.Unmarshal(fixed, req); err2 != nil {
		return fmt.Errorf("after escaping bytes that are not UTF-8: %w", errors.Join(err, err2))
	}
	return nil
}

// maxEscapeDepth bounds the nesting escapeInvalidUTF8 follows (a request
// is three deep: request, descriptor, entry).
const maxEscapeDepth = 8

// escapeInvalidUTF8 appends to dst the message b of type md with every
// string field, at any depth, made valid UTF-8 by writing each byte that
// is not as \xNN. changed reports whether anything was rewritten.
func escapeInvalidUTF8(dst, b []byte, md protoreflect.MessageDescriptor) (out []byte, changed bool, err error) {
	return escapeAt(dst, b, md, 0)
}

func escapeAt(dst, b []byte, md protoreflect.MessageDescriptor, depth int) ([]byte, bool, error) {
	if depth > maxEscapeDepth {
		return nil, false, errors.New("message nested too deep")
	}
	changed := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, protowire.ParseError(n)
		}
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil || (fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.MessageKind) {
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				return nil, false, protowire.ParseError(m)
			}
			dst = append(dst, b[:n+m]...)
			b = b[n+m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return nil, false, protowire.ParseError(m)
		}
		b = b[n+m:]
		dst = protowire.AppendTag(dst, num, typ)
		switch {
		case fd.Kind() == protoreflect.MessageKind:
			inner, c, err := escapeAt(nil, v, fd.Message(), depth+1)
			if err != nil {
				return nil, false, err
			}
			dst = protowire.AppendBytes(dst, inner)
			changed = changed || c
		case utf8.Valid(v):
			dst = protowire.AppendBytes(dst, v)
		default:
			dst = protowire.AppendString(dst, escapeBytes(v))
			changed = true
		}
	}
	return dst, changed, nil
}

// escapeBytes is s with each byte that is not part of valid UTF-8 written
// as \xNN.
func escapeBytes(s []byte) string {
	const hex = "0123456789abcdef"
	out := make([]byte, 0, len(s)+8)
	for len(s) > 0 {
		r, size := utf8.DecodeRune(s)
		if r == utf8.RuneError && size == 1 {
			out = append(out, '\\', 'x', hex[s[0]>>4], hex[s[0]&15])
		} else {
			out = append(out, s[:size]...)
		}
		s = s[size:]
	}
	return string(out)
}
