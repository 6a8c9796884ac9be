package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
)

// versionFlag is the flag every command takes to print the version line
// instead of running (buildinfo.Info.String). It is never read from the
// environment: a RATELIMITD_VERSION a deployment sets for itself must not
// turn serve into a one-line print.
const versionFlag = "version"

// addVersionFlag adds --version to fs; *to says whether it was given.
func addVersionFlag(fs *flag.FlagSet, to *bool) {
	fs.BoolVar(to, versionFlag, false, "print the version (one line) and exit")
}

// runVersion is the version command: the running binary's build, one line
// (--output text) or a JSON object (--output json).
func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelimitd version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	output := fs.String("output", "text", "text (one line) or json (version, revision, modified, build_time, go_version, platform)")
	var ignored bool
	addVersionFlag(fs, &ignored) // `version --version` is the version
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ratelimitd version [--output text|json]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("version: unexpected argument %q", fs.Arg(0))}
	}
	return writeVersion(stdout, buildinfo.Get(), *output)
}

// writeVersion writes info as output says: "text", its String and a
// newline; "json", an indented object and a newline.
func writeVersion(w io.Writer, info buildinfo.Info, output string) error {
	switch output {
	case "text":
		_, err := fmt.Fprintln(w, info)
		return err
	case "json":
		b, err := json.MarshalIndent(info, "", "  ")
		if err != nil {
			return err
		}
		_, err = w.Write(append(b, '\n'))
		return err
	}
	return usageError{fmt.Errorf("version: --output %q: want text or json", output)}
}

// printVersion is what --version prints, for any command.
func printVersion(w io.Writer) error { return writeVersion(w, buildinfo.Get(), "text") }
