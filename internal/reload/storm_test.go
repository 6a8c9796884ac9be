package reload

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
)

// rate is the rate of the only rule of a Set made by yamlWithRate.
func rate(s *config.Set) int64 {
	r := s.Lookup("d", []config.Entry{{Key: "k", Value: "v"}})
	if r == nil {
		return -1
	}
	return r.Limits[0].Limit.Count
}

// TestStormSettlesOnNewestValid walks storms of changes in a synctest
// bubble: when they settle on invalid files, the config in force must be
// the newest valid content the Watcher read, not the one it loaded during
// the storm (the MaxWait load at 2 s).
func TestStormSettlesOnNewestValid(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name string
		// contents are written 30 ms apart, from 0; 0 is invalid, n the
		// rate of a valid file.
		contents    []int
		wantRates   []int // the rates given to OnLoad, in order
		wantErrs    int
		wantLoads   int
		wantInForce int
	}{
		{
			name:        "100 rewrites then an invalid one: the 100th is in force",
			contents:    append(seq(2, 101), 0),
			wantRates:   []int{68, 101}, // 68 was on disk at the MaxWait load (2 s)
			wantErrs:    1,
			wantInForce: 101,
		},
		{
			name:        "valid, then half-written writes: the last valid is in force",
			contents:    []int{5, 6, 0, 0, 0},
			wantRates:   []int{6},
			wantErrs:    1,
			wantInForce: 6,
		},
		{
			name:        "back to the config in force, then invalid: nothing changes",
			contents:    []int{5, 6, 1, 0},
			wantErrs:    1,
			wantInForce: 1,
		},
		{
			name:        "more half-written contents than are kept: the config in force stays",
			contents:    append([]int{7}, make([]int, maxSnapshots+1)...),
			wantErrs:    1,
			wantInForce: 1,
		},
	}
	for _, tt := range tests {
		runInBubble(t, tt.name, func(t *testing.T, initial *config.Set, files *fakeFiles) {
			var out outcome
			var rates []int
			inForce := initial
			w := newFakeWatcher(t, initial, files, func(s *config.Set) {
				out.onLoad(s)
				rates = append(rates, int(rate(s)))
				inForce = s
			}, out.onError)
			changes, stop := startLoop(t, w)
			for i, n := range tt.contents {
				time.Sleep(time.Duration(i)*30*ms - time.Since(files.start))
				if n == 0 {
					// A file seen half-written: distinct each time, invalid.
					files.set("domain: d\ndescriptors: [" + string(rune('a'+i%26)))
				} else {
					files.set(yamlWithRate(n))
				}
				changes <- struct{}{}
			}
			time.Sleep(time.Duration(len(tt.contents))*30*ms + 5*time.Second - time.Since(files.start))
			synctest.Wait()
			stop()
			if fmt.Sprint(rates) != fmt.Sprint(tt.wantRates) {
				t.Errorf("OnLoad given rates %v, want %v", rates, tt.wantRates)
			}
			if len(out.errs) != tt.wantErrs {
				t.Errorf("OnError called %d times (%v), want %d", len(out.errs), out.errs, tt.wantErrs)
			}
			if got := rate(inForce); got != int64(tt.wantInForce) {
				t.Errorf("in force after the storm: rate %d, want %d", got, tt.wantInForce)
			}
			if len(w.kept.list) != 0 || w.kept.bytes != 0 {
				t.Errorf("%d contents (%d bytes) kept after the storm settled, want none", len(w.kept.list), w.kept.bytes)
			}
		})
	}
}

func seq(from, to int) []int {
	var s []int
	for n := from; n <= to; n++ {
		s = append(s, n)
	}
	return s
}

// TestStormOnDisk rewrites a real file 100 times as fast as it can, then
// writes an invalid file once the Watcher has read the 100th content: when
// the storm settles, the 100th is in force, whatever the Watcher loaded
// during the storm. Waiting for the read is what makes the test
// deterministic: content replaced before the Watcher could read it is not
// content it can fall back on.
func TestStormOnDisk(t *testing.T) {
	tests := []struct {
		name  string
		write func(name, data string) error
	}{
		{"written in place", func(name, data string) error { return os.WriteFile(name, []byte(data), 0o644) }},
		{"written beside and renamed", func(name, data string) error {
			tmp := filepath.Join(filepath.Dir(name), ".tmp-"+filepath.Base(name))
			if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
				return err
			}
			return os.Rename(tmp, name)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			name := filepath.Join(dir, "a.yaml")
			if err := tt.write(name, yamlWithRate(1)); err != nil {
				t.Fatal(err)
			}
			initial, err := config.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			const last = 100
			lastHash := config.HashFiles([]config.File{{Name: name, Data: []byte(yamlWithRate(last))}})
			var (
				mu       sync.Mutex
				inForce  = initial
				errs     int
				lastRead = make(chan struct{})
				once     sync.Once
			)
			loaded := make(chan struct{}, 1000)
			w, err := New(Options{Path: dir, Current: initial, Debounce: 50 * time.Millisecond,
				OnLoad: func(s *config.Set) {
					mu.Lock()
					inForce = s
					mu.Unlock()
					loaded <- struct{}{}
				},
				OnError: func(error) {
					mu.Lock()
					errs++
					mu.Unlock()
				}})
			if err != nil {
				t.Fatal(err)
			}
			w.test.read = func(hash string) {
				if hash == lastHash {
					once.Do(func() { close(lastRead) })
				}
			}
			defer startRun(w)()

			for n := 2; n <= last; n++ {
				if err := tt.write(name, yamlWithRate(n)); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-lastRead:
			case <-time.After(10 * time.Second):
				t.Fatal("the Watcher never read the last valid content")
			}
			if err := tt.write(name, "domain: d\ndescriptors: [unfinished"); err != nil {
				t.Fatal(err)
			}
			// Settled: the invalid file was rejected and the 100th is in force.
			deadline := time.After(10 * time.Second)
			for {
				mu.Lock()
				r, e := rate(inForce), errs
				mu.Unlock()
				if r == last && e > 0 {
					break
				}
				select {
				case <-loaded:
				case <-time.After(20 * time.Millisecond):
				case <-deadline:
					t.Fatalf("after the storm: rate %d in force with %d rejections, want %d and at least 1", r, e, last)
				}
			}
			// And it stays so: nothing later puts another in force.
			time.Sleep(200 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if rate(inForce) != last {
				t.Errorf("rate %d in force once settled, want %d", rate(inForce), last)
			}
		})
	}
}

