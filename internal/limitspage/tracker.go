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

	"github.com/ratelimitd/ratelimitd/internal/redact"
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
	// first, then the least full, down to MaxBuckets/2. After forgetting
	// buckets still in use, and until it next forgets, the tracker adds a
	// new bucket only if it is at least as full as a bar that falls as the
	// kept buckets refill (a bucket that denied its call always is), or if
	// it has room and the bucket refills more slowly than the bar falls
	// (see Tracker).
	MaxBuckets int
	// Redact is how bucket descriptors show the request's values on the
	// page and in its JSON; default redact.Off (as they are). Configured
	// rule paths are the config's own text and are shown as they are.
	Redact redact.Mode
}

// Tracker counts, per configured rule, the descriptors and tokens of the
// last minute, and remembers the most recent state of recently used
// buckets. It is a server.Observer, safe for concurrent use; its memory is
// bounded by the number of rules and MaxBuckets.
//
// Buckets are ranked as Busiest ranks them: by share of burst in use,
// estimated at an instant from each bucket's last call and its refill
// rate. A bucket already remembered is updated by every call. When
// MaxBuckets are remembered and a call uses a new one, the tracker evicts:
// it forgets the buckets that have refilled, then, if more than
// MaxBuckets/2 remain, all but the MaxBuckets/2 fullest.
//
// An eviction of the second kind sets a bar: the least share in use among
// the buckets kept (counting their refill in fractions of a token, where
// the estimate counts whole tokens), falling from then on at the fastest
// refill rate among them. Until the next eviction, a call on a bucket not
// yet remembered adds it only if the bucket's share in use is at least the
// bar at the call's Start, or at the latest call on a kept bucket if that
// started later (a bucket left without tokens, as by a denied call, always
// is), or if fewer than MaxBuckets are remembered and the bucket refills
// more slowly than the bar falls (below the kept buckets now, it may
// outrank them later). A call that leaves a kept bucket below the bar so
// taken, or gives it a limit that refills faster than the bar falls,
// removes the bar. So each bucket kept stays, by the estimate, at least as
// full as the bar.
//
// A bucket seen but not held therefore had refilled, or was, when it was
// last evicted or turned away, ranked below MaxBuckets/2 buckets the
// tracker held: Busiest(n) at that instant, for any n up to MaxBuckets/2,
// is the same as if it had been kept. (Eviction has always judged at one
// instant: buckets refill at different rates, so one forgotten can later
// be fuller than some kept.)
type Tracker struct {
	maxBuckets int
	redact     redact.Mode

	mu      sync.Mutex
	rules   map[string]*window            // by rule path
	buckets map[string]map[string]*bucket // by rule path, then descriptor
	nb      int                           // buckets in buckets
	bar     bar                           // set by the last eviction
	scratch []byte
	all     []filled // evict's, kept between calls to spare its allocation
}

// bar is what a bucket not yet remembered must reach to be added (see
// Tracker). Its zero value admits every bucket.
type bar struct {
	share float64   // at the eviction; 0: no bar
	at    time.Time // of the eviction
	fall  float64   // share of burst refilled per nanosecond
	last  time.Time // the latest of at and the calls on the buckets kept
	gen   uint64    // numbers the bars set; the buckets kept carry it
}

// shareAt returns the bar for a call at t. It is judged at last when that
// is later: the estimate for any instant before a bucket's last call is
// that call's state.
func (r *bar) shareAt(t time.Time) float64 {
	if t.Before(r.last) {
		t = r.last
	}
	return r.share - r.fall*float64(t.Sub(r.at))
}

// admits reports whether a new bucket of limit l with used tokens in use
// at t reaches the bar. A denied call leaves its bucket at share 1, which
// no bar exceeds.
func (r *bar) admits(l limiter.Limit, used int64, t time.Time) bool {
	return r.share <= 0 || float64(used)/float64(l.Burst) >= r.shareAt(t)
}

// holds reports whether b, a bucket the bar's eviction kept, still stays
// at least as full as the bar once a call at t leaves it with limit l and
// used tokens in use.
func (r *bar) holds(b *bucket, l limiter.Limit, used int64, t time.Time) bool {
	if l != b.limit && fall(l) > r.fall {
		return false
	}
	next := bucket{limit: l, used: used, at: t}
	if t.Before(r.last) {
		t = r.last
	}
	return next.shareFloor(t) >= r.shareAt(t)
}

// fall returns the share of its burst a bucket of limit l refills per
// nanosecond, as usedAt counts it.
func fall(l limiter.Limit) float64 {
	if l.Period <= 0 || l.Burst <= 0 {
		return 0
	}
	return float64(l.Count) / float64(l.Period) / float64(l.Burst)
}

// shareFloor returns the share of burst in use at t with the refill since
// the last call counted in full, not in whole tokens: never more than
// usedAt(t)/burst, and from then on falling at fall(b.limit), never faster
// than usedAt.
func (b *bucket) shareFloor(t time.Time) float64 {
	s := float64(b.used) / float64(b.limit.Burst)
	if el := t.Sub(b.at); el > 0 {
		s -= fall(b.limit) * float64(el)
	}
	return s
}

