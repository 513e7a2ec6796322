// Command mkimage builds the pleg-bridge container image without a
// container daemon (no Docker, no BuildKit): from the static binary alone,
// nothing pulled. It writes a docker image archive, for `ctr images import`,
// `docker load` or `podman load`, and/or pushes the image to a registry. The
// image is what the Dockerfile builds, for machines without Docker or that
// cannot pull its base images (gcr.io/distroless/static-debian12:nonroot):
//
//	/pleg-bridge                        the binary (0755)
//	/etc/passwd, /etc/group             root, nobody and nonroot (65532), as distroless has them
//	/etc/ssl/certs/ca-certificates.crt  the CA certificates (-ca-certs, Debian's bundle)
//	/home/nonroot, /tmp                 the non-root user's home and a sticky /tmp
//
// with the Dockerfile's user (65532:65532), exposed port, entrypoint, default
// command and OCI labels, the version among them, for the binary's
// architecture (read from its ELF header; the binary must be static,
// CGO_ENABLED=0). Every file time and the creation time are the Unix epoch,
// so the same binary and certificates give the same image digest.
// main_test.go holds the configuration to the Dockerfile's.
//
//	CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=v1.2.3" \
//	    -o pleg-bridge ./cmd/pleg-bridge
//	go run ./test/k8s/mkimage -binary pleg-bridge -version v1.2.3 -revision "$(git rev-parse HEAD)" \
//	    -ref registry.example.com/pleg-bridge:v1.2.3 -push
//	go run ./test/k8s/mkimage -binary pleg-bridge -version v1.2.3 -out pleg-bridge.tar
//
// -push authenticates as the docker CLI, podman or crane would: with
// $DOCKER_CONFIG/config.json or ~/.docker/config.json (and the credential
// helpers it names), then $REGISTRY_AUTH_FILE or containers' auth.json. It
// prints the pushed reference with its digest, to pin the image by.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Options says what goes into the image.
type Options struct {
	Binary   []byte // the static pleg-bridge binary
	CACerts  []byte // a PEM bundle of CA certificates
	Version  string // org.opencontainers.image.version, as VERSION in the Dockerfile
	Revision string // org.opencontainers.image.revision, as REVISION
	Arch     string // the image's architecture (GOARCH)
}

// The layout, as the Dockerfile and its distroless base make it.
const (
	binaryPath  = "/pleg-bridge"
	caCertsPath = "/etc/ssl/certs/ca-certificates.crt"
	user        = "65532:65532"
	metricsPort = "9470/tcp"
)

// labels are the Dockerfile's LABEL instruction, with its two build
// arguments filled in.
func labels(version, revision string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":         "pleg-bridge",
		"org.opencontainers.image.description":   "Kubernetes container lifecycle events from the node's CRI runtime to NATS JetStream as CloudEvents",
		"org.opencontainers.image.source":        "https://github.com/pleg-bridge/pleg-bridge",
		"org.opencontainers.image.url":           "https://github.com/pleg-bridge/pleg-bridge",
		"org.opencontainers.image.documentation": "https://github.com/pleg-bridge/pleg-bridge#readme",
		"org.opencontainers.image.vendor":        "pleg-bridge",
		"org.opencontainers.image.version":       version,
		"org.opencontainers.image.revision":      revision,
	}
}

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// run builds the image the flags in args describe, writes it and/or pushes
// it, and says where on stdout. The push stops when ctx is done.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	binPath := fs.String("binary", "", "the static pleg-bridge binary (required; CGO_ENABLED=0, GOOS=linux)")
	out := fs.String("out", "", "write the image to this docker image archive")
	push := fs.Bool("push", false, "push the image to -ref's registry")
	ref := fs.String("ref", "localhost/pleg-bridge:e2e", "the image's name, registry/repository:tag")
	caCerts := fs.String("ca-certs", "/etc/ssl/certs/ca-certificates.crt", "PEM bundle of CA certificates to put in the image")
	version := fs.String("version", "dev", "the version label, as the Dockerfile's VERSION")
	revision := fs.String("revision", "unknown", "the revision label, as the Dockerfile's REVISION")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *binPath == "":
		return errors.New("-binary is required")
	case *out == "" && !*push:
		return errors.New("-out or -push is required: nothing to do")
	case fs.NArg() != 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	tag, err := name.NewTag(*ref)
	if err != nil {
		return fmt.Errorf("-ref %q: %w", *ref, err)
	}
	bin, err := os.ReadFile(*binPath)
	if err != nil {
		return fmt.Errorf("read the binary: %w", err)
	}
	arch, err := staticArch(bin)
	if err != nil {
		return fmt.Errorf("-binary %s: %w", *binPath, err)
	}
	certs, err := os.ReadFile(*caCerts)
	if err != nil {
		return fmt.Errorf("read the CA certificates (-ca-certs): %w", err)
	}
	img, err := Build(Options{Binary: bin, CACerts: certs, Version: *version, Revision: *revision, Arch: arch})
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if *out != "" {
		if err := tarball.WriteToFile(*out, tag, img); err != nil {
			return fmt.Errorf("write the image archive: %w", err)
		}
		fmt.Fprintf(stdout, "wrote %s: %s (linux/%s)\n", *out, tag.Name(), arch)
	}
	if *push {
		if err := remote.Write(tag, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("push %s: %w", tag.Name(), err)
		}
		fmt.Fprintf(stdout, "pushed %s@%s (linux/%s)\n", tag.Name(), digest, arch)
	}
	return nil
}

