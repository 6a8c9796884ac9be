package image_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/image"
)

// instruction is one Dockerfile instruction: its keyword (upper case) and
// the rest of its line, continuations joined.
type instruction struct {
	line int
	cmd  string
	args string
}

// parseDockerfile splits a Dockerfile into instructions: comments and
// blank lines dropped, lines ending in a backslash joined to the next.
func parseDockerfile(text string) []instruction {
	var out []instruction
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// shellWords splits s as a POSIX shell splits words, for the subset the
// Dockerfile uses: blanks separate, double and single quotes group.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	in, quote := false, rune(0)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '"' || r == '\'':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// TestDockerfile keeps the Dockerfile, which cannot be built here, in step
// with the image the package builds: the same user, entrypoint, ports,
// environment, labels, paths, files and build flags.
func TestDockerfile(t *testing.T) {
	all := parseDockerfile(string(readFile(t, filepath.Join(moduleRoot, "Dockerfile"))))
	last := 0
	for i, in := range all {
		if in.cmd == "FROM" {
			last = i
		}
	}
	final, build := all[last:], all[:last]
	if got := final[0].args; got != "scratch" {
		t.Errorf("final stage FROM %q, want scratch (the image holds only its own files)", got)
	}

	got := map[string][]string{}
	for _, in := range final[1:] {
		got[in.cmd] = append(got[in.cmd], in.args)
	}
	var ports []string
	for _, p := range image.ExposedPorts() {
		ports = append(ports, fmt.Sprint(p))
	}
	for _, c := range []struct{ cmd, want string }{
		{"USER", image.User()},
		{"ENV", strings.Join(image.Env(), " ")},
		{"WORKDIR", "/"},
		{"EXPOSE", strings.Join(ports, " ")},
		{"COPY", "--from=build /out/ /"},
	} {
		if !slices.Equal(got[c.cmd], []string{c.want}) {
			t.Errorf("final stage %s = %q, want one, %q", c.cmd, got[c.cmd], c.want)
		}
	}
	var entry []string
	if es := got["ENTRYPOINT"]; len(es) != 1 || json.Unmarshal([]byte(es[0]), &entry) != nil || !slices.Equal(entry, []string{image.BinaryPath}) {
		t.Errorf("final stage ENTRYPOINT = %q, want one, exec form [%q]", es, image.BinaryPath)
	}
	labels := map[string]string{}
	for _, l := range got["LABEL"] {
		for _, kv := range shellWords(l) {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = v
		}
	}
	wantLabels := image.Options{}.Labels()
	delete(wantLabels, "org.opencontainers.image.created") // a daemon's build sets its own time
	if !maps.Equal(labels, wantLabels) {
		t.Errorf("final stage labels = %v, want %v", labels, wantLabels)
	}

	// The build stage: one RUN builds the binary as GoBuild does and lays
	// out /out as the image's root.
	var run []string
	for _, in := range build {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			run = shellWords(in.args)
		}
	}
	if run == nil {
		t.Fatal("no RUN with go build in the build stage")
	}
	commands := splitCommands(run)
	goBuild := commandWith(commands, "go", "build")
	if goBuild == nil {
		t.Fatalf("no go build command in %q", run)
	}
	for _, w := range append(image.GoBuildFlags(), "CGO_ENABLED=0", image.MainPackage) {
		if !slices.Contains(goBuild, w) {
			t.Errorf("go build command %q lacks %q", goBuild, w)
		}
	}
	if i := slices.Index(goBuild, "-o"); i < 0 || i+1 >= len(goBuild) || goBuild[i+1] != "/out"+image.BinaryPath {
		t.Errorf("go build command %q does not write /out%s", goBuild, image.BinaryPath)
	}
	for _, want := range [][]string{
		{"ln", "/out" + image.BinaryPath, "/out" + image.IncumbentPath},
		{"cp", image.DefaultCABundle, "/out" + image.CABundlePath},
		{"cp", "internal/image/rootfs/etc/passwd", "internal/image/rootfs/etc/group", "/out/etc/"},
		{"chmod", "0644", "/out/etc/passwd", "/out/etc/group", "/out" + image.CABundlePath},
	} {
		if !slices.ContainsFunc(commands, func(c []string) bool { return slices.Equal(c, want) }) {
			t.Errorf("build stage lacks the command %q", want)
		}
	}
}

// splitCommands splits shell words at && into commands.
func splitCommands(words []string) [][]string {
	var out [][]string
	var cur []string
	for _, w := range words {
		if w == "&&" {
			out = append(out, cur)
			cur = nil
			continue
		}
		cur = append(cur, w)
	}
	return append(out, cur)
}

// commandWith is the first command whose words include name followed by
// sub, or nil.
func commandWith(commands [][]string, name, sub string) []string {
	for _, c := range commands {
		if i := slices.Index(c, name); i >= 0 && i+1 < len(c) && c[i+1] == sub {
			return c
		}
	}
	return nil
}

func TestParseDockerfile(t *testing.T) {
	got := parseDockerfile("# c\nFROM a AS b\n\nRUN x \\\n && y \"p q\"\nuser 1:1\n")
	want := []instruction{{2, "FROM", "a AS b"}, {4, "RUN", `x  && y "p q"`}, {6, "USER", "1:1"}}
	if !slices.Equal(got, want) {
		t.Errorf("parseDockerfile = %+v, want %+v", got, want)
	}
	if w := shellWords(`a -ldflags="-s -w" 'b c'd`); !slices.Equal(w, []string{"a", "-ldflags=-s -w", "b cd"}) {
		t.Errorf("shellWords = %q", w)
	}
}
