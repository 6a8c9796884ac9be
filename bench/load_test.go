package main

import (
	"context"
	"regexp"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// flakyServer fails some calls: those aimed over the limit (abuser) with
// Unavailable, and (when hang is set) three-entry calls for DELETE by
// never answering, so that the client's own deadline ends them. It
// answers every other call OK.
type flakyServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	hangAll bool
}

func (f flakyServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	es := req.GetDescriptors()[0].GetEntries()
	switch {
	case f.hangAll || len(es) == 3 && es[2].GetValue() == "DELETE":
		<-ctx.Done() // the client's deadline, or the test's end
		return nil, status.FromContextError(ctx.Err()).Err()
	case es[0].GetKey() == "abuser":
		return nil, status.Error(codes.Unavailable, "backend unavailable: waiting for a batched call")
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// TestLoadCountsErrors: every failed call is an error, a gRPC error from
// the server or the client's own deadline, in the measured phase and the
// warm-up; the first is sampled with its code; the decided share counts
// the rest; and a server that never answers keeps no worker past the
// deadline.
func TestLoadCountsErrors(t *testing.T) {
	for _, tt := range []struct {
		name      string
		srv       flakyServer
		wantCodes []string
		wantFirst *regexp.Regexp
	}{
		{"some calls fail", flakyServer{}, []string{"Unavailable", "DeadlineExceeded"},
			regexp.MustCompile(`^(Unavailable: backend unavailable: waiting for a batched call|DeadlineExceeded: context deadline exceeded)$`)},
		// The server's own end of the deadline (it resets the stream) may
		// reach the client before the client's timer fires.
		{"no call is answered", flakyServer{hangAll: true}, []string{"DeadlineExceeded"},
			regexp.MustCompile(`^DeadlineExceeded: (context deadline exceeded|stream terminated by RST_STREAM with error code: CANCEL)$`)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := testLoadOptions(serveInProcess(t, tt.srv), MixMixed)
			o.prime, o.timeout = false, 30*time.Millisecond
			if err := o.validate(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res, err := load(context.Background(), o, make([]int64, o.maxRequests))
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			// Warm-up 50 ms and 300 ms measured, each call at most 30 ms.
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("load took %v, want well under a second", el)
			}
			var byCode int64
			for _, c := range tt.wantCodes {
				if res.ErrorKind[c] == 0 {
					t.Errorf("error codes = %v, want some %s", res.ErrorKind, c)
				}
			}
			for _, n := range res.ErrorKind {
				byCode += n
			}
			if res.Errors == 0 || byCode != res.Errors || res.Calls != res.OK+res.OverLimit+res.Errors {
				t.Errorf("load = %d calls, %d OK, %d OVER_LIMIT, %d errors (%v by code); want errors that add up", res.Calls, res.OK, res.OverLimit, res.Errors, res.ErrorKind)
			}
			if res.WarmupErrors == 0 || res.ErrorsTotal != res.Errors+res.WarmupErrors {
				t.Errorf("load = %d errors, %d in warm-up, %d in all; want warm-up errors counted in the total", res.Errors, res.WarmupErrors, res.ErrorsTotal)
			}
			if !tt.wantFirst.MatchString(res.FirstError) {
				t.Errorf("first error = %q, want it to match %v", res.FirstError, tt.wantFirst)
			}
			if want := float64(res.OK+res.OverLimit) / float64(res.Calls); res.DecidedShare != want || (tt.srv.hangAll && res.DecidedShare != 0) {
				t.Errorf("decided share = %v, want %v", res.DecidedShare, want)
			}
			if res.TimeoutMs != 30 {
				t.Errorf("timeout = %v ms, want 30", res.TimeoutMs)
			}
			if tt.srv.hangAll {
				// 4 workers, 300 ms, 30 ms a call: about 40 calls.
				if res.Calls < 4 || res.Calls > 4*(300/30+1) {
					t.Errorf("%d calls to a server that never answers, want about 40 (4 workers, 300 ms, 30 ms deadlines)", res.Calls)
				}
			}
		})
	}
}