// TestReloadOverTheCap checks that files grown over Options.Limits are
// refused with config.ErrTooLarge and leave the config in force, and that
// files back under the cap load.
func TestReloadOverTheCap(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(name, []byte(yamlWithRate(1)), 0o644); err != nil {
		t.Fatal(err)
	}
	initial, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	loads := make(chan *config.Set, 10)
	errs := make(chan error, 10)
	w, err := New(Options{Path: dir, Current: initial, Watch: WatchReloadOnly,
		Limits: config.LoadOptions{MaxTotalBytes: 1024},
		OnLoad: func(s *config.Set) { loads <- s }, OnError: func(err error) { errs <- err }})
	if err != nil {
		t.Fatal(err)
	}
	defer startRun(w)()

	big := yamlWithRate(2) + "# " + strings.Repeat("x", 1024) + "\n"
	if err := os.WriteFile(name, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	w.Reload()
	select {
	case err := <-errs:
		if !errors.Is(err, config.ErrTooLarge) || !strings.Contains(err.Error(), "more than the cap of 1024 bytes") {
			t.Errorf("OnError(%v), want config.ErrTooLarge naming the cap", err)
		}
	case s := <-loads:
		t.Fatalf("a config over the cap was loaded (rate %d)", rate(s))
	case <-time.After(10 * time.Second):
		t.Fatal("Reload reported nothing")
	}
	if err := os.WriteFile(name, []byte(yamlWithRate(3)), 0o644); err != nil {
		t.Fatal(err)
	}
	w.Reload()
	select {
	case s := <-loads:
		if rate(s) != 3 {
			t.Errorf("loaded rate %d, want 3", rate(s))
		}
	case err := <-errs:
		t.Fatalf("files under the cap refused: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Reload reported nothing")
	}
}

// TestStormReadsArePaced: when reading the files takes time (a directory
// of thousands), reads at changes take about a fifth of the time at most,
// and the config in force once settled is the newest valid content read.
// Virtual time: each read takes 10 ms, changes come every millisecond.
func TestStormReadsArePaced(t *testing.T) {
	const ms = time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		initial, files := newFakeFiles(t)
		var (
			mu      sync.Mutex
			reads   []time.Duration
			newest  string // the hash of the newest valid content read
			inForce = initial
		)
		w, err := New(Options{Path: "unused", Current: initial, Watch: WatchReloadOnly,
			Read: func(p string) ([]config.File, error) {
				fs, err := files.read(p)
				time.Sleep(10 * ms)
				return fs, err
			},
			Parse: parse,
			OnLoad: func(s *config.Set) {
				mu.Lock()
				defer mu.Unlock()
				inForce = s
			}})
		if err != nil {
			t.Fatal(err)
		}
		w.test.read = func(hash string) {
			mu.Lock()
			defer mu.Unlock()
			reads = append(reads, time.Since(files.start))
			for _, s := range w.kept.list {
				if s.hash == hash {
					if _, err := parse(s.files); err == nil {
						newest = hash
					}
				}
			}
		}
		changes, stop := startLoop(t, w)
		const n = 300
		for i := range n {
			time.Sleep(time.Duration(i)*ms - time.Since(files.start))
			files.set(yamlWithRate(i + 2))
			changes <- struct{}{}
		}
		time.Sleep(n*ms - time.Since(files.start))
		files.set("domain: d\ndescriptors: [broken")
		changes <- struct{}{}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		stop()
		mu.Lock()
		defer mu.Unlock()
		// 300 ms of changes, reads of 10 ms at most every 50 ms: about 7,
		// the last some 50 ms after the last change; then the load's.
		during := 0
		for _, at := range reads {
			if at <= (n+60)*ms {
				during++
			}
		}
		if during > n/50+2 || during == len(reads) {
			t.Errorf("%d reads at %v during 300 ms of changes and after, want at most %d, then the load's", during, reads, n/50+2)
		}
		if inForce.Hash() != newest || newest == "" {
			t.Errorf("rate %d in force after the storm, not the newest valid content read", rate(inForce))
		}
	})
}
