package config

import "strings"

// MaxScanBytes bounds the part of a request value that the inner literals
// of one wildcard pattern are sought in: the literals between two '*'
// ("b" in "a*b*c") are looked for within the first MaxScanBytes bytes after
// the pattern's literal prefix. A pattern's prefix and suffix are checked
// against the whole value, at the cost of their own length. It is the
// longest value a descriptor may have in a config file, so every value that
// a config could name exactly is searched in full.
const MaxScanBytes = MaxValueBytes

// globPattern is a compiled wildcard value: the literal before the first
// '*', the literal after the last, and the literals between, in order. It
// matches a value that starts with prefix, ends with suffix, and holds
// every inner literal, in order and without overlap, in between: the
// greedy leftmost search of each inner literal after the end of the one
// before is correct, since taking the earliest end for each leaves the most
// room for the rest.
type globPattern struct {
	prefix, suffix string
	inner          []string
	// minLen is the length of every literal together: no shorter value
	// matches.
	minLen int
}

// compileGlob compiles pattern, which holds at least one '*'. Runs of '*'
// are one '*'.
func compileGlob(pattern string) *globPattern {
	first, last := strings.IndexByte(pattern, '*'), strings.LastIndexByte(pattern, '*')
	g := &globPattern{prefix: pattern[:first], suffix: pattern[last+1:]}
	for _, lit := range strings.Split(pattern[first+1:last+1], "*") {
		if lit != "" {
			g.inner = append(g.inner, lit)
		}
	}
	g.minLen = len(g.prefix) + len(g.suffix)
	for _, lit := range g.inner {
		g.minLen += len(lit)
	}
	return g
}

// match reports whether value matches g. It does not allocate and examines
// at most steps(g) bytes of value, whatever value's length (see matchSteps).
func (g *globPattern) match(value string) bool {
	ok, _ := g.matchSteps(value)
	return ok
}

// matchSteps is match, also counting the bytes of value it handed to a
// comparison or a search: at most len(prefix)+len(suffix) for the ends,
// plus MaxScanBytes for the inner literals (each search starts where the
// last ended, within one window). Go's strings.Index is linear in the bytes
// it is given (brute force for short needles, Rabin-Karp beyond), so the
// time follows the count: O(len(pattern) + MaxScanBytes) per pattern.
func (g *globPattern) matchSteps(value string) (bool, int) {
	if len(value) < g.minLen {
		return false, 0
	}
	steps := len(g.prefix) + len(g.suffix)
	if !strings.HasPrefix(value, g.prefix) || !strings.HasSuffix(value, g.suffix) {
		return false, steps
	}
	if len(g.inner) == 0 {
		return true, steps
	}
	region := value[len(g.prefix) : len(value)-len(g.suffix)]
	if len(region) > MaxScanBytes {
		region = region[:MaxScanBytes]
	}
	at := 0
	for _, lit := range g.inner {
		rest := region[at:]
		j := strings.Index(rest, lit)
		if j < 0 {
			return false, steps + len(rest)
		}
		steps += j + len(lit)
		at += j + len(lit)
	}
	return true, steps
}

// maxSteps is the most bytes matchSteps examines for g, for any value.
func (g *globPattern) maxSteps() int {
	n := len(g.prefix) + len(g.suffix)
	if len(g.inner) > 0 {
		n += MaxScanBytes
	}
	return n
}
