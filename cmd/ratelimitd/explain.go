package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ratelimitd/ratelimitd/config"
)

// runExplain loads descriptor files and prints, for each -d descriptor,
// how matching walks the domain's tree and which rule it lands on. It
// needs no server.
func runExplain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelimitd explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "descriptor file or directory (required)")
	domain := fs.String("domain", "", "the request's domain (required)")
	var descs descriptorFlags
	fs.Var(&descs, "d", "a descriptor, key=value[,key=value...]; repeat for several (at least one)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ratelimitd explain --config PATH --domain D -d key=value[,key=value] [-d ...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	switch {
	case fs.NArg() > 0:
		return usageError{fmt.Errorf("explain: unexpected argument %q", fs.Arg(0))}
	case *path == "":
		return usageError{errors.New("explain: --config is required")}
	case *domain == "":
		return usageError{errors.New("explain: --domain is required")}
	case len(descs) == 0:
		return usageError{errors.New("explain: at least one -d key=value is required")}
	}
	set, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errInvalidConfig
	}
	var b strings.Builder
	for i, d := range descs {
		entries := make([]config.Entry, len(d))
		for j, e := range d {
			entries[j] = config.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "descriptor %d: %s\n", i+1, entriesString(d))
		for _, line := range set.Explain(*domain, entries) {
			fmt.Fprintf(&b, "  %s\n", line)
		}
	}
	_, err = io.WriteString(stdout, b.String())
	return err
}
