package reload_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/reload"
)

// timeout bounds every wait for the watcher; the waits return as soon as
// the awaited callback arrives.
const timeout = 10 * time.Second

func yamlWithRate(n int) string {
	return fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", n)
}

// rateOf returns the rate of the only rule of a set made by yamlWithRate.
func rateOf(s *config.Set) int64 {
	r := s.Lookup("d", []config.Entry{{Key: "k", Value: "v"}})
	if r == nil {
		return -1
	}
	return r.Limits[0].Limit.Count
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeByRename writes name the way editors and config tools do: a
// temporary file beside it, renamed over it.
func writeByRename(t *testing.T, name, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(name), "."+filepath.Base(name)+".tmp")
	writeFile(t, tmp, data)
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
}

// watched is a running Watcher and what its callbacks reported.
type watched struct {
	w      *reload.Watcher
	loads  chan *config.Set
	errs   chan error
	cancel context.CancelFunc
}

// watch starts a Watcher on path, with the Set at path in force.
func watch(t *testing.T, path string) *watched {
	t.Helper()
	current, err := config.Load(path)
	if err != nil {
		t.Fatalf("config.Load(%s): %v", path, err)
	}
	wd := &watched{loads: make(chan *config.Set, 1000), errs: make(chan error, 1000)}
	wd.w, err = reload.New(reload.Options{
		Path:     path,
		Current:  current,
		Debounce: 20 * time.Millisecond,
		OnLoad:   func(s *config.Set) { wd.loads <- s },
		OnError:  func(err error) { wd.errs <- err },
	})
	if err != nil {
		t.Fatalf("reload.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := wd.w.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return wd
}

// waitRate waits for a load of a Set with rate n, skipping errors (a
// half-done change may be reported before the finished one lands).
func (wd *watched) waitRate(t *testing.T, n int64) *config.Set {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case s := <-wd.loads:
			if rateOf(s) == n {
				return s
			}
		case <-wd.errs:
		case <-deadline:
			t.Fatalf("no config with rate %d loaded within %v", n, timeout)
			return nil
		}
	}
}

// waitError waits for a failed load and returns its error; a load in the
// meantime fails the test.
func (wd *watched) waitError(t *testing.T) error {
	t.Helper()
	select {
	case err := <-wd.errs:
		return err
	case s := <-wd.loads:
		t.Fatalf("loaded a config with rate %d, want a rejected load", rateOf(s))
	case <-time.After(timeout):
		t.Fatalf("no rejected load within %v", timeout)
	}
	return nil
}

// TestReloadsOnChange makes each kind of change on disk that config files
// see in practice and checks that the Watcher loads the result.
func TestReloadsOnChange(t *testing.T) {
	tests := []struct {
		name string
		// setup lays out the files with rate 1 in dir and returns the path
		// to watch.
		setup func(t *testing.T, dir string) string
		// change changes the files to rate 2.
		change func(t *testing.T, dir string)
	}{
		{
			name:   "directory, file written in place",
			setup:  plainDir,
			change: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "a.yaml"), yamlWithRate(2)) },
		},
		{
			name:   "directory, editor renames a temporary file over it",
			setup:  plainDir,
			change: func(t *testing.T, dir string) { writeByRename(t, filepath.Join(dir, "a.yaml"), yamlWithRate(2)) },
		},
		{
			name:  "directory, a file added",
			setup: plainDir,
			change: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "b.yaml"), "domain: e\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 9}}]\n")
				writeFile(t, filepath.Join(dir, "a.yaml"), yamlWithRate(2))
			},
		},
		{
			name: "single file, editor renames a temporary file over it",
			setup: func(t *testing.T, dir string) string {
				return filepath.Join(plainDir(t, dir), "a.yaml")
			},
			change: func(t *testing.T, dir string) { writeByRename(t, filepath.Join(dir, "a.yaml"), yamlWithRate(2)) },
		},
		{
			name: "single file, written in place",
			setup: func(t *testing.T, dir string) string {
				return filepath.Join(plainDir(t, dir), "a.yaml")
			},
			change: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "a.yaml"), yamlWithRate(2)) },
		},
		{
			name:   "Kubernetes ConfigMap directory, ..data swapped",
			setup:  configMap,
			change: func(t *testing.T, dir string) { configMapUpdate(t, dir, 2) },
		},
		{
			name: "Kubernetes ConfigMap, single file through ..data",
			setup: func(t *testing.T, dir string) string {
				return filepath.Join(configMap(t, dir), "a.yaml")
			},
			change: func(t *testing.T, dir string) { configMapUpdate(t, dir, 2) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tt.setup(t, dir)
			wd := watch(t, path)
			tt.change(t, dir)
			got := wd.waitRate(t, 2)
			want, err := config.Load(path)
			if err != nil {
				t.Fatalf("config.Load after the change: %v", err)
			}
			if got.Hash() != want.Hash() {
				t.Errorf("loaded hash %s, want the files' %s", got.Hash(), want.Hash())
			}
		})
	}
}

// plainDir writes a.yaml with rate 1 into dir and returns dir.
func plainDir(t *testing.T, dir string) string {
	writeFile(t, filepath.Join(dir, "a.yaml"), yamlWithRate(1))
	return dir
}

