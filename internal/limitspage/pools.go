package limitspage

import (
	"time"
)

// PoolState is one concurrency pool of a Page: a rule with
// concurrency, and the values above its lease level.
type PoolState struct {
	// Rule is the rule's label; Pool names the pool (config.Rule.PoolLabel).
	Rule string `json:"rule"`
	Pool string `json:"pool"`
	// InFlight is the leases held when last asked; MaxInFlight the rule's
	// max_in_flight; Waiting the requests waiting here for a slot.
	InFlight    int64 `json:"in_flight"`
	MaxInFlight int64 `json:"max_in_flight"`
	Waiting     int   `json:"waiting"`
	// FillPercent is InFlight of MaxInFlight, 0 to 100.
	FillPercent int `json:"fill_percent"`
	// Seen is when the pool was last asked.
	Seen time.Time `json:"seen"`
}

// pools lists the fullest pools (by leases held), at most n.
func (h *Handler) pools(n int) []PoolState {
	if h.opts.Pools == nil {
		return nil
	}
	var out []PoolState
	for _, p := range h.opts.Pools(n) {
		fill := 0
		if p.MaxInFlight > 0 {
			fill = int(min(100, p.InFlight*100/p.MaxInFlight))
		}
		out = append(out, PoolState{Rule: p.Rule.Label(), Pool: p.Label, InFlight: p.InFlight, MaxInFlight: p.MaxInFlight,
			Waiting: p.Waiting, FillPercent: fill, Seen: p.Seen})
	}
	return out
}
