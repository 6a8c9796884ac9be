package image_test

// The image as a container runtime would get it: ratelimitd built as `make
// image` builds it (once per test binary), assembled by the package,
// written as an OCI layout, read back with go-containerregistry and its
// layers unpacked into a root filesystem, which the tests inspect and
// run_test.go runs.

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/ratelimitd/ratelimitd/internal/image"
)

const (
	moduleRoot = "../.."
	testTag    = image.Repository + ":test"
)

// created is the test image's timestamp: not the epoch, so that a default
// taking over would show.
var created = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// fixture is the image built once for the test binary.
type fixture struct {
	platform v1.Platform
	opts     image.Options
	bin      string // the binary built for the image
	tiny     string // a static do-nothing binary, cheap to pack again
	layout   string // the OCI layout written
	img      v1.Image
	rootfs   string                 // img's layers, unpacked
	headers  map[string]*tar.Header // the flattened tar's entries by path
}

var (
	fixOnce sync.Once
	fix     *fixture
	fixErr  error
	fixDir  string // removed by TestMain
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fixDir != "" {
		os.RemoveAll(fixDir)
	}
	os.Exit(code)
}

// built returns the fixture, building it at the first call. Only a missing
// go command skips.
func built(t *testing.T) *fixture {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("the image tests build ratelimitd and need the go command on the PATH: %v", err)
	}
	fixOnce.Do(func() { fix, fixErr = build() })
	if fixErr != nil {
		t.Fatal(fixErr)
	}
	return fix
}

func build() (*fixture, error) {
	dir, err := os.MkdirTemp("", "ratelimitd-image-")
	if err != nil {
		return nil, err
	}
	fixDir = dir
	f := &fixture{
		platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
		bin:      filepath.Join(dir, "ratelimitd"),
		tiny:     filepath.Join(dir, "tiny"),
		layout:   filepath.Join(dir, "oci"),
		rootfs:   filepath.Join(dir, "rootfs"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if err := image.GoBuild(ctx, "go", moduleRoot, f.platform, f.bin); err != nil {
		return nil, err
	}
	if err := buildTiny(ctx, dir, f.tiny); err != nil {
		return nil, err
	}
	f.opts = image.Options{
		Binaries: []image.Binary{{Platform: f.platform, Path: f.bin}},
		Created:  created,
		Version:  "v0.0.0-test",
		Revision: "0123456789abcdef",
	}
	idx, err := image.Build(f.opts)
	if err != nil {
		return nil, err
	}
	if err := image.WriteLayout(f.layout, testTag, idx); err != nil {
		return nil, err
	}
	if f.img, err = readBack(f.layout, f.platform); err != nil {
		return nil, err
	}
	if f.headers, err = unpack(f.img, f.rootfs); err != nil {
		return nil, err
	}
	return f, nil
}

// buildTiny builds a static do-nothing program for the host to out: the
// tests that pack images again (reproducibility, errors) need a static ELF,
// not ratelimitd's 30 MB, which take seconds to compress under -race.
func buildTiny(ctx context.Context, dir, out string) error {
	src := filepath.Join(dir, "tiny.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build tiny.go: %w\n%s", err, b)
	}
	return nil
}

// readBack opens the layout at dir as a registry client would: index.json
// names one index, tagged testTag, holding an image for p.
func readBack(dir string, p v1.Platform) (v1.Image, error) {
	outer, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	om, err := outer.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(om.Manifests) != 1 {
		return nil, fmt.Errorf("index.json has %d entries, want 1", len(om.Manifests))
	}
	d := om.Manifests[0]
	if d.MediaType != types.OCIImageIndex {
		return nil, fmt.Errorf("index.json entry is a %s, want %s", d.MediaType, types.OCIImageIndex)
	}
	if ref := d.Annotations["org.opencontainers.image.ref.name"]; ref != testTag {
		return nil, fmt.Errorf("index.json ref.name = %q, want %q", ref, testTag)
	}
	idx, err := outer.ImageIndex(d.Digest)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, m := range im.Manifests {
		if m.Platform != nil && m.Platform.Equals(p) {
			if m.MediaType != types.OCIManifestSchema1 {
				return nil, fmt.Errorf("image for %s is a %s, want %s", p, m.MediaType, types.OCIManifestSchema1)
			}
			return idx.Image(m.Digest)
		}
	}
	return nil, fmt.Errorf("the index has no image for %s", p)
}

// unpack writes the flattened file system of img (mutate.Extract) into dir,
// as a container runtime does: directories, regular files with their modes,
// hard links. It returns the tar headers by path, and fails on any other
// entry type or a path that leaves dir.
func unpack(img v1.Image, dir string) (map[string]*tar.Header, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	headers := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return headers, nil
		}
		if err != nil {
			return nil, err
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return nil, fmt.Errorf("layer entry %q leaves the root", h.Name)
		}
		headers[name] = h
		path := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, h.FileInfo().Mode().Perm()); err != nil {
				return nil, err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, h.FileInfo().Mode().Perm())
			if err != nil {
				return nil, err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, err
			}
		case tar.TypeLink:
			target := filepath.Clean(h.Linkname)
			if !filepath.IsLocal(target) {
				return nil, fmt.Errorf("hard link %q → %q leaves the root", h.Name, h.Linkname)
			}
			if err := os.Link(filepath.Join(dir, target), path); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("layer entry %q has type %q, which the image does not use", h.Name, h.Typeflag)
		}
	}
}

