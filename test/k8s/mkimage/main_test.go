package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// finalStage is what the Dockerfile's last stage says about the image.
type finalStage struct {
	from       string
	labels     map[string]string
	user       string
	expose     []string
	entrypoint []string
	cmd        []string
	copies     []string // destinations of COPY
}

// parseDockerfile reads the instructions of the Dockerfile's last stage, the
// ones that make the image's configuration. Build arguments are replaced by
// args.
func parseDockerfile(t *testing.T, args map[string]string) finalStage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// Join continuation lines, drop comments and blank lines.
	var lines []string
	cur := ""
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur += s + " "
			continue
		}
		lines = append(lines, cur+line)
		cur = ""
	}
	var st finalStage
	for _, line := range lines {
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(os.Expand(rest, func(k string) string {
			if v, ok := args[k]; ok {
				return v
			}
			return "${" + k + "}"
		}))
		switch strings.ToUpper(instr) {
		case "FROM":
			st = finalStage{from: rest, labels: map[string]string{}}
		case "LABEL":
			for _, kv := range splitLabels(t, rest) {
				k, v, _ := strings.Cut(kv, "=")
				st.labels[k] = v
			}
		case "USER":
			st.user = rest
		case "EXPOSE":
			st.expose = append(st.expose, strings.Fields(rest)...)
		case "ENTRYPOINT":
			st.entrypoint = jsonArray(t, rest)
		case "CMD":
			st.cmd = jsonArray(t, rest)
		case "COPY":
			f := strings.Fields(rest)
			st.copies = append(st.copies, f[len(f)-1])
		}
	}
	return st
}

// splitLabels splits k="v" k2="v 2" into its pairs, unquoted.
func splitLabels(t *testing.T, s string) []string {
	t.Helper()
	var out []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		k, rest, ok := strings.Cut(s, "=")
		if !ok || !strings.HasPrefix(rest, `"`) {
			t.Fatalf("LABEL %q: want key=\"value\" pairs", s)
		}
		end := strings.Index(rest[1:], `"`)
		if end < 0 {
			t.Fatalf("LABEL %q: unterminated value", s)
		}
		out = append(out, k+"="+rest[1:end+1])
		s = rest[end+2:]
	}
	return out
}

func jsonArray(t *testing.T, s string) []string {
	t.Helper()
	var a []string
	if err := json.Unmarshal([]byte(s), &a); err != nil {
		t.Fatalf("%q is not in exec form: %v", s, err)
	}
	return a
}

func testOptions() Options {
	return Options{
		Binary:   []byte("\x7fELF not really"),
		CACerts:  []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
		Version:  "v9.8.7",
		Revision: "0123456789abcdef",
		Arch:     "amd64",
	}
}

func TestTheImageIsConfiguredAsTheDockerfileSays(t *testing.T) {
	t.Parallel()
	o := testOptions()
	img, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	checkAsTheDockerfileSays(t, img, o)
}

