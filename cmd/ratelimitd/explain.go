package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/answer"
)

// runExplain loads descriptor files and prints, for each -d descriptor,
// how matching walks the domain's tree and which rule it lands on. It
// needs no server.
func runExplain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelimitd explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "descriptor file or directory (required)")
	var rf requestFlags
	if printed, err := rf.parse(fs, "explain", "usage: ratelimitd explain --config PATH --domain D -d key=value[,key=value] [-d ...]", args, stdout); printed || err != nil {
		return err
	}
	if *path == "" {
		return usageError{errors.New("explain: --config is required")}
	}
	set, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errInvalidConfig
	}
	var b strings.Builder
	for i, d := range rf.descs {
		entries := make([]config.Entry, len(d))
		for j, e := range d {
			entries[j] = config.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "descriptor %d: %s\n", i+1, answer.Entries(d))
		for _, line := range set.Explain(rf.domain, entries) {
			fmt.Fprintf(&b, "  %s\n", line)
		}
		if r := set.Lookup(rf.domain, entries); r != nil {
			// The key envoyproxy/ratelimit's per-rule stats carry.
			fmt.Fprintf(&b, "  stats key %s\n", r.StatKey(entries))
			if r.Kind == config.KindConcurrency && len(entries) > 0 {
				fmt.Fprintf(&b, "  pool %s, lease %q: at request time (hits >= 1) it takes the lease, with is_negative_hits it releases it\n",
					r.PoolLabel(entries), entries[len(entries)-1].Value)
			}
		}
	}
	_, err = io.WriteString(stdout, b.String())
	return err
}
