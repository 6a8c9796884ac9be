package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/ratelimitd/ratelimitd/config"
)

// errInvalidConfig is returned by validate when the files have problems
// (already printed, one per line).
var errInvalidConfig = errors.New("invalid configuration")

// runValidate checks the descriptor files at a path: it prints every
// problem and fails, or prints one line per domain, and on stderr a
// "warning:" line for each thing the files mean differently under
// envoyproxy/ratelimit (config.Set.Warnings), which does not fail.
func runValidate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelimitd validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var showVersion bool
	addVersionFlag(fs, &showVersion)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ratelimitd validate PATH (a descriptor file or a directory of them)")
	}
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if showVersion {
		return printVersion(stdout)
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return usageError{errors.New("validate takes exactly one PATH")}
	}
	set, err := config.Load(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errInvalidConfig
	}
	for _, d := range set.Domains() {
		files := make([]string, len(d.Files))
		for i, f := range d.Files {
			files[i] = filepath.Base(f)
		}
		fmt.Fprintf(stdout, "%s: %d rules from %s%s\n", d.Name, len(d.Rules), strings.Join(files, ", "), ruleNotes(d.Rules))
	}
	for _, w := range set.Warnings() {
		fmt.Fprintf(stderr, "warning: %v\n", w)
	}
	return nil
}

// ruleNotes counts the rules that use the incumbent's newer fields, for
// the domain's line: " (2 in quota mode, 2 with metadata)", or "".
func ruleNotes(rules []*config.Rule) string {
	var quota, meta, share, conc int
	for _, r := range rules {
		if r.Kind == config.KindConcurrency {
			conc++
		}
		if r.QuotaMode {
			quota++
		}
		if r.Metadata != nil {
			meta++
		}
		if r.SharesBucket() {
			share++
		}
	}
	var notes []string
	for _, n := range []struct {
		count int
		what  string
	}{{quota, "in quota mode"}, {meta, "with metadata"}, {share, "sharing a wildcard's bucket"}, {conc, "concurrency limits"}} {
		if n.count > 0 {
			notes = append(notes, fmt.Sprintf("%d %s", n.count, n.what))
		}
	}
	if len(notes) == 0 {
		return ""
	}
	return " (" + strings.Join(notes, ", ") + ")"
}
