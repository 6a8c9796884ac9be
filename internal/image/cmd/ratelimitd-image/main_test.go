package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
)

// TestRun runs the command as `make image` does, for the host's platform,
// and reads back what it wrote: the layout's index holds one image, the
// tarball is that same image under the tag, and SOURCE_DATE_EPOCH is its
// creation time.
func TestRun(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("needs the go command on the PATH: %v", err)
	}
	out := t.TempDir()
	t.Chdir("../../../..") // the module root, where make runs it
	const tag = "registry.example/ratelimitd:t1"
	platform := "linux/" + runtime.GOARCH
	env := map[string]string{"SOURCE_DATE_EPOCH": "1764590400"}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if err := run(ctx, []string{"--out", out, "--platforms", platform, "--tag", tag, "--version", "v0.0.0-t1", "--revision", "abc", "--modified"}, func(k string) string { return env[k] }, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	index, entry, layoutImg := layoutImage(t, filepath.Join(out, "oci"))
	if index.Annotations["org.opencontainers.image.ref.name"] != tag {
		t.Fatalf("index.json %+v, want one index tagged %s", index, tag)
	}
	if entry.Platform.String() != platform {
		t.Fatalf("index %+v, want one image for %s", entry, platform)
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	tarImg, err := tarball.ImageFromPath(filepath.Join(out, "ratelimitd-linux-"+runtime.GOARCH+".tar"), &ref)
	if err != nil {
		t.Fatal(err)
	}
	// A docker tarball has a manifest of its own: the config and the
	// layers are what must be the layout's.
	got, gotLayers := contents(t, tarImg)
	want, wantLayers := contents(t, layoutImg)
	if got != want {
		t.Errorf("tarball image config %s, want the layout's %s", got, want)
	}
	if len(gotLayers) != len(wantLayers) {
		t.Fatalf("tarball has %d layers, the layout %d", len(gotLayers), len(wantLayers))
	}
	for i := range gotLayers {
		if gotLayers[i] != wantLayers[i] {
			t.Errorf("tarball layer %d %s, want the layout's %s", i, gotLayers[i], wantLayers[i])
		}
	}
	cf, err := tarImg.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(1764590400, 0); !cf.Created.Time.Equal(want) {
		t.Errorf("created %v, want SOURCE_DATE_EPOCH %v", cf.Created.Time, want)
	}
	if r := cf.Config.Labels["org.opencontainers.image.revision"]; r != "abc" {
		t.Errorf("revision label %q, want abc", r)
	}
	if v := cf.Config.Labels["org.opencontainers.image.version"]; v != "v0.0.0-t1" {
		t.Errorf("version label %q, want v0.0.0-t1", v)
	}
	// The binary says what the labels say, dated SOURCE_DATE_EPOCH.
	bin := filepath.Join(out, "ratelimitd-linux-"+runtime.GOARCH)
	info := binaryVersion(t, bin)
	if want := (buildinfo.Info{Version: "v0.0.0-t1", Revision: "abc", Modified: true, BuildTime: "2025-12-01T12:00:00Z", GoVersion: info.GoVersion, Platform: platform}); info != want {
		t.Errorf("%s version:\n %+v\nwant\n %+v", bin, info, want)
	}
	if !strings.Contains(stdout.String(), "docker load -i ") {
		t.Errorf("stdout does not say how to load the tarball:\n%s", stdout.String())
	}
}

// layoutImage reads the OCI layout at dir as a registry client would:
// index.json must name one image index, and that index one image. It
// returns index.json's entry, the index's entry and the image.
func layoutImage(t *testing.T, dir string) (index, entry v1.Descriptor, img v1.Image) {
	t.Helper()
	outer, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	om, err := outer.IndexManifest()
	if err != nil || len(om.Manifests) != 1 {
		t.Fatalf("%s/index.json: %v, %+v; want one index", dir, err, om)
	}
	inner, err := outer.ImageIndex(om.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := inner.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("the image index: %v, %+v; want one image", err, im)
	}
	if img, err = inner.Image(im.Manifests[0].Digest); err != nil {
		t.Fatal(err)
	}
	return om.Manifests[0], im.Manifests[0], img
}

// contents is img's config digest and its layers' digests, in order.
func contents(t *testing.T, img v1.Image) (config v1.Hash, layers []v1.Hash) {
	t.Helper()
	config, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, d)
	}
	return config, layers
}

// binaryVersion is what the ratelimitd binary bin says of itself (version
// --output json).
func binaryVersion(t *testing.T, bin string) buildinfo.Info {
	t.Helper()
	out, err := exec.Command(bin, "version", "--output", "json").Output()
	if err != nil {
		t.Fatalf("%s version --output json: %v", bin, err)
	}
	var info buildinfo.Info
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("%s version --output json: %v\n%s", bin, err, out)
	}
	return info
}

func TestRunErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"--platforms", "amd64"}, "", `platform "amd64": want os/arch`},
		{nil, "yesterday", `SOURCE_DATE_EPOCH "yesterday"`},
		{[]string{"extra"}, "", "unexpected arguments"},
	} {
		args := append([]string{"--out", t.TempDir()}, c.args...)
		err := run(context.Background(), args, func(string) string { return c.env }, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run(%q, SOURCE_DATE_EPOCH=%q) = %v, want an error containing %q", c.args, c.env, err, c.want)
		}
	}
}
