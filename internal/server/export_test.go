package server

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/config"
)

// MustParse parses yaml as one descriptor file, test.yaml, failing t if
// it does not parse. It is here, in the package, so that the internal and
// the external tests share it.
func MustParse(t testing.TB, yaml string) *config.Set {
	t.Helper()
	set, err := config.Parse([]config.File{{Name: "test.yaml", Data: []byte(yaml)}})
	if err != nil {
		t.Fatalf("config.Parse: %v", err)
	}
	return set
}
