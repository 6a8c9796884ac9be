// Package limitspage serves /limits, a live page of every configured rule
// with its traffic over the last minute and the fullest buckets right now,
// and /limits.json with the same data. A Tracker (a server.Observer) feeds
// it; time is taken from each call's Start, so tests drive it without
// sleeping.
package limitspage

import (
	"cmp"
	"slices"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// Window is the span the per-rule counts cover.
const Window = time.Minute

// slots is the number of one-second slots in Window.
const slots = int(Window / time.Second)

// TrackerOptions configures a Tracker; zero fields take the defaults.
type TrackerOptions struct {
	// MaxBuckets bounds the buckets remembered for "busiest buckets";
	// default 1000. When full, buckets that have refilled are forgotten
	// first, then the least full.
	MaxBuckets int
}

// Tracker counts, per configured rule, the descriptors and tokens of the
// last minute, and remembers the most recent state of recently used
// buckets. It is a server.Observer, safe for concurrent use; its memory is
// bounded by the number of rules and MaxBuckets.
type Tracker struct {
	maxBuckets int

	mu      sync.Mutex
	rules   map[string]*window            // by rule path
	buckets map[string]map[string]*bucket // by rule path, then descriptor
	nb      int                           // buckets in buckets
	scratch []byte
}

// NewTracker returns an empty Tracker.
func NewTracker(opts TrackerOptions) *Tracker {
	if opts.MaxBuckets <= 0 {
		opts.MaxBuckets = 1000
	}
	return &Tracker{
		maxBuckets: opts.MaxBuckets,
		rules:      make(map[string]*window),
		buckets:    make(map[string]map[string]*bucket),
	}
}

// window holds one rule's counts in one-second slots.
type window struct {
	slot [slots]Counts
	sec  [slots]int64 // the unix second each slot holds
}

// Counts are what a rule saw over a span of time.
type Counts struct {
	// Requests is the number of descriptors that matched the rule.
	Requests int64 `json:"requests"`
	// Shed is how many of them denied their request (OVER_LIMIT).
	Shed int64 `json:"shed"`
	// ShadowShed is how many a shadow-mode rule would have denied.
	ShadowShed int64 `json:"shadow_shed"`
	// Tokens is the sum of their hits_addend.
	Tokens int64 `json:"tokens"`
}

func (w *window) add(sec int64, c Counts) {
	i := int(uint64(sec) % uint64(slots))
	if w.sec[i] != sec {
		w.sec[i], w.slot[i] = sec, Counts{}
	}
	s := &w.slot[i]
	s.Requests += c.Requests
	s.Shed += c.Shed
	s.ShadowShed += c.ShadowShed
	s.Tokens += c.Tokens
}

// sum adds the slots of the Window that ends at second now.
func (w *window) sum(now int64) Counts {
	var c Counts
	for i := range w.slot {
		if s := w.sec[i]; s > now-int64(slots) && s <= now {
			c.Requests += w.slot[i].Requests
			c.Shed += w.slot[i].Shed
			c.ShadowShed += w.slot[i].ShadowShed
			c.Tokens += w.slot[i].Tokens
		}
	}
	return c
}

// bucket is the last known state of one bucket.
type bucket struct {
	path, desc string
	limit      limiter.Limit
	used       int64 // burst − remaining after the last call
	at         time.Time
}

// usedAt estimates the tokens in use at t: the bucket refills Count tokens
// per Period after its last call.
func (b *bucket) usedAt(t time.Time) int64 {
	el := t.Sub(b.at)
	if el <= 0 || b.limit.Period <= 0 {
		return b.used
	}
	refill := int64(float64(b.limit.Count) * float64(el) / float64(b.limit.Period))
	return max(b.used-refill, 0)
}

// ObserveCall implements server.Observer.
func (t *Tracker) ObserveCall(c server.Call) {
	if len(c.Descriptors) == 0 {
		return
	}
	sec := c.Start.Unix()
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range c.Descriptors {
		d := &c.Descriptors[i]
		if d.Rule == nil || d.Rule.File == "" { // no rule, or a limit override
			continue
		}
		w := t.rules[d.Rule.Path]
		if w == nil {
			w = &window{}
			t.rules[d.Rule.Path] = w
		}
		var n Counts
		switch d.Outcome {
		case server.WithinLimit, server.OverLimit, server.ShadowOverLimit, server.Unlimited:
			n = Counts{Requests: 1, Tokens: max(d.Hits, 0)} // a refund adds no tokens
		default:
			continue
		}
		switch d.Outcome {
		case server.OverLimit:
			n.Shed = 1
		case server.ShadowOverLimit:
			n.ShadowShed = 1
		}
		w.add(sec, n)
		if d.Limit.Burst > 0 && d.Outcome != server.Unlimited {
			t.noteBucket(d, c.Start)
		}
	}
}

// noteBucket records a bucket's state after a call. t.mu is held.
func (t *Tracker) noteBucket(d *server.DescriptorOutcome, at time.Time) {
	t.scratch = appendDescriptor(t.scratch[:0], d.Descriptor.GetEntries())
	used := d.Limit.Burst - d.Decision.Remaining
	if !d.Decision.Allowed {
		used = d.Limit.Burst
	}
	byDesc := t.buckets[d.Rule.Path]
	if b := byDesc[string(t.scratch)]; b != nil {
		if !at.Before(b.at) {
			b.limit, b.used, b.at = d.Limit, used, at
		}
		return
	}
	if t.nb >= t.maxBuckets {
		t.evict(at)
		byDesc = t.buckets[d.Rule.Path] // evict may have dropped the rule's map
	}
	if byDesc == nil {
		byDesc = make(map[string]*bucket)
		t.buckets[d.Rule.Path] = byDesc
	}
	b := &bucket{path: d.Rule.Path, desc: string(t.scratch), limit: d.Limit, used: used, at: at}
	byDesc[b.desc] = b
	t.nb++
}

// evict forgets the buckets that have refilled by now, and if that is not
// enough, the least full, down to half of maxBuckets, so that the sort it
// may need is paid for by as many new buckets as it frees.
func (t *Tracker) evict(now time.Time) {
	var all []filled
	for path, byDesc := range t.buckets {
		for k, b := range byDesc {
			used := b.usedAt(now)
			if used == 0 {
				delete(byDesc, k)
				t.nb--
				continue
			}
			all = append(all, filled{b, used})
		}
		if len(byDesc) == 0 {
			delete(t.buckets, path)
		}
	}
	keep := t.maxBuckets / 2
	if len(all) <= keep {
		return
	}
	slices.SortFunc(all, compareFilled)
	for _, f := range all[keep:] {
		b := f.b
		delete(t.buckets[b.path], b.desc)
		t.nb--
		if len(t.buckets[b.path]) == 0 {
			delete(t.buckets, b.path)
		}
	}
}

// filled is a bucket and the tokens in use in it at one instant.
type filled struct {
	b    *bucket
	used int64
}

// compareFilled orders buckets fullest first: by share of burst in use,
// then by tokens in use, then by name.
func compareFilled(x, y filled) int {
	// ux/bx > uy/by  ⇔  ux·by > uy·bx (bursts are at most 2^40, used ≤ burst).
	fx, fy := float64(x.used)*float64(y.b.limit.Burst), float64(y.used)*float64(x.b.limit.Burst)
	return cmp.Or(cmp.Compare(fy, fx), cmp.Compare(y.used, x.used), cmp.Compare(x.b.path, y.b.path), cmp.Compare(x.b.desc, y.b.desc))
}

// appendDescriptor appends entries as "key=value, key=value", with ",",
// "=" and "%" in keys and values percent-escaped so that distinct
// descriptors read differently.
func appendDescriptor(b []byte, entries []*ratelimitv3.RateLimitDescriptor_Entry) []byte {
	esc := func(b []byte, s string) []byte {
		for i := 0; i < len(s); i++ {
			switch c := s[i]; c {
			case ',':
				b = append(b, "%2C"...)
			case '=':
				b = append(b, "%3D"...)
			case '%':
				b = append(b, "%25"...)
			default:
				b = append(b, c)
			}
		}
		return b
	}
	for i, e := range entries {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = esc(b, e.GetKey())
		b = append(b, '=')
		b = esc(b, e.GetValue())
	}
	return b
}

// BucketState is one bucket as the page shows it.
type BucketState struct {
	// Rule is the rule's path; Descriptor the request descriptor's entries.
	Rule       string `json:"rule"`
	Descriptor string `json:"descriptor"`
	// Used is the estimated number of tokens in use now (burst − tokens
	// left, refilled since LastSeen); Burst the bucket's size.
	Used  int64 `json:"used"`
	Burst int64 `json:"burst"`
	// FillPercent is Used / Burst, in percent, rounded down.
	FillPercent int64 `json:"fill_percent"`
	// LastSeen is the start of the last call that used the bucket.
	LastSeen time.Time `json:"last_seen"`
}

// LastMinute returns the counts of the rule with the given path over the
// Window that ends at now.
func (t *Tracker) LastMinute(path string, now time.Time) Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w := t.rules[path]; w != nil {
		return w.sum(now.Unix())
	}
	return Counts{}
}

// Busiest returns up to n buckets that are not full of tokens at now,
// fullest first.
func (t *Tracker) Busiest(n int, now time.Time) []BucketState {
	t.mu.Lock()
	var all []filled
	for _, byDesc := range t.buckets {
		for _, b := range byDesc {
			if u := b.usedAt(now); u > 0 {
				all = append(all, filled{b, u})
			}
		}
	}
	slices.SortFunc(all, compareFilled)
	all = all[:min(n, len(all))]
	out := make([]BucketState, len(all))
	for i, f := range all {
		b, u := f.b, f.used
		out[i] = BucketState{Rule: b.path, Descriptor: b.desc, Used: u, Burst: b.limit.Burst,
			FillPercent: u * 100 / b.limit.Burst, LastSeen: b.at}
	}
	t.mu.Unlock()
	return out
}
