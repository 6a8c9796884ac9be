package goldentest

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCompare(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.golden")
	if err := os.WriteFile(path, []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if want, differ := Compare(t, path, "a\n"); differ || want != "a\n" {
		t.Errorf("Compare(same) = %q, %v; want %q, false", want, differ, "a\n")
	}
	if want, differ := Compare(t, path, "b\n"); !differ || want != "a\n" {
		t.Errorf("Compare(other) = %q, %v; want %q, true", want, differ, "a\n")
	}
}
