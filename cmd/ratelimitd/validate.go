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
// problem and fails, or prints one line per domain.
func runValidate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelimitd validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ratelimitd validate PATH (a descriptor file or a directory of them)")
	}
	if err := fs.Parse(args); err != nil {
		return usageError{err}
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
		fmt.Fprintf(stdout, "%s: %d rules from %s\n", d.Name, len(d.Rules), strings.Join(files, ", "))
	}
	return nil
}
