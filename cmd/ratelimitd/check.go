package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/answer"
	"github.com/ratelimitd/ratelimitd/internal/tlsreload"
)

// requestFlags are the flags check and explain share: a request's domain
// and its descriptors.
type requestFlags struct {
	domain string
	descs  descriptorFlags
}

// parse registers r's flags and --version on fs, which holds command
// cmd's own flags and writes to its output, and parses args into them;
// usage is the first line of fs's help. printed reports that --version
// was asked for and printed: cmd has nothing more to do. The error is a
// usageError for a bad argument (see check) or the version's write error.
func (r *requestFlags) parse(fs *flag.FlagSet, cmd, usage string, args []string, stdout io.Writer) (printed bool, err error) {
	fs.StringVar(&r.domain, "domain", "", "the request's domain (required)")
	fs.Var(&r.descs, "d", "a descriptor, key=value[,key=value...]; repeat for several (at least one)")
	var showVersion bool
	addVersionFlag(fs, &showVersion)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return false, usageError{err}
	}
	if showVersion {
		return true, printVersion(stdout)
	}
	return false, r.check(cmd, fs)
}

// check is the usage error of command cmd whose flags fs parsed into r: a
// stray argument, or no domain or descriptor.
func (r *requestFlags) check(cmd string, fs *flag.FlagSet) error {
	switch {
	case fs.NArg() > 0:
		return usageError{fmt.Errorf("%s: unexpected argument %q", cmd, fs.Arg(0))}
	case r.domain == "":
		return usageError{fmt.Errorf("%s: --domain is required", cmd)}
	case len(r.descs) == 0:
		return usageError{fmt.Errorf("%s: at least one -d key=value is required", cmd)}
	}
	return nil
}

// descriptorFlags collects repeated -d key=value[,key=value] flags, one
// request descriptor each.
type descriptorFlags [][]*ratelimitv3.RateLimitDescriptor_Entry

func (d *descriptorFlags) String() string {
	parts := make([]string, len(*d))
	for i, entries := range *d {
		parts[i] = answer.Entries(entries)
	}
	return strings.Join(parts, " ")
}

// Set parses one descriptor: entries separated by ",", each key=value
// (split at the first "="; a value may contain "=" but not ",").
func (d *descriptorFlags) Set(s string) error {
	var entries []*ratelimitv3.RateLimitDescriptor_Entry
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || k == "" {
			return fmt.Errorf("descriptor entry %q: want key=value", part)
		}
		entries = append(entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	*d = append(*d, entries)
	return nil
}

// runCheck sends one ShouldRateLimit to a running server and prints the
// answer. Any answer, OK or OVER_LIMIT, exits 0; a failed call does not.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelimitd check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "the server's gRPC address")
	tlsCA := fs.String("tls-ca", "", "speak TLS, trusting this PEM CA (a server started with --grpc-tls-cert)")
	tlsCert := fs.String("tls-cert", "", "client certificate (PEM) for a server that requires one (--grpc-client-ca)")
	tlsKey := fs.String("tls-key", "", "key (PEM) of --tls-cert")
	hits := fs.Uint("hits", 0, "the request's hits_addend (0: Envoy's default, 1)")
	release := fs.Bool("release", false, "send the descriptors as Envoy's stream-done call does (hits_addend 1, is_negative_hits): give back tokens, or release a concurrency lease")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	var rf requestFlags
	if printed, err := rf.parse(fs, "check", "usage: ratelimitd check [--addr HOST:PORT] --domain D -d key=value[,key=value] [-d ...] [--hits N] [--release] [--json]", args, stdout); printed || err != nil {
		return err
	}
	if *hits > 1<<32-1 {
		return usageError{fmt.Errorf("check: --hits %d is more than hits_addend holds", *hits)}
	}
	req := &rlsv3.RateLimitRequest{Domain: rf.domain, HitsAddend: uint32(*hits)}
	for _, entries := range rf.descs {
		d := &ratelimitv3.RateLimitDescriptor{Entries: entries}
		if *release {
			d.HitsAddend, d.IsNegativeHits = wrapperspb.UInt64(uint64(max(*hits, 1))), true
		}
		req.Descriptors = append(req.Descriptors, d)
	}

	creds, err := checkCredentials(*tlsCA, *tlsCert, *tlsKey)
	if err != nil {
		return usageError{fmt.Errorf("check: %w", err)}
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("check: connect to %s: %w", *addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		return fmt.Errorf("check: ShouldRateLimit at %s: %w", *addr, err)
	}
	ans := answer.Of(req, resp)
	if *asJSON {
		return ans.WriteJSON(stdout)
	}
	if err := ans.WriteTable(stdout); err != nil {
		return fmt.Errorf("check: %w", err)
	}
	return nil
}

// checkCredentials is plaintext without a CA, else TLS trusting it, with a
// client certificate when given.
func checkCredentials(caFile, certFile, keyFile string) (credentials.TransportCredentials, error) {
	if caFile == "" {
		if certFile != "" || keyFile != "" {
			return nil, errors.New("--tls-cert and --tls-key need --tls-ca")
		}
		return insecure.NewCredentials(), nil
	}
	cfg, err := tlsreload.ClientConfig("--tls", caFile, certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}
