package doclinks

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// TestLinks checks every relative link of the repository's Markdown files:
// the file it names exists, and its #anchor, if any, is the slug of a
// heading of that file (or of the linking file, for a bare #anchor).
// External links (a scheme such as https: or mailto:) are not fetched.
func TestLinks(t *testing.T) {
	root := repoRoot(t)
	files, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "CONTRIBUTING.md"} {
		if !slices.Contains(files, want) {
			t.Errorf("markdownFiles(%s) misses %s", root, want)
		}
	}
	if !slices.ContainsFunc(files, func(f string) bool { return strings.HasPrefix(f, "docs/") }) {
		t.Errorf("markdownFiles(%s) finds nothing under docs/", root)
	}
	for _, p := range check(root, files) {
		t.Error(p)
	}
}

// TestCheckFindsBroken runs check over a small tree with one link of each
// kind that must fail and one of each kind that must pass.
func TestCheckFindsBroken(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# Top\n\n"+
		"[ok](docs/a.md) [ok](docs/a.md#the-max_wait-field) [ok](#top) [ok](docs/)\n"+
		"[ok](https://example.com/missing.md) [ok](mailto:x@example.com)\n"+
		"[gone](docs/missing.md)\n"+
		"[bad anchor](docs/a.md#no-such-heading)\n"+
		"`[in code](docs/missing-too.md)`\n"+
		"```\n[in a fence](docs/missing-three.md)\n```\n"+
		"[ref]: docs/ref-missing.md\n")
	write("docs/a.md", "# A\n\n## The `max_wait` field\n\n[up](../README.md#top) [self](#nowhere)\n")

	got := check(root, []string{"README.md", "docs/a.md"})
	want := []string{
		"README.md:5: docs/missing.md: no file docs/missing.md",
		"README.md:6: docs/a.md#no-such-heading: no heading",
		"README.md:11: docs/ref-missing.md: no file docs/ref-missing.md",
		"docs/a.md:5: #nowhere: no heading",
	}
	if len(got) != len(want) {
		t.Fatalf("check found %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d = %q, want it to start with %q", i, got[i], want[i])
		}
	}
}

func TestSlug(t *testing.T) {
	for _, c := range []struct{ heading, want string }{
		{"Quick start", "quick-start"},
		{"Logical models and quota groups", "logical-models-and-quota-groups"},
		{"Quota groups: aliases cannot multiply capacity", "quota-groups-aliases-cannot-multiply-capacity"},
		{"Tokens charged after the response (post-paid)", "tokens-charged-after-the-response-post-paid"},
		{"Envoy's timeout must exceed max_wait", "envoys-timeout-must-exceed-max_wait"},
		{"The `max_wait` field", "the-max_wait-field"},
		{"TLS and mTLS", "tls-and-mtls"},
		{"Testing the /limits page", "testing-the-limits-page"},
		{"A [link](x.md) and **bold**", "a-link-and-bold"},
		{"Größe – 2×", "größe--2"},
	} {
		if got := slug(c.heading); got != c.want {
			t.Errorf("slug(%q) = %q, want %q", c.heading, got, c.want)
		}
	}
}

// repoRoot walks up from the working directory to the directory holding
// go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// markdownFiles lists the .md files under root, slash-separated and
// relative to it, skipping hidden directories, testdata and bin.
func markdownFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	return files, err
}

// check returns a line "file:line: target: problem" for every relative link
// of files (relative to root) that does not resolve.
func check(root string, files []string) []string {
	anchors := map[string]map[string]bool{} // file → slugs, read once
	anchorsOf := func(file string) (map[string]bool, error) {
		if a, ok := anchors[file]; ok {
			return a, nil
		}
		a, err := headingAnchors(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			return nil, err
		}
		anchors[file] = a
		return a, nil
	}
	var problems []string
	for _, file := range files {
		ls, err := links(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", file, err))
			continue
		}
		for _, l := range ls {
			if err := resolve(root, file, l.target, anchorsOf); err != nil {
				problems = append(problems, fmt.Sprintf("%s:%d: %s: %v", file, l.line, l.target, err))
			}
		}
	}
	return problems
}

var (
	scheme     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	lineAnchor = regexp.MustCompile(`^L[0-9]+(-L[0-9]+)?$`)
)