func TestImageConfig(t *testing.T) {
	f := built(t)
	m, err := f.img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type = %s, want %s", m.Config.MediaType, types.OCIConfigJSON)
	}
	if len(m.Layers) != 2 {
		t.Errorf("%d layers, want 2 (base, binary)", len(m.Layers))
	}
	for i, l := range m.Layers {
		if l.MediaType != types.OCILayer {
			t.Errorf("layer %d media type = %s, want %s", i, l.MediaType, types.OCILayer)
		}
	}
	cf, err := f.img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	var ports []string
	for _, p := range image.ExposedPorts() {
		ports = append(ports, fmt.Sprintf("%d/tcp", p))
	}
	for _, c := range []struct {
		field     string
		got, want any
	}{
		{"os", cf.OS, "linux"},
		{"architecture", cf.Architecture, runtime.GOARCH},
		{"created", cf.Created.UTC(), created},
		{"User", cf.Config.User, "65534:65534"},
		{"Entrypoint", cf.Config.Entrypoint, []string{"/bin/ratelimitd"}},
		{"Cmd", cf.Config.Cmd, []string(nil)},
		{"Env", cf.Config.Env, []string{"PATH=/bin"}},
		{"WorkingDir", cf.Config.WorkingDir, "/"},
		{"ExposedPorts", slices.Sorted(maps.Keys(cf.Config.ExposedPorts)), slices.Sorted(slices.Values(ports))},
		{"ports", ports, []string{"8080/tcp", "8081/tcp", "6070/tcp", "19001/tcp"}},
		{"Labels", cf.Config.Labels, map[string]string{
			"org.opencontainers.image.title":       "ratelimitd",
			"org.opencontainers.image.description": f.opts.Labels()["org.opencontainers.image.description"],
			"org.opencontainers.image.source":      "https://github.com/ratelimitd/ratelimitd",
			"org.opencontainers.image.url":         "https://github.com/ratelimitd/ratelimitd",
			"org.opencontainers.image.created":     "2026-12-01T12:00:00Z",
			"org.opencontainers.image.version":     "v0.0.0-test",
			"org.opencontainers.image.revision":    "0123456789abcdef",
		}},
	} {
		if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
			t.Errorf("config %s = %v, want %v", c.field, c.got, c.want)
		}
	}
	for i, h := range cf.History {
		if !h.Created.Time.Equal(created) {
			t.Errorf("history %d created %v, want %v", i, h.Created.Time, created)
		}
	}
}

func TestImageFiles(t *testing.T) {
	f := built(t)
	type file struct {
		mode os.FileMode
		link string // hard link target
	}
	want := map[string]file{
		"bin":                               {mode: os.ModeDir | 0o755},
		"bin/ratelimitd":                    {mode: 0o755},
		"bin/ratelimit":                     {link: "bin/ratelimitd"},
		"etc":                               {mode: os.ModeDir | 0o755},
		"etc/group":                         {mode: 0o644},
		"etc/passwd":                        {mode: 0o644},
		"etc/ssl":                           {mode: os.ModeDir | 0o755},
		"etc/ssl/certs":                     {mode: os.ModeDir | 0o755},
		"etc/ssl/certs/ca-certificates.crt": {mode: 0o644},
	}
	if got, w := slices.Sorted(maps.Keys(f.headers)), slices.Sorted(maps.Keys(want)); !slices.Equal(got, w) {
		t.Fatalf("image files = %q, want %q", got, w)
	}
	for name, h := range f.headers {
		w := want[name]
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s owned by %d:%d (%q:%q), want 0:0 without names", name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if !h.ModTime.Equal(created) {
			t.Errorf("%s mtime %v, want %v", name, h.ModTime, created)
		}
		if w.link != "" {
			if h.Typeflag != tar.TypeLink || h.Linkname != w.link {
				t.Errorf("%s: type %q link %q, want a hard link to %s", name, h.Typeflag, h.Linkname, w.link)
			}
			continue
		}
		if got := h.FileInfo().Mode(); got != w.mode {
			t.Errorf("%s mode %v, want %v", name, got, w.mode)
		}
	}

	// Both names are one file, the binary that was built, and it is static.
	root := f.rootfs
	a, err := os.Stat(filepath.Join(root, image.BinaryPath))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.Stat(filepath.Join(root, image.IncumbentPath))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(a, b) {
		t.Errorf("%s and %s are different files", image.BinaryPath, image.IncumbentPath)
	}
	sameBytes(t, filepath.Join(root, image.BinaryPath), f.bin)
	if err := image.CheckStatic(readFile(t, filepath.Join(root, image.IncumbentPath)), runtime.GOARCH); err != nil {
		t.Errorf("CheckStatic(%s) = %v", image.IncumbentPath, err)
	}
	sameBytes(t, filepath.Join(root, image.CABundlePath), image.DefaultCABundle)
	passwd := readFile(t, filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "\nnobody:x:65534:65534:") {
		t.Errorf("/etc/passwd has no nobody 65534:65534:\n%s", passwd)
	}
}

