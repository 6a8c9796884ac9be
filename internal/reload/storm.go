package reload

import (
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
)

// What the Watcher keeps of the contents it read during a storm of
// changes: at most maxSnapshots distinct contents, and no more bytes than
// the config's total cap (Options.Limits), the oldest dropped first.
const (
	maxSnapshots = 8
	// maxDrain bounds the change events merged into one read.
	maxDrain = 64
	// readGap bounds the time spent reading at changes to about a fifth:
	// after a read that took d, the next waits until readGap·d after it
	// began (a read of a few small files takes microseconds; one of a
	// directory of thousands, milliseconds).
	readGap = 5
)

// snapTimer paces the reads at changes (see readGap): a change that comes
// before next arms the timer, whose read then sees it and every change
// after it.
type snapTimer struct {
	t    *time.Timer
	c    <-chan time.Time // nil unless a read is pending
	next time.Time
}

// cancel drops the pending read, if any.
func (st *snapTimer) cancel() {
	if st.t != nil {
		st.t.Stop()
	}
	st.c = nil
}

// snapSoon reads the files now, or, too soon after the last read, arms st
// to read them once the gap has passed.
func (w *Watcher) snapSoon(st *snapTimer) {
	now := time.Now()
	if !now.Before(st.next) {
		w.snapNow(st)
		return
	}
	if st.c != nil {
		return // the pending read will see this change
	}
	if st.t == nil {
		st.t = time.NewTimer(st.next.Sub(now))
	} else {
		st.t.Reset(st.next.Sub(now))
	}
	st.c = st.t.C
}

// snapNow reads the files and sets when the next read may be.
func (w *Watcher) snapNow(st *snapTimer) {
	begin := time.Now()
	w.snap()
	st.next = begin.Add(readGap * time.Since(begin))
}

// A snapshot is the content of the files as read at one change: read,
// not checked (checking is what costs).
type snapshot struct {
	files []config.File
	hash  string // config.HashFiles(files)
	bytes int64
}

// snapshots are the contents read since the config in force was loaded,
// oldest first.
type snapshots struct {
	list  []snapshot
	bytes int64
	most  int64 // the byte budget
}

// add keeps s as the newest content, unless it is the newest already, and
// drops the oldest contents beyond the budget.
func (ss *snapshots) add(s snapshot) {
	if n := len(ss.list); n > 0 && ss.list[n-1].hash == s.hash {
		return
	}
	ss.list = append(ss.list, s)
	ss.bytes += s.bytes
	for len(ss.list) > 1 && (len(ss.list) > maxSnapshots || ss.bytes > ss.most) {
		ss.bytes -= ss.list[0].bytes
		ss.list[0] = snapshot{}
		ss.list = ss.list[1:]
	}
}

// reset forgets every content: all were older than the config in force,
// or invalid.
func (ss *snapshots) reset() {
	clear(ss.list)
	ss.list, ss.bytes = ss.list[:0], 0
}

// snap reads the files as they are now and keeps their content, for load
// to fall back on if the files end up invalid. A read that fails (the
// directory half-replaced, say) keeps nothing: the next change reads again.
func (w *Watcher) snap() {
	files, err := w.opts.Read(w.opts.Path)
	if err != nil {
		return
	}
	s := snapshot{files: files, hash: config.HashFiles(files)}
	for _, f := range files {
		s.bytes += int64(len(f.Data))
	}
	w.kept.add(s)
	if w.test.read != nil {
		w.test.read(s.hash)
	}
}

// load reads and checks the files and reports the outcome: a Set that
// differs from the one in force goes to OnLoad, a failure to OnError.
//
// When the files fail, the contents read since the config in force was
// loaded are checked, newest first, and the first valid one is put in
// force (after OnError has been told of the failure): after a storm of
// writes that ends in an invalid one, the config in force is the newest
// valid content the Watcher read, not the one it happened to load during
// the storm. The search stops at a content equal to the config in force,
// which is then the newest valid one.
func (w *Watcher) load() {
	defer w.kept.reset()
	if w.test.load != nil {
		w.test.load()
	}
	files, err := w.opts.Read(w.opts.Path)
	var hash string
	if err == nil {
		hash = config.HashFiles(files)
		if w.test.read != nil {
			w.test.read(hash)
		}
		if hash == w.hash {
			return
		}
		var set *config.Set
		if set, err = w.opts.Parse(files); err == nil {
			w.put(set)
			return
		}
	}
	w.opts.OnError(fmt.Errorf("reload %s: %w", w.opts.Path, err))
	for i := len(w.kept.list) - 1; i >= 0; i-- {
		s := w.kept.list[i]
		switch s.hash {
		case w.hash:
			return // the config in force is the newest valid content
		case hash:
			continue // what failed just now
		}
		if set, err := w.opts.Parse(s.files); err == nil {
			w.put(set)
			return
		}
	}
}

// put makes set the config in force, if it differs from it.
func (w *Watcher) put(set *config.Set) {
	if set.Hash() == w.hash {
		return
	}
	w.hash = set.Hash()
	w.opts.OnLoad(set)
}
