package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// MainPackage is the package of the binary the image ships, relative to the
// module root.
const MainPackage = "./cmd/ratelimitd"

// GoBuildFlags are the `go build` flags of the image's binary, beside
// CGO_ENABLED=0 in its environment (the Dockerfile uses the same): paths
// trimmed and no VCS stamp, so that the binary depends only on the source,
// and no symbol table or DWARF (stack traces keep their function names).
func GoBuildFlags() []string {
	return []string{"-trimpath", "-buildvcs=false", "-ldflags=-s -w"}
}

// GoBuild runs `goCmd build` in dir (the module root) for MainPackage and
// platform p, static (CGO_ENABLED=0) with GoBuildFlags, writing the binary
// to out. ldflags, if any, are added to GoBuildFlags' -ldflags (a
// release's buildinfo.Stamp.LinkerFlags); none may hold a blank. The rest
// of the environment is the process's (GOCACHE, GOPATH, GOFLAGS,
// GOTOOLCHAIN).
func GoBuild(ctx context.Context, goCmd, dir string, p v1.Platform, out string, ldflags ...string) error {
	flags := GoBuildFlags()
	for i, f := range flags {
		if strings.HasPrefix(f, "-ldflags=") && len(ldflags) > 0 {
			flags[i] = f + " " + strings.Join(ldflags, " ")
		}
	}
	args := append([]string{"build"}, flags...)
	args = append(args, "-o", out, MainPackage)
	cmd := exec.CommandContext(ctx, goCmd, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	if p.Architecture == "arm" && p.Variant != "" {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build for %s: %w\n%s", p, err, b)
	}
	return nil
}

// WriteLayout writes idx as an OCI image layout in dir (created if missing;
// it must hold no layout yet), as the one entry of its index.json,
// annotated with ref (org.opencontainers.image.ref.name) so that
// `skopeo copy --all oci:DIR:REF` and `crane push DIR REF` find it.
func WriteLayout(dir, ref string, idx v1.ImageIndex) error {
	if _, err := os.Stat(dir + "/index.json"); err == nil {
		return fmt.Errorf("image: %s already holds an OCI layout", dir)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("image: layout %s: %w", dir, err)
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": ref,
		}))
	}
	if err := p.AppendIndex(idx, opts...); err != nil {
		return fmt.Errorf("image: layout %s: %w", dir, err)
	}
	return nil
}

// WriteTarball writes img, tagged ref, as a tarball `docker load` reads.
func WriteTarball(path, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image: tag %q: %w", ref, err)
	}
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		return fmt.Errorf("image: tarball %s: %w", path, err)
	}
	return nil
}

// Platforms parses a comma-separated list of os/arch[/variant] platforms,
// such as "linux/amd64,linux/arm64".
func Platforms(list string) ([]v1.Platform, error) {
	var ps []v1.Platform
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := v1.ParsePlatform(s)
		if err != nil {
			return nil, fmt.Errorf("platform %q: %w", s, err)
		}
		if p.OS == "" || p.Architecture == "" {
			return nil, fmt.Errorf("platform %q: want os/arch", s)
		}
		ps = append(ps, *p)
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("no platforms in %q", list)
	}
	return ps, nil
}