// resolve checks one link target of file.
func resolve(root, file, target string, anchorsOf func(string) (map[string]bool, error)) error {
	if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return nil // external: not fetched
	}
	target, anchor, _ := strings.Cut(target, "#")
	if i := strings.IndexByte(target, '?'); i >= 0 {
		target = target[:i]
	}
	dest := file
	if target != "" {
		if strings.HasPrefix(target, "/") {
			dest = path.Clean(strings.TrimPrefix(target, "/"))
		} else {
			dest = path.Join(path.Dir(file), target)
		}
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return errors.New("outside the repository")
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("no file %s", dest)
		} else if err != nil {
			return err
		}
	}
	if anchor == "" {
		return nil
	}
	if !strings.HasSuffix(dest, ".md") {
		if lineAnchor.MatchString(anchor) {
			return nil // a line of a source file
		}
		return fmt.Errorf("anchor #%s on %s, which is not Markdown", anchor, dest)
	}
	a, err := anchorsOf(dest)
	if err != nil {
		return err
	}
	if !a[anchor] {
		return fmt.Errorf("no heading of %s has the anchor #%s", dest, anchor)
	}
	return nil
}

type link struct {
	line   int
	target string
}

var (
	// inlineLink matches [text](target) and ![alt](target "title"); text
	// may hold one level of brackets, as in [`[x]`](y).
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// refDef matches a reference definition: [label]: target.
	refDef   = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$`)
	htmlHref = regexp.MustCompile(`<a\s[^>]*href="([^"]*)"`)
	codeSpan = regexp.MustCompile("`+[^`]*`+")
)

// links returns the link targets of the Markdown file at p, outside fenced
// code blocks and code spans.
func links(p string) ([]link, error) {
	var out []link
	err := eachLine(p, func(n int, line string, inFence bool) {
		if inFence {
			return
		}
		if m := refDef.FindStringSubmatch(line); m != nil {
			out = append(out, link{n, m[1]})
			return
		}
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, link{n, m[1]})
		}
		for _, m := range htmlHref.FindAllStringSubmatch(line, -1) {
			out = append(out, link{n, m[1]})
		}
	})
	return out, err
}

var (
	atxHeading  = regexp.MustCompile(`^ {0,3}#{1,6}(?:\s+(.*?))?(?:\s+#+)?\s*$`)
	setextLine  = regexp.MustCompile(`^ {0,3}(=+|-+)\s*$`)
	htmlAnchor  = regexp.MustCompile(`<a\s[^>]*(?:id|name)="([^"]+)"`)
	orderedItem = regexp.MustCompile(`^[0-9]+[.)]\s`)
)

// headingAnchors returns the anchors GitHub gives the headings of the
// Markdown file at p (a repeated slug gets -1, -2, … as GitHub numbers
// them), and the ids of explicit <a id="…"> or <a name="…"> tags.
func headingAnchors(p string) (map[string]bool, error) {
	anchors := map[string]bool{}
	seen := map[string]int{}
	add := func(heading string) {
		s := slug(heading)
		if n := seen[s]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	}
	prev := ""
	err := eachLine(p, func(_ int, line string, inFence bool) {
		defer func() { prev = line }()
		if inFence {
			line = ""
			return
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			add(m[1])
			line = "" // a heading does not start a setext heading
			return
		}
		if setextLine.MatchString(line) && paragraphLine(prev) {
			add(strings.TrimSpace(prev))
			line = ""
		}
	})
	return anchors, err
}

// paragraphLine reports whether line can be the text of a setext heading:
// not blank, not a table row, list item, quote, fence or HTML block.
func paragraphLine(line string) bool {
	s := strings.TrimSpace(line)
	if s == "" {
		return false
	}
	switch s[0] {
	case '|', '-', '*', '+', '>', '<', '#', '`', '~':
		return false
	}
	return !orderedItem.MatchString(s)
}

// eachLine calls f for each line of the file at p with its number and
// whether it is inside (or opens or closes) a fenced code block.
func eachLine(p string, f func(n int, line string, inFence bool)) error {
	file, err := os.Open(p)
	if err != nil {
		return err
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	fence := "" // the opening fence while inside a block
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence == "" && len(line)-len(trimmed) <= 3 && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:len(trimmed)-len(strings.TrimLeft(trimmed, trimmed[:1]))]
			f(n, line, true)
		case fence != "":
			// A closing fence: at least as many of the same character,
			// then nothing but spaces.
			rest := strings.TrimLeft(trimmed, fence[:1])
			if len(trimmed)-len(rest) >= len(fence) && strings.TrimSpace(rest) == "" {
				fence = ""
			}
			f(n, line, true)
		default:
			f(n, line, false)
		}
	}
	return sc.Err()
}

var headingLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

// slug is GitHub's anchor for a heading: its text as rendered (code spans
// and emphasis markers dropped, links reduced to their text), lower-cased,
// each space turned into '-', and every other character dropped unless it
// is a letter, a digit, '-' or '_'.
func slug(heading string) string {
	text := headingLink.ReplaceAllString(heading, "$1")
	text = strings.NewReplacer("`", "", "*", "").Replace(text)
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
