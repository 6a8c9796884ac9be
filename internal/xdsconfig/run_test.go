package xdsconfig

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

// TestRetryWait: the waits grow from first, double, are capped at most,
// and u spreads each over its range.
func TestRetryWait(t *testing.T) {
	const s = time.Second
	tests := []struct {
		first, most time.Duration
		n           int
		lo, hi      time.Duration
	}{
		{s, 30 * s, 0, s, 2 * s},
		{s, 30 * s, 1, 2 * s, 4 * s},
		{s, 30 * s, 2, 4 * s, 8 * s},
		{s, 30 * s, 3, 8 * s, 16 * s},
		{s, 30 * s, 4, 15 * s, 30 * s}, // 32s is past most: capped
		{s, 30 * s, 5, 15 * s, 30 * s},
		{s, 30 * s, 1000, 15 * s, 30 * s},
		{3 * s, 60 * s, 0, 3 * s, 6 * s},
		{10 * s, 10 * s, 0, 10 * s, 10 * s},
		{10 * s, 10 * s, 7, 10 * s, 10 * s},
		{10 * s, 5 * s, 3, 10 * s, 10 * s}, // most below first counts as first
		{s, 1500 * time.Millisecond, 0, s, 1500 * time.Millisecond},
	}
	for _, tt := range tests {
		lo, hi := retryWait(tt.first, tt.most, tt.n, 0), retryWait(tt.first, tt.most, tt.n, 0.999999999)
		if lo != tt.lo || hi < tt.hi-time.Millisecond || hi > tt.hi {
			t.Errorf("retryWait(%v, %v, %d, 0…1) spans [%v, %v], want [%v, %v]", tt.first, tt.most, tt.n, lo, hi, tt.lo, tt.hi)
		}
		if mid := retryWait(tt.first, tt.most, tt.n, 0.5); mid != tt.lo+(tt.hi-tt.lo)/2 {
			t.Errorf("retryWait(%v, %v, %d, 0.5) = %v, want the middle %v", tt.first, tt.most, tt.n, mid, tt.lo+(tt.hi-tt.lo)/2)
		}
	}
	for n := range 70 {
		for _, u := range []float64{-1, 0, 0.3, 0.7, 1, 2} {
			if w := retryWait(s, 30*s, n, u); w < s || w > 30*s {
				t.Fatalf("retryWait(1s, 30s, %d, %v) = %v, outside [1s, 30s]", n, u, w)
			}
		}
	}
}

// records collects log records.
type records struct {
	mu   sync.Mutex
	list []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rec)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) count(level slog.Level, msgPrefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.list {
		if rec.Level == level && strings.HasPrefix(rec.Message, msgPrefix) {
			n++
		}
	}
	return n
}

// TestRunBackoff walks Run's retry loop on a fake clock: the waits
// between attempts follow retryWait with the drawn jitter, start over
// after a stream that delivered a response, and the same failure is
// logged as a warning once a minute only.
func TestRunBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &records{}
		c, err := New(Options{Addr: "127.0.0.1:1", ConnectRetryInterval: time.Second, MaxBackoff: 8 * time.Second},
			func(*config.Set, string) {}, slog.New(logs))
		if err != nil {
			t.Fatal(err)
		}
		// Attempt i responds (a stream that worked) when responds[i].
		responds := []bool{false, false, false, false, false, true, false, false}
		jitter := []float64{0, 0.5, 0.25, 0.999999999, 0.5, 0, 0.75, 0.5}
		var starts []time.Time
		ctx, cancel := context.WithCancel(t.Context())
		c.random = func() float64 { return jitter[len(starts)-1] }
		c.session = func(context.Context) (bool, error) {
			starts = append(starts, time.Now())
			if len(starts) == len(responds) {
				cancel()
				return false, ctx.Err()
			}
			// The local port changes from one attempt to the next.
			return responds[len(starts)-1], fmt.Errorf("write tcp 127.0.0.1:%d->127.0.0.1:1: broken pipe", 40000+len(starts))
		}
		if err := c.Run(ctx); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		failures := []int{0, 1, 2, 3, 4, 0, 1} // failures in a row before each wait
		for i := 1; i < len(starts); i++ {
			got := starts[i].Sub(starts[i-1])
			want := retryWait(time.Second, 8*time.Second, failures[i-1], jitter[i-1])
			if got != want {
				t.Errorf("wait %d = %v, want %v (failures %d, jitter %v)", i, got, want, failures[i-1], jitter[i-1])
			}
		}
		// 1s, 1.5s, 2.5s, 8s, 6s (capped), then 1s after the response, …:
		// everything within a minute of the first warning is debug only.
		if n := logs.count(slog.LevelWarn, "xDS connection failed"); n != 1 {
			t.Errorf("%d warnings for the same failure within a minute, want 1", n)
		}
		if n := logs.count(slog.LevelDebug, "xDS connection failed again"); n != len(starts)-2 {
			t.Errorf("%d debug records of repeats, want %d", n, len(starts)-2)
		}
		if st := c.Status(); st.Connected || st.LastError != "write tcp 127.0.0.1:40007->127.0.0.1:1: broken pipe" {
			t.Errorf("Status = %+v, want disconnected with the last error", st)
		}
	})
}

