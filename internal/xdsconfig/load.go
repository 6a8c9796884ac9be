package xdsconfig

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/config"
)

// Refusal is a domain of the latest push that could not be loaded while
// the rest of the push was (see Client).
type Refusal struct {
	// Domain is the domain of the refused resources (their file name,
	// `xds:(resource "…")`, for resources without a domain).
	Domain string
	// Reason is the loader's message, one line per problem, at most
	// 64 KiB.
	Reason string
	// Kept is true when an older config of the domain, the last of it that
	// loaded, stays in force; false when there is none (requests for the
	// domain are answered UNAVAILABLE, see config.Set.Refused).
	Kept bool
	// Since is when this content of the domain was first refused.
	Since time.Time
}

// name is the group's domain, or its file name for resources without one.
func (g *group) name() string {
	if g.domain != "" {
		return g.domain
	}
	return g.key
}

// group is the resources of one domain in a push, in push order.
type group struct {
	domain string // the resources' domain ("" when they have none)
	key    string // FileName of the resources: "xds:<domain>"
	files  []config.File
	err    error  // a resource that could not be converted
	sum    string // the resources' content, canonical (see contentSum)
}

// domainLoad is what loading a push gives.
type domainLoad struct {
	set *config.Set
	// good are the files in force per domain key afterwards: the push's
	// for domains that loaded, the last good ones for refused domains
	// that had some.
	good map[string][]config.File
	// refused are the domains refused, by key, sorted.
	refused []refusedGroup
}

type refusedGroup struct {
	g      *group
	reason string
	kept   bool
}

// load converts the resources of a push and loads them: as a whole when
// they are all valid; else domain by domain, each domain that cannot be
// loaded being refused, keeping its files of the last push that loaded it
// (good, by domain key) if any. An error (no Set) is a push that cannot be
// used at all: over the total size cap, or refused as a whole.
func load(rcs []*rlsconfv3.RateLimitConfig, good map[string][]config.File, opts config.LoadOptions) (domainLoad, error) {
	groups := groupByDomain(rcs)
	var all []config.File
	converted := true
	for _, g := range groups {
		all = append(all, g.files...)
		converted = converted && g.err == nil
	}
	if converted {
		set, err := config.ParseWith(all, opts)
		if err == nil {
			out := domainLoad{set: set, good: make(map[string][]config.File, len(groups))}
			for _, g := range groups {
				out.good[g.key] = g.files
			}
			return out, nil
		}
		if errors.Is(err, config.ErrTooLarge) {
			return domainLoad{}, err
		}
	}
	// One domain at a time: those that load are applied, the others keep
	// their last good files.
	out := domainLoad{good: make(map[string][]config.File, len(groups))}
	refused := make(map[string]string)
	var files []config.File
	for _, g := range groups {
		err := g.err
		if err == nil {
			_, err = config.ParseWith(g.files, opts)
		}
		if err == nil {
			out.good[g.key] = g.files
			files = append(files, g.files...)
			continue
		}
		old, kept := good[g.key]
		if kept {
			out.good[g.key] = old
			files = append(files, old...)
		}
		reason := nackMessage(err)
		out.refused = append(out.refused, refusedGroup{g: g, reason: reason, kept: kept})
		if g.domain != "" {
			refused[g.domain] = firstLine(reason)
		}
	}
	set, err := config.ParseWith(files, opts)
	if err != nil {
		return domainLoad{}, err // the domains that loaded alone do not together
	}
	out.set = set.WithRefused(refused)
	return out, nil
}

// groupByDomain converts rcs to files (named as Files names them) and
// groups them by domain, sorted by the domains' file names.
func groupByDomain(rcs []*rlsconfv3.RateLimitConfig) []*group {
	names := fileNames(rcs)
	byKey := make(map[string]*group)
	var groups []*group
	for i, rc := range rcs {
		key := FileName(rc)
		g := byKey[key]
		if g == nil {
			g = &group{domain: rc.GetDomain(), key: key}
			byKey[key] = g
			groups = append(groups, g)
		}
		f, err := File(rc)
		if err != nil {
			if g.err == nil {
				g.err = err
			}
			continue
		}
		f.Name = names[i]
		g.files = append(g.files, f)
	}
	members := make(map[string][]*rlsconfv3.RateLimitConfig, len(groups))
	for _, rc := range rcs {
		members[FileName(rc)] = append(members[FileName(rc)], rc)
	}
	for _, g := range groups {
		g.sum = contentSum(members[g.key])
	}
	slices.SortFunc(groups, func(a, b *group) int { return cmp.Compare(a.key, b.key) })
	return groups
}

// maxReasonBytes bounds the reason a refused domain's calls are answered
// with (its first problem).
const maxReasonBytes = 512

// firstLine is the first line of msg, at most maxReasonBytes of it, for
// a reason that travels in a gRPC status.
func firstLine(msg string) string {
	line, _, _ := strings.Cut(msg, "\n")
	if len(line) > maxReasonBytes {
		cut := maxReasonBytes
		for cut > 0 && !utf8.RuneStart(line[cut]) {
			cut--
		}
		line = line[:cut] + "…"
	}
	switch n := strings.Count(msg, "\n"); n {
	case 0:
	case 1:
		line += " (and 1 more problem)"
	default:
		line += fmt.Sprintf(" (and %d more problems)", n)
	}
	return line
}

// contentSum identifies resources by their content, whatever their order:
// each resource's name and its deterministic encoding, sorted, each part
// length-prefixed, hashed. go-control-plane builds each response from a
// map, so the same snapshot resent comes in another order.
func contentSum(rcs []*rlsconfv3.RateLimitConfig) string {
	parts := make([][]byte, 0, len(rcs))
	for _, rc := range rcs {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(rc)
		if err != nil {
			b = []byte("unmarshalable: " + err.Error())
		}
		parts = append(parts, b)
	}
	return sumParts(sha256.New(), parts)
}

// sumParts hashes parts sorted, each length-prefixed.
func sumParts(h hash.Hash, parts [][]byte) string {
	slices.SortFunc(parts, func(a, b []byte) int { return strings.Compare(string(a), string(b)) })
	var n [binary.MaxVarintLen64]byte
	for _, p := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		h.Write(p)
	}
	return string(h.Sum(nil))
}
