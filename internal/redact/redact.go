// Package redact hides descriptor values (which may be API keys, user ids
// or addresses) where operators look at them: the /limits page, its JSON
// and the metrics' value labels. A Mode says how; it is applied to each
// value alone, so that values stay distinct (hash) or group (prefix) the
// same way wherever they are shown.
package redact

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"unicode/utf8"
)

// Mode is how values are shown. The zero value is invalid; Parse and the
// flag take "off", "hash" and "prefix".
type Mode int

const (
	// Off shows values as they are.
	Off Mode = iota + 1
	// Hash shows "sha256:" and the first 8 hex digits of the value's
	// SHA-256: equal values look alike, others almost surely not, and the
	// value cannot be read back (short or guessable values, such as small
	// numbers, can be found by trying them).
	Hash
	// Prefix shows the first PrefixRunes characters of the value, but never
	// more than half of them, and "…": enough to tell tenants or key kinds
	// apart ("sk-l…"), not to use a key; a short value keeps less ("42"
	// shows as "4…").
	Prefix
)

// PrefixRunes is how many characters Prefix keeps.
const PrefixRunes = 4

// HashDigits is how many hex digits of the SHA-256 Hash keeps.
const HashDigits = 8

// Modes are the valid modes' names, in the order help text lists them.
var Modes = []string{"off", "hash", "prefix"}

// Parse returns the Mode named s.
func Parse(s string) (Mode, error) {
	switch s {
	case "off":
		return Off, nil
	case "hash":
		return Hash, nil
	case "prefix":
		return Prefix, nil
	}
	return 0, fmt.Errorf("unknown redaction %q (want off, hash or prefix)", s)
}

// modeNames are the modes' names, as Parse takes them, indexed by Mode.
var modeNames = [...]string{Off: "off", Hash: "hash", Prefix: "prefix"}

// String is the mode's name, as Parse takes it.
func (m Mode) String() string {
	if m >= Off && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Value returns v as m shows it. The empty value (a key-only descriptor's,
// or a rule's own series) is shown as it is, as is every value with Off;
// an invalid Mode (the zero value) hashes, so that a mistake fails closed.
func (m Mode) Value(v string) string {
	if v == "" || m == Off {
		return v
	}
	if m == Prefix {
		return prefix(v)
	}
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:HashDigits/2])
}

// prefix keeps the first PrefixRunes characters of v, at most half of
// them (whole UTF-8 sequences; an invalid byte counts as a character),
// and marks the cut with "…".
func prefix(v string) string {
	keep := min(PrefixRunes, utf8.RuneCountInString(v)/2)
	n := 0
	for i := range v {
		if n == keep {
			return v[:i] + "…"
		}
		n++
	}
	return v + "…" // not reached: keep is less than the count
}
