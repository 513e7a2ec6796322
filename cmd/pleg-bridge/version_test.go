package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

func TestBuildInfoSaysTheVersionCommitContractAndFormat(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfo())
	want := fmt.Sprintf(`# HELP pleg_bridge_build_info Always 1; the labels are the version and commit of pleg-bridge, the Go version it was built with, and the wire contract and data directory format versions it writes.
# TYPE pleg_bridge_build_info gauge
pleg_bridge_build_info{commit=%q,contract_version=%q,format_version=%q,go_version=%q,version=%q} 1
`, commitString(), schemas.ContractVersion, datadir.FormatVersion, runtime.Version(), versionString())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pleg_bridge_build_info"); err != nil {
		t.Error(err)
	}
}

func TestVersionSaysTheCommitContractAndDataDirectoryFormat(t *testing.T) {
	t.Parallel()
	var stdout bytes.Buffer
	if err := run(t.Context(), []string{"version"}, envFrom(t, nil), &stdout, io.Discard); err != nil {
		t.Fatalf("version = %v", err)
	}
	want := fmt.Sprintf("pleg-bridge %s (commit %s, contract %s, data directory format %s, %s, %s/%s)\n",
		versionString(), commitString(), schemas.ContractVersion, datadir.FormatVersion, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if stdout.String() != want {
		t.Errorf("version printed %q, want %q", stdout.String(), want)
	}
}

// TestVersionOfABuildWithoutVCSInformation builds the binary as the
// Dockerfile does, from a tree without .git (-buildvcs=false) and with the
// version and commit given to the linker, and runs its version command.
func TestVersionOfABuildWithoutVCSInformation(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "pleg-bridge")
	const rev = "0123456789abcdef0123456789abcdef01234567"
	build := exec.CommandContext(t.Context(), "go", "build", "-buildvcs=false", "-trimpath",
		"-ldflags", "-X main.version=v9.8.7 -X main.commit="+rev, "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(t.Context(), bin, "version").Output()
	if err != nil {
		t.Fatalf("pleg-bridge version: %v", err)
	}
	prefix := fmt.Sprintf("pleg-bridge v9.8.7 (commit %s, contract %s, data directory format %s, ", rev, schemas.ContractVersion, datadir.FormatVersion)
	if !strings.HasPrefix(string(out), prefix) {
		t.Errorf("version printed %q, want it to start with %q", out, prefix)
	}
}

// TestDockerfileStampsTheVersionAndCommit: the image's build has no .git,
// so the linker must be given both.
func TestDockerfileStampsTheVersionAndCommit(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-X main.version=${VERSION}", "-X main.commit=${REVISION}"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}
