//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Environment of the tests.
const (
	// envVersion names the containerd version under test: 2.4.2 or 1.7.35.
	envVersion = "PLEG_E2E_CONTAINERD_VERSION"
	// envSocket, if set, is the socket of a containerd that containerd.sh
	// already started (in the directory holding the socket); otherwise the
	// tests start one themselves.
	envSocket = "PLEG_E2E_CONTAINERD_SOCKET"
)

// The images test/e2e/mkimages writes and containerd.sh imports.
const (
	pauseImage = "localhost/pleg-e2e/pause:1"
	workImage  = "localhost/pleg-e2e/work:1"
)

// suite is what every test shares: set once by TestMain, read-only after.
var suite struct {
	version string // containerd version, "2.4.2" or "1.7.35"
	workdir string // containerd.sh's workdir: config, log, socket
	socket  string // CRI socket path
	bridge  string // the pleg-bridge binary
	script  string // containerd.sh
}

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	code := 1
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
	} else {
		code = m.Run()
	}
	if os.Getenv(envSocket) == "" && suite.workdir != "" {
		if out, err := exec.Command("bash", suite.script, "stop", suite.workdir).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: stop containerd: %v\n%s", err, out)
		}
		os.RemoveAll(suite.workdir)
	}
	if suite.bridge != "" {
		os.RemoveAll(filepath.Dir(suite.bridge))
	}
	return code
}

// setup builds the bridge and finds or starts containerd. It fails rather
// than skips: these tests never skip silently.
func setup() error {
	suite.version = os.Getenv(envVersion)
	switch suite.version {
	case "2.4.2", "1.7.35":
	default:
		return fmt.Errorf("%s=%q: want 2.4.2 or 1.7.35", envVersion, suite.version)
	}
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		return fmt.Errorf("the e2e tests need root on Linux (GOOS=%s, euid=%d)", runtime.GOOS, os.Geteuid())
	}
	_, self, _, _ := runtime.Caller(0)
	here := filepath.Dir(self)
	suite.script = filepath.Join(here, "containerd.sh")

	dir, err := os.MkdirTemp("", "pleg-e2e-bin-")
	if err != nil {
		return err
	}
	suite.bridge = filepath.Join(dir, "pleg-bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", suite.bridge, "./cmd/pleg-bridge")
	build.Dir = filepath.Join(here, "..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build pleg-bridge: %v\n%s", err, out)
	}

	if s := os.Getenv(envSocket); s != "" {
		suite.socket = s
		suite.workdir = filepath.Dir(s)
		if _, err := os.Stat(s); err != nil {
			return fmt.Errorf("%s=%q: %w", envSocket, s, err)
		}
		return nil
	}
	// Short, so that the socket path fits in a sockaddr_un.
	suite.workdir, err = os.MkdirTemp("", "pleg-e2e-")
	if err != nil {
		return err
	}
	suite.socket = filepath.Join(suite.workdir, "containerd.sock")
	for _, args := range [][]string{{"setup", suite.version}, {"start", suite.version, suite.workdir}} {
		cmd := exec.CommandContext(ctx, "bash", append([]string{suite.script}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("containerd.sh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// containerd runs containerd.sh with args against the suite's workdir.
func containerd(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", append([]string{suite.script}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("containerd.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