func sameBytes(t *testing.T, got, want string) {
	t.Helper()
	if g, w := readFile(t, got), readFile(t, want); !bytes.Equal(g, w) {
		t.Errorf("%s (%d bytes) differs from %s (%d bytes)", got, len(g), want, len(w))
	}
}

// readFile is the content of the file at path; it fails t if it cannot
// be read.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReproducible: the same inputs give the same digests; another time
// gives others.
func TestReproducible(t *testing.T) {
	f := built(t)
	build := func(o image.Options) v1.ImageIndex {
		t.Helper()
		idx, err := image.Build(o)
		if err != nil {
			t.Fatal(err)
		}
		return idx
	}
	digest := func(o image.Options) v1.Hash {
		t.Helper()
		d, err := build(o).Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	opts := f.opts
	opts.Binaries = []image.Binary{{Platform: f.platform, Path: f.tiny}}
	first, again := digest(opts), digest(opts)
	if first != again {
		t.Errorf("two builds of the same inputs: %s and %s", first, again)
	}
	later := opts
	later.Created = created.Add(time.Second)
	if d := digest(later); d == first {
		t.Errorf("a build one second later has the same digest %s", d)
	}
	epoch := opts
	epoch.Created = time.Time{}
	idx := build(epoch)
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !cf.Created.Time.Equal(time.Unix(0, 0)) {
		t.Errorf("zero Created: image created %v, want the Unix epoch", cf.Created.Time)
	}
}

func TestBuildErrors(t *testing.T) {
	f := built(t)
	dir := t.TempDir()
	emptyCA := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(emptyCA, []byte("\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(dir, "not-elf")
	if err := os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A dynamically linked executable every Debian has.
	dynamic, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	dynamic, err = filepath.EvalSymlinks(dynamic)
	if err != nil {
		t.Fatal(err)
	}
	host := f.platform
	other := v1.Platform{OS: "linux", Architecture: "arm64"}
	if runtime.GOARCH == "arm64" {
		other.Architecture = "amd64"
	}
	for _, c := range []struct {
		name string
		bins []image.Binary
		ca   string
		want string
	}{
		{"no binaries", nil, "", "no binaries"},
		{"missing CA bundle", []image.Binary{{host, f.tiny}}, filepath.Join(dir, "nope.pem"), "CA bundle"},
		{"empty CA bundle", []image.Binary{{host, f.tiny}}, emptyCA, "is empty"},
		{"missing binary", []image.Binary{{host, filepath.Join(dir, "nope")}}, "", "binary for linux/" + runtime.GOARCH},
		{"not an ELF", []image.Binary{{host, text}}, "", "not an ELF"},
		{"another architecture", []image.Binary{{other, f.tiny}}, "", "ELF machine"},
		{"dynamically linked", []image.Binary{{v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, dynamic}}, "", "dynamically linked"},
		{"not linux", []image.Binary{{v1.Platform{OS: "windows", Architecture: "amd64"}, f.tiny}}, "", "only linux"},
		{"unsupported architecture", []image.Binary{{v1.Platform{OS: "linux", Architecture: "mips"}, f.tiny}}, "", `unsupported architecture "mips"`},
		{"platform twice", []image.Binary{{host, f.tiny}, {host, f.tiny}}, "", "given twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := image.Build(image.Options{Binaries: c.bins, CABundle: c.ca})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Build = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestWriteLayoutRefusesAnExistingLayout(t *testing.T) {
	f := built(t)
	idx, err := layout.ImageIndexFromPath(f.layout)
	if err != nil {
		t.Fatal(err)
	}
	if err := image.WriteLayout(f.layout, testTag, idx); err == nil || !strings.Contains(err.Error(), "already holds") {
		t.Errorf("WriteLayout over a layout = %v, want an error", err)
	}
}

func TestPlatforms(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    string // platforms joined by " ", or the error's text
		wantErr bool
	}{
		{"linux/amd64,linux/arm64", "linux/amd64 linux/arm64", false},
		{" linux/arm/v7 ", "linux/arm/v7", false},
		{"", `no platforms in ""`, true},
		{"amd64", `platform "amd64": want os/arch`, true},
	} {
		ps, err := image.Platforms(c.in)
		if c.wantErr {
			if err == nil || err.Error() != c.want {
				t.Errorf("Platforms(%q) = %v, %v; want error %q", c.in, ps, err, c.want)
			}
			continue
		}
		var got []string
		for _, p := range ps {
			got = append(got, p.String())
		}
		if err != nil || strings.Join(got, " ") != c.want {
			t.Errorf("Platforms(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}
