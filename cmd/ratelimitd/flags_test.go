package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

func noEnv(string) string { return "" }

// TestParseServeFlagsChoices sets every accepted value of each flag that
// names one of a few choices, and checks the config field it lands in.
func TestParseServeFlagsChoices(t *testing.T) {
	tests := []struct {
		flag, value string
		field       func(serveConfig) any
		want        any
	}{
		{"retry-after", "send", func(c serveConfig) any { return c.RetryAfter }, server.RetryAfterSend},
		{"retry-after", "omit", func(c serveConfig) any { return c.RetryAfter }, server.RetryAfterOmit},
		{"ratelimit-headers", "off", func(c serveConfig) any { return c.RateLimitHeaders }, server.RateLimitHeadersOff},
		{"ratelimit-headers", "draft03", func(c serveConfig) any { return c.RateLimitHeaders }, server.RateLimitHeadersDraft03},
		{"ratelimit-headers", "ietf", func(c serveConfig) any { return c.RateLimitHeaders }, server.RateLimitHeadersIETF},
		{"ratelimit-headers", "incumbent", func(c serveConfig) any { return c.RateLimitHeaders }, server.RateLimitHeadersIncumbent},
		{"dynamic-metadata", "all", func(c serveConfig) any { return c.DynamicMetadata }, server.DynamicMetadataAll},
		{"dynamic-metadata", "notable", func(c serveConfig) any { return c.DynamicMetadata }, server.DynamicMetadataNotable},
		{"dynamic-metadata", "off", func(c serveConfig) any { return c.DynamicMetadata }, server.DynamicMetadataOff},
		{"quota-mode", "per-rule", func(c serveConfig) any { return c.QuotaMode }, server.QuotaModePerRule},
		{"quota-mode", "all", func(c serveConfig) any { return c.QuotaMode }, server.QuotaModeAll},
		{"refunds", "taken", func(c serveConfig) any { return c.Refunds }, server.RefundsTaken},
		{"refunds", "unbounded", func(c serveConfig) any { return c.Refunds }, server.RefundsUnbounded},
		{"descriptor-metadata", "passed", func(c serveConfig) any { return c.DescriptorMetadata }, server.DescriptorMetadataPassed},
		{"descriptor-metadata", "incumbent", func(c serveConfig) any { return c.DescriptorMetadata }, server.DescriptorMetadataIncumbent},
		{"descriptor-metadata", "off", func(c serveConfig) any { return c.DescriptorMetadata }, server.DescriptorMetadataOff},
		{"default-overdraft", "0", func(c serveConfig) any { return [2]any{c.Overdraft.On, c.Overdraft.Bursts} }, [2]any{false, int64(0)}},
		{"default-overdraft", "2", func(c serveConfig) any { return [2]any{c.Overdraft.On, c.Overdraft.Bursts} }, [2]any{true, int64(2)}},
		{"log-format", "text", func(c serveConfig) any { return c.logFormat }, "text"},
		{"log-format", "json", func(c serveConfig) any { return c.logFormat }, "json"},
		{"on-backend-failure", "error", func(c serveConfig) any { return c.Failure.Mode }, failover.Error},
		{"on-backend-failure", "allow", func(c serveConfig) any { return c.Failure.Mode }, failover.Allow},
		{"on-backend-failure", "deny", func(c serveConfig) any { return c.Failure.Mode }, failover.Deny},
		{"on-backend-failure", "local", func(c serveConfig) any { return c.Failure.Mode }, failover.Local},
		{"failure-grace-mode", "error", func(c serveConfig) any { return c.Failure.GraceMode }, failover.Error},
		{"failure-grace-mode", "allow", func(c serveConfig) any { return c.Failure.GraceMode }, failover.Allow},
		{"failure-grace-mode", "deny", func(c serveConfig) any { return c.Failure.GraceMode }, failover.Deny},
		{"breaker-failing-for", "30ms", func(c serveConfig) any { return c.Failure.FailingFor }, 30 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.flag+"="+tt.value, func(t *testing.T) {
			c, err := parseServeFlags([]string{"--config", "x", "--" + tt.flag, tt.value}, noEnv, io.Discard)
			if err != nil {
				t.Fatalf("parseServeFlags: %v", err)
			}
			if got := tt.field(c); got != tt.want {
				t.Errorf("--%s %s gives %v, want %v", tt.flag, tt.value, got, tt.want)
			}
		})
	}
}

// TestParseServeFlagsDefaults checks the defaults of the choice flags and
// of the failure-mode flags docs/failure-modes.md lists.
func TestParseServeFlagsDefaults(t *testing.T) {
	c, err := parseServeFlags([]string{"--config", "x"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		flag      string
		got, want any
	}{
		{"retry-after", c.RetryAfter, server.RetryAfterSend},
		{"ratelimit-headers", c.RateLimitHeaders, server.RateLimitHeadersOff},
		{"dynamic-metadata", c.DynamicMetadata, server.DynamicMetadataNotable},
		{"log-format", c.logFormat, "text"},
		{"on-backend-failure", c.Failure.Mode, failover.Error},
		{"failure-grace", c.Failure.Grace, time.Duration(0)},
		{"failure-grace-mode", c.Failure.GraceMode, failover.Error},
		{"replicas-hint", c.Failure.ReplicasHint, int64(1)},
		{"grpc-stream-workers", c.StreamWorkers, 128},
		{"gc-heap-floor-mib", c.GCHeapFloor, uint64(64 << 20)},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("--%s defaults to %v, want %v", tt.flag, tt.got, tt.want)
		}
	}
}

