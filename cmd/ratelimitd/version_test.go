package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// TestWriteVersion pins both forms of the version command's output.
func TestWriteVersion(t *testing.T) {
	info := buildinfo.Info{Version: "v1.2.3", Revision: "4c35b9250afefede41c5f5acd76191f90f625898", Modified: true,
		BuildTime: "2026-12-05T10:15:00Z", GoVersion: "go1.26.8", Platform: "linux/arm64"}
	for _, c := range []struct {
		output string
		want   string
	}{
		{"text", "ratelimitd v1.2.3 revision=4c35b9250afefede41c5f5acd76191f90f625898 modified=true built=2026-12-05T10:15:00Z go=go1.26.8 platform=linux/arm64\n"},
		{"json", `{
  "version": "v1.2.3",
  "revision": "4c35b9250afefede41c5f5acd76191f90f625898",
  "modified": true,
  "build_time": "2026-12-05T10:15:00Z",
  "go_version": "go1.26.8",
  "platform": "linux/arm64"
}
`},
	} {
		var out bytes.Buffer
		if err := writeVersion(&out, info, c.output); err != nil {
			t.Fatalf("writeVersion(%q): %v", c.output, err)
		}
		if out.String() != c.want {
			t.Errorf("writeVersion(%q) =\n%s\nwant\n%s", c.output, out.String(), c.want)
		}
	}
}

// TestVersionCommands: `version`, `version --output json` and --version on
// every command print the running build, and nothing else runs; a bad
// --output is a usage error.
func TestVersionCommands(t *testing.T) {
	b := buildinfo.Get()
	line := b.String() + "\n"
	js, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	// RATELIMITD_VERSION is a deployment's own business: never read.
	getenv := func(k string) string {
		return map[string]string{"RATELIMITD_VERSION": "v9", "RATELIMITD_CONFIG": "/nonexistent"}[k]
	}
	for _, c := range []struct {
		args    []string
		want    string
		wantErr string
	}{
		{args: []string{"version"}, want: line},
		{args: []string{"version", "--output", "text"}, want: line},
		{args: []string{"version", "--output", "json"}, want: string(js) + "\n"},
		{args: []string{"version", "--output=json"}, want: string(js) + "\n"},
		{args: []string{"--version"}, want: line},
		{args: []string{"-version"}, want: line},
		{args: []string{"serve", "--version", "--retry-after", "never"}, want: line},
		{args: []string{"validate", "--version"}, want: line},
		{args: []string{"check", "--version"}, want: line},
		{args: []string{"explain", "--version"}, want: line},
		{args: []string{"version", "--output", "yaml"}, wantErr: `--output "yaml": want text or json`},
		{args: []string{"version", "extra"}, wantErr: `unexpected argument "extra"`},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), c.args, getenv, &out, &errOut)
		if c.wantErr != "" {
			if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("run(%q) = %v, want a usage error containing %q", c.args, err, c.wantErr)
			}
			continue
		}
		if err != nil || out.String() != c.want || errOut.Len() > 0 {
			t.Errorf("run(%q) = %v, stdout %q, stderr %q; want stdout %q", c.args, err, out.String(), errOut.String(), c.want)
		}
	}
	// Without --version, RATELIMITD_VERSION still changes nothing.
	if _, err := parseServeFlags(nil, getenv, &bytes.Buffer{}); err != nil {
		t.Errorf("parseServeFlags with RATELIMITD_VERSION=v9: %v, want it ignored", err)
	}
}

// TestReleaseBuildNamesItself builds ratelimitd as a release is built,
// its version, revision and date set with the linker, and checks that
// the binary says so: `version` in both forms, the start line, and
// ratelimitd_build_info on /metrics.
func TestReleaseBuildNamesItself(t *testing.T) {
	stamp := buildinfo.Stamp{Version: "v9.8.7-test", Revision: "0123456789abcdef0123456789abcdef01234567", Modified: true,
		Time: time.Date(2026, 12, 5, 10, 15, 0, 0, time.UTC)}
	bin := filepath.Join(t.TempDir(), "ratelimitd")
	out, err := exec.Command("go", "build", "-ldflags", strings.Join(stamp.LinkerFlags(), " "), "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	const prefix = "ratelimitd v9.8.7-test revision=0123456789abcdef0123456789abcdef01234567 modified=true built=2026-12-05T10:15:00Z go="
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(bin, args...).Output()
		if err != nil || !strings.HasPrefix(string(out), prefix) || strings.Count(string(out), "\n") != 1 {
			t.Errorf("ratelimitd %s = %v, %q; want one line starting %q", strings.Join(args, " "), err, out, prefix)
		}
	}
	out, err = exec.Command(bin, "version", "--output", "json").Output()
	if err != nil {
		t.Fatalf("version --output json: %v", err)
	}
	var info buildinfo.Info
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("version --output json: %v\n%s", err, out)
	}
	if want := (buildinfo.Info{Version: "v9.8.7-test", Revision: stamp.Revision, Modified: true, BuildTime: "2026-12-05T10:15:00Z",
		GoVersion: info.GoVersion, Platform: info.Platform}); info != want || !strings.HasPrefix(info.GoVersion, "go") || info.Platform == "" {
		t.Errorf("version --output json = %+v, want %+v with a Go version and platform", info, want)
	}

	dir := writeConfig(t, map[string]string{"api.yaml": fivePerMinute})
	p := launchProcAt(t, "ratelimitd (stamped)", bin, "--config", dir).await(t)
	code, body := servertest.Get(t, "http://"+p.httpAddr+"/metrics")
	want := `ratelimitd_build_info{goversion="` + info.GoVersion + `",revision="` + stamp.Revision + `",version="v9.8.7-test"} 1` + "\n"
	if code != http.StatusOK || !strings.Contains(body, want) {
		t.Errorf("GET /metrics = %d, want 200 with %q", code, want)
	}
	var start struct {
		Version  string `json:"version"`
		Revision string `json:"revision"`
	}
	first, _, _ := strings.Cut(p.logs.String(), "\n")
	if err := json.Unmarshal([]byte(first), &start); err != nil || !strings.Contains(first, `"msg":"ratelimitd starting"`) ||
		start.Version != "v9.8.7-test" || start.Revision != stamp.Revision {
		t.Errorf("first log line %s, want ratelimitd starting with the version and revision", first)
	}
}
