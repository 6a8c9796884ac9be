package config

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteText writes the set as text, one line per limit, for the debug
// listener's /rlconfig: domains sorted by name, each domain's rules in
// file order. Each line starts as envoyproxy/ratelimit's config dump does,
//
//	domain.key_value.key: unit=MINUTE requests_per_unit=20, shadow_mode: false, quota_mode: false
//
// (the key is the rule's stats key as the file writes it, the unit in
// capitals; an unlimited or deny-all rule shows requests_per_unit=0),
// then adds what ratelimitd knows beyond it: burst, the other fields that
// are set, the name and where the rule is written. The output is the same
// for equal sets.
func (s *Set) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	for _, d := range s.Domains() {
		for _, r := range d.Rules {
			writeRuleText(bw, r)
		}
	}
	return bw.Flush()
}

func writeRuleText(w *bufio.Writer, r *Rule) {
	key := r.fileKey()
	tail := func() {
		if r.Name != "" {
			fmt.Fprintf(w, ", name: %q", r.Name)
		}
		writeOn(w,
			onText{r.DetailedMetric, ", detailed_metric: true"},
			onText{r.ValueToMetric, ", value_to_metric: true"},
			onText{r.SharesBucket(), ", share_threshold: true"})
		if len(r.Replaces) > 0 {
			fmt.Fprintf(w, ", replaces: %s", strings.Join(r.Replaces, " "))
		}
		if r.Metadata != nil {
			if b, err := json.Marshal(r.Metadata); err == nil {
				fmt.Fprintf(w, ", metadata: %s", b)
			}
		}
		fmt.Fprintf(w, " (%s:%d)\n", r.File, r.Line)
	}
	head := func(unit string, count int64) {
		fmt.Fprintf(w, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t", key, unit, count, r.ShadowMode, r.QuotaMode)
	}
	switch r.Kind {
	case KindUnlimited:
		head("UNKNOWN", 0)
		w.WriteString(", unlimited: true")
		tail()
		return
	case KindDenyAll:
		head(strings.ToUpper(r.Limits[0].Unit.String()), 0)
		tail()
		return
	}
	for _, l := range r.Limits {
		head(strings.ToUpper(l.Unit.String()), l.Limit.Count)
		fmt.Fprintf(w, ", burst: %d", l.Limit.Burst)
		if l.UnitMultiplier > 1 {
			fmt.Fprintf(w, ", unit_multiplier: %d", l.UnitMultiplier)
		}
		if l.Name != "" && len(r.Limits) > 1 {
			fmt.Fprintf(w, ", limit: %q", l.Name)
		}
		if l.Counts == Tokens {
			w.WriteString(", counts: tokens")
		}
		if l.Limit.MaxDebt > 0 {
			fmt.Fprintf(w, ", max_debt: %d", l.Limit.MaxDebt)
		}
		if l.MaxWait > 0 {
			fmt.Fprintf(w, ", max_wait: %v, max_waiters: %d", l.MaxWait, l.MaxWaiters)
		}
		if l.Group != "" {
			fmt.Fprintf(w, ", quota_group: %q", l.Group)
			if l.Shared {
				w.WriteString(" (shared)")
			}
		}
		tail()
	}
}

// fileKey is the rule's stats key as its file writes it:
// "domain.key_value.key", as envoyproxy/ratelimit names a rule.
func (r *Rule) fileKey() string {
	var b strings.Builder
	b.WriteString(r.Domain)
	for _, l := range r.levels {
		b.WriteByte('.')
		b.WriteString(l.key)
		if l.value != "" {
			b.WriteByte('_')
			b.WriteString(l.value)
		}
	}
	return b.String()
}
