package servertest_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

func TestDescriptorDir(t *testing.T) {
	files := map[string]string{"a.yaml": "domain: a\n", "b.yaml": "domain: b\n"}
	dir := servertest.DescriptorDir(t, files)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(files) {
		t.Errorf("DescriptorDir wrote %d files, want %d", len(entries), len(files))
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
}
