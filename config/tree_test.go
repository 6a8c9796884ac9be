package config

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestExplain(t *testing.T) {
	s := mustParse(t, File{"ai.yaml", []byte(lookupYAML)})
	tests := []struct {
		domain  string
		entries []Entry
		want    []string
	}{
		{"ai", e("model", "gpt-4o", "user", "bob"), []string{
			"domain ai (ai.yaml)",
			"model=gpt-4o: exact value matched [ai.yaml:4]",
			"user=bob: exact value matched [ai.yaml:10]",
			"rule ai > model=gpt-4o > user=bob: 5 per minute, burst 5",
		}},
		{"ai", e("model", "gpt-4o", "user", "alice"), []string{
			"domain ai (ai.yaml)",
			"model=gpt-4o: exact value matched [ai.yaml:4]",
			"user=alice: key-only rule matched (own bucket per value) [ai.yaml:8]",
			"rule ai > model=gpt-4o > user: 20 per minute, burst 20",
		}},
		{"ai", e("model", "gpt-4o", "tier", "gold", "user", "x"), []string{
			"domain ai (ai.yaml)",
			"model=gpt-4o: exact value matched [ai.yaml:4]",
			"tier=gold: exact value matched [ai.yaml:13]",
			"user=x: key-only rule matched (own bucket per value) [ai.yaml:16]",
			"rule ai > model=gpt-4o > tier=gold > user: 1000 per 2 hours, burst 1000",
		}},
		{"ai", e("model", "gpt-4o", "tier", "gold"), []string{
			"domain ai (ai.yaml)",
			"model=gpt-4o: exact value matched [ai.yaml:4]",
			"tier=gold: exact value matched [ai.yaml:13]",
			"ai > model=gpt-4o > tier=gold has no rate_limit (it only groups nested descriptors): no rule",
		}},
		{"ai", e("model", "gpt-4o", "tier", "silver"), []string{
			"domain ai (ai.yaml)",
			"model=gpt-4o: exact value matched [ai.yaml:4]",
			"no rule for tier=silver under ai > model=gpt-4o: no descriptor with this value, no wildcard matches it, and no key-only descriptor for tier",
		}},
		{"ai", e("model", "gpt-4o", "region", "eu"), []string{
			"domain ai (ai.yaml)",
			"model=gpt-4o: exact value matched [ai.yaml:4]",
			"no rule for region=eu under ai > model=gpt-4o: no descriptor has key region (keys here: tier, user)",
		}},
		{"ai", e("model", "gpt-4.1", "user", "x"), []string{
			"domain ai (ai.yaml)",
			`model=gpt-4.1: wildcard value "gpt-4*" matched [ai.yaml:18]`,
			"no rule for user=x under ai > model=gpt-4*: it has no nested descriptors",
		}},
		{"ai", e("team", "a", "model", "o3"), []string{
			"domain ai (ai.yaml)",
			"team=a: key-only descriptor matched [ai.yaml:32]",
			`model=o3: wildcard value "o*" matched [ai.yaml:34]`,
			"rule ai > team > model=o*: 7 per second, burst 7, shadow mode (never denies)",
		}},
		{"ai", e("internal", "x"), []string{
			"domain ai (ai.yaml)",
			"internal=x: key-only rule matched (own bucket per value) [ai.yaml:38]",
			`rule ai > internal (name "internal"): unlimited`,
		}},
		{"ai", nil, []string{"domain ai (ai.yaml)", "no entries: no rule"}},
		{"nope", e("k", "v"), []string{"unknown domain nope: no rule"}},
		{"has space", e("k", "v"), []string{`unknown domain "has space": no rule`}},
	}
	for _, tt := range tests {
		got := s.Explain(tt.domain, tt.entries)
		if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
			t.Errorf("Explain(%q, %q) =\n\t%s\nwant\n\t%s", tt.domain, tt.entries, strings.Join(got, "\n\t"), strings.Join(tt.want, "\n\t"))
		}
	}
}

func TestGlob(t *testing.T) {
	for _, tt := range []struct {
		pattern, value string
		want           bool
	}{
		{"*", "", true}, {"*", "abc", true},
		{"a*", "a", true}, {"a*", "abc", true}, {"a*", "ba", false},
		{"*c", "abc", true}, {"*c", "abcd", false},
		{"a*c", "ac", true}, {"a*c", "abbbc", true}, {"a*c", "abcb", false},
		{"a*b*c", "aXbYc", true}, {"a*b*c", "abc", true}, {"a*b*c", "acb", false},
		{"**", "x", true}, {"a**b", "ab", true},
		{"*a*a*a*a*b", strings.Repeat("a", 100), false},
		{"é*", "éa", true}, {"*\x00", "x\x00", true},
		{"lit*", "lit*", true}, {"ab*b", "ab", false}, {"ab*ba", "aba", false}, {"ab*ba", "abba", true},
	} {
		if got := compileGlob(tt.pattern).match(tt.value); got != tt.want {
			t.Errorf("glob(%q, %q) = %v, want %v", tt.pattern, tt.value, got, tt.want)
		}
	}
}

