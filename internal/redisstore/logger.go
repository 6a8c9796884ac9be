package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
)

// Logger carries go-redis's own log lines (a dial that failed, a
// connection found broken) into a slog logger, at debug level: the daemon
// already logs an outage once, at error, when Redis starts failing and
// again when it answers, so these per-connection lines are detail for
// whoever asks for debug, in the format of the rest. go-redis has one
// logger per process (redis.SetLogger): a command installs one Logger,
// once, and hands it its logger with Use.
// Until then lines go to slog.Default(). It is safe for concurrent use.
type Logger struct {
	log atomic.Pointer[slog.Logger]
}

// Use makes l the logger lines are written through from now on.
func (r *Logger) Use(l *slog.Logger) { r.log.Store(l) }

// Printf implements go-redis's logging interface: it logs the formatted
// line, without its trailing newline, at debug level.
func (r *Logger) Printf(ctx context.Context, format string, v ...any) {
	l := r.log.Load()
	if l == nil {
		l = slog.Default()
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if !l.Enabled(ctx, slog.LevelDebug) {
		return // do not format what is not written
	}
	l.DebugContext(ctx, strings.TrimRight(fmt.Sprintf(format, v...), "\n"), "logger", "go-redis")
}
