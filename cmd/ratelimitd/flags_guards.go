package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/envcompat"
	"github.com/ratelimitd/ratelimitd/internal/redact"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

// addGuardFlags registers the flags of what a hostile or careless input
// may cost: the answers to requests Envoy would let through on an error,
// the total size of a config, and the redaction of request values where
// operators look at them. finish, called once the flags are set, checks
// them and fills c; its errors name the flags as given spells them.
func addGuardFlags(fs *flag.FlagSet, c *serveConfig) (finish func(given map[string]string) error) {
	onInvalid := fs.String("on-invalid-override", "deny", "answer to a descriptor whose limit override is invalid (unit outside second…year, requests_per_unit 0, unit_multiplier 0, beyond a bucket's bounds): deny (OVER_LIMIT, status named \"invalid limit override\"), ignore (decide by the configured rule) or error (INVALID_ARGUMENT, which Envoy lets through by default)")
	onOversized := fs.String("on-oversized-request", "deny", "answer to a request over --max-message-bytes (up to 4 times it; gRPC refuses larger ones itself): deny (OVER_LIMIT) or error (RESOURCE_EXHAUSTED, which Envoy lets through by default)")
	fs.Int64Var(&c.MaxConfigBytes, "max-config-bytes", config.DefaultMaxTotalBytes, "largest config, all its files (or an xDS push) together, in bytes; a larger one is refused (at start, or on reload, keeping the config in force)")
	redactValues := fs.String("redact-values", "off", "how request descriptor values show on /limits, /limits.json and the metrics' value labels: off, hash (sha256: and 8 hex digits) or prefix (the first 4 characters, at most half of the value)")
	return func(given map[string]string) error {
		var errs []error
		var err error
		if c.OnInvalidOverride, err = server.ParseInvalidOverride(*onInvalid); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", envcompat.Spelling(given, "on-invalid-override"), err))
		}
		if c.OnOversizedRequest, err = server.ParseOversizedRequest(*onOversized); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", envcompat.Spelling(given, "on-oversized-request"), err))
		}
		if c.RedactValues, err = redact.Parse(*redactValues); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", envcompat.Spelling(given, "redact-values"), err))
		}
		if c.MaxConfigBytes <= 0 {
			errs = append(errs, fmt.Errorf("%s %d: want more than 0", envcompat.Spelling(given, "max-config-bytes"), c.MaxConfigBytes))
		}
		return errors.Join(errs...)
	}
}
