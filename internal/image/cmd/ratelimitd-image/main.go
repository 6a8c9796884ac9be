// Command ratelimitd-image builds ratelimitd's container image without a
// container daemon (`make image` runs it from the module root):
//
//	go run ./internal/image/cmd/ratelimitd-image [--out bin/image] [--platforms linux/amd64,linux/arm64] [--tag REF]
//
// For each platform it builds a static ratelimitd (CGO_ENABLED=0, the flags
// of image.GoBuildFlags) into OUT/ratelimitd-OS-ARCH, assembles the image
// (package internal/image says what is in it), and writes
//
//	OUT/oci/                      an OCI image layout: one multi-platform index, tagged REF
//	OUT/ratelimitd-OS-ARCH.tar    each platform's image as a `docker load` tarball, tagged REF
//
// SOURCE_DATE_EPOCH (seconds), when set, is every timestamp in the image, so
// that a rebuild from the same commit gives the same digests.
//
// --version, --revision (with --modified) and SOURCE_DATE_EPOCH are also
// stamped into the binaries (internal/buildinfo), so that `ratelimitd
// version` and ratelimitd_build_info say what the image's labels say.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
	"github.com/ratelimitd/ratelimitd/internal/image"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "ratelimitd-image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelimitd-image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "bin/image", "output directory (must not hold an OCI layout yet)")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "comma-separated os/arch platforms of the index")
	tag := fs.String("tag", image.Repository+":dev", "image reference the layout and the tarballs are tagged with")
	ca := fs.String("ca", image.DefaultCABundle, "PEM CA bundle copied to "+image.CABundlePath)
	goCmd := fs.String("go", "go", "the go command that builds the binaries")
	version := fs.String("version", "", "org.opencontainers.image.version label (none if empty)")
	revision := fs.String("revision", "", "org.opencontainers.image.revision label (none if empty)")
	modified := fs.Bool("modified", false, "the work tree differs from --revision (stamped in the binaries with it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	ps, err := image.Platforms(*platforms)
	if err != nil {
		return err
	}
	opts := image.Options{CABundle: *ca, Version: *version, Revision: *revision}
	if s := getenv("SOURCE_DATE_EPOCH"); s != "" {
		secs, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since the epoch", s)
		}
		opts.Created = time.Unix(secs, 0)
	}
	stamp := buildinfo.Stamp{Version: *version, Revision: *revision, Modified: *modified, Time: opts.Created}
	if err := stamp.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	for _, p := range ps {
		bin := filepath.Join(*out, "ratelimitd-"+p.OS+"-"+p.Architecture+p.Variant)
		fmt.Fprintf(stdout, "go build %s → %s\n", p, bin)
		if err := image.GoBuild(ctx, *goCmd, ".", p, bin, stamp.LinkerFlags()...); err != nil {
			return err
		}
		opts.Binaries = append(opts.Binaries, image.Binary{Platform: p, Path: bin})
	}
	idx, err := image.Build(opts)
	if err != nil {
		return err
	}
	layoutDir := filepath.Join(*out, "oci")
	if err := image.WriteLayout(layoutDir, *tag, idx); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "OCI layout %s: %s %s\n", layoutDir, *tag, digest)
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, desc := range m.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return err
		}
		p := desc.Platform
		tar := filepath.Join(*out, "ratelimitd-"+p.OS+"-"+p.Architecture+p.Variant+".tar")
		if err := image.WriteTarball(tar, *tag, img); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "docker load -i %s   # %s %s\n", tar, p, desc.Digest)
	}
	return nil
}
