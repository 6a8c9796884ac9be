// Package image assembles ratelimitd's container image with
// go-containerregistry, on a machine without a container daemon: from a
// static Linux binary per platform it builds an OCI image index whose
// images hold exactly
//
//	/bin/ratelimitd                      the binary (mode 0755)
//	/bin/ratelimit                       a hard link to it: the incumbent's name
//	/etc/ssl/certs/ca-certificates.crt   the CA bundle (0644)
//	/etc/passwd, /etc/group              root and nobody (65534), for tools that show names
//
// and run as User 65534:65534 with Entrypoint /bin/ratelimitd, the ports of
// ExposedPorts and the OCI labels of Options. Nothing in the image is
// written at run time (ratelimitd writes no files), so it runs with a
// read-only root filesystem and needs no /tmp.
//
// The repository's Dockerfile builds the same image with a container
// daemon; the package's tests parse it and check that its user, paths,
// ports, build flags and labels are these.
//
// An image is reproducible: every timestamp (the config's, the history's,
// each file's) is Options.Created, tar headers carry no names or access
// times, and gzip no time, so the same binaries and CA bundle give the same
// digests.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"embed"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The paths and identity the image, the Dockerfile and the Kubernetes
// examples share.
const (
	// BinaryPath is ratelimitd in the image, and the Entrypoint.
	BinaryPath = "/bin/ratelimitd"
	// IncumbentPath is the same binary under envoyproxy/ratelimit's name,
	// the command Envoy Gateway's Deployment runs; run under it, ratelimitd
	// reads the incumbent's environment.
	IncumbentPath = "/bin/ratelimit"
	// CABundlePath is where Go's crypto/x509 looks first on Linux.
	CABundlePath = "/etc/ssl/certs/ca-certificates.crt"
	// DefaultCABundle is the build machine's bundle (Debian's path), copied
	// to CABundlePath when Options.CABundle is empty.
	DefaultCABundle = "/etc/ssl/certs/ca-certificates.crt"
	// UID and GID are nobody's, as Envoy Gateway's and Istio's Deployments
	// run the incumbent.
	UID, GID = 65534, 65534
	// Repository is where the project publishes the image.
	Repository = "ghcr.io/ratelimitd/ratelimitd"
	// Source is the org.opencontainers.image.source label.
	Source = "https://github.com/ratelimitd/ratelimitd"
)

// User is the config's User, "65534:65534".
func User() string { return strconv.Itoa(UID) + ":" + strconv.Itoa(GID) }

// ExposedPorts are the ports ratelimitd and its envoyproxy/ratelimit
// surface listen on: HTTP (health, /metrics, /limits) 8080, gRPC 8081,
// the debug listener 6070 and the incumbent's Prometheus address 19001.
func ExposedPorts() []int { return []int{8080, 8081, 6070, 19001} }

// Env is the config's environment: only PATH, so that a shell-less image
// still finds its two names.
func Env() []string { return []string{"PATH=/bin"} }

// rootfs holds the files the image ships as they are (the Dockerfile
// copies them too).
//
//go:embed rootfs/etc/passwd rootfs/etc/group
var rootfs embed.FS

// Binary is one platform's ratelimitd.
type Binary struct {
	// Platform is the image's OS and architecture (Variant for arm
	// versions); OS must be linux.
	Platform v1.Platform
	// Path is the binary on disk: a static ELF for Platform.Architecture.
	Path string
}

// Options say what Build assembles. Binaries is required; the zero value of
// every other field means its documented default.
type Options struct {
	// Binaries are the platforms of the index, in its order; at least one.
	Binaries []Binary
	// CABundle is the PEM bundle copied to CABundlePath; default
	// DefaultCABundle.
	CABundle string
	// Created is every timestamp in the image; default the Unix epoch.
	// SOURCE_DATE_EPOCH (the last commit's time) makes rebuilds identical.
	Created time.Time
	// Version and Revision are the org.opencontainers.image.version and
	// .revision labels, left out when empty.
	Version, Revision string
}

// Labels are the org.opencontainers.image.* labels of an image built with
// o.
func (o Options) Labels() map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       "ratelimitd",
		"org.opencontainers.image.description": "Envoy-compatible global rate-limit service (token buckets, Redis); a drop-in for envoyproxy/ratelimit",
		"org.opencontainers.image.source":      Source,
		"org.opencontainers.image.url":         Source,
		"org.opencontainers.image.created":     o.created().Format(time.RFC3339),
	}
	if o.Version != "" {
		l["org.opencontainers.image.version"] = o.Version
	}
	if o.Revision != "" {
		l["org.opencontainers.image.revision"] = o.Revision
	}
	return l
}

func (o Options) created() time.Time {
	if o.Created.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return o.Created.UTC()
}

