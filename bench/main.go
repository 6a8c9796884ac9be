// Command ratelimit-bench measures ratelimitd against a floor: a
// RateLimitService that answers OK and does no work, run side by side on
// the same machine in the same run, so that results are ratios (throughput
// and latency relative to the floor), which stay meaningful on a shared or
// noisy machine where absolute numbers do not. With Redis, a second floor
// (floor --redis-addr) makes one PING round trip per call: what asking
// Redis once per call costs here, at least; a third (floor --redis-addr
// --script) runs a minimal token-bucket script per call instead: what
// deciding each call alone in a Redis script costs here, at least. The
// tuned floor (floor --runtime-tuning) is the floor with the runtime
// tuning ratelimitd has by default (one P while lightly loaded, a GC heap
// floor): beside it, ratelimitd's figures show what the work alone costs.
//
//	ratelimit-bench load --addr 127.0.0.1:8081 [flags]   drive one server, print one row
//	ratelimit-bench floor --addr 127.0.0.1:0             serve the floor until SIGINT/SIGTERM
//	                      [--redis-addr HOST:PORT]       (the Redis floor: one PING per call)
//	                      [--script]                     (the script floor: one script per call)
//	                      [--runtime-tuning]             (the tuned floor)
//	ratelimit-bench run [flags]                          the matrix behind `make bench`
//	ratelimit-bench --write-config DIR                   write the descriptors the load expects
//
// The load calls ShouldRateLimit over gRPC at a fixed concurrency for a
// bounded time and a bounded number of calls, with a realistic mix (see
// mix.go), each call with a client deadline (--timeout, 2 s). Every
// address must be a loopback one: this is a tool for measuring on one
// machine, not for loading someone else's server.
//
// Errors are loud. Every row shows its errors (any gRPC error, the
// client's own deadline included), by code, with the first one's message,
// and the share of calls answered with a decision. The run command starts
// every backend itself, healthy, so an error in one of its strict cells
// (every cell with the long deadline) fails it: it prints everything,
// then exits 1 naming those cells (--allow-errors exits 0). Its
// short-deadline cells (--short-timeout, Envoy's default 20 ms, at
// --short-concurrency) set the share of calls ratelimitd on Redis answers
// within that deadline beside the floor's; calls that miss it are shown
// but do not fail the run. Its attack cells (see attack.go) set the
// mixed load's throughput beside attackers sending 60 KiB values to a
// level with 400 wildcard rules against its own without them, and fail
// the run below --attack-min-ratio.
//
// It is a tool beside the product, not part of it, so it lives in bench/
// rather than cmd/ (which lists what an operator installs); `make bench`
// builds it as bin/ratelimit-bench. The rules its load expects are
// config/bench.yaml, embedded.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	// A second Ctrl-C kills at once; child processes die with us (see proc_linux.go).
	go func() { <-ctx.Done(); stop() }()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit-bench:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode is the exit status for run's error: 0 for nil, 2 for a
// usageError, else 1 (cellErrors included).
func exitCode(err error) int {
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &usage):
		return 2
	}
	return 1
}

// usageError is an error in how the command was called (exit status 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// run is the whole program; it returns when the work is done, on an error,
// or soon after ctx is done (having stopped everything it started). A
// command's --help prints its usage to stderr and returns nil.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := runCommand(ctx, args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // the flag package has printed the usage
	}
	return err
}

// runCommand runs the command args name.
func runCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return usageError{errors.New("no command")}
	}
	switch args[0] {
	case "load":
		return runLoad(ctx, args[1:], stdout, stderr)
	case "floor":
		return runFloor(ctx, args[1:], stderr)
	case "run":
		return runMatrix(ctx, args[1:], stdout, stderr)
	case "fleet":
		return runFleet(ctx, args[1:], stdout, stderr)
	case "--write-config", "-write-config":
		if len(args) != 2 {
			return usageError{errors.New("usage: ratelimit-bench --write-config DIR")}
		}
		path, err := writeConfig(args[1])
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, path)
		return nil
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usageText)
		return nil
	}
	fmt.Fprint(stderr, usageText)
	return usageError{fmt.Errorf("unknown command %q", args[0])}
}

const usageText = `ratelimit-bench: load ratelimitd and compare it with a do-nothing floor.

Usage:
  ratelimit-bench load --addr HOST:PORT [flags]   drive ShouldRateLimit, print the result
  ratelimit-bench floor --addr 127.0.0.1:0        serve a RateLimitService that does no work
        [--redis-addr HOST:PORT [--script]]       but one Redis PING (or token-bucket
                                                  script) per call
        [--runtime-tuning]                        with ratelimitd's runtime tuning
  ratelimit-bench run [flags]                     start the floors, ratelimitd and redis-server,
                                                  run the matrix, print ratios to the floor;
                                                  exit 1 if a call failed in a strict cell
                                                  or an attack cell fell below its baseline
  ratelimit-bench fleet [flags]                   simulate replicas sharing one hot bucket on one
                                                  redis-server, token leases off then on; exit 1
                                                  if any second admitted above rate·t + burst
  ratelimit-bench --write-config DIR              write the descriptor file the load expects
  ratelimit-bench COMMAND --help                  list a command's flags

Addresses must be loopback ones.
`
