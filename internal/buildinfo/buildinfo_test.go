package buildinfo

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"
)

const rev = "4c35b9250afefede41c5f5acd76191f90f625898"

var commitTime = time.Date(2026, 12, 5, 10, 15, 0, 0, time.UTC)

// vcs is the build information `go build` records in a checkout at rev.
func vcs(version string, dirty bool) *debug.BuildInfo {
	m := "false"
	if dirty {
		m = "true"
	}
	return &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/ratelimitd/ratelimitd", Version: version},
		Settings: []debug.BuildSetting{
			{Key: "-trimpath", Value: "true"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: rev},
			{Key: "vcs.time", Value: "2026-12-05T11:15:00+01:00"},
			{Key: "vcs.modified", Value: m},
		},
	}
}

func TestResolve(t *testing.T) {
	const goVersion, platform = "go1.26.8", "linux/arm64"
	release := Stamp{Version: "v1.2.3", Revision: "0123456789abcdef0123456789abcdef01234567", Time: commitTime.Add(time.Hour)}
	for _, c := range []struct {
		name  string
		stamp Stamp
		bi    *debug.BuildInfo
		want  Info
	}{
		{
			name: "plain go build of a tagged commit",
			bi:   vcs("v1.2.3", false),
			want: Info{Version: "v1.2.3", Revision: rev, BuildTime: "2026-12-05T10:15:00Z"},
		},
		{
			name: "plain go build of a changed tree",
			bi:   vcs("v0.0.0-20261205101500-4c35b9250afe+dirty", true),
			want: Info{Version: "v0.0.0-20261205101500-4c35b9250afe+dirty", Revision: rev, Modified: true, BuildTime: "2026-12-05T10:15:00Z"},
		},
		{
			name: "no VCS stamp (-buildvcs=false, go test)",
			bi:   &debug.BuildInfo{Main: debug.Module{Path: "github.com/ratelimitd/ratelimitd", Version: Devel}},
			want: Info{Version: Devel},
		},
		{
			name: "no build information at all",
			want: Info{Version: Devel},
		},
		{
			name:  "release: every field from the linker, over the Go command's",
			stamp: release,
			bi:    vcs("v0.0.0-20261205101500-4c35b9250afe+dirty", true),
			want:  Info{Version: "v1.2.3", Revision: release.Revision, BuildTime: "2026-12-05T11:15:00Z"},
		},
		{
			name:  "release built with -buildvcs=false",
			stamp: Stamp{Version: "v1.2.3", Revision: rev, Modified: true, Time: commitTime},
			bi:    &debug.BuildInfo{Main: debug.Module{Version: Devel}},
			want:  Info{Version: "v1.2.3", Revision: rev, Modified: true, BuildTime: "2026-12-05T10:15:00Z"},
		},
		{
			name:  "only the version stamped: the rest from VCS",
			stamp: Stamp{Version: "v1.2.4"},
			bi:    vcs("v1.2.3", true),
			want:  Info{Version: "v1.2.4", Revision: rev, Modified: true, BuildTime: "2026-12-05T10:15:00Z"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.want.GoVersion, c.want.Platform = goVersion, platform
			if got := resolve(c.stamp, c.bi, goVersion, platform); got != c.want {
				t.Errorf("resolve(%+v) =\n %+v\nwant\n %+v", c.stamp, got, c.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	for _, c := range []struct {
		info Info
		want string
	}{
		{
			Info{Version: "v1.2.3", Revision: rev, BuildTime: "2026-12-05T10:15:00Z", GoVersion: "go1.26.8", Platform: "linux/amd64"},
			"ratelimitd v1.2.3 revision=" + rev + " modified=false built=2026-12-05T10:15:00Z go=go1.26.8 platform=linux/amd64",
		},
		{
			Info{Version: Devel, GoVersion: "go1.26.8", Platform: "linux/arm64"},
			"ratelimitd (devel) revision=unknown modified=false built=unknown go=go1.26.8 platform=linux/arm64",
		},
		{
			Info{Version: "v0.0.0-20261205101500-4c35b9250afe+dirty", Revision: rev, Modified: true, GoVersion: "go1.26.8", Platform: "darwin/arm64"},
			"ratelimitd v0.0.0-20261205101500-4c35b9250afe+dirty revision=" + rev + " modified=true built=unknown go=go1.26.8 platform=darwin/arm64",
		},
	} {
		if got := c.info.String(); got != c.want {
			t.Errorf("%+v.String() =\n %s\nwant\n %s", c.info, got, c.want)
		}
	}
}

func TestJSON(t *testing.T) {
	i := Info{Version: "v1.2.3", Revision: rev, Modified: true, BuildTime: "2026-12-05T10:15:00Z", GoVersion: "go1.26.8", Platform: "linux/amd64"}
	b, err := json.Marshal(i)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"version":"v1.2.3","revision":"` + rev + `","modified":true,"build_time":"2026-12-05T10:15:00Z","go_version":"go1.26.8","platform":"linux/amd64"}`
	if string(b) != want {
		t.Errorf("json.Marshal(%+v) =\n %s\nwant\n %s", i, b, want)
	}
}

func TestLinkerFlags(t *testing.T) {
	const p = "github.com/ratelimitd/ratelimitd/internal/buildinfo."
	for _, c := range []struct {
		stamp Stamp
		want  []string
	}{
		{Stamp{}, nil},
		{Stamp{Version: "v1.2.3"}, []string{"-X", p + "version=v1.2.3"}},
		{
			Stamp{Version: "v1.2.3", Revision: rev, Time: commitTime.In(time.FixedZone("CET", 3600))},
			[]string{"-X", p + "version=v1.2.3", "-X", p + "revision=" + rev, "-X", p + "modified=false", "-X", p + "buildTime=2026-12-05T10:15:00Z"},
		},
		{Stamp{Revision: rev, Modified: true}, []string{"-X", p + "revision=" + rev, "-X", p + "modified=true"}},
		// Modified says something only of a revision.
		{Stamp{Modified: true}, nil},
	} {
		if got := c.stamp.LinkerFlags(); !slices.Equal(got, c.want) {
			t.Errorf("%+v.LinkerFlags() =\n %q\nwant\n %q", c.stamp, got, c.want)
		}
	}
}

// TestLinkedRoundTrip: what LinkerFlags sets, linked reads back, as a
// release binary would.
func TestLinkedRoundTrip(t *testing.T) {
	s := Stamp{Version: "v1.2.3", Revision: rev, Modified: true, Time: commitTime}
	saved := [4]string{version, revision, modified, buildTime}
	t.Cleanup(func() { version, revision, modified, buildTime = saved[0], saved[1], saved[2], saved[3] })
	vars := map[string]*string{"version": &version, "revision": &revision, "modified": &modified, "buildTime": &buildTime}
	flags := s.LinkerFlags()
	for i := 1; i < len(flags); i += 2 {
		name, value, _ := strings.Cut(strings.TrimPrefix(flags[i], pkgPath+"."), "=")
		v, ok := vars[name]
		if !ok {
			t.Fatalf("LinkerFlags sets %s, not a variable of the package", flags[i])
		}
		*v = value
	}
	if got := linked(); got != s {
		t.Errorf("linked() = %+v, want the stamp %+v", got, s)
	}
	modified, buildTime = "maybe", "yesterday"
	if got := linked(); got.Modified || !got.Time.IsZero() {
		t.Errorf("linked() with modified=maybe, buildTime=yesterday = %+v, want them unset", got)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		stamp Stamp
		ok    bool
	}{
		{Stamp{Version: "v1.2.3-rc.1+build.5", Revision: rev}, true},
		{Stamp{}, true},
		{Stamp{Version: "v1.2.3 beta"}, false},
		{Stamp{Version: `v1"`}, false},
		{Stamp{Revision: "abc\n"}, false},
	} {
		if err := c.stamp.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v.Validate() = %v, want ok %t", c.stamp, err, c.ok)
		}
	}
}

// TestGet: the test binary's own Info is this runtime's, and has a
// version.
func TestGet(t *testing.T) {
	i := Get()
	if i.GoVersion != runtime.Version() || i.Platform != runtime.GOOS+"/"+runtime.GOARCH || i.Version == "" {
		t.Errorf("Get() = %+v, want a version, %s and %s/%s", i, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
}
