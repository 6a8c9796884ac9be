package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/envcompat"
)

func newLogger(c serveConfig, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.logLevel}
	if c.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the service until ctx is done, then shuts down gracefully.
// SIGHUP reloads the config.
func serve(ctx context.Context, c serveConfig, logw io.Writer) error {
	// SIGHUP's default action ends the process. Take it first thing, so
	// that one sent while the service starts (a config tool's reload racing
	// a rollout) is a reload, not a crash; it is handled once the service
	// runs. From when serve returns it is ignored, not restored to its
	// default; during the drain Reload does nothing, so one sent then does
	// not cut the calls in flight short.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Ignore(syscall.SIGHUP)
	log := newLogger(c, logw)
	logBuild(log, buildinfo.Get())
	if c.ConfigPath != "" {
		warnings, err := envcompat.CheckConfigLayout(c.ConfigPath, c.envCompat == envcompat.Envoyproxy)
		if err != nil {
			return usageError{err}
		}
		for _, w := range warnings {
			log.Warn("config files not read", "why", w)
		}
	}
	envcompat.Warn(log, c.unhonoured, c.foreignVars)
	d, err := daemon.New(c.Config, log)
	if err != nil {
		return err
	}
	if len(c.ignoredFlags) > 0 {
		log.Warn("flags only the Redis backend reads are ignored on the memory backend", "flags", strings.Join(c.ignoredFlags, ","))
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-hup:
				log.Info("SIGHUP: reloading config", "config", c.ConfigPath)
				d.Reload()
			}
		}
	}()
	return d.Run(ctx)
}

// logBuild logs the first line of serve: which build starts, so that a
// fleet's logs say which replica ran which build before anything it did.
func logBuild(log *slog.Logger, b buildinfo.Info) {
	log.Info("ratelimitd starting", "version", b.Version, "revision", b.Revision, "modified", b.Modified,
		"build_time", b.BuildTime, "go_version", b.GoVersion, "platform", b.Platform)
}