// checkAsTheDockerfileSays checks img, built from o, against the
// Dockerfile's last stage: labels, user, port, entrypoint and command,
// platform, and the files it copies and takes from its base.
func checkAsTheDockerfileSays(t *testing.T, img v1.Image, o Options) {
	t.Helper()
	df := parseDockerfile(t, map[string]string{"VERSION": o.Version, "REVISION": o.Revision})
	if !strings.Contains(df.from, "distroless/static") || !strings.Contains(df.from, ":nonroot") {
		t.Fatalf("the Dockerfile's base is %q; mkimage rebuilds distroless/static's nonroot layout, so revisit it", df.from)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if diff := cmp.Diff(df.labels, c.Labels); diff != "" {
		t.Errorf("labels (-Dockerfile +image):\n%s", diff)
	}
	if c.User != df.user {
		t.Errorf("user %q, the Dockerfile's USER is %q", c.User, df.user)
	}
	var ports []string
	for p := range c.ExposedPorts {
		ports = append(ports, strings.TrimSuffix(p, "/tcp"))
	}
	if !slices.Equal(ports, df.expose) {
		t.Errorf("exposed ports %q, the Dockerfile's EXPOSE %q", ports, df.expose)
	}
	if !slices.Equal(c.Entrypoint, df.entrypoint) || !slices.Equal(c.Cmd, df.cmd) {
		t.Errorf("entrypoint %q cmd %q, the Dockerfile's %q %q", c.Entrypoint, c.Cmd, df.entrypoint, df.cmd)
	}
	if cfg.OS != "linux" || cfg.Architecture != o.Arch {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, o.Arch)
	}

	files := layerFiles(t, img)
	for _, dst := range df.copies {
		if string(files[strings.TrimPrefix(dst, "/")].data) != string(o.Binary) {
			t.Errorf("the Dockerfile copies the binary to %s, which the image does not hold", dst)
		}
	}
	if len(df.copies) == 0 {
		t.Error("the Dockerfile's last stage copies nothing")
	}
	if f := files[strings.TrimPrefix(df.entrypoint[0], "/")]; f.mode&0o111 == 0 {
		t.Errorf("the entrypoint %s is not executable in the image", df.entrypoint[0])
	}
	if string(files["etc/ssl/certs/ca-certificates.crt"].data) != string(o.CACerts) {
		t.Error("the image lacks the CA certificates at /etc/ssl/certs/ca-certificates.crt")
	}
	uid, gid, _ := strings.Cut(df.user, ":")
	if !strings.Contains(string(files["etc/passwd"].data), ":x:"+uid+":"+gid+":") ||
		!strings.Contains(string(files["etc/group"].data), ":x:"+gid+":") {
		t.Errorf("/etc/passwd and /etc/group do not name the USER %s", df.user)
	}
	if f := files["tmp"]; f.mode&0o1777 != 0o1777 {
		t.Errorf("/tmp has mode %o, want 1777", f.mode)
	}
}

type layerFile struct {
	mode int64
	data []byte
}

func layerFiles(t *testing.T, img v1.Image) map[string]layerFile {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]layerFile{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.IsZero() && h.ModTime.Unix() != 0 {
			t.Errorf("%s has time %s, not the epoch", h.Name, h.ModTime)
		}
		out[strings.TrimSuffix(h.Name, "/")] = layerFile{mode: h.Mode, data: b}
	}
	return out
}

func TestTheSameInputsGiveTheSameImage(t *testing.T) {
	t.Parallel()
	digest := func(o Options) string {
		img, err := Build(o)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	a, b := digest(testOptions()), digest(testOptions())
	if a != b {
		t.Errorf("two builds of the same inputs: %s and %s", a, b)
	}
	other := testOptions()
	other.Version = "v9.8.8"
	if digest(other) == a {
		t.Error("another version gives the same digest")
	}
}

func TestBuildRefusesMissingInputs(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]func(*Options){
		"an empty binary":         func(o *Options) { o.Binary = nil },
		"a bundle without a cert": func(o *Options) { o.CACerts = []byte("nothing") },
		"no version":              func(o *Options) { o.Version = "" },
	} {
		o := testOptions()
		change(&o)
		if _, err := Build(o); err == nil {
			t.Errorf("Build accepts %s", name)
		}
	}
}

// fakeELF returns the headers of a 64-bit little-endian ELF executable for
// machine, with a PT_INTERP program header if dynamic: what staticArch
// reads of a binary.
func fakeELF(machine elf.Machine, dynamic bool) []byte {
	var progs []elf.ProgType
	if dynamic {
		progs = append(progs, elf.PT_INTERP)
	}
	progs = append(progs, elf.PT_LOAD)
	var b bytes.Buffer
	le := binary.LittleEndian
	b.Write([]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT), byte(elf.ELFOSABI_NONE)})
	b.Write(make([]byte, 8))
	for _, v := range []any{
		uint16(elf.ET_EXEC), uint16(machine), uint32(elf.EV_CURRENT),
		uint64(0x401000), uint64(64), uint64(0), // entry, program and section header offsets
		uint32(0), uint16(64), uint16(56), uint16(len(progs)), uint16(64), uint16(0), uint16(0),
	} {
		_ = binary.Write(&b, le, v)
	}
	for _, p := range progs {
		for _, v := range []any{uint32(p), uint32(elf.PF_R), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0x1000)} {
			_ = binary.Write(&b, le, v)
		}
	}
	return b.Bytes()
}

