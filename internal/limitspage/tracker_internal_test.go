package limitspage

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

func TestAppendDescriptorEscapes(t *testing.T) {
	tests := []struct {
		kv   []string
		want string
	}{
		{[]string{"model", "gpt-4o"}, "model=gpt-4o"},
		{[]string{"model", "gpt-4o", "client", "acme"}, "model=gpt-4o, client=acme"},
		{[]string{"a", "b, c=d"}, "a=b%2C c%3Dd"},
		{[]string{"a", "b", "c", "d"}, "a=b, c=d"},
		{[]string{",=%", "100%"}, "%2C%3D%25=100%25"},
		{[]string{"a=b", "c"}, "a%3Db=c"},
		{[]string{"", ""}, "="},
	}
	for _, tt := range tests {
		var entries []*ratelimitv3.RateLimitDescriptor_Entry
		for i := 0; i+1 < len(tt.kv); i += 2 {
			entries = append(entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: tt.kv[i], Value: tt.kv[i+1]})
		}
		if got := string(appendDescriptor([]byte("x"), entries)); got != "x"+tt.want {
			t.Errorf("appendDescriptor(x, %q) = %q, want %q", tt.kv, got, "x"+tt.want)
		}
	}
}

// TestTrackerTurnsAwayOnlyBucketsBelowHalf drives a small tracker with
// random calls (late ones, refunds, limits that change) and checks what
// the Tracker's doc promises: a bucket it turns away is, at that call's
// Start, less full than MaxBuckets/2 buckets it holds, by Busiest's
// estimate.
func TestTrackerTurnsAwayOnlyBucketsBelowHalf(t *testing.T) {
	const maxBuckets = 16
	limits := []limiter.Limit{
		{Count: 10, Period: time.Second, Burst: 10},
		{Count: 10, Period: time.Minute, Burst: 10},
		{Count: 3, Period: time.Minute, Burst: 7},
		{Count: 100, Period: time.Hour, Burst: 100},
		{Count: 1, Period: time.Hour, Burst: 1},
	}
	rules := []*config.Rule{{Path: "r > a", File: "r.yaml"}, {Path: "r > b", File: "r.yaml"}}
	rng := rand.New(rand.NewPCG(7, 8))
	keys := rand.NewZipf(rng, 1.1, 1, 300)
	tr := NewTracker(TrackerOptions{MaxBuckets: maxBuckets})
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	turnedAway := 0
	for i := range 20000 {
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		at := now
		if rng.IntN(10) == 0 {
			at = at.Add(-time.Duration(rng.IntN(2000)) * time.Millisecond) // a late call
		}
		k := keys.Uint64()
		rule := rules[k%2]
		l := limits[k%uint64(len(limits))]
		if rng.IntN(50) == 0 {
			l = limits[rng.IntN(len(limits))] // another of the rule's limits, or a reload
		}
		used := rng.Int64N(l.Burst + 1)
		if rng.IntN(3) == 0 {
			used = rng.Int64N(l.Burst/2 + 1)
		}
		d := server.DescriptorOutcome{
			Descriptor: &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: fmt.Sprint(k)}}},
			Rule:       rule, Outcome: server.WithinLimit, Hits: 1, Limit: l,
			Decision: limiter.Decision{Allowed: used < l.Burst || rng.IntN(2) == 0, Remaining: l.Burst - used},
		}
		if !d.Decision.Allowed {
			d.Outcome, d.Decision.Remaining = server.OverLimit, 0
		}
		desc := fmt.Sprintf("k=%d", k)
		tr.ObserveCall(server.Call{Start: at, Descriptors: []server.DescriptorOutcome{d}})
		if tr.buckets[rule.Path][desc] != nil {
			continue
		}
		turnedAway++
		fuller := 0
		for _, byDesc := range tr.buckets {
			for _, b := range byDesc {
				if b.usedAt(at)*l.Burst > used*b.limit.Burst {
					fuller++
				}
			}
		}
		if fuller < maxBuckets/2 {
			t.Fatalf("call %d: %s %s at %d/%d turned away at %v, but only %d of %d held buckets are fuller; bar %+v",
				i, rule.Path, desc, used, l.Burst, at, fuller, tr.nb, tr.bar)
		}
	}
	if turnedAway < 1000 {
		t.Errorf("%d of 20000 calls turned away: the test does not exercise the bar", turnedAway)
	}
}
