package limitspage_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/limitspage"
	"github.com/ratelimitd/ratelimitd/internal/redact"
)

// TestHeaders: every answer declares its type, forbids sniffing another
// one, and allows no script, load or framing: values from requests on the
// page cannot run as HTML or script, whatever they hold.
func TestHeaders(t *testing.T) {
	f := newFixture(t)
	f.call(t, 1, "model", "gpt-4o", "client", `<script>alert(1)</script>`)
	hs := mount(f.handler)
	defer hs.Close()
	tests := []struct {
		path, wantType string
	}{
		{"/limits", "text/html; charset=utf-8"},
		{"/limits.json", "application/json"},
		{"/limits?format=json", "application/json"},
	}
	for _, tt := range tests {
		body, resp := get(t, hs, tt.path)
		for header, want := range map[string]string{
			"Content-Type":            tt.wantType,
			"X-Content-Type-Options":  "nosniff",
			"Cache-Control":           "no-store",
			"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
		} {
			if got := resp.Header.Get(header); got != want {
				t.Errorf("GET %s: %s = %q, want %q", tt.path, header, got, want)
			}
		}
		if strings.Contains(body, "<script>") {
			t.Errorf("GET %s: the request's value is in the body unescaped", tt.path)
		}
	}
}

// TestRedactedBuckets: with TrackerOptions.Redact the busiest buckets show
// the request's values redacted, on the page and in the JSON, and the raw
// value appears nowhere; configured values (rule paths) stay as written.
func TestRedactedBuckets(t *testing.T) {
	const key = "sk-live-0123456789"
	tests := []struct {
		mode redact.Mode
		want string // the bucket's descriptor
	}{
		{redact.Off, "model=gpt-4o, client=" + key},
		{redact.Hash, "model=" + redact.Hash.Value("gpt-4o") + ", client=" + redact.Hash.Value(key)},
		{redact.Prefix, "model=gpt…, client=sk-l…"},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			f := newFixtureTracking(t, testConfig, limitspage.TrackerOptions{Redact: tt.mode})
			f.call(t, 3, "model", "gpt-4o", "client", key)
			hs := mount(f.handler)
			defer hs.Close()
			body, _ := get(t, hs, "/limits.json")
			var page limitspage.Page
			if err := json.Unmarshal([]byte(body), &page); err != nil {
				t.Fatal(err)
			}
			var descs []string
			for _, b := range page.Busiest {
				descs = append(descs, b.Descriptor)
			}
			found := false
			for _, d := range descs {
				found = found || d == tt.want
			}
			if !found {
				t.Errorf("busiest descriptors %q, want one %q", descs, tt.want)
			}
			html, _ := get(t, hs, "/limits")
			if tt.mode != redact.Off {
				for what, b := range map[string]string{"JSON": body, "page": html} {
					if strings.Contains(b, key) || strings.Contains(b, "sk-live") {
						t.Errorf("the %s shows the value %q", what, key)
					}
				}
			}
			if !strings.Contains(body, `"path": "ai-gateway \u003e model=gpt-4o \u003e client"`) {
				t.Errorf("the JSON lost the configured rule path ai-gateway > model=gpt-4o > client:\n%s", body)
			}
		})
	}
}
