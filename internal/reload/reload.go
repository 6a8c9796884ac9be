// Package reload keeps a config.Set in step with the files it was loaded
// from: it watches the config path with fsnotify, waits for the changes to
// settle (a debounce), loads and validates the files in full, and hands a
// Set that differs from the one in force to a callback. A load that fails
// leaves the last good Set in force and is reported to another callback.
//
// It handles the ways config files really change on disk: editors that write
// a temporary file and rename it over the old one, Kubernetes ConfigMap
// volumes (whose files are links through a "..data" link that is swapped
// atomically), writes seen half-done (the half fails validation, the whole is
// picked up when it lands), the directory being deleted and created again,
// and a symbolic link among the path's ancestors being swapped to another
// tree (envoyproxy/ratelimit's RUNTIME_ROOT with RUNTIME_WATCH_ROOT, where a
// deployment tool points a "current" link at each new release).
//
// After a storm of writes the newest valid content wins: the Watcher reads
// the files (without checking them, which is what costs) at each change it
// sees and keeps what it read since the config in force was loaded; when a
// load finds the files invalid, it puts in force the newest valid content it
// kept. So once the files settle, the config in force is the last valid
// content the Watcher read, even if the storm ended in an invalid write.
// Content replaced before the Watcher could read it is not seen: reads are
// paced to take about a fifth of the time at most (a directory of
// thousands of files is read less often than a few small files), and the
// read after a pause sees every change before it. At most 8 distinct
// contents, and no more bytes than the config's total cap
// (Options.Limits), are kept, the oldest dropped.
package reload

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/ratelimitd/ratelimitd/config"
)

// ErrWatch marks errors of the file watcher itself (not of the config), as
// passed to Options.OnError.
var ErrWatch = errors.New("watching config")

// Watch says whether a Watcher watches the file system. The zero value
// means WatchFiles.
type Watch int

const (
	// WatchFiles reloads on file-system events and on Reload.
	WatchFiles Watch = iota + 1
	// WatchReloadOnly reloads only when Reload is called (on SIGHUP, say).
	WatchReloadOnly
)

// Defaults of Options.
const (
	DefaultDebounce = 200 * time.Millisecond
	DefaultMaxWait  = 2 * time.Second
)

// Options configures a Watcher. Path and OnLoad are required; the zero value
// of every other field means its documented default.
type Options struct {
	// Path is the config file or directory, as given to config.Load.
	Path string
	// Current is the Set in force when the Watcher starts, if any. A load
	// whose Set has the same Hash as the one in force is not reported.
	Current *config.Set
	// Limits bound the config read (see config.LoadOptions).
	Limits config.LoadOptions
	// Read reads the files at Path without checking them, Parse checks
	// them; defaults config.ReadFiles and config.ParseWith, with Limits.
	// Reading is cheap beside checking: the Watcher reads the files at
	// every change it sees, and checks them when they have settled.
	Read  func(path string) ([]config.File, error)
	Parse func([]config.File) (*config.Set, error)
	// OnLoad is given every Set loaded that differs from the one in force;
	// it becomes the one in force.
	OnLoad func(*config.Set)
	// OnError is told of every load that failed (the Set in force stays) and
	// of watcher failures (those wrap ErrWatch); default ignores them.
	OnError func(error)
	// Watch defaults to WatchFiles.
	Watch Watch
	// Debounce is how long the files must stay quiet after a change before
	// they are loaded; default DefaultDebounce (200 ms).
	Debounce time.Duration
	// MaxWait bounds the wait of a change when others keep following it:
	// files that never stay quiet are still loaded at least this often while
	// they change. Default DefaultMaxWait (2 s); never less than Debounce.
	MaxWait time.Duration
}

// Watcher reloads a config path when it changes or when asked. Create one
// with New and run it with Run; Reload may be called from any goroutine.
// OnLoad and OnError are called from Run's goroutine, one at a time.
type Watcher struct {
	opts   Options
	fsw    *fsnotify.Watcher // nil with WatchReloadOnly
	dir    string            // the directory watched: Path, or Path's parent
	parent string            // dir's parent, watched to see dir come back
	file   string            // Path when it is a file, else ""
	links  map[string]bool   // the ancestors of dir that are symbolic links
	hash   string            // hash of the Set in force
	kick   chan struct{}     // Reload requests, coalesced
	kept   snapshots         // contents read since the last load
	test   testHooks         // zero outside tests
}

