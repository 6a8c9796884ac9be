package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestJSONHandler posts to /json over a real loopback HTTP server: the
// incumbent's status codes, the gRPC checks and messages, the body limit,
// and tokens spent as a gRPC call spends them.
func TestJSONHandler(t *testing.T) {
	clk := clocktest.New()
	c, srv := startServer(t, server.Options{Now: clk.Now, DynamicMetadata: server.DynamicMetadataAll}, server.MustParse(t, testConfig))
	hs := httptest.NewServer(srv.JSONHandler(512))
	t.Cleanup(hs.Close)
	post := func(body string) (int, string, string) {
		t.Helper()
		resp, err := http.Post(hs.URL, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	client := `{"domain": "api", "descriptors": [{"entries": [{"key": "client", "value": "acme"}]}]}`
	tests := []struct {
		name      string
		body      string
		code      int
		overall   rlsv3.RateLimitResponse_Code // for 200 and 429
		remaining uint32
		text      string // for the others: part of the body
	}{
		{"first of two a minute", client, http.StatusOK, rlsv3.RateLimitResponse_OK, 1, ""},
		{"second", client, http.StatusOK, rlsv3.RateLimitResponse_OK, 0, ""},
		{"third: over the limit", client, http.StatusTooManyRequests, rlsv3.RateLimitResponse_OVER_LIMIT, 0, ""},
		{"bad JSON", `{"domain": `, http.StatusBadRequest, 0, 0, "no RateLimitRequest"},
		{"unknown field", `{"domain": "api", "bogus": 1}`, http.StatusBadRequest, 0, 0, "bogus"},
		{"invalid request: the gRPC check and message", `{"domain": "", "descriptors": [{"entries": [{"key": "a", "value": "b"}]}]}`, http.StatusBadRequest, 0, 0, "domain is empty"},
		{"body over the limit", `{"domain": "` + strings.Repeat("x", 600) + `"}`, http.StatusRequestEntityTooLarge, 0, 0, "more than 512 bytes"},
	}
	for _, tt := range tests {
		code, ctype, body := post(tt.body)
		if code != tt.code {
			t.Errorf("%s: status %d, want %d (%s)", tt.name, code, tt.code, body)
			continue
		}
		if code != http.StatusOK && code != http.StatusTooManyRequests {
			if !strings.Contains(body, tt.text) {
				t.Errorf("%s: body %q, want it to say %q", tt.name, body, tt.text)
			}
			continue
		}
		if ctype != "application/json" {
			t.Errorf("%s: Content-Type %q, want application/json", tt.name, ctype)
		}
		var resp rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(body), &resp); err != nil {
			t.Fatalf("%s: answer %q: %v", tt.name, body, err)
		}
		if resp.GetOverallCode() != tt.overall || resp.GetStatuses()[0].GetLimitRemaining() != tt.remaining {
			t.Errorf("%s: %v, want %v remaining %d", tt.name, &resp, tt.overall, tt.remaining)
		}
		if _, has := resp.GetDynamicMetadata().GetFields()["ratelimitd.matched"]; !has {
			t.Errorf("%s: answer lost its dynamic metadata: %s", tt.name, body)
		}
	}
	// The /json calls spent the tokens gRPC sees.
	if got := call(t, c, request("api", desc("client", "acme"))).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("gRPC after /json spent the bucket: %v, want OVER_LIMIT", got)
	}
	resp, err := http.Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodPost {
		t.Errorf("GET: %d Allow %q, want 405 Allow POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// TestJSONHandlerUnavailable: before any config, /json answers 503.
func TestJSONHandlerUnavailable(t *testing.T) {
	srv, err := server.New(server.Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	srv.JSONHandler(0).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json",
		strings.NewReader(`{"domain": "api", "descriptors": [{"entries": [{"key": "a", "value": "b"}]}]}`)))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), server.ErrNoConfig.Error()) {
		t.Errorf("no config: %d %q, want 503 with %q", rec.Code, rec.Body.String(), server.ErrNoConfig)
	}
}
