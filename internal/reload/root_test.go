package reload_test

import (
	"os"
	"path/filepath"
	"testing"
)

// release writes a release tree as a deployment tool does for
// envoyproxy/ratelimit's RUNTIME_ROOT: base/name/ratelimit/config/a.yaml
// with the given rate. It returns base/name.
func release(t *testing.T, base, name string, rate int) string {
	t.Helper()
	dir := filepath.Join(base, name, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), yamlWithRate(rate))
	return filepath.Join(base, name)
}

// swapLink points link at target as `ln -sfn` or a deployment tool does:
// a new link beside it, renamed over it (atomic).
func swapLink(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + ".tmp"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// TestReloadsOnRootLinkSwap swaps a "current" link above the config
// directory (RUNTIME_ROOT with RUNTIME_WATCH_ROOT=true): the new tree is
// loaded, and the watches follow it, so a later change in the new tree is
// loaded too, as is a second swap (by remove and create, as older `ln -sf`
// does it).
func TestReloadsOnRootLinkSwap(t *testing.T) {
	base := t.TempDir()
	current := filepath.Join(base, "current")
	swapLink(t, release(t, base, "v1", 1), current)
	wd := watch(t, filepath.Join(current, "ratelimit", "config"))

	swapLink(t, release(t, base, "v2", 2), current)
	wd.waitRate(t, 2)

	writeByRename(t, filepath.Join(base, "v2", "ratelimit", "config", "a.yaml"), yamlWithRate(3))
	wd.waitRate(t, 3)

	v4 := release(t, base, "v4", 4)
	if err := os.Remove(current); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(v4, current); err != nil {
		t.Fatal(err)
	}
	wd.waitRate(t, 4)
}

// TestReloadsOnNestedLinkSwap swaps a link two levels above the config
// directory while the directory's own parent is also a link: both are
// followed.
func TestReloadsOnNestedLinkSwap(t *testing.T) {
	base := t.TempDir()
	for _, r := range []struct {
		name string
		rate int
	}{{"a", 1}, {"b", 2}} {
		dir := filepath.Join(base, "data-"+r.name, "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "a.yaml"), yamlWithRate(r.rate))
		if err := os.MkdirAll(filepath.Join(base, "root-"+r.name), 0o755); err != nil {
			t.Fatal(err)
		}
		// root-X/ratelimit -> data-X
		if err := os.Symlink(filepath.Join(base, "data-"+r.name), filepath.Join(base, "root-"+r.name, "ratelimit")); err != nil {
			t.Fatal(err)
		}
	}
	current := filepath.Join(base, "current")
	swapLink(t, filepath.Join(base, "root-a"), current)
	wd := watch(t, filepath.Join(current, "ratelimit", "config"))

	swapLink(t, filepath.Join(base, "root-b"), current)
	wd.waitRate(t, 2)
	writeFile(t, filepath.Join(base, "data-b", "config", "a.yaml"), yamlWithRate(5))
	wd.waitRate(t, 5)
}