// TestLookupAllocs pins Lookup's promise not to allocate, on every kind of
// match and miss.
func TestLookupAllocs(t *testing.T) {
	s := mustParse(t, File{"ai.yaml", []byte(lookupYAML)})
	requests := [][]Entry{
		e("model", "gpt-4o", "user", "bob"),
		e("model", "gpt-4o", "tier", "gold", "user", "x"),
		e("model", "gpt-4o-mini"),
		e("model", "claude-opus"),
		e("team", "t", "model", "o3"),
		e("nope", "x"),
	}
	for _, entries := range requests {
		if n := testing.AllocsPerRun(100, func() { s.Lookup("ai", entries) }); n != 0 {
			t.Errorf("Lookup(%q) allocates %v times, want 0", entries, n)
		}
	}
	if n := testing.AllocsPerRun(100, func() { s.Lookup("other", requests[0]) }); n != 0 {
		t.Errorf("Lookup(unknown domain) allocates %v times, want 0", n)
	}
}

func BenchmarkLookup(b *testing.B) {
	s := mustParse(b, File{"ai.yaml", []byte(lookupYAML)})
	for _, bm := range []struct {
		name    string
		entries []Entry
	}{
		{"exact", e("model", "gpt-4o")},
		{"nested", e("model", "gpt-4o", "tier", "gold", "user", "alice")},
		{"wildcard", e("model", "o4-mini")},
		{"keyonly", e("model", "claude-opus-4")},
		{"miss", e("region", "eu")},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if s.Lookup("ai", bm.entries) == nil && bm.name != "miss" {
					b.Fatal("no rule")
				}
			}
		})
	}
}

// pathOf names a rule Lookup returned, nil included.
func pathOf(r *Rule) string {
	if r == nil {
		return "<nil>"
	}
	return r.Path
}

// TestConcurrentUse shares one Set between goroutines: each asks it what a
// sequential run asked first, in its own order, and every answer must be
// the sequential one (the same *Rule, the same lines), counted so that a
// goroutine that stopped early shows. Run with -race, it also shows that
// reading a Set writes nothing.
func TestConcurrentUse(t *testing.T) {
	s := mustParse(t, File{"ai.yaml", []byte(lookupYAML)})
	queries := []struct {
		domain  string
		entries []Entry
	}{
		{"ai", e("model", "gpt-4o")},
		{"ai", e("model", "gpt-4o-mini")},
		{"ai", e("model", "gpt-4.1")},
		{"ai", e("model", "o4-mini")},
		{"ai", e("model", "claude")},
		{"ai", e("model", "gpt-4o", "user", "bob")},
		{"ai", e("model", "gpt-4o", "user", "alice")},
		{"ai", e("model", "gpt-4o", "tier", "gold", "user", "x")},
		{"ai", e("team", "a", "model", "o3")},
		{"ai", e("internal", "svc")},
		{"ai", e("region", "eu")},
		{"other", e("model", "gpt-4o")},
	}
	want := make([]*Rule, len(queries))
	explained := make([]string, len(queries))
	found := 0
	for i, q := range queries {
		want[i] = s.Lookup(q.domain, q.entries)
		explained[i] = strings.Join(s.Explain(q.domain, q.entries), "\n")
		if want[i] != nil {
			found++
		}
	}
	if found < len(queries)/2 || found == len(queries) {
		t.Fatalf("sequentially, %d of %d queries find a rule: want most, not all", found, len(queries))
	}
	wantDomains, wantHash := slices.Clone(s.Domains()), s.Hash()

	const goroutines, rounds = 8, 4000
	var answered, wrong atomic.Int64
	mismatch := func(format string, args ...any) {
		if wrong.Add(1) <= 5 {
			t.Errorf(format, args...)
		}
	}
	var wg sync.WaitGroup
	start := make(chan struct{}) // all at once, not one after the other
	for g := range goroutines {
		order := rand.New(rand.NewPCG(uint64(g), 0)).Perm(len(queries)) // this goroutine's own
		wg.Go(func() {
			<-start
			for round := range rounds {
				for j := range queries {
					i := order[(j+round)%len(queries)]
					q := queries[i]
					if r := s.Lookup(q.domain, q.entries); r != want[i] {
						mismatch("goroutine %d: Lookup(%q, %v) = rule %s; sequentially %s", g, q.domain, q.entries, pathOf(r), pathOf(want[i]))
					}
					answered.Add(1)
				}
				if round%4 != 0 {
					continue
				}
				i := (round/4 + g) % len(queries)
				if got := strings.Join(s.Explain(queries[i].domain, queries[i].entries), "\n"); got != explained[i] {
					mismatch("goroutine %d: Explain(%q, %v) = %q; sequentially %q", g, queries[i].domain, queries[i].entries, got, explained[i])
				}
				// Domains hands out a slice of the caller's: scribbling on
				// it changes what no one else sees.
				d := s.Domains()
				if !slices.Equal(d, wantDomains) || s.Hash() != wantHash {
					mismatch("goroutine %d: Domains() = %v, Hash() = %s; sequentially %v, %s", g, d, s.Hash(), wantDomains, wantHash)
				}
				clear(d)
				answered.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if n, want := answered.Load(), int64(goroutines*rounds*len(queries)+goroutines*rounds/4); n != want || wrong.Load() != 0 {
		t.Errorf("%d queries answered concurrently, %d of them differently from the sequential run; want %d, all the same", n, wrong.Load(), want)
	}
}
