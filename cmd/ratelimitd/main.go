// Command ratelimitd is an Envoy-compatible global rate-limit service: it
// serves envoy.service.ratelimit.v3.RateLimitService over gRPC, deciding with
// token buckets kept in memory or in Redis, from descriptor files in the
// envoyproxy/ratelimit format.
//
//	ratelimitd --config DIR_OR_FILE [flags]   serve
//	ratelimitd validate PATH                  check descriptor files
//	ratelimitd check --domain D -d k=v ...    ask a running server
//	ratelimitd explain --config P --domain D -d k=v ...   which rule matches, and why
//	ratelimitd version [--output json]        which build this is
//
// Every command also takes --version, which prints the version line
// instead of running.
//
// Every flag can also be set from the environment as RATELIMITD_<FLAG>, with
// dashes as underscores (--grpc-addr is RATELIMITD_GRPC_ADDR); a flag on the
// command line wins. Run as "ratelimit" (or with RATELIMITD_ENV_COMPAT=
// envoyproxy) it also reads envoyproxy/ratelimit's variables, with its
// defaults, below the RATELIMITD_ ones (see
// docs/replacing-envoyproxy-ratelimit.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/daemon"
	"github.com/ratelimitd/ratelimitd/internal/envcompat"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	// go-redis logs through one hook for the whole process: it is set here,
	// once, and nowhere else, so that its lines go through the serve
	// command's logger (at debug level) rather than straight to stderr.
	redisLog := &redisstore.Logger{}
	redis.SetLogger(redisLog)
	err := runWith(ctx, os.Args[1:], envcompat.ProgramGetenv(os.Args[0], os.Getenv), os.Stdout, os.Stderr, redisLog.Use)
	stop()
	var usage usageError
	switch {
	case err == nil:
	case errors.As(err, &usage):
		fmt.Fprintln(os.Stderr, "ratelimitd:", err)
		os.Exit(2)
	case errors.Is(err, daemon.ErrDrainCut):
		fmt.Fprintln(os.Stderr, "ratelimitd:", err)
		os.Exit(exitDrainCut)
	default:
		fmt.Fprintln(os.Stderr, "ratelimitd:", err)
		os.Exit(1)
	}
}

// exitDrainCut is the exit status of a shutdown that had to close calls
// still in flight at --shutdown-timeout (daemon.ErrDrainCut); 1 is any
// other failure, 2 a usage error.
const exitDrainCut = 3

// usageError is an error in how the command was called (exit status 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// run is the whole program: it returns when ctx is done (after a graceful
// shutdown) or on a fatal error. A command's --help prints its usage to
// stderr and returns nil.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return runWith(ctx, args, getenv, stdout, stderr, nil)
}

// runWith is run that also gives useLogger (unless nil) the logger the
// serve command logs with, once its flags are parsed and before it opens
// anything.
func runWith(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, useLogger func(*slog.Logger)) error {
	err := runCommand(ctx, args, getenv, stdout, stderr, useLogger)
	if errors.Is(err, flag.ErrHelp) {
		return nil // the flag package has printed the usage
	}
	return err
}

// runCommand runs the command args name; serve when they name none.
func runCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, useLogger func(*slog.Logger)) error {
	if len(args) > 0 {
		switch args[0] {
		case "validate":
			return runValidate(args[1:], stdout, stderr)
		case "check":
			return runCheck(ctx, args[1:], stdout, stderr)
		case "explain":
			return runExplain(args[1:], stdout, stderr)
		case "version":
			return runVersion(args[1:], stdout, stderr)
		case "serve":
			args = args[1:]
		case "help", "-h", "--help", "-help":
			fmt.Fprint(stdout, usageText)
			return nil
		}
	}
	cfg, err := parseServeFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	if cfg.showVersion {
		return printVersion(stdout)
	}
	if useLogger != nil {
		// serve builds its own from the same flags and writer: the same
		// format, level and destination.
		useLogger(newLogger(cfg, stderr))
	}
	return serve(ctx, cfg, stderr)
}

const usageText = `ratelimitd: an Envoy-compatible global rate-limit service (token buckets).

Usage:
  ratelimitd [serve] --config DIR_OR_FILE [flags]   serve RateLimitService v3 over gRPC
  ratelimitd validate PATH                          check descriptor files and exit
  ratelimitd check --domain D -d k=v[,k=v] [--addr A] [--hits N] [--json]
                                                    ask a running server, print its answer
  ratelimitd explain --config PATH --domain D -d k=v[,k=v]
                                                    show which rule each descriptor matches, and why
  ratelimitd version [--output json]                print the version, revision, build time, Go version and platform
  ratelimitd serve --help                           list the flags

Every command takes --version: it prints the version line and exits.

Every flag can also be given as an environment variable RATELIMITD_<FLAG>,
e.g. RATELIMITD_GRPC_ADDR for --grpc-addr; the command line wins.
Run as "ratelimit", or with RATELIMITD_ENV_COMPAT=envoyproxy, it also reads
envoyproxy/ratelimit's variables (REDIS_URL, GRPC_PORT, CONFIG_TYPE, ...)
with that project's defaults, below the RATELIMITD_ ones.
`
