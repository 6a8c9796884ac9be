package reload

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
)

// fakeFiles stands in for the config files: read reads what was last set,
// and load records when the Watcher began a load.
type fakeFiles struct {
	mu    sync.Mutex
	yaml  string // "" makes Parse fail
	loads []time.Duration
	start time.Time
}

func (f *fakeFiles) set(yaml string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.yaml = yaml
}

func (f *fakeFiles) read(string) ([]config.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return []config.File{{Name: "a.yaml", Data: []byte(f.yaml)}}, nil
}

func (f *fakeFiles) load() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads = append(f.loads, time.Since(f.start))
}

// newFakeFiles returns the config of yamlWithRate(1), parsed, and fake
// files holding it whose clock starts now.
func newFakeFiles(t *testing.T) (*config.Set, *fakeFiles) {
	t.Helper()
	initial, err := config.Parse([]config.File{{Name: "a.yaml", Data: []byte(yamlWithRate(1))}})
	if err != nil {
		t.Fatal(err)
	}
	return initial, &fakeFiles{yaml: yamlWithRate(1), start: time.Now()}
}

// startLoop runs w.loop on changes (a send on it is a change to the files)
// until the test's context ends or stop is called; stop waits until the
// loop returned.
func startLoop(t *testing.T, w *Watcher) (changes chan struct{}, stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	changes = make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.loop(ctx, changes, nil)
	}()
	return changes, func() { cancel(); <-done }
}

// newFakeWatcher is a Watcher of files, starting from initial, that
// loads only when told (a test sends the changes; see startLoop) and
// reports to onLoad and onError.
func newFakeWatcher(t *testing.T, initial *config.Set, files *fakeFiles, onLoad func(*config.Set), onError func(error)) *Watcher {
	t.Helper()
	w, err := New(Options{Path: "unused", Current: initial, Read: files.read, Parse: parse,
		OnLoad: onLoad, OnError: onError, Watch: WatchReloadOnly})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// runInBubble runs f as the subtest name in a synctest bubble, on new fake
// files and the config they hold (see newFakeFiles).
func runInBubble(t *testing.T, name string, f func(t *testing.T, initial *config.Set, files *fakeFiles)) {
	t.Run(name, func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			initial, files := newFakeFiles(t)
			f(t, initial, files)
		})
	})
}

// startRun runs w.Run until stop is called; stop waits until Run returned.
func startRun(w *Watcher) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	return func() { cancel(); <-done }
}

// parse is config.Parse, with an empty file standing for a half-written one.
func parse(files []config.File) (*config.Set, error) {
	if len(files) == 1 && len(files[0].Data) == 0 {
		return nil, errors.New("half-written file")
	}
	return config.Parse(files)
}

func yamlWithRate(n int) string {
	return fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", n)
}

// outcome records what the callbacks were told.
type outcome struct {
	mu     sync.Mutex
	loaded []string // hashes
	errs   []error
}

func (o *outcome) onLoad(s *config.Set) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.loaded = append(o.loaded, s.Hash())
}

func (o *outcome) onError(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, err)
}

// TestDebounce walks timelines of changes in a synctest bubble, where time
// is virtual: each step happens at its offset, and the loads must happen at
// exactly the expected offsets.
func TestDebounce(t *testing.T) {
	const ms = time.Millisecond
	type step struct {
		at     time.Duration
		yaml   string // set before the event; "-" leaves it
		reload bool   // Reload instead of a file event
	}
	every := func(from, to, gap time.Duration, yaml string) []step {
		var s []step
		for at := from; at <= to; at += gap {
			s = append(s, step{at: at, yaml: yaml})
		}
		return s
	}
	tests := []struct {
		name       string
		steps      []step
		until      time.Duration
		wantLoads  []time.Duration
		wantLoaded int // OnLoad calls
		wantErrs   int
	}{
		{
			name:       "one change loads after the debounce",
			steps:      []step{{at: 0, yaml: yamlWithRate(2)}},
			until:      time.Second,
			wantLoads:  []time.Duration{200 * ms},
			wantLoaded: 1,
		},
		{
			name:       "a burst of changes loads once, a debounce after the last",
			steps:      every(0, 90*ms, 10*ms, yamlWithRate(2)),
			until:      time.Second,
			wantLoads:  []time.Duration{290 * ms},
			wantLoaded: 1,
		},
		{
			name:       "changes that never settle still load every MaxWait",
			steps:      every(0, 4900*ms, 100*ms, yamlWithRate(2)),
			until:      6 * time.Second,
			wantLoads:  []time.Duration{2000 * ms, 4000 * ms, 5100 * ms},
			wantLoaded: 1, // the later loads find the same files
		},
		{
			name:       "Reload loads at once and cancels the pending debounce",
			steps:      []step{{at: 0, yaml: yamlWithRate(2)}, {at: 50 * ms, yaml: "-", reload: true}},
			until:      time.Second,
			wantLoads:  []time.Duration{50 * ms},
			wantLoaded: 1,
		},
		{
			name:      "files equal to the config in force are not reported",
			steps:     []step{{at: 0, yaml: yamlWithRate(1)}, {at: time.Second, yaml: "-", reload: true}},
			until:     2 * time.Second,
			wantLoads: []time.Duration{200 * ms, time.Second},
		},
		{
			name: "a half-written file is rejected, the finished one loaded",
			steps: []step{
				{at: 0, yaml: ""},
				{at: 500 * ms, yaml: yamlWithRate(3)},
			},
			until:      time.Second,
			wantLoads:  []time.Duration{200 * ms, 700 * ms},
			wantLoaded: 1,
			wantErrs:   1,
		},
		{
			name: "a rejected change back to the files in force reports nothing new",
			steps: []step{
				{at: 0, yaml: ""},
				{at: 500 * ms, yaml: yamlWithRate(1)},
			},
			until:     time.Second,
			wantLoads: []time.Duration{200 * ms, 700 * ms},
			wantErrs:  1,
		},
	}
	for _, tt := range tests {
		runInBubble(t, tt.name, func(t *testing.T, initial *config.Set, files *fakeFiles) {
			var out outcome
			w := newFakeWatcher(t, initial, files, out.onLoad, out.onError)
			w.test.load = files.load
			changes, stop := startLoop(t, w)
			for _, s := range tt.steps {
				time.Sleep(s.at - time.Since(files.start))
				if s.yaml != "-" {
					files.set(s.yaml)
				}
				if s.reload {
					w.Reload()
				} else {
					changes <- struct{}{}
				}
			}
			time.Sleep(tt.until - time.Since(files.start))
			synctest.Wait()
			stop()
			if fmt.Sprint(files.loads) != fmt.Sprint(tt.wantLoads) {
				t.Errorf("loads at %v, want %v", files.loads, tt.wantLoads)
			}
			if len(out.loaded) != tt.wantLoaded || len(out.errs) != tt.wantErrs {
				t.Errorf("OnLoad called %d times, OnError %d times (%v); want %d and %d",
					len(out.loaded), len(out.errs), out.errs, tt.wantLoaded, tt.wantErrs)
			}
		})
	}
}