func TestStaticArchReadsTheBinarysArchitectureAndRefusesADynamicOne(t *testing.T) {
	t.Parallel()
	for machine, want := range map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64", elf.EM_S390: "s390x"} {
		if got, err := staticArch(fakeELF(machine, false)); err != nil || got != want {
			t.Errorf("a static %s binary: %q, %v; want %s", machine, got, err, want)
		}
	}
	for name, bin := range map[string][]byte{
		"a dynamically linked binary": fakeELF(elf.EM_X86_64, true),
		"a script":                    []byte("#!/bin/sh\nexec true\n"),
		"an unknown machine":          fakeELF(elf.EM_SPARCV9, false),
	} {
		if arch, err := staticArch(bin); err == nil {
			t.Errorf("staticArch accepts %s as %s", name, arch)
		}
	}
	if _, err := staticArch(fakeELF(elf.EM_X86_64, true)); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("a dynamically linked binary: %v, want an error saying CGO_ENABLED=0", err)
	}
}

// testInputs writes a static amd64 binary and a CA bundle and returns the
// flags that name them with testOptions' version and revision, and the
// Options mkimage should build from them.
func testInputs(t *testing.T) ([]string, Options) {
	t.Helper()
	o := testOptions()
	o.Binary = fakeELF(elf.EM_X86_64, false)
	dir := t.TempDir()
	bin, certs := filepath.Join(dir, "pleg-bridge"), filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(bin, o.Binary, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certs, o.CACerts, 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"-binary", bin, "-ca-certs", certs, "-version", o.Version, "-revision", o.Revision}, o
}

func TestPushedImageIsPulledBackAsTheDockerfileSays(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/pleg-bridge/pleg-bridge:v9.8.7"
	args, o := testInputs(t)

	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), append(args, "-ref", ref, "-push"), &stdout, &stderr); err != nil {
		t.Fatalf("mkimage -push: %v\n%s", err, stderr.String())
	}
	want, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := want.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if got, w := strings.TrimSpace(stdout.String()), "pushed "+ref+"@"+digest.String()+" (linux/amd64)"; got != w {
		t.Errorf("mkimage printed %q, want %q", got, w)
	}

	// Pulled back by tag and by the digest it printed: the same image,
	// configured and laid out as the Dockerfile says.
	for _, r := range []string{ref, strings.TrimSuffix(ref, ":v9.8.7") + "@" + digest.String()} {
		nr, err := name.ParseReference(r)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(nr, remote.WithContext(t.Context()))
		if err != nil {
			t.Fatalf("pull %s: %v", r, err)
		}
		if d, err := img.Digest(); err != nil || d != digest {
			t.Errorf("%s has digest %v (%v), mkimage pushed %s", r, d, err, digest)
		}
		checkAsTheDockerfileSays(t, img, o)
	}
}

func TestArchiveHoldsTheImageUnderItsName(t *testing.T) {
	t.Parallel()
	args, o := testInputs(t)
	out := filepath.Join(t.TempDir(), "pleg-bridge.tar")
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), append(args, "-ref", "localhost/pleg-bridge:e2e", "-out", out), &stdout, &stderr); err != nil {
		t.Fatalf("mkimage -out: %v\n%s", err, stderr.String())
	}
	tag, err := name.NewTag("localhost/pleg-bridge:e2e")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("the archive does not hold %s: %v", tag, err)
	}
	checkAsTheDockerfileSays(t, img, o)
}

func TestRunRefusesNothingToDoAndABinaryTheImageCannotRun(t *testing.T) {
	t.Parallel()
	args, _ := testInputs(t)
	dynamic := filepath.Join(t.TempDir(), "dynamic")
	if err := os.WriteFile(dynamic, fakeELF(elf.EM_X86_64, true), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, tt := range map[string]struct {
		args []string
		want string
	}{
		"neither -out nor -push":    {args, "-out or -push is required"},
		"no binary":                 {[]string{"-push"}, "-binary is required"},
		"a dynamically linked one":  {append(slices.Clone(args), "-binary", dynamic, "-push"), "CGO_ENABLED=0"},
		"a reference without a tag": {append(slices.Clone(args), "-ref", "UPPER/case", "-push"), "-ref"},
	} {
		err := run(t.Context(), tt.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tt.want)
		}
	}
}