// TestRunStops: Run returns nil promptly when ctx is done during a wait,
// and warns again about a failure that lasts more than a minute.
func TestRunStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &records{}
		c, err := New(Options{Addr: "127.0.0.1:1", ConnectRetryInterval: 20 * time.Second, MaxBackoff: 40 * time.Second},
			func(*config.Set, string) {}, slog.New(logs))
		if err != nil {
			t.Fatal(err)
		}
		c.random = func() float64 { return 0 }
		attempts := 0
		c.session = func(context.Context) (bool, error) { attempts++; return false, errors.New("down") }
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- c.Run(ctx) }()
		// With no jitter every wait is the lower end of its range: 20s,
		// then [20s, 40s] from the second on. Attempts at 0, 20s, … 80s.
		time.Sleep(90 * time.Second)
		synctest.Wait()
		if attempts != 5 {
			t.Errorf("%d attempts in 90s, want 5", attempts)
		}
		if n := logs.count(slog.LevelWarn, "xDS connection failed"); n != 2 {
			t.Errorf("%d warnings over 60s of the same failure, want 2 (at 0 and at 60s)", n)
		}
		if err := c.Run(ctx); err == nil || !strings.Contains(err.Error(), "already running") {
			t.Errorf("second Run = %v, want an error saying one runs", err)
		}
		start := time.Now()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("Run took %v to return after cancel, want 0", d)
		}
	})
}