// goArch is the GOARCH of each ELF machine Go builds linux binaries for.
var goArch = map[elf.Machine]string{
	elf.EM_X86_64:    "amd64",
	elf.EM_AARCH64:   "arm64",
	elf.EM_386:       "386",
	elf.EM_ARM:       "arm",
	elf.EM_S390:      "s390x",
	elf.EM_RISCV:     "riscv64",
	elf.EM_LOONGARCH: "loong64",
}

// staticArch returns the image architecture (GOARCH) of a linux binary, and
// an error if it is not an ELF file or is linked dynamically: the image has
// no dynamic loader or C library, so such a binary would not start ("no such
// file or directory").
func staticArch(bin []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return "", fmt.Errorf("not a linux (ELF) binary; build it with GOOS=linux: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", errors.New("linked dynamically (it needs a program interpreter), which the image cannot run; build it with CGO_ENABLED=0")
		}
	}
	arch, ok := goArch[f.Machine]
	if f.Machine == elf.EM_PPC64 && f.ByteOrder == binary.LittleEndian {
		arch, ok = "ppc64le", true
	}
	if !ok {
		return "", fmt.Errorf("built for %s, an architecture mkimage does not know", f.Machine)
	}
	return arch, nil
}

// Build returns the image: one layer with the files above and the
// Dockerfile's configuration. It fails on an empty binary, an empty
// certificate bundle or an empty version.
func Build(o Options) (v1.Image, error) {
	switch {
	case len(o.Binary) == 0:
		return nil, errors.New("the binary is empty")
	case !bytes.Contains(o.CACerts, []byte("-----BEGIN CERTIFICATE-----")):
		return nil, errors.New("the CA certificate bundle holds no PEM certificate")
	case o.Version == "" || o.Revision == "" || o.Arch == "":
		return nil, errors.New("version, revision and architecture are required")
	}
	layerTar, err := layer(o)
	if err != nil {
		return nil, fmt.Errorf("write the layer: %w", err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("make the layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return nil, fmt.Errorf("make the image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = o.Arch
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config.User = user
	cfg.Config.ExposedPorts = map[string]struct{}{metricsPort: {}}
	cfg.Config.Entrypoint = []string{binaryPath}
	cfg.Config.Cmd = []string{"run"}
	cfg.Config.WorkingDir = "/"
	cfg.Config.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"SSL_CERT_FILE=" + caCertsPath,
	}
	cfg.Config.Labels = labels(o.Version, o.Revision)
	return mutate.ConfigFile(img, cfg)
}

// layer returns the image's only layer, an uncompressed tar.
func layer(o Options) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dir := func(path string, mode int64, uid int) error {
		return tw.WriteHeader(&tar.Header{Name: path + "/", Typeflag: tar.TypeDir, Mode: mode, Uid: uid, Gid: uid, ModTime: epoch, Format: tar.FormatPAX})
	}
	file := func(path string, mode int64, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: path, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
	for _, step := range []func() error{
		func() error { return dir("etc", 0o755, 0) },
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return dir("etc/ssl", 0o755, 0) },
		func() error { return dir("etc/ssl/certs", 0o755, 0) },
		func() error { return file(caCertsPath[1:], 0o644, o.CACerts) },
		func() error { return dir("home", 0o755, 0) },
		func() error { return dir("home/nonroot", 0o700, 65532) },
		func() error { return dir("tmp", 0o1777, 0) },
		func() error { return file(binaryPath[1:], 0o755, o.Binary) },
		tw.Close,
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}