// Build assembles the OCI image index of o: one image per binary, each with
// a base layer (CA bundle, passwd, group) and a binary layer. It fails,
// naming the file, when a binary is missing, is not a static ELF for its
// platform's architecture, or the CA bundle is missing or empty.
func Build(o Options) (v1.ImageIndex, error) {
	if len(o.Binaries) == 0 {
		return nil, errors.New("image: no binaries")
	}
	var seen []string
	for _, b := range o.Binaries {
		p := b.Platform
		if p.OS != "linux" {
			return nil, fmt.Errorf("image: platform %s: only linux images", p)
		}
		if slices.Contains(seen, p.String()) {
			return nil, fmt.Errorf("image: platform %s given twice", p)
		}
		seen = append(seen, p.String())
	}
	ca := o.CABundle
	if ca == "" {
		ca = DefaultCABundle
	}
	caPEM, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("image: CA bundle: %w", err)
	}
	if len(bytes.TrimSpace(caPEM)) == 0 {
		return nil, fmt.Errorf("image: CA bundle %s is empty", ca)
	}
	base, err := o.baseLayer(caPEM)
	if err != nil {
		return nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, b := range o.Binaries {
		p := b.Platform
		img, err := o.image(b, base)
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &p},
		})
	}
	return idx, nil
}

func (o Options) image(b Binary, base v1.Layer) (v1.Image, error) {
	p := b.Platform
	bin, err := os.ReadFile(b.Path)
	if err != nil {
		return nil, fmt.Errorf("image: binary for %s: %w", p, err)
	}
	if err := CheckStatic(bin, p.Architecture); err != nil {
		return nil, fmt.Errorf("image: binary %s for %s: %w", b.Path, p, err)
	}
	layer, err := o.layer([]entry{
		{name: "bin/", mode: 0o755},
		{name: BinaryPath[1:], mode: 0o755, data: bin},
		{name: IncumbentPath[1:], link: BinaryPath[1:]},
	})
	if err != nil {
		return nil, err
	}
	ports := map[string]struct{}{}
	for _, n := range ExposedPorts() {
		ports[strconv.Itoa(n)+"/tcp"] = struct{}{}
	}
	created := v1.Time{Time: o.created()}
	cfg := &v1.ConfigFile{
		Architecture: p.Architecture,
		OS:           p.OS,
		Variant:      p.Variant,
		Created:      created,
		Config: v1.Config{
			User:         User(),
			Entrypoint:   []string{BinaryPath},
			ExposedPorts: ports,
			Env:          Env(),
			WorkingDir:   "/",
			Labels:       o.Labels(),
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img, err := mutate.ConfigFile(mutate.MediaType(empty.Image, types.OCIManifestSchema1), cfg)
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: created, CreatedBy: "ratelimitd-image: CA bundle, passwd, group"}},
		mutate.Addendum{Layer: layer, History: v1.History{Created: created, CreatedBy: "ratelimitd-image: " + BinaryPath + ", " + IncumbentPath}},
	)
	if err != nil {
		return nil, fmt.Errorf("image: layers: %w", err)
	}
	return img, nil
}

func (o Options) baseLayer(caPEM []byte) (v1.Layer, error) {
	passwd, err := rootfs.ReadFile("rootfs/etc/passwd")
	if err != nil {
		return nil, err
	}
	group, err := rootfs.ReadFile("rootfs/etc/group")
	if err != nil {
		return nil, err
	}
	return o.layer([]entry{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: group},
		{name: "etc/passwd", mode: 0o644, data: passwd},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: CABundlePath[1:], mode: 0o644, data: caPEM},
	})
}

// entry is one tar entry: a directory (name ends in /), a regular file, or
// a hard link to an earlier entry.
type entry struct {
	name string
	mode int64
	data []byte
	link string
}

// layer is a gzipped OCI layer of entries, owned by root, every time
// o.created().
func (o Options) layer(entries []entry) (v1.Layer, error) {
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: o.created(), Format: tar.FormatPAX}
		switch {
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeLink, e.link, 0o755
		case e.name[len(e.name)-1] == '/':
			h.Typeflag = tar.TypeDir
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("image: tar %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("image: tar %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: tar: %w", err)
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarBuf.Bytes()); err != nil {
		return nil, fmt.Errorf("image: gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("image: gzip: %w", err)
	}
	compressed := gz.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// elfMachines are the ELF machines of the OCI architectures.
var elfMachines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"arm":     elf.EM_ARM,
	"386":     elf.EM_386,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

// CheckStatic says why bin is not a statically linked Linux executable for
// the OCI architecture arch (an ELF for another machine, or one with an
// interpreter or a dynamic section), or nil.
func CheckStatic(bin []byte, arch string) error {
	want, ok := elfMachines[arch]
	if !ok {
		return fmt.Errorf("unsupported architecture %q", arch)
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if f.Machine != want {
		return fmt.Errorf("ELF machine %v, want %v for %s", f.Machine, want, arch)
	}
	for _, p := range f.Progs {
		switch p.Type {
		case elf.PT_INTERP:
			return errors.New("has a program interpreter: dynamically linked (build with CGO_ENABLED=0)")
		case elf.PT_DYNAMIC:
			return errors.New("has a dynamic section: dynamically linked (build with CGO_ENABLED=0)")
		}
	}
	if f.Type != elf.ET_EXEC {
		return fmt.Errorf("ELF type %v, want %v (a static executable)", f.Type, elf.ET_EXEC)
	}
	return nil
}