// TestHandle: what a push becomes, for pushes gRPC does not let the
// snapshot cache send (wrong types, bad bytes).
func TestHandle(t *testing.T) {
	good, err := anypb.New(xdstest.EGConfig(egDomain, "route-a", false))
	if err != nil {
		t.Fatal(err)
	}
	wrongType, err := anypb.New(durationpb.New(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	badBytes := &anypb.Any{TypeUrl: TypeURL, Value: []byte{0x0a, 0xff}}
	tests := []struct {
		name    string
		resp    *discoveryv3.DiscoveryResponse
		wantErr string // "" for an ACK
		domains int
	}{
		{name: "good", resp: &discoveryv3.DiscoveryResponse{TypeUrl: TypeURL, Resources: []*anypb.Any{good}}, domains: 1},
		{name: "empty push removes every domain", resp: &discoveryv3.DiscoveryResponse{TypeUrl: TypeURL}, domains: 0},
		{name: "resource of another type", resp: &discoveryv3.DiscoveryResponse{TypeUrl: TypeURL, Resources: []*anypb.Any{good, wrongType}},
			wantErr: "resource 1: type type.googleapis.com/google.protobuf.Duration, want " + TypeURL},
		{name: "bad bytes", resp: &discoveryv3.DiscoveryResponse{TypeUrl: TypeURL, Resources: []*anypb.Any{badBytes}},
			wantErr: "resource 0: decode RateLimitConfig: "},
		{name: "response of another type", resp: &discoveryv3.DiscoveryResponse{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"},
			wantErr: "response of type type.googleapis.com/envoy.config.cluster.v3.Cluster"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &applied{}
			c, err := New(Options{Addr: "x:1", NodeID: "n"}, a.apply, nil)
			if err != nil {
				t.Fatal(err)
			}
			c.acked = "7"
			tt.resp.VersionInfo, tt.resp.Nonce = "8", "nonce-8"
			req, _ := c.handle(tt.resp)
			if req.GetResponseNonce() != "nonce-8" || req.GetTypeUrl() != TypeURL || req.GetNode().GetId() != "n" {
				t.Errorf("answer %v, want nonce-8, the type and the node", req)
			}
			sets, versions := a.calls()
			if tt.wantErr != "" {
				if req.GetErrorDetail() == nil || !strings.Contains(req.GetErrorDetail().GetMessage(), tt.wantErr) {
					t.Fatalf("answer error_detail %v, want a NACK containing %q", req.GetErrorDetail(), tt.wantErr)
				}
				if req.GetVersionInfo() != "7" || len(versions) != 0 || c.Status().LastNACK == "" {
					t.Errorf("NACK version %q, apply calls %q, LastNACK %q; want version 7, no apply, LastNACK set",
						req.GetVersionInfo(), versions, c.Status().LastNACK)
				}
				return
			}
			if req.GetErrorDetail() != nil || req.GetVersionInfo() != "8" {
				t.Fatalf("answer %v, want an ACK of 8", req)
			}
			if len(sets) != 1 || len(sets[0].Domains()) != tt.domains {
				t.Errorf("apply calls %q, want one with %d domains", versions, tt.domains)
			}
			// The same push again (a reconnect) is ACKed without applying.
			if req, _ := c.handle(proto.Clone(tt.resp).(*discoveryv3.DiscoveryResponse)); req.GetErrorDetail() != nil {
				t.Fatalf("second answer is a NACK: %v", req.GetErrorDetail())
			}
			if _, versions := a.calls(); len(versions) != 1 {
				t.Errorf("apply calls %q after the same push twice, want one", versions)
			}
		})
	}
}

// TestNACKBounded: a refusal's message is cut at maxNACKBytes, as a NACK's
// is.
func TestNACKBounded(t *testing.T) {
	var ds []*rlsconfv3.RateLimitDescriptor
	for i := range 30 { // 30 problems of about 4 KB each
		ds = append(ds, &rlsconfv3.RateLimitDescriptor{Key: strings.Repeat("k", 250), Value: fmt.Sprintf("%04d", i) + strings.Repeat("v", 4000),
			RateLimit: policy0(rlsconfv3.RateLimitUnit_UNKNOWN, 1)})
	}
	a, err := anypb.New(one(ds...))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Addr: "x:1"}, func(*config.Set, string) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := c.handle(&discoveryv3.DiscoveryResponse{TypeUrl: TypeURL, Resources: []*anypb.Any{a}, Nonce: "1"})
	st := c.Status()
	if req.GetErrorDetail() != nil || len(st.Refused) != 1 {
		t.Fatalf("answer %v, Status.Refused %+v: want an ACK and api refused", req.GetErrorDetail(), st.Refused)
	}
	if msg := st.Refused[0].Reason; len(msg) != maxNACKBytes+len("…") || !strings.HasSuffix(msg, "…") {
		t.Errorf("refusal of %d bytes, want it cut at %d and marked", len(msg), maxNACKBytes)
	}
	// A cut never splits a character.
	long := errors.New("x" + strings.Repeat("é", maxNACKBytes)) // odd: a cut at maxNACKBytes lands inside a character
	if msg := nackMessage(long); !utf8.ValidString(msg) || len(msg) > maxNACKBytes+len("…") {
		t.Errorf("nackMessage of %d bytes of 'é' = %d bytes, valid UTF-8 %v", maxNACKBytes*2, len(msg), utf8.ValidString(msg))
	}
}

// TestNew: options that cannot work are refused up front.
func TestNew(t *testing.T) {
	certs := xdstest.NewCerts(t)
	apply := func(*config.Set, string) {}
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no address", Options{}, "no management server address"},
		{"negative retry", Options{Addr: "x:1", ConnectRetryInterval: -time.Second}, "negative"},
		{"negative size", Options{Addr: "x:1", MaxMessageBytes: -1}, "negative"},
		{"reserved header", Options{Addr: "x:1", Headers: map[string]string{"grpc-timeout": "1"}}, `header "grpc-timeout": reserved name`},
		{"bad header name", Options{Addr: "x:1", Headers: map[string]string{"a b": "1"}}, `header "a b": name has ' '`},
		{"bad header value", Options{Addr: "x:1", Headers: map[string]string{"a": "x\ny"}}, "control character"},
		{"cert without key", Options{Addr: "x:1", TLS: &TLSFiles{CertFile: certs.ClientCert}}, "TLS.CertFile and TLS.KeyFile go together"},
		{"missing CA file", Options{Addr: "x:1", TLS: &TLSFiles{CAFile: certs.ClientCert + ".missing"}}, "xds-tls-ca: open "},
		{"key of another cert", Options{Addr: "x:1", TLS: &TLSFiles{CertFile: certs.ClientCert, KeyFile: certs.ServerKey}}, "xds-tls-cert/xds-tls-key: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts, apply, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := New(Options{Addr: "x:1"}, nil, nil); err == nil {
		t.Errorf("New with a nil apply = nil error")
	}
	c, err := New(Options{Addr: "x:1", ConnectRetryInterval: time.Minute}, apply, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.opts.NodeID != DefaultNodeID || c.opts.MaxBackoff != time.Minute || c.opts.MaxMessageBytes != DefaultMaxMessageBytes {
		t.Errorf("defaults: node %q, max backoff %v, max message %d", c.opts.NodeID, c.opts.MaxBackoff, c.opts.MaxMessageBytes)
	}
}

// fakeStream is an ADS stream inside a synctest bubble: Recv takes the
// pushes the test sends, Send records the answers with their time.
type fakeStream struct {
	pushes  chan *discoveryv3.DiscoveryResponse
	mu      sync.Mutex
	answers []*discoveryv3.DiscoveryRequest
	at      []time.Time
}

func (f *fakeStream) Send(r *discoveryv3.DiscoveryRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers = append(f.answers, r)
	f.at = append(f.at, time.Now())
	return nil
}

func (f *fakeStream) Recv() (*discoveryv3.DiscoveryResponse, error) {
	r, ok := <-f.pushes
	if !ok {
		return nil, errors.New("stream closed")
	}
	return r, nil
}

func (f *fakeStream) sent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.answers)
}

