package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
)

func newLogger(c serveConfig, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.logLevel}
	if c.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// daemonConfig is the daemon's Config for the flags.
func (c serveConfig) daemonConfig() daemon.Config {
	workers := c.streamWorkers
	if workers == 0 {
		workers = -1 // --grpc-stream-workers 0: none kept
	}
	return daemon.Config{
		ConfigPath:       c.configPath,
		WatchConfig:      c.watch,
		GRPCAddr:         c.grpcAddr,
		HTTPAddr:         c.httpAddr,
		GRPCTLS:          daemon.TLSFiles{CertFile: c.tls.certFile, KeyFile: c.tls.keyFile, ClientCAFile: c.tls.clientCA},
		MaxMessageBytes:  c.maxMessageBytes,
		StreamWorkers:    workers,
		ShutdownTimeout:  c.shutdownTimeout,
		RetryAfter:       c.retryAfter,
		RateLimitHeaders: c.rateLimitHeader,
		DynamicMetadata:  c.dynamicMetadata,
		Limits:           c.limits,
		MaxWait:          c.maxWait,
		Redis:            c.redis.config(),
		Failure:          c.failure,
		NearLimitRatio:   c.nearLimitRatio,
		MaxMetricValues:  c.maxMetricValues,
		Tracing:          c.tracing,
		Pprof:            c.pprof,
		GCHeapFloor:      c.gcHeapFloor,
		AdaptiveProcs:    c.adaptiveProcs,
	}
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
	d, err := daemon.New(c.daemonConfig(), log)
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
				log.Info("SIGHUP: reloading config", "config", c.configPath)
				d.Reload()
			}
		}
	}()
	return d.Run(ctx)
}
