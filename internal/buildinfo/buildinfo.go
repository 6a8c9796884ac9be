// Package buildinfo says which build of ratelimitd is running: its
// version, the VCS revision it was built from and whether the work tree
// had changes, when the build is dated, and the Go version and platform.
//
// Every value has one source. A release build sets them with the linker
// (Stamp.LinkerFlags; `make release` does it through the image tool):
// the version given, the commit, and SOURCE_DATE_EPOCH as the build
// time, so that two builds of one commit are the same bytes. A plain
// `go build` sets none of them, and they come from what the Go command
// records in the binary (runtime/debug.ReadBuildInfo): the main module's
// version (a tag, or a pseudo-version built from the commit; "(devel)"
// when the build has no VCS stamp) and the vcs.revision, vcs.modified and
// vcs.time settings (the commit's time: a plain build is dated by its
// commit too).
//
// The values are fixed for the life of the process: Get reads them once
// and is safe for concurrent use.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The linker sets these (-X, see Stamp.LinkerFlags); empty means not set.
var (
	version   string
	revision  string
	modified  string // "true" or "false"
	buildTime string // RFC 3339
)

// pkgPath is this package's import path, which -X names its variables by.
const pkgPath = "github.com/ratelimitd/ratelimitd/internal/buildinfo"

// Devel is the Version of a build that has none: the Go command's word
// for a main module built from a tree without a VCS stamp.
const Devel = "(devel)"

// Info is one build of ratelimitd. Its JSON is what `ratelimitd version
// --output json` prints.
type Info struct {
	// Version is a release's tag ("v1.2.3"), a Go pseudo-version for a
	// build from a commit without one ("v0.0.0-20261205101500-a746683abcde+dirty"),
	// or Devel.
	Version string `json:"version"`
	// Revision is the full VCS commit hash; "" when the build does not
	// say.
	Revision string `json:"revision"`
	// Modified is true when the work tree the build came from differed
	// from Revision (uncommitted or untracked files).
	Modified bool `json:"modified"`
	// BuildTime is the time the build is dated, RFC 3339 in UTC: the
	// commit's (SOURCE_DATE_EPOCH for a release, vcs.time otherwise); ""
	// when the build does not say.
	BuildTime string `json:"build_time"`
	// GoVersion is the Go release that built it ("go1.26.8").
	GoVersion string `json:"go_version"`
	// Platform is GOOS/GOARCH ("linux/amd64").
	Platform string `json:"platform"`
}

// String is Info on one line, each field named but the version:
//
//	ratelimitd v1.2.3 revision=4c35b92… modified=false built=2026-12-05T10:15:00Z go=go1.26.8 platform=linux/amd64
//
// An unknown revision or build time reads "unknown".
func (i Info) String() string {
	rev, built := i.Revision, i.BuildTime
	if rev == "" {
		rev = "unknown"
	}
	if built == "" {
		built = "unknown"
	}
	return fmt.Sprintf("ratelimitd %s revision=%s modified=%t built=%s go=%s platform=%s",
		i.Version, rev, i.Modified, built, i.GoVersion, i.Platform)
}

// Get returns the running binary's Info.
func Get() Info { return get() }

var get = sync.OnceValue(func() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return resolve(linked(), bi, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
})

// Stamp is what a release build sets with the linker. Its zero value sets
// nothing.
type Stamp struct {
	// Version is the release ("v1.2.3"); empty leaves the Go command's.
	Version string
	// Revision is the commit; empty leaves the Go command's vcs.revision,
	// and Modified with it.
	Revision string
	// Modified says the work tree differed from Revision; set only with
	// Revision.
	Modified bool
	// Time dates the build (SOURCE_DATE_EPOCH); zero leaves vcs.time.
	Time time.Time
}

// LinkerFlags are the -X flags of the go command's -ldflags that stamp s
// into a binary: "-X", "importpath.name=value" pairs, for the fields s
// sets. No value holds a space, so they join into one -ldflags string
// as they are (Validate refuses one that does).
func (s Stamp) LinkerFlags() []string {
	var out []string
	set := func(name, value string) {
		out = append(out, "-X", pkgPath+"."+name+"="+value)
	}
	if s.Version != "" {
		set("version", s.Version)
	}
	if s.Revision != "" {
		set("revision", s.Revision)
		set("modified", strconv.FormatBool(s.Modified))
	}
	if !s.Time.IsZero() {
		set("buildTime", s.Time.UTC().Format(time.RFC3339))
	}
	return out
}

// Validate says why s cannot be stamped: a version or revision with
// white space or a quote, which -ldflags would split or mangle.
func (s Stamp) Validate() error {
	for _, f := range []struct{ name, v string }{{"version", s.Version}, {"revision", s.Revision}} {
		if strings.ContainsAny(f.v, " \t\n\r'\"\\") {
			return fmt.Errorf("buildinfo: %s %q: want no blanks, quotes or backslashes", f.name, f.v)
		}
	}
	return nil
}

// linked is what the linker set, as a Stamp; a value it set that does
// not parse (a hand-made -X) is taken as unset.
func linked() Stamp {
	s := Stamp{Version: version, Revision: revision}
	s.Modified, _ = strconv.ParseBool(modified)
	if t, err := time.Parse(time.RFC3339, buildTime); err == nil {
		s.Time = t
	}
	return s
}

// resolve is the Info of a binary stamped with s, whose Go build
// information is bi (nil when it has none), built by goVersion for
// platform: each field from s when s sets it, else from bi.
func resolve(s Stamp, bi *debug.BuildInfo, goVersion, platform string) Info {
	i := Info{Version: s.Version, Revision: s.Revision, Modified: s.Modified, GoVersion: goVersion, Platform: platform}
	if !s.Time.IsZero() {
		i.BuildTime = s.Time.UTC().Format(time.RFC3339)
	}
	if bi != nil {
		if i.Version == "" {
			i.Version = bi.Main.Version
		}
		for _, kv := range bi.Settings {
			switch kv.Key {
			case "vcs.revision":
				if s.Revision == "" {
					i.Revision = kv.Value
				}
			case "vcs.modified":
				if s.Revision == "" {
					i.Modified = kv.Value == "true"
				}
			case "vcs.time":
				if t, err := time.Parse(time.RFC3339Nano, kv.Value); err == nil && i.BuildTime == "" {
					i.BuildTime = t.UTC().Format(time.RFC3339)
				}
			}
		}
	}
	if i.Version == "" {
		i.Version = Devel
	}
	return i
}
