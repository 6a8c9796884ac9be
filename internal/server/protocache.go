package server

import (
	"slices"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimitd/config"
)

// protoCache holds the protobuf parts of answers that depend only on a
// rule of the loaded config, built once and then shared read-only by every
// answer (protobuf messages are safe to marshal concurrently). A new one
// comes with each config, so rules of old configs are dropped with it.
type protoCache struct {
	names  sync.Map    // *config.Rule → *structpb.Value, the rule's name
	alones [2]sync.Map // *config.Rule → aloneMetadata, metadata naming only it: [admitted, denied]
	limits sync.Map    // *config.RateLimit → *rlsv3.RateLimitResponse_RateLimit
	metas  sync.Map    // *config.Rule → *structpb.Value, its Metadata (nil if it cannot be one)
}

// metadata is r.Metadata as a Struct value, or nil if it cannot be one
// (a Struct holds only UTF-8 strings, which YAML always gives).
func (c *protoCache) metadata(r *config.Rule) *structpb.Value {
	if v, ok := c.metas.Load(r); ok {
		return v.(*structpb.Value)
	}
	var v *structpb.Value
	if st, err := structpb.NewStruct(r.Metadata); err == nil {
		v = structpb.NewStructValue(st)
	}
	got, _ := c.metas.LoadOrStore(r, v)
	return got.(*structpb.Value)
}

// name is the metadata value naming r.
func (c *protoCache) name(r *config.Rule) *structpb.Value {
	if v, ok := c.names.Load(r); ok {
		return v.(*structpb.Value)
	}
	v, _ := c.names.LoadOrStore(r, structpb.NewStringValue(r.Label()))
	return v.(*structpb.Value)
}

// list is a metadata list naming rules. Only rules of the loaded config
// may have their names cached: a rule made for one call's limit override
// is new on every call, and caching it would grow the cache without bound.
func (c *protoCache) list(rules []*config.Rule, configured bool) *structpb.Value {
	values := make([]*structpb.Value, len(rules))
	for i, r := range rules {
		if configured {
			values[i] = c.name(r)
		} else {
			values[i] = structpb.NewStringValue(r.Label())
		}
	}
	return structpb.NewListValue(&structpb.ListValue{Values: values})
}

// aloneMetadata is the metadata of an answer in which only one rule
// matched: the Struct, and wire, the encoding of RateLimitResponse field
// dynamic_metadata holding it (see setMetadata). Wire is nil if the
// Struct cannot be encoded (protobuf strings must be UTF-8, which rule
// labels from YAML always are); the answer then carries the Struct, and
// fails to marshal as it always did.
type aloneMetadata struct {
	meta *structpb.Struct
	wire protoreflect.RawFields
}

// alone is the metadata of an answer in which only r matched, and either
// admitted or denied the request.
func (c *protoCache) alone(r *config.Rule, denied bool) aloneMetadata {
	build := func() aloneMetadata {
		rules := []*config.Rule{r}
		fields := map[string]*structpb.Value{metaMatched: c.list(rules, true)}
		if denied {
			fields[metaDeniedBy] = c.list(rules, true)
		}
		a := aloneMetadata{meta: &structpb.Struct{Fields: fields}}
		// A message with only this field set encodes as exactly that
		// field: tag, length, the Struct. Clipped, so that an append to
		// an answer's unknown fields (proto.Merge into it) copies rather
		// than writing into the array every answer shares.
		if b, err := proto.Marshal(&rlsv3.RateLimitResponse{DynamicMetadata: a.meta}); err == nil {
			a.wire = slices.Clip(b)
		}
		return a
	}
	m := &c.alones[0]
	if denied {
		m = &c.alones[1]
	}
	if v, ok := m.Load(r); ok {
		return v.(aloneMetadata)
	}
	v, _ := m.LoadOrStore(r, build())
	return v.(aloneMetadata)
}

// currentLimit is currentLimit(r, l), shared.
func (c *protoCache) currentLimit(r *config.Rule, l *config.RateLimit) *rlsv3.RateLimitResponse_RateLimit {
	if v, ok := c.limits.Load(l); ok {
		return v.(*rlsv3.RateLimitResponse_RateLimit)
	}
	v, _ := c.limits.LoadOrStore(l, currentLimit(r, l))
	return v.(*rlsv3.RateLimitResponse_RateLimit)
}
