package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

// TestServeObservability runs the whole program and checks what an
// operator reaches on the HTTP port after some traffic: /metrics,
// /limits, /limits.json, and /debug/pprof/ only with --pprof.
func TestServeObservability(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantPprof int
	}{
		{"default", nil, http.StatusNotFound},
		{"pprof", []string{"--pprof"}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			grpcAddr, httpAddr, _, _ := startRun(t, tt.args...)
			rls := rlsClient(t, grpcAddr)
			req := servertest.Request("api", servertest.Desc("model", "gpt-4o"))
			for range 7 { // 5 pass, 2 are shed
				if _, err := rls.ShouldRateLimit(context.Background(), req); err != nil {
					t.Fatal(err)
				}
			}
			base := "http://" + httpAddr

			code, body := servertest.Get(t, base+"/metrics")
			for _, want := range []string{
				`ratelimitd_descriptor_hits_total{domain="api",rule="gpt-4o",value=""} 7`,
				`ratelimitd_descriptor_over_limit_total{domain="api",rule="gpt-4o",value=""} 2`,
				`ratelimitd_request_duration_seconds_count{backend="memory",code="OK"} 7`,
				`ratelimitd_config_reloads_total{result="ok"} 1`,
				"ratelimitd_config_info{hash=",
			} {
				if code != http.StatusOK || !strings.Contains(body, want) {
					t.Errorf("GET /metrics = %d, lacks %q", code, want)
				}
			}

			code, body = servertest.Get(t, base+"/limits.json")
			var page struct {
				Domains []struct {
					Rules []struct {
						Name       string `json:"name"`
						LastMinute struct {
							Requests, Shed int64
						} `json:"last_minute"`
					} `json:"rules"`
				} `json:"domains"`
			}
			if err := json.Unmarshal([]byte(body), &page); err != nil || code != http.StatusOK {
				t.Fatalf("GET /limits.json = %d, %v", code, err)
			}
			if len(page.Domains) != 1 || len(page.Domains[0].Rules) != 1 {
				t.Fatalf("/limits.json = %s, want one domain with one rule", body)
			}
			if r := page.Domains[0].Rules[0]; r.Name != "gpt-4o" || r.LastMinute.Requests != 7 || r.LastMinute.Shed != 2 {
				t.Errorf("/limits.json rule = %+v, want gpt-4o with 7 requests, 2 shed", r)
			}
			if code, body := servertest.Get(t, base+"/limits"); code != http.StatusOK || !strings.Contains(body, `<tr data-rule="gpt-4o">`) {
				t.Errorf("GET /limits = %d, lacks the gpt-4o row", code)
			}
			if code, _ := servertest.Get(t, base+"/healthz"); code != http.StatusOK {
				t.Errorf("GET /healthz = %d, want 200 beside the new endpoints", code)
			}
			if code, _ := servertest.Get(t, base+"/debug/pprof/"); code != tt.wantPprof {
				t.Errorf("GET /debug/pprof/ = %d, want %d", code, tt.wantPprof)
			}
		})
	}
}

func TestBadObservabilityFlags(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--config", "x", "--near-limit-ratio", "0"}, nil, "--near-limit-ratio"},
		{[]string{"--config", "x"}, map[string]string{"OTEL_TRACES_SAMPLER_ARG": "lots"}, "OTEL_TRACES_SAMPLER_ARG"},
	}
	for _, tt := range tests {
		err := run(context.Background(), tt.args, func(k string) string { return tt.env[k] }, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q, %v) = %v, want an error naming %s", tt.args, tt.env, err, tt.want)
		}
	}
}
