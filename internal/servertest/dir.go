package servertest

import (
	"os"
	"path/filepath"
	"testing"
)

// DescriptorDir writes files (file name → its text, descriptor YAML for a
// config directory) into a new directory, removed when the test ends, and
// returns its path. It fails the test if a file cannot be written.
func DescriptorDir(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatalf("servertest: write %s: %v", name, err)
		}
	}
	return dir
}
