package server

import (
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimitd/config"
)

// Keys of the dynamic metadata envoyproxy/ratelimit sets
// (src/service/ratelimit.go@f2fb157, ratelimitToMetadata).
const (
	incMetaDomain      = "domain"
	incMetaDescriptors = "descriptors"
	incMetaHitsAddend  = "hitsAddend"
	incMetaMetadata    = "metadata"
	incMetaEntries     = "entries"
	incMetaLimit       = "limit"
)

// incumbentMetadata is the part of an answer's dynamic metadata that
// follows envoyproxy/ratelimit, as mode asks (see DescriptorMetadata), or
// nil when there is none: under "metadata", the merged metadata of the
// descriptors that passed (status OK, a rule of the config that is neither
// unlimited nor replaced: the incumbent's passed descriptors), merged in
// request order by config.MergeMetadata (the first descriptor wins a
// conflict, mappings merge); in incumbent mode also the domain, each
// descriptor (as planned: a long value stands as its stand-in) and the
// hits_addend.
func incumbentMetadata(req *rlsv3.RateLimitRequest, p plan, statuses []*rlsv3.RateLimitResponse_DescriptorStatus, mode DescriptorMetadata, cache *protoCache) map[string]*structpb.Value {
	if mode == DescriptorMetadataOff {
		return nil
	}
	var merged *structpb.Value
	var first *config.Rule
	var acc map[string]any
	for i, it := range p.items {
		r := it.rule
		if r == nil || r.Metadata == nil || !it.configured || it.replaced || !it.limited && !it.denyAll ||
			statuses[i].Code != rlsv3.RateLimitResponse_OK {
			continue
		}
		switch {
		case first == nil:
			first = r
		case first != r:
			if acc == nil {
				acc = config.MergeMetadata(nil, first.Metadata)
			}
			acc = config.MergeMetadata(acc, r.Metadata)
		}
	}
	switch {
	case acc != nil:
		if st, err := structpb.NewStruct(acc); err == nil {
			merged = structpb.NewStructValue(st)
		}
	case first != nil:
		merged = cache.metadata(first)
	}
	if mode != DescriptorMetadataIncumbent {
		if merged == nil {
			return nil
		}
		return map[string]*structpb.Value{incMetaMetadata: merged}
	}
	fields := make(map[string]*structpb.Value, 4)
	fields[incMetaDomain] = structpb.NewStringValue(req.GetDomain())
	descs := make([]*structpb.Value, 0, len(p.descs))
	for _, d := range p.descs {
		entries := make([]*structpb.Value, len(d.GetEntries()))
		var b strings.Builder
		for j, e := range d.GetEntries() {
			b.Reset()
			b.WriteString(e.GetKey())
			b.WriteByte('=')
			b.WriteString(e.GetValue())
			entries[j] = structpb.NewStringValue(b.String())
		}
		df := map[string]*structpb.Value{incMetaEntries: structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if o := d.GetLimit(); o != nil {
			df[incMetaLimit] = structpb.NewStringValue(o.String()) // the incumbent's text, protobuf's String
		}
		if h := d.GetHitsAddend(); h != nil {
			df[incMetaHitsAddend] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields[incMetaDescriptors] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields[incMetaHitsAddend] = structpb.NewNumberValue(float64(h))
	}
	if merged != nil {
		fields[incMetaMetadata] = merged
	}
	return fields
}
