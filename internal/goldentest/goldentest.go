// Package goldentest compares what a test produced with a golden file, or
// rewrites the file when the test binary runs with -update (the flag it
// registers). Tests of config's errors and of the command's output share
// it.
package goldentest

import (
	"flag"
	"os"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// Compare reads the golden file at path and reports its contents and
// whether they differ from got, for the caller to say how; with -update it
// writes got to path instead and reports no difference. A file it cannot
// read fails the test.
func Compare(t testing.TB, path, got string) (want string, differ bool) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return got, false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	return string(b), got != string(b)
}
