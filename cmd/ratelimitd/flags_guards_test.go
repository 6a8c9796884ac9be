package main

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/redact"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// TestGuardFlags: each value of the guard flags lands in its Config field,
// from the command line or the environment; the defaults deny, redact
// nothing and cap a config at 16 MiB.
func TestGuardFlags(t *testing.T) {
	tests := []struct {
		args  []string
		env   map[string]string
		field func(serveConfig) any
		want  any
	}{
		{nil, nil, func(c serveConfig) any { return c.OnInvalidOverride }, server.InvalidOverrideDeny},
		{nil, nil, func(c serveConfig) any { return c.OnOversizedRequest }, server.OversizedDeny},
		{nil, nil, func(c serveConfig) any { return c.RedactValues }, redact.Off},
		{nil, nil, func(c serveConfig) any { return c.MaxConfigBytes }, int64(config.DefaultMaxTotalBytes)},
		{[]string{"--on-invalid-override", "ignore"}, nil, func(c serveConfig) any { return c.OnInvalidOverride }, server.InvalidOverrideIgnore},
		{[]string{"--on-invalid-override", "error"}, nil, func(c serveConfig) any { return c.OnInvalidOverride }, server.InvalidOverrideError},
		{[]string{"--on-oversized-request", "error"}, nil, func(c serveConfig) any { return c.OnOversizedRequest }, server.OversizedError},
		{[]string{"--redact-values", "hash"}, nil, func(c serveConfig) any { return c.RedactValues }, redact.Hash},
		{[]string{"--redact-values", "prefix"}, nil, func(c serveConfig) any { return c.RedactValues }, redact.Prefix},
		{[]string{"--max-config-bytes", "1048576"}, nil, func(c serveConfig) any { return c.MaxConfigBytes }, int64(1 << 20)},
		{nil, map[string]string{"RATELIMITD_REDACT_VALUES": "hash"}, func(c serveConfig) any { return c.RedactValues }, redact.Hash},
		{nil, map[string]string{"RATELIMITD_ON_INVALID_OVERRIDE": "ignore"}, func(c serveConfig) any { return c.OnInvalidOverride }, server.InvalidOverrideIgnore},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, "=")+mapString(tt.env), func(t *testing.T) {
			c, err := parseServeFlags(append([]string{"--config", "x"}, tt.args...), func(k string) string { return tt.env[k] }, io.Discard)
			if err != nil {
				t.Fatalf("parseServeFlags: %v", err)
			}
			if got := tt.field(c); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func mapString(m map[string]string) string {
	var s []string
	for k, v := range m {
		s = append(s, k+"="+v)
	}
	return strings.Join(s, ",")
}

// TestGuardFlagErrors: a bad value is a usage error naming the flag as
// given and the choices.
func TestGuardFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--on-invalid-override", "allow"}, nil, `--on-invalid-override: unknown policy "allow" (want deny, ignore or error)`},
		{[]string{"--on-oversized-request", "ignore"}, nil, `--on-oversized-request: unknown policy "ignore" (want deny or error)`},
		{[]string{"--redact-values", "sha1"}, nil, `--redact-values: unknown redaction "sha1" (want off, hash or prefix)`},
		{[]string{"--max-config-bytes", "0"}, nil, "--max-config-bytes 0: want more than 0"},
		{nil, map[string]string{"RATELIMITD_REDACT_VALUES": "all"}, `RATELIMITD_REDACT_VALUES: unknown redaction "all"`},
	}
	for _, tt := range tests {
		_, err := parseServeFlags(append([]string{"--config", "x"}, tt.args...), func(k string) string { return tt.env[k] }, io.Discard)
		var usage usageError
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.As(err, &usage) {
			t.Errorf("parseServeFlags(%q, %v) = %v, want a usage error containing %q", tt.args, tt.env, err, tt.want)
		}
	}
}
