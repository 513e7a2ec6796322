package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
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
	df := parseDockerfile(t, map[string]string{"VERSION": o.Version, "REVISION": o.Revision})
	if !strings.Contains(df.from, "distroless/static") || !strings.Contains(df.from, ":nonroot") {
		t.Fatalf("the Dockerfile's base is %q; mkimage rebuilds distroless/static's nonroot layout, so revisit it", df.from)
	}
	img, err := Build(o)
	if err != nil {
		t.Fatal(err)
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
		t.Errorf("platform %s/%s", cfg.OS, cfg.Architecture)
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