// TestRepeatedNACK: a server that pushes a refused snapshot again at once
// (go-control-plane does) gets its NACKs at a growing pace, not in a hot
// loop; a different push is answered at once.
func TestRepeatedNACK(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := New(Options{Addr: "x:1", ConnectRetryInterval: time.Second, MaxBackoff: 8 * time.Second},
			func(*config.Set, string) {}, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.random = func() float64 { return 0.5 }
		bad := &anypb.Any{TypeUrl: TypeURL, Value: []byte{0x0a, 0xff}} // does not decode
		good, err := anypb.New(xdstest.EGConfig(egDomain, "r", false))
		if err != nil {
			t.Fatal(err)
		}
		f := &fakeStream{pushes: make(chan *discoveryv3.DiscoveryResponse)}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := c.serve(t.Context(), f); err == nil {
				t.Errorf("serve = nil error after the stream closed")
			}
		}()
		push := func(version, nonce string, a *anypb.Any) {
			f.pushes <- &discoveryv3.DiscoveryResponse{TypeUrl: TypeURL, VersionInfo: version, Nonce: nonce, Resources: []*anypb.Any{a}}
			synctest.Wait()
		}
		expect := func(step string, answers int) {
			t.Helper()
			if got := f.sent(); got != answers {
				t.Fatalf("%s: %d answers, want %d", step, got, answers)
			}
		}
		synctest.Wait()
		expect("subscribed", 1)
		push("2", "a", bad)
		expect("first NACK at once", 2)
		for i, n := range []int{0, 1, 2, 3} {
			push("2", "again-"+string(rune('a'+i)), bad)
			wait := retryWait(time.Second, 8*time.Second, n, 0.5)
			time.Sleep(wait - time.Nanosecond)
			synctest.Wait()
			expect("before the wait of repeat "+string(rune('1'+i)), 2+i)
			time.Sleep(time.Nanosecond)
			synctest.Wait()
			expect("after the wait of repeat "+string(rune('1'+i)), 3+i)
		}
		push("3", "b", good)
		expect("ACK at once", 7)
		push("2", "c", bad)
		expect("a NACK after an ACK at once", 8)
		close(f.pushes)
		<-done
		for i, r := range f.answers[1:] {
			if (r.GetErrorDetail() == nil) != (i == 5) {
				t.Errorf("answer %d: error_detail %v", i+1, r.GetErrorDetail())
			}
		}
	})
}

// TestPushKeyIsContent: a push is the same push whatever the order of its
// resources and its version, and another push if one resource differs.
func TestPushKeyIsContent(t *testing.T) {
	var anys []*anypb.Any
	for _, rc := range manyDomains(5) {
		a, err := anypb.New(rc)
		if err != nil {
			t.Fatal(err)
		}
		anys = append(anys, a)
	}
	bad := &anypb.Any{TypeUrl: TypeURL, Value: []byte{0x0a, 0xff}}
	push := func(version string, order ...int) *discoveryv3.DiscoveryResponse {
		r := &discoveryv3.DiscoveryResponse{TypeUrl: TypeURL, VersionInfo: version}
		for _, i := range order {
			if i < 0 {
				r.Resources = append(r.Resources, bad)
			} else {
				r.Resources = append(r.Resources, anys[i])
			}
		}
		return r
	}
	first := pushKey(push("1", 0, 1, 2, 3, 4, -1))
	if got := pushKey(push("2", -1, 4, 2, 0, 3, 1)); got != first {
		t.Errorf("the same resources reordered under another version make another key")
	}
	if got := pushKey(push("1", 0, 1, 2, 3, -1)); got == first {
		t.Errorf("a push without one resource makes the same key")
	}
	if got := pushKey(push("1", 0, 1, 2, 3, 3, -1)); got == first {
		t.Errorf("a push with one resource in place of another makes the same key")
	}
}