// testHooks tell a test of what the Watcher does; nil hooks are skipped.
type testHooks struct {
	read func(hash string) // a content read, at a change (snap) or by a load
	load func()            // a load begins
}

// New returns a Watcher for opts.Path. With WatchFiles it starts watching
// at once, so a change made after New returns is seen by Run; it fails if
// the path cannot be watched.
func New(opts Options) (*Watcher, error) {
	if opts.Path == "" {
		return nil, errors.New("reload: Options.Path is required")
	}
	if opts.OnLoad == nil {
		return nil, errors.New("reload: Options.OnLoad is required")
	}
	if opts.Read == nil {
		limits := opts.Limits
		opts.Read = func(path string) ([]config.File, error) { return config.ReadFiles(path, limits) }
	}
	if opts.Parse == nil {
		limits := opts.Limits
		opts.Parse = func(files []config.File) (*config.Set, error) { return config.ParseWith(files, limits) }
	}
	if opts.OnError == nil {
		opts.OnError = func(error) {}
	}
	if opts.Watch == 0 {
		opts.Watch = WatchFiles
	}
	if opts.Watch != WatchFiles && opts.Watch != WatchReloadOnly {
		return nil, fmt.Errorf("reload: invalid Watch %d", opts.Watch)
	}
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = DefaultMaxWait
	}
	opts.MaxWait = max(opts.MaxWait, opts.Debounce)
	w := &Watcher{opts: opts, hash: opts.Current.Hash(), kick: make(chan struct{}, 1)}
	w.kept.most = opts.Limits.MaxTotalBytes
	if w.kept.most <= 0 {
		w.kept.most = config.DefaultMaxTotalBytes
	}
	if opts.Watch == WatchReloadOnly {
		return w, nil
	}
	if err := w.watch(); err != nil {
		return nil, err
	}
	return w, nil
}

// watch sets up the fsnotify watches: the config directory (or the file's
// directory: editors and ConfigMaps replace files by rename, which a watch
// on the file itself would lose), that directory's parent, to notice the
// directory being removed and created again, and the parent of each
// ancestor that is a symbolic link, to notice the link being swapped
// (inotify watches what a path resolves to when the watch is added, so a
// swapped link leaves the watches on the old tree: see rewatch).
func (w *Watcher) watch() error {
	abs, err := filepath.Abs(w.opts.Path)
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	w.dir = abs
	st, err := os.Stat(abs)
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	if !st.IsDir() {
		w.file, w.dir = abs, filepath.Dir(abs)
	}
	w.parent = filepath.Dir(w.dir)
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	if err := fsw.Add(w.dir); err != nil {
		fsw.Close()
		return fmt.Errorf("reload: watch %s: %w", w.dir, err)
	}
	if w.parent != w.dir {
		if err := fsw.Add(w.parent); err != nil {
			fsw.Close()
			return fmt.Errorf("reload: watch %s: %w", w.parent, err)
		}
	}
	w.fsw = fsw
	if err := w.watchLinks(); err != nil {
		fsw.Close()
		return err
	}
	return nil
}

// watchLinks finds the ancestors of dir that are symbolic links and
// watches the directory each is in.
func (w *Watcher) watchLinks() error {
	w.links = map[string]bool{}
	for p := w.parent; ; p = filepath.Dir(p) {
		if st, err := os.Lstat(p); err == nil && st.Mode()&os.ModeSymlink != 0 {
			w.links[p] = true
			if err := w.fsw.Add(filepath.Dir(p)); err != nil {
				return fmt.Errorf("reload: watch %s (the directory of the link %s): %w", filepath.Dir(p), p, err)
			}
		}
		if filepath.Dir(p) == p {
			return nil
		}
	}
}