// TestGOGCWinsOverTheHeapFloor: with GOGC set, the operator has chosen the
// collector's pace, and no heap floor is kept, whatever the flag says.
func TestGOGCWinsOverTheHeapFloor(t *testing.T) {
	tests := []struct {
		gogc string
		args []string
		want uint64
	}{
		{"", []string{"--gc-heap-floor-mib", "256"}, 256 << 20},
		{"", []string{"--gc-heap-floor-mib", "0"}, 0},
		{"200", nil, 0},
		{"off", []string{"--gc-heap-floor-mib", "256"}, 0},
	}
	for _, tt := range tests {
		getenv := func(k string) string {
			if k == "GOGC" {
				return tt.gogc
			}
			return ""
		}
		c, err := parseServeFlags(append([]string{"--config", "x"}, tt.args...), getenv, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if c.GCHeapFloor != tt.want {
			t.Errorf("GOGC=%q %q: heap floor %d, want %d", tt.gogc, tt.args, c.GCHeapFloor, tt.want)
		}
	}
}

// TestParseServeFlagsRejects checks values and combinations that are usage
// errors, and the message of each.
func TestParseServeFlagsRejects(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"retry-after", []string{"--retry-after", "later"}, `--retry-after "later": want send or omit`},
		{"ratelimit-headers", []string{"--ratelimit-headers", "draft04"}, `--ratelimit-headers "draft04": want off, draft03, ietf or incumbent`},
		{"header names without incumbent", []string{"--ratelimit-header-names", "a,b,c"}, "--ratelimit-header-names: only with --ratelimit-headers incumbent"},
		{"two header names", []string{"--ratelimit-headers", "incumbent", "--ratelimit-header-names", "a,b"}, `--ratelimit-header-names "a,b": want three names, limit,remaining,reset`},
		{"a header name with a space", []string{"--ratelimit-headers", "incumbent", "--ratelimit-header-names", "a,b c,d"}, `--ratelimit-header-names: the remaining header's name "b c" is not an HTTP header name`},
		{"an empty header name", []string{"--ratelimit-headers", "incumbent", "--ratelimit-header-names", "a,b,"}, `--ratelimit-header-names: the reset header's name "" is not an HTTP header name`},
		{"dynamic-metadata", []string{"--dynamic-metadata", "some"}, `--dynamic-metadata "some": want all, notable or off`},
		{"quota-mode", []string{"--quota-mode", "some"}, `--quota-mode "some": want per-rule or all`},
		{"descriptor-metadata", []string{"--descriptor-metadata", "all"}, `--descriptor-metadata "all": want passed, incumbent or off`},
		{"negative overdraft", []string{"--default-overdraft", "-1"}, "--default-overdraft -1: must not be negative"},
		{"overdraft counting", []string{"--default-overdraft", "1", "--default-overdraft-counting", "never"}, `--default-overdraft-counting "never": want always or where-denied`},
		{"overdraft domains alone", []string{"--default-overdraft-domains", "api"}, "need --default-overdraft"},
		{"log-format", []string{"--log-format", "xml"}, `--log-format "xml": want text or json`},
		{"on-backend-failure", []string{"--on-backend-failure", "retry"}, `--on-backend-failure "retry": want error, allow, deny or local`},
		{"failure-grace-mode local", []string{"--failure-grace-mode", "local"}, `--failure-grace-mode "local": want error, allow or deny`},
		{"tls cert without key", []string{"--grpc-tls-cert", "cert.pem"}, "--grpc-tls-cert and --grpc-tls-key go together"},
		{"tls key without cert", []string{"--grpc-tls-key", "key.pem"}, "--grpc-tls-cert and --grpc-tls-key go together"},
		{"negative heap floor", []string{"--gc-heap-floor-mib", "-1"}, "--gc-heap-floor-mib -1: want 0 to 85899344"},
		{"client CA without cert", []string{"--grpc-client-ca", "ca.pem"}, "--grpc-client-ca needs --grpc-tls-cert and --grpc-tls-key"},
		{"zero shutdown timeout", []string{"--shutdown-timeout", "0"}, "--shutdown-timeout 0s: want more than 0"},
		{"negative shutdown timeout", []string{"--shutdown-timeout", "-1s"}, "--shutdown-timeout -1s: want more than 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseServeFlags(append([]string{"--config", "x"}, tt.args...), noEnv, io.Discard)
			var usage usageError
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.As(err, &usage) {
				t.Errorf("parseServeFlags(%q) = %v, want a usage error containing %q", tt.args, err, tt.want)
			}
		})
	}
}

// TestHelp checks that each command's --help prints its usage and nothing
// else, and succeeds.
func TestHelp(t *testing.T) {
	tests := []struct {
		args      []string
		wantUsage string
	}{
		{[]string{"serve", "--help"}, "-http-addr"},
		{[]string{"--config", "x", "-h"}, "-http-addr"},
		{[]string{"check", "--help"}, "usage: ratelimitd check"},
		{[]string{"explain", "--help"}, "usage: ratelimitd explain"},
		{[]string{"validate", "--help"}, "usage: ratelimitd validate"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if err := run(context.Background(), tt.args, noEnv, &stdout, &stderr); err != nil {
				t.Errorf("run(%q) = %v, want nil", tt.args, err)
			}
			if !strings.Contains(stderr.String(), tt.wantUsage) {
				t.Errorf("run(%q) printed %q, want the usage (%q)", tt.args, stderr.String(), tt.wantUsage)
			}
			if strings.Contains(stderr.String(), "help requested") || stdout.Len() > 0 {
				t.Errorf("run(%q) printed more than the usage: stdout %q, stderr %q", tt.args, stdout.String(), stderr.String())
			}
		})
	}
}
