package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/goldentest"
)

// badCases returns the files of each case under testdata/bad: a lone
// name.yaml, or a directory name/ of files that load together. Files are named
// by their path under testdata, as errors show them.
func badCases(t testing.TB) map[string][]File {
	t.Helper()
	entries, err := os.ReadDir("testdata/bad")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]File{}
	for _, e := range entries {
		name := e.Name()
		switch {
		case e.IsDir():
			cases[name] = readFiles(t, "testdata/bad/"+name)
		case strings.HasSuffix(name, ".yaml"):
			cases[strings.TrimSuffix(name, ".yaml")] = []File{readTestFile(t, "testdata/bad/"+name)}
		}
	}
	return cases
}

func readFiles(t testing.TB, dir string) []File {
	t.Helper()
	names, err := filepath.Glob(dir + "/*.yaml")
	if err != nil || len(names) == 0 {
		t.Fatalf("no files in %s: %v", dir, err)
	}
	var files []File
	for _, n := range names {
		files = append(files, readTestFile(t, n))
	}
	return files
}

func readTestFile(t testing.TB, name string) File {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return File{Name: strings.TrimPrefix(filepath.ToSlash(name), "testdata/"), Data: data}
}

// TestBadGolden checks every problem Parse reports for the broken files under
// testdata/bad against name.golden. Run with -update to rewrite them, then
// read the diff.
func TestBadGolden(t *testing.T) {
	for name, files := range badCases(t) {
		t.Run(name, func(t *testing.T) {
			s, err := Parse(files)
			if err == nil {
				t.Fatalf("Parse(%s) = %v, nil; want errors", name, s)
			}
			if s != nil {
				t.Errorf("Parse(%s) returned a Set with its errors", name)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Errorf("Parse(%s) error %T is no *config.Error", name, err)
			}
			got := err.Error() + "\n"
			golden := filepath.Join("testdata", "bad", name+".golden")
			if want, differ := goldentest.Compare(t, golden, got); differ {
				t.Errorf("Parse(%s) errors:\n%s\nwant (%s):\n%s", name, got, golden, want)
			}
		})
	}
}
