package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimitd/internal/tlsreload"
)

// requestFlags are the flags check and explain share: a request's domain
// and its descriptors.
type requestFlags struct {
	domain string
	descs  descriptorFlags
}

func (r *requestFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.domain, "domain", "", "the request's domain (required)")
	fs.Var(&r.descs, "d", "a descriptor, key=value[,key=value...]; repeat for several (at least one)")
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
		parts[i] = entriesString(entries)
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

func entriesString(entries []*ratelimitv3.RateLimitDescriptor_Entry) string {
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = e.GetKey() + "=" + e.GetValue()
	}
	return strings.Join(parts, ",")
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
	var rf requestFlags
	rf.register(fs)
	hits := fs.Uint("hits", 0, "the request's hits_addend (0: Envoy's default, 1)")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ratelimitd check [--addr HOST:PORT] --domain D -d key=value[,key=value] [-d ...] [--hits N] [--json]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if err := rf.check("check", fs); err != nil {
		return err
	}
	if *hits > 1<<32-1 {
		return usageError{fmt.Errorf("check: --hits %d is more than hits_addend holds", *hits)}
	}
	req := &rlsv3.RateLimitRequest{Domain: rf.domain, HitsAddend: uint32(*hits)}
	for _, entries := range rf.descs {
		req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: entries})
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
	ans := newCheckAnswer(req, resp)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false) // rule paths hold '>'
		return enc.Encode(ans)
	}
	return ans.writeTable(stdout)
}

// checkAnswer is the answer as check prints it; its JSON form is stable.
type checkAnswer struct {
	OverallCode          string         `json:"overall_code"`
	Statuses             []checkStatus  `json:"statuses"`
	ResponseHeadersToAdd []checkHeader  `json:"response_headers_to_add,omitempty"`
	RequestHeadersToAdd  []checkHeader  `json:"request_headers_to_add,omitempty"`
	DynamicMetadata      map[string]any `json:"dynamic_metadata,omitempty"`
}

type checkStatus struct {
	Descriptor   string      `json:"descriptor"`
	Code         string      `json:"code"`
	Limit        *checkLimit `json:"limit,omitempty"`
	Remaining    uint32      `json:"remaining"`
	ResetSeconds int64       `json:"reset_seconds"`
}

type checkLimit struct {
	Name            string `json:"name,omitempty"`
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
	UnitMultiplier  uint32 `json:"unit_multiplier,omitempty"`
}

type checkHeader struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

func newCheckAnswer(req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) checkAnswer {
	a := checkAnswer{OverallCode: resp.GetOverallCode().String(), Statuses: []checkStatus{}}
	for i, st := range resp.GetStatuses() {
		s := checkStatus{Code: st.GetCode().String(), Remaining: st.GetLimitRemaining(), ResetSeconds: st.GetDurationUntilReset().GetSeconds()}
		if i < len(req.GetDescriptors()) {
			s.Descriptor = entriesString(req.GetDescriptors()[i].GetEntries())
		}
		if l := st.GetCurrentLimit(); l != nil {
			s.Limit = &checkLimit{Name: l.GetName(), RequestsPerUnit: l.GetRequestsPerUnit(), Unit: strings.ToLower(l.GetUnit().String()),
				UnitMultiplier: l.GetUnitMultiplier().GetValue()}
		}
		a.Statuses = append(a.Statuses, s)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		a.ResponseHeadersToAdd = append(a.ResponseHeadersToAdd, checkHeader{h.GetKey(), h.GetValue()})
	}
	for _, h := range resp.GetRequestHeadersToAdd() {
		a.RequestHeadersToAdd = append(a.RequestHeadersToAdd, checkHeader{h.GetKey(), h.GetValue()})
	}
	if md := resp.GetDynamicMetadata(); md != nil && len(md.GetFields()) > 0 {
		a.DynamicMetadata = md.AsMap()
	}
	return a
}

func (l *checkLimit) String() string {
	if l == nil {
		return "-"
	}
	per := l.Unit
	if l.UnitMultiplier > 1 {
		per = fmt.Sprintf("%d %ss", l.UnitMultiplier, l.Unit)
	}
	s := fmt.Sprintf("%d/%s", l.RequestsPerUnit, per)
	if l.Name != "" {
		s += " (" + l.Name + ")"
	}
	return s
}

// writeTable prints the answer for people: the overall code, a table of
// statuses, then headers and metadata.
func (a checkAnswer) writeTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "overall: %s\n\n", a.OverallCode)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DESCRIPTOR\tCODE\tLIMIT\tREMAINING\tRESET")
	for _, s := range a.Statuses {
		remaining := "-"
		if s.Limit != nil {
			remaining = fmt.Sprint(s.Remaining)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%ds\n", s.Descriptor, s.Code, s.Limit, remaining, s.ResetSeconds)
	}
	tw.Flush()
	headers := func(title string, hs []checkHeader) {
		if len(hs) == 0 {
			return
		}
		fmt.Fprintf(&b, "\n%s:\n", title)
		for _, h := range hs {
			fmt.Fprintf(&b, "  %s: %s\n", h.Key, h.Value)
		}
	}
	headers("response headers", a.ResponseHeadersToAdd)
	headers("request headers", a.RequestHeadersToAdd)
	if len(a.DynamicMetadata) > 0 {
		var md strings.Builder
		enc := json.NewEncoder(&md)
		enc.SetEscapeHTML(false) // rule paths hold '>'
		if err := enc.Encode(a.DynamicMetadata); err != nil {
			return fmt.Errorf("check: metadata: %w", err)
		}
		fmt.Fprintf(&b, "\ndynamic metadata: %s", md.String())
	}
	_, err := io.WriteString(w, b.String())
	return err
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
