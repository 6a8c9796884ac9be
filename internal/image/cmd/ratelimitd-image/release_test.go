package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMakeReleaseIsReproducible runs `make release` twice at one commit,
// for the host's platform (the image tests compiled its packages; another
// architecture would compile them all again), into two directories, and
// compares them byte for byte; then it checks what the release says: its
// SHA256SUMS, the version, commit and date stamped in the binary, and the
// image's labels. Each run links the binary and packs the image (seconds):
// it runs with the heavy tests.
func TestMakeReleaseIsReproducible(t *testing.T) {
	if os.Getenv("RATELIMITD_HEAVY_TESTS") == "" {
		t.Skip("builds a release twice; set RATELIMITD_HEAVY_TESTS=1 (make test does)")
	}
	for _, tool := range []string{"make", "git", "sha256sum", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("make release needs %s on the PATH: %v", tool, err)
		}
	}
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) string {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	rev := git("rev-parse", "HEAD")
	secs, err := strconv.ParseInt(git("log", "-1", "--format=%ct"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	const version = "v0.0.0-reproducible"
	platform := "linux/" + runtime.GOARCH
	// The test may run under make (make test): the inner make must not
	// take the outer one's flags or jobs.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "MAKEFLAGS=") || strings.HasPrefix(kv, "MFLAGS=") || strings.HasPrefix(kv, "MAKELEVEL=") || strings.HasPrefix(kv, "SOURCE_DATE_EPOCH=")
	})
	var dirs [2]string
	for i := range dirs {
		dirs[i] = filepath.Join(t.TempDir(), "release")
		cmd := exec.Command("make", "-C", root, "--no-print-directory", "release",
			"VERSION="+version, "RELEASE_DIR="+dirs[i], "RELEASE_PLATFORMS="+platform)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make release (run %d): %v\n%s", i+1, err, out)
		}
	}
	if now := git("rev-parse", "HEAD"); now != rev {
		t.Skipf("HEAD moved from %s to %s between the runs", rev, now)
	}

	first, second := files(t, dirs[0]), files(t, dirs[1])
	if !slices.Equal(keys(first), keys(second)) {
		t.Fatalf("the runs wrote different files:\n %q\n %q", keys(first), keys(second))
	}
	for _, name := range keys(first) {
		if !bytes.Equal(first[name], second[name]) {
			t.Errorf("%s differs between the runs (%d and %d bytes)", name, len(first[name]), len(second[name]))
		}
	}

	bin := "ratelimitd-" + strings.ReplaceAll(platform, "/", "-")
	wantSums := ""
	for _, name := range []string{bin, bin + ".tar"} {
		data, ok := first[name]
		if !ok {
			t.Fatalf("the release has no %s: %q", name, keys(first))
		}
		sum := sha256.Sum256(data)
		wantSums += hex.EncodeToString(sum[:]) + "  " + name + "\n"
	}
	if got := string(first["SHA256SUMS"]); got != wantSums {
		t.Errorf("SHA256SUMS =\n%s\nwant\n%s", got, wantSums)
	}

	info := binaryVersion(t, filepath.Join(dirs[0], bin))
	built := time.Unix(secs, 0).UTC().Format(time.RFC3339)
	if info.Version != version || info.Revision != rev || info.BuildTime != built || info.Platform != platform {
		t.Errorf("%s version = %+v, want version %s, revision %s, built %s (the commit's time), platform %s", bin, info, version, rev, built, platform)
	}

	_, _, img := layoutImage(t, filepath.Join(dirs[0], "oci"))
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	for label, want := range map[string]string{"org.opencontainers.image.version": version, "org.opencontainers.image.revision": rev, "org.opencontainers.image.created": built} {
		if got := cf.Config.Labels[label]; got != want {
			t.Errorf("image label %s = %q, want %q", label, got, want)
		}
	}
}

// files reads every regular file under dir, by slash-separated path.
func files(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		out[filepath.ToSlash(rel)] = data
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func keys(m map[string][]byte) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
