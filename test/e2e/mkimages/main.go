// Command mkimages writes the end-to-end tests' container images as one
// docker image archive, ready for `ctr -n k8s.io images import`. Both images
// hold one layer with the static test binary (test/e2e/image) at
// /pleg-e2e; they differ only in name and default command:
//
//	localhost/pleg-e2e/pause:1   /pleg-e2e pause   (the sandbox image)
//	localhost/pleg-e2e/work:1    /pleg-e2e work --sleep 1h --exit 0
//
// Nothing is pulled: the archive is built from the binary alone.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// binaryPath is where the test binary lives inside the images.
const binaryPath = "/pleg-e2e"

func main() {
	binary := flag.String("binary", "", "the static test binary to put in the images (required)")
	out := flag.String("out", "", "the image archive to write (required)")
	pauseRef := flag.String("pause", "localhost/pleg-e2e/pause:1", "name of the sandbox image")
	workRef := flag.String("work", "localhost/pleg-e2e/work:1", "name of the workload image")
	flag.Parse()
	if *binary == "" || *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := write(*binary, *out, *pauseRef, *workRef); err != nil {
		fmt.Fprintln(os.Stderr, "mkimages:", err)
		os.Exit(1)
	}
}

func write(binary, out, pauseRef, workRef string) error {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return fmt.Errorf("read test binary: %w", err)
	}
	layerTar, err := layerArchive(bin)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("make layer: %w", err)
	}
	images := map[name.Reference]v1.Image{}
	for ref, cmd := range map[string][]string{
		pauseRef: {"pause"},
		workRef:  {"work", "--sleep", "1h", "--exit", "0"},
	} {
		tag, err := name.NewTag(ref)
		if err != nil {
			return fmt.Errorf("image name %q: %w", ref, err)
		}
		img, err := image(layer, cmd)
		if err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
		images[tag] = img
	}
	if err := tarball.MultiRefWriteToFile(out, images); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	return nil
}

// layerArchive returns an uncompressed tar holding the binary at binaryPath.
func layerArchive(bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{
		Name:     binaryPath[1:],
		Mode:     0o755,
		Size:     int64(len(bin)),
		Typeflag: tar.TypeReg,
		ModTime:  time.Unix(0, 0),
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	return buf.Bytes(), nil
}

// image returns a single-layer image for this machine's platform whose
// default command is binaryPath followed by cmd.
func image(layer v1.Layer, cmd []string) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = runtime.GOARCH
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config.Entrypoint = []string{binaryPath}
	cfg.Config.Cmd = cmd
	cfg.Config.WorkingDir = "/"
	cfg.Config.Env = []string{"PATH=/"}
	return mutate.ConfigFile(img, cfg)
}
