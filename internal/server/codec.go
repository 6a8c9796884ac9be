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
//
// Escaping a request allocates a small multiple of its size: the escaped
// copy (at most 4 times the request, as \xNN is 4 bytes for 1) and what
// decoding that copy allocates. A request larger than 4 MiB (four times
// the default --max-message-bytes, and gRPC's own default limit) is not
// escaped, nor is one whose escaped copy would exceed 4 times its size
// (which only a mistake in this file could cause): it is refused as
// before, INTERNAL.
func Codec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(requestCodec{encoding.GetCodecV2("proto")})
}

// requestCodec wraps gRPC's protobuf codec (see Codec); valid messages go
// through it unchanged, on its buffers.
type requestCodec struct{ encoding.CodecV2 }

func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*sizedRequest); ok {
		return c.unmarshalSized(data, r)
	}
	err := c.CodecV2.Unmarshal(data, v)
	req, ok := v.(*rlsv3.RateLimitRequest)
	if err == nil || !ok {
		return err
	}
	// As gRPC's codec does: no copy when data is one buffer, as gRPC
	// receives a message.
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	fixed := escapeInvalidUTF8(buf.ReadOnlyData(), req.ProtoReflect().Descriptor())
	if fixed == nil {
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

// maxEscapeSize is the largest message escapeInvalidUTF8 escapes, in
// bytes (see Codec): 4 MiB, four times the default --max-message-bytes.
// Escaping one that large allocates under 40 MB (TestEscapeAllocations).
const maxEscapeSize = 4 << 20

// escapeInvalidUTF8 is the message b of type md with every string field,
// at any depth, made valid UTF-8 by writing each byte that is not as
// \xNN, in a buffer allocated once at its exact size. It is nil if there
// is nothing to escape, if b does not parse or nests deeper than
// maxEscapeDepth, if b is larger than maxEscapeSize, or if the result
// would be more than 4 times larger than b.
//
// Fields are copied as they are except the string and message fields of
// md, whose tags and length prefixes are written anew; a length prefix
// grows by at most a byte when its field grows, so the result is never
// more than 4 times larger than b.
func escapeInvalidUTF8(b []byte, md protoreflect.MessageDescriptor) []byte {
	if len(b) > maxEscapeSize {
		return nil
	}
	size, changed, err := escapedSize(b, md, 0)
	if err != nil || !changed || size > 4*len(b) {
		return nil
	}
	out, err := appendEscaped(make([]byte, 0, size), b, md, 0)
	if err != nil || len(out) != size {
		return nil
	}
	return out
}

var errTooDeep = errors.New("message nested too deep")

// rewrittenField is the field of md that escapedSize and appendEscaped
// rewrite for a tag (num, typ): a string or message field, on the wire as
// bytes. It is nil for any other field, which is copied as it is.
func rewrittenField(md protoreflect.MessageDescriptor, num protowire.Number, typ protowire.Type) protoreflect.FieldDescriptor {
	if typ != protowire.BytesType {
		return nil
	}
	fd := md.Fields().ByNumber(num)
	if fd == nil || (fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.MessageKind) {
		return nil
	}
	return fd
}

// escapedSize is the size of what appendEscaped appends for the message b
// of type md at the given depth, and whether a string in it is escaped.
func escapedSize(b []byte, md protoreflect.MessageDescriptor, depth int) (size int, changed bool, err error) {
	if depth > maxEscapeDepth {
		return 0, false, errTooDeep
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false, protowire.ParseError(n)
		}
		fd := rewrittenField(md, num, typ)
		if fd == nil {
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				return 0, false, protowire.ParseError(m)
			}
			size += n + m
			b = b[n+m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return 0, false, protowire.ParseError(m)
		}
		b = b[n+m:]
		l := len(v)
		if fd.Kind() == protoreflect.MessageKind {
			var c bool
			if l, c, err = escapedSize(v, fd.Message(), depth+1); err != nil {
				return 0, false, err
			}
			changed = changed || c
		} else if bad := invalidUTF8Bytes(v); bad > 0 {
			l += 3 * bad // each \xNN is 3 bytes more
			changed = true
		}
		size += protowire.SizeTag(num) + protowire.SizeBytes(l)
	}
	return size, changed, nil
}

// appendEscaped appends to dst the message b of type md, at the given
// depth, with each string escaped; the length prefix of each message field
// comes from escapedSize (so a byte at depth d is read d+2 times, and d
// is at most maxEscapeDepth).
func appendEscaped(dst, b []byte, md protoreflect.MessageDescriptor, depth int) ([]byte, error) {
	if depth > maxEscapeDepth {
		return nil, errTooDeep
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		fd := rewrittenField(md, num, typ)
		if fd == nil {
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				return nil, protowire.ParseError(m)
			}
			dst = append(dst, b[:n+m]...)
			b = b[n+m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		b = b[n+m:]
		dst = protowire.AppendTag(dst, num, typ)
		if fd.Kind() == protoreflect.MessageKind {
			size, _, err := escapedSize(v, fd.Message(), depth+1)
			if err != nil {
				return nil, err
			}
			dst = protowire.AppendVarint(dst, uint64(size))
			if dst, err = appendEscaped(dst, v, fd.Message(), depth+1); err != nil {
				return nil, err
			}
			continue
		}
		dst = protowire.AppendVarint(dst, uint64(len(v)+3*invalidUTF8Bytes(v)))
		dst = escapeBytes(dst, v)
	}
	return dst, nil
}

// invalidUTF8Bytes is the number of bytes of s that are not part of valid
// UTF-8: the bytes escapeBytes writes as \xNN.
func invalidUTF8Bytes(s []byte) int {
	if utf8.Valid(s) {
		return 0
	}
	bad := 0
	for len(s) > 0 {
		r, size := utf8.DecodeRune(s)
		if r == utf8.RuneError && size == 1 {
			bad++
		}
		s = s[size:]
	}
	return bad
}

// escapeBytes appends to dst s with each byte that is not part of valid
// UTF-8 written as \xNN: len(s) + 3*invalidUTF8Bytes(s) bytes.
func escapeBytes(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	if utf8.Valid(s) {
		return append(dst, s...)
	}
	for len(s) > 0 {
		r, size := utf8.DecodeRune(s)
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, '\\', 'x', hex[s[0]>>4], hex[s[0]&15])
		} else {
			dst = append(dst, s[:size]...)
		}
		s = s[size:]
	}
	return dst
}