// NewTracker returns an empty Tracker.
func NewTracker(opts TrackerOptions) *Tracker {
	if opts.MaxBuckets <= 0 {
		opts.MaxBuckets = 1000
	}
	if opts.Redact == 0 {
		opts.Redact = redact.Off
	}
	return &Tracker{
		maxBuckets: opts.MaxBuckets,
		redact:     opts.Redact,
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
	// Tokens is the sum of the tokens they asked for (hits_addend), taken
	// or not: shed ones and those of requests another descriptor denied
	// included.
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
	shown      string // desc as the page shows it (redacted), if not desc
	limit      limiter.Limit
	used       int64 // burst − remaining after the last call
	at         time.Time
	kept       uint64 // the gen of the bar whose eviction kept it, if any
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
		case server.WithinLimit, server.OverLimit, server.ShadowOverLimit, server.DeniedByOther, server.Unlimited:
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

// admits reports whether a bucket not yet remembered, of limit l with used
// tokens in use after a call at t, is to be added: if it reaches the bar,
// or if there is room and it refills more slowly than the bar falls (it
// may yet outrank the kept buckets, and is not offered again before its
// next call). t.mu is held.
func (t *Tracker) admits(l limiter.Limit, used int64, at time.Time) bool {
	return t.bar.admits(l, used, at) || t.nb < t.maxBuckets && fall(l) < t.bar.fall
}

// noteBucket records a bucket's state after a call. t.mu is held.
func (t *Tracker) noteBucket(d *server.DescriptorOutcome, at time.Time) {
	used := d.Limit.Burst - d.Decision.Remaining
	if !d.Decision.Allowed {
		used = d.Limit.Burst
	}
	byDesc := t.buckets[d.Rule.Path]
	admit := t.admits(d.Limit, used, at)
	if len(byDesc) == 0 && !admit {
		return // not remembered, and not to be: spare building its name
	}
	t.scratch = appendDescriptor(t.scratch[:0], d.Descriptor.GetEntries())
	if b := byDesc[string(t.scratch)]; b != nil {
		if !at.Before(b.at) {
			if b.kept == t.bar.gen && t.bar.share > 0 {
				if !t.bar.holds(b, d.Limit, used, at) {
					t.bar = bar{gen: t.bar.gen}
				} else if at.After(t.bar.last) {
					t.bar.last = at
				}
			}
			b.limit, b.used, b.at = d.Limit, used, at
		}
		return
	}
	if !admit {
		return
	}
	if t.nb >= t.maxBuckets {
		t.evict(at)
		if !t.admits(d.Limit, used, at) {
			return
		}
		byDesc = t.buckets[d.Rule.Path] // evict may have dropped the rule's map
	}
	if byDesc == nil {
		byDesc = make(map[string]*bucket)
		t.buckets[d.Rule.Path] = byDesc
	}
	b := &bucket{path: d.Rule.Path, desc: string(t.scratch), limit: d.Limit, used: used, at: at}
	if t.redact != redact.Off {
		b.shown = string(appendDescriptorAs(nil, d.Descriptor.GetEntries(), t.redact))
	}
	byDesc[b.desc] = b
	t.nb++
}

// evict forgets the buckets that have refilled by now, and if that is not
// enough, the least full, down to half of maxBuckets, so that the sort it
// may need is paid for by as many new buckets as it frees; then it sets
// the bar (see Tracker) for those it kept, or none if it kept all.
func (t *Tracker) evict(now time.Time) {
	t.bar = bar{gen: t.bar.gen}
	all := t.all[:0]
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
	if keep := t.maxBuckets / 2; len(all) > keep {
		slices.SortFunc(all, compareFilled)
		if keep > 0 {
			t.bar = bar{share: 1, at: now, last: now, gen: t.bar.gen + 1}
		}
		for _, f := range all[:keep] {
			f.b.kept = t.bar.gen
			t.bar.share = min(t.bar.share, f.b.shareFloor(now))
			t.bar.fall = max(t.bar.fall, fall(f.b.limit))
		}
		for _, f := range all[keep:] {
			b := f.b
			delete(t.buckets[b.path], b.desc)
			t.nb--
			if len(t.buckets[b.path]) == 0 {
				delete(t.buckets, b.path)
			}
		}
	}
	clear(all) // hold on to no forgotten bucket
	t.all = all[:0]
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
	return appendDescriptorAs(b, entries, redact.Off)
}

// appendDescriptorAs is appendDescriptor with values as red shows them.
func appendDescriptorAs(b []byte, entries []*ratelimitv3.RateLimitDescriptor_Entry, red redact.Mode) []byte {
	for i, e := range entries {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = server.AppendEscaped(b, e.GetKey(), ",=")
		b = append(b, '=')
		b = server.AppendEscaped(b, red.Value(e.GetValue()), ",=")
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
	copies := make([]bucket, 0, t.nb) // to sort after unlocking
	for _, byDesc := range t.buckets {
		for _, b := range byDesc {
			if b.usedAt(now) > 0 {
				copies = append(copies, *b)
			}
		}
	}
	t.mu.Unlock()
	all := make([]filled, len(copies))
	for i := range copies {
		all[i] = filled{&copies[i], copies[i].usedAt(now)}
	}
	slices.SortFunc(all, compareFilled)
	all = all[:min(n, len(all))]
	out := make([]BucketState, len(all))
	for i, f := range all {
		b, u := f.b, f.used
		out[i] = BucketState{Rule: b.path, Descriptor: cmp.Or(b.shown, b.desc), Used: u, Burst: b.limit.Burst,
			FillPercent: u * 100 / b.limit.Burst, LastSeen: b.at}
	}
	return out
}
