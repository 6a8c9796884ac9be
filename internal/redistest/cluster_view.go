package redistest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// clusterView is one node's CLUSTER NODES.
type clusterView struct {
	from  string // the node's address as clients see it
	text  string
	lines []nodeLine
}

// nodeLine is one line of CLUSTER NODES.
type nodeLine struct {
	id       string
	addr     string // ip:port as announced
	flags    []string
	masterID string // "" for a master
	slots    [][2]int
}

func (l nodeLine) isMaster() bool { return slices.Contains(l.flags, "master") }

// failed reports a node flagged as failed, or not (yet) usable.
func (l nodeLine) failed() bool {
	return slices.ContainsFunc(l.flags, func(f string) bool {
		return f == "fail" || f == "noaddr" || f == "handshake"
	})
}

// view returns the CLUSTER NODES of the first live node (masters first)
// that answers, other than the node whose ID is not.
func (rc *ReplicatedCluster) view(ctx context.Context, not string) (clusterView, error) {
	live := rc.live()
	slices.SortStableFunc(live, func(a, b *clusterNode) int { // masters first
		return cmp.Compare(rc.masterIndex(a), rc.masterIndex(b))
	})
	var errs []error
	for _, n := range live {
		if n.id == not {
			continue
		}
		v, err := nodeView(ctx, n)
		if err == nil {
			return v, nil
		}
		errs = append(errs, err)
	}
	return clusterView{}, fmt.Errorf("redistest: no cluster node answered CLUSTER NODES: %w", errors.Join(errs...))
}

// masterIndex is n's index as a master, or a large number for a replica.
func (rc *ReplicatedCluster) masterIndex(n *clusterNode) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if i := slices.Index(rc.masters, n); i >= 0 {
		return i
	}
	return len(rc.masters)
}

// nodeView reads and parses n's CLUSTER NODES.
func nodeView(ctx context.Context, n *clusterNode) (clusterView, error) {
	text, err := n.admin.ClusterNodes(ctx).Result()
	if err != nil {
		return clusterView{}, fmt.Errorf("CLUSTER NODES on %s: %w", n.addr, err)
	}
	lines, err := parseClusterNodes(text)
	if err != nil {
		return clusterView{}, fmt.Errorf("CLUSTER NODES on %s: %w", n.addr, err)
	}
	return clusterView{from: n.addr, text: text, lines: lines}, nil
}

// parseClusterNodes parses CLUSTER NODES: per line, <id>
// <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv>
// <config-epoch> <link-state> <slot>…, where a slot is "n", "first-last", or (on the node itself) a
// migration in brackets, which is skipped.
func parseClusterNodes(text string) ([]nodeLine, error) {
	var lines []nodeLine
	for s := range strings.Lines(text) {
		f := strings.Fields(s)
		if len(f) == 0 {
			continue
		}
		if len(f) < 8 {
			return nil, fmt.Errorf("line %q: want at least 8 fields", s)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		l := nodeLine{id: f[0], addr: addr, flags: strings.Split(f[2], ",")}
		if f[3] != "-" {
			l.masterID = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue
			}
			first, last, isRange := strings.Cut(r, "-")
			if !isRange {
				last = first
			}
			a, err1 := strconv.Atoi(first)
			b, err2 := strconv.Atoi(last)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("line %q: slot range %q", s, r)
			}
			l.slots = append(l.slots, [2]int{a, b})
		}
		lines = append(lines, l)
	}
	return lines, nil
}

// mastersOf returns the masters v does not flag as failed, by first slot
// (those without slots last, by address).
func mastersOf(v clusterView) []Node {
	var ms []Node
	for _, l := range v.lines {
		if l.isMaster() && !l.failed() {
			ms = append(ms, Node{Addr: l.addr, ID: l.id, Slots: l.slots})
		}
	}
	slices.SortFunc(ms, func(a, b Node) int {
		switch {
		case len(a.Slots) == 0 && len(b.Slots) == 0:
			return strings.Compare(a.Addr, b.Addr)
		case len(a.Slots) == 0:
			return 1
		case len(b.Slots) == 0:
			return -1
		}
		return cmp.Compare(a.Slots[0][0], b.Slots[0][0])
	})
	return ms
}

// replicasOf returns the replicas of the master with that ID that v does
// not flag as failed, by address.
func replicasOf(v clusterView, masterID string) []Node {
	var rs []Node
	for _, l := range v.lines {
		if l.masterID == masterID && !l.isMaster() && !l.failed() {
			rs = append(rs, Node{Addr: l.addr, ID: l.id})
		}
	}
	slices.SortFunc(rs, func(a, b Node) int { return strings.Compare(a.Addr, b.Addr) })
	return rs
}

// ownerOf returns the ID of the node v gives slot to, or "".
func ownerOf(v clusterView, slot int) string {
	for _, l := range v.lines {
		for _, r := range l.slots {
			if r[0] <= slot && slot <= r[1] {
				return l.id
			}
		}
	}
	return ""
}

// covers reports whether the ranges have cover every slot of want.
func covers(have, want [][2]int) bool {
	for _, w := range want {
		for s := w[0]; s <= w[1]; s++ {
			if !slices.ContainsFunc(have, func(r [2]int) bool { return r[0] <= s && s <= r[1] }) {
				return false
			}
		}
	}
	return true
}

// slotMap is a canonical form of who serves which slot in v: each owner's
// ID and ranges, by ID. Two nodes agree when their slot maps are equal.
func slotMap(v clusterView) string {
	var owners []string
	for _, l := range v.lines {
		if len(l.slots) > 0 {
			owners = append(owners, fmt.Sprintf("%s:%v", l.id, l.slots))
		}
	}
	slices.Sort(owners)
	return strings.Join(owners, " ")
}

// waitAgree waits until every live node's CLUSTER NODES gives the same
// owner to every slot and check (if not nil) accepts it.
func (rc *ReplicatedCluster) waitAgree(ctx context.Context, check func(clusterView) error) error {
	for {
		state := rc.disagreement(ctx, check)
		if state == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: cluster nodes do not agree on the slots: %w; %s", ctx.Err(), state)
		case <-time.After(pollInterval):
		}
	}
}

// disagreement says how the live nodes' slot maps differ or check refuses
// one, or returns "" if they agree.
func (rc *ReplicatedCluster) disagreement(ctx context.Context, check func(clusterView) error) string {
	var first string
	for _, n := range rc.live() {
		v, err := nodeView(ctx, n)
		if err == nil && check != nil {
			err = check(v)
		}
		if err != nil {
			return fmt.Sprintf("%s: %v", n.addr, err)
		}
		switch m := slotMap(v); {
		case first == "":
			first = m
		case m != first:
			return fmt.Sprintf("%s says %s; the first node says %s", n.addr, m, first)
		}
	}
	return ""
}

// infoFields parses the "key:value" lines of INFO or CLUSTER INFO.
func infoFields(info string) map[string]string {
	fields := make(map[string]string)
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields
}