// configMap lays dir out as the kubelet mounts a ConfigMap: the data in a
// timestamped directory, a "..data" link to it, and each file a link
// through "..data". It returns dir.
func configMap(t *testing.T, dir string) string {
	configMapUpdate(t, dir, 1)
	if err := os.Symlink(filepath.Join("..data", "a.yaml"), filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// configMapUpdate does what the kubelet does on a ConfigMap update: write
// the new data into a new timestamped directory, point a new link at it,
// rename that link over "..data" (atomic), and remove the old directory.
func configMapUpdate(t *testing.T, dir string, rate int) {
	t.Helper()
	data := filepath.Join(dir, fmt.Sprintf("..2026_11_29_12_00_%02d.%d", rate, rate))
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(data, "a.yaml"), yamlWithRate(rate))
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(data), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPartialWriteKeepsTheConfigUntilTheWriteIsDone writes half a file and
// lets the Watcher see it: the half fails validation and is rejected; when
// the rest is written the whole file is loaded.
func TestPartialWriteKeepsTheConfigUntilTheWriteIsDone(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "a.yaml")
	writeFile(t, name, yamlWithRate(1))
	wd := watch(t, dir)

	whole := strings.Replace(yamlWithRate(3), "second", "minute", 1)
	half := whole[:strings.Index(whole, "minute")+3] // "unit: min": not a unit
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(half); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := wd.waitError(t); err == nil {
		t.Fatal("half a file: no error")
	}
	if _, err := f.WriteString(whole[len(half):]); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wd.waitRate(t, 3)
}

// TestInvalidConfigIsRejectedWithItsMessage checks that OnError gets the
// validation problems in full, pointing at the file.
func TestInvalidConfigIsRejectedWithItsMessage(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "a.yaml")
	writeFile(t, name, yamlWithRate(1))
	wd := watch(t, dir)
	writeByRename(t, name, strings.Replace(yamlWithRate(4), "second", "minutes", 1))
	err := wd.waitError(t)
	for _, want := range []string{name + ":4:", `unknown unit "minutes"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("OnError(%q): want it to contain %q", err, want)
		}
	}
	// Fixing the file loads it.
	writeByRename(t, name, yamlWithRate(4))
	wd.waitRate(t, 4)
}

// TestDirectoryDeletedAndCreatedAgain removes the config directory (the
// config in force stays: the load fails) and creates it again with new
// files, which are loaded.
func TestDirectoryDeletedAndCreatedAgain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "limits")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), yamlWithRate(1))
	wd := watch(t, dir)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	wd.waitError(t)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), yamlWithRate(5))
	wd.waitRate(t, 5)
	// The directory is watched again.
	writeByRename(t, filepath.Join(dir, "a.yaml"), yamlWithRate(6))
	wd.waitRate(t, 6)
}

// TestReloadWithoutWatching checks that WatchReloadOnly ignores the files
// until Reload is called, and that Reload reports nothing when the files are
// those in force.
func TestReloadWithoutWatching(t *testing.T) {
	const debounce = 20 * time.Millisecond // what a watcher would wait
	dir := t.TempDir()
	name := filepath.Join(dir, "a.yaml")
	writeFile(t, name, yamlWithRate(1))
	current, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	loadCalls := make(chan struct{}, 10) // one per load, whatever it finds
	loads := make(chan *config.Set, 10)  // one per OnLoad
	w, err := reload.New(reload.Options{Path: dir, Current: current, Watch: reload.WatchReloadOnly, Debounce: debounce,
		Read: func(path string) ([]config.File, error) { // without watching, only loads read
			defer func() { loadCalls <- struct{}{} }()
			return config.ReadFiles(path, config.LoadOptions{})
		},
		OnLoad: func(s *config.Set) { loads <- s }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)

	w.Reload() // the files in force: loaded, nothing to report
	select {
	case <-loadCalls:
	case <-time.After(timeout):
		t.Fatal("Reload did not load the files")
	}
	writeFile(t, name, yamlWithRate(7))
	time.Sleep(2 * reload.DefaultDebounce) // 400 ms, twenty times the debounce
	if n := len(loadCalls); n > 0 {
		t.Errorf("the changed files were loaded without Reload (%d loads)", n)
	}
	if n := len(loads); n > 0 {
		t.Fatalf("OnLoad was called before the Reload of the changed files (%d calls)", n)
	}

	w.Reload()
	select {
	case s := <-loads:
		if rateOf(s) != 7 {
			t.Errorf("Reload loaded rate %d, want 7", rateOf(s))
		}
	case <-time.After(timeout):
		t.Fatal("Reload loaded nothing")
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opts reload.Options
		want string
	}{
		{"no path", reload.Options{OnLoad: func(*config.Set) {}}, "Path is required"},
		{"no OnLoad", reload.Options{Path: "."}, "OnLoad is required"},
		{"bad Watch", reload.Options{Path: ".", OnLoad: func(*config.Set) {}, Watch: 9}, "invalid Watch 9"},
		{"missing path", reload.Options{Path: "/nonexistent/limits", OnLoad: func(*config.Set) {}}, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := reload.New(tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
