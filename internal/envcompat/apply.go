package envcompat

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/server"
)

// VarName is the RATELIMITD_ variable that sets flag name: dashes as
// underscores, upper case (--grpc-addr is RATELIMITD_GRPC_ADDR).
func VarName(flag string) string {
	return "RATELIMITD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// ForMode reads the environment as the --env-compat mode says: with
// Native, ratelimitd's own variables alone, returning envoyproxy/
// ratelimit's that are set nonetheless (foreign, for a warning); with
// Envoyproxy, envoyproxy/ratelimit's too (Read). Any other mode is an
// error naming the valid ones.
func ForMode(mode string, getenv func(string) string) (e Env, foreign []string, err error) {
	switch mode {
	case Native:
		return Env{}, VarsIn(getenv), nil
	case Envoyproxy:
		if e, err = Read(getenv); err != nil {
			return Env{}, nil, fmt.Errorf("envoyproxy/ratelimit's environment:\n%w", err)
		}
		return e, nil, nil
	}
	return Env{}, nil, fmt.Errorf("--env-compat %q: want envoyproxy, or nothing for ratelimitd's own variables only", mode)
}

// Apply sets every flag of fs not given on the command line (nor named in
// skip) from its RATELIMITD_ variable (VarName), when that is set, or
// else from e (what envoyproxy/ratelimit's variables say, when they are
// read). It returns the flags it set, each mapped to the variables it was
// set from, and every value a flag refused.
func (e Env) Apply(fs *flag.FlagSet, getenv func(string) string, skip ...string) (map[string]string, error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range skip {
		given[name] = true
	}
	fromEnv := map[string]string{}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		name := VarName(f.Name)
		v := getenv(name)
		if v == "" {
			var ok bool
			if v, ok = e.Flags[f.Name]; !ok {
				return
			}
			name = e.Spelt[f.Name]
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			return
		}
		fromEnv[f.Name] = name
	})
	return fromEnv, errors.Join(errs...)
}

// Given maps each flag of fs the operator set to something other than
// its default, on the command line or (those in fromEnv, from Apply) in
// the environment, to the way they spelled it: "--redis-password" or
// "RATELIMITD_REDIS_PASSWORD". A flag set to its default (--redis-url "",
// as a template with an empty variable writes it) changes nothing and is
// left out.
func Given(fs *flag.FlagSet, fromEnv map[string]string) map[string]string {
	given := map[string]string{}
	fs.Visit(func(f *flag.Flag) {
		if f.Value.String() == f.DefValue {
			return
		}
		if spelt, ok := fromEnv[f.Name]; ok {
			given[f.Name] = spelt
		} else {
			given[f.Name] = "--" + f.Name
		}
	})
	return given
}

// Spelling is how the operator set flag, per given (see Given), or
// "--flag".
func Spelling(given map[string]string, flag string) string {
	if s, ok := given[flag]; ok {
		return s
	}
	return "--" + flag
}

// Choose returns vals[i] for the got that equals names[i], the accepted
// values of --flagName; any other got is an error listing them all.
func Choose[T any](flagName, got string, names []string, vals []T) (T, error) {
	for i, name := range names {
		if got == name {
			return vals[i], nil
		}
	}
	var zero T
	return zero, fmt.Errorf("--%s %q: want %s", flagName, got, oneOf(names))
}

// oneOf lists names as "a", "a or b", "a, b or c".
func oneOf(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// HeaderNames is the value of --ratelimit-header-names for the headers
// mode: the three names, limit,remaining,reset, with
// server.RateLimitHeadersIncumbent; the zero HeaderNames when the flag is
// not given (see Given), or when it is envoyproxy/ratelimit's names
// (from e) while the operator chose another mode over its
// LIMIT_RESPONSE_HEADERS_ENABLED, which are not read. Given with any
// other mode, it is an error.
func (e Env) HeaderNames(given map[string]string, mode server.RateLimitHeaders, value string) (server.HeaderNames, error) {
	spelt, ok := given["ratelimit-header-names"]
	switch {
	case !ok || mode != server.RateLimitHeadersIncumbent && spelt == e.Spelt["ratelimit-header-names"]:
		return server.HeaderNames{}, nil
	case mode != server.RateLimitHeadersIncumbent:
		return server.HeaderNames{}, fmt.Errorf("%s: only with %s incumbent", spelt, Spelling(given, "ratelimit-headers"))
	}
	names := strings.Split(value, ",")
	if len(names) != 3 {
		return server.HeaderNames{}, fmt.Errorf("%s %q: want three names, limit,remaining,reset", spelt, value)
	}
	n := server.HeaderNames{Limit: strings.TrimSpace(names[0]), Remaining: strings.TrimSpace(names[1]), Reset: strings.TrimSpace(names[2])}
	if err := n.Validate(); err != nil {
		return server.HeaderNames{}, fmt.Errorf("%s: %w", spelt, err)
	}
	return n, nil
}

// Warn logs, once each, the startup warnings of the environment read:
// envoyproxy/ratelimit's settings that are not honoured (Env.Unhonoured),
// or, under ratelimitd's own name, those that are set but not read
// (ForMode's foreign).
func Warn(log *slog.Logger, unhonoured, foreign []string) {
	if len(unhonoured) > 0 {
		log.Warn("envoyproxy/ratelimit settings not honoured", "settings", strings.Join(unhonoured, "; "))
	}
	if len(foreign) > 0 {
		log.Warn("envoyproxy/ratelimit's variables are set but not read: under its own name ratelimitd reads only RATELIMITD_* variables; run it as ratelimit, or with RATELIMITD_ENV_COMPAT=envoyproxy (--env-compat=envoyproxy), to read them",
			"variables", strings.Join(foreign, ","))
	}
}