// rewatch drops every watch and sets them up again through the paths as
// they resolve now: after a link among dir's ancestors was swapped, the
// old watches are on the tree it pointed at before. If the new tree is
// not (yet) whole, the next event or Reload tries again; the load that
// follows reads whatever the paths resolve to.
func (w *Watcher) rewatch() error {
	for _, p := range w.fsw.WatchList() {
		_ = w.fsw.Remove(p)
	}
	var errs []error
	for _, p := range []string{w.dir, w.parent} {
		if err := w.fsw.Add(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("watch %s: %w", p, err))
		}
	}
	if err := w.watchLinks(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Reload asks Run to load the files now, without waiting for the debounce.
// It does not block; requests made while one is pending are merged.
func (w *Watcher) Reload() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Run reloads as files change or Reload is called, until ctx is done; it
// then stops watching and returns nil. Call it once.
func (w *Watcher) Run(ctx context.Context) error {
	if w.fsw == nil {
		return w.loop(ctx, nil, nil)
	}
	defer w.fsw.Close()
	changes := make(chan struct{})
	errs := make(chan error)
	done := make(chan struct{})
	defer close(done)
	go w.translate(changes, errs, done)
	return w.loop(ctx, changes, errs)
}

// translate turns fsnotify's events into changes that matter for the
// config, and follows the directory when it is created again.
func (w *Watcher) translate(changes chan<- struct{}, errs chan<- error, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			if !w.relevant(ev) {
				continue
			}
			switch {
			case w.links[ev.Name] && ev.Has(fsnotify.Create):
				// A link among the ancestors was swapped (a new link renamed
				// over it, or removed and made again): follow it.
				if err := w.rewatch(); err != nil {
					select {
					case errs <- err:
					case <-done:
						return
					}
				}
			case ev.Name == w.dir && ev.Has(fsnotify.Create):
				// The directory is back (or another was renamed to its name):
				// watch it. If it is already gone again, the next Create says so.
				_ = w.fsw.Add(w.dir)
			}
			select {
			case changes <- struct{}{}:
			case <-done:
				return
			}
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			select {
			case errs <- err:
			case <-done:
				return
			}
		}
	}
}

// relevant reports whether ev may change what Load reads.
func (w *Watcher) relevant(ev fsnotify.Event) bool {
	if ev.Op == fsnotify.Chmod {
		return false // touch, chmod: contents are the same
	}
	if ev.Name == w.dir || w.links[ev.Name] {
		return true // the directory itself, or a link above it: removed, renamed, created
	}
	if filepath.Dir(ev.Name) != w.dir {
		return false // something else in the parent
	}
	if w.file == "" {
		return true // anything in the directory; the hash tells if it mattered
	}
	// A single file: the file, or a ConfigMap's "..data" link and its
	// timestamped directories, through which the file may be a link.
	return ev.Name == w.file || strings.HasPrefix(filepath.Base(ev.Name), "..")
}

// loop is Run's body: changes are debounced, a Reload is served at once.
// changes and errs may be nil (no file watching).
func (w *Watcher) loop(ctx context.Context, changes <-chan struct{}, errs <-chan error) error {
	var (
		timer    *time.Timer
		fire     <-chan time.Time
		deadline time.Time // latest time of the pending load, set by MaxWait
	)
	stop := func() {
		if timer != nil {
			timer.Stop()
		}
		fire = nil
	}
	defer stop()
	var reads snapTimer
	defer reads.cancel()
	schedule := func() {
		now := time.Now()
		if fire == nil {
			deadline = now.Add(w.opts.MaxWait)
		}
		wait := min(w.opts.Debounce, deadline.Sub(now))
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		fire = timer.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
			drain(changes)
			w.snapSoon(&reads)
			schedule()
		case err := <-errs:
			// Events may have been lost (a full queue): load to be sure.
			w.opts.OnError(fmt.Errorf("%w %s: %w", ErrWatch, w.opts.Path, err))
			w.snapSoon(&reads)
			schedule()
		case <-reads.c:
			reads.c = nil
			w.snapNow(&reads)
		case <-fire:
			fire = nil
			reads.cancel() // the load reads them
			w.load()
		case <-w.kick:
			stop()
			reads.cancel()
			w.load()
		}
	}
}

// drain takes the changes already waiting (at most maxDrain), which one
// read of the files covers.
func drain(changes <-chan struct{}) {
	for range maxDrain {
		select {
		case <-changes:
		default:
			return
		}
	}
}
