package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/internal/cli"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
)

// runFailing runs the run command with env and, when environ is not nil,
// the environment it lists, and returns what it logged and its error. The
// command must fail on its own within 20 s.
func runFailing(t *testing.T, env lookupFunc, environ []string) (string, error) {
	t.Helper()
	var stderr logtest.Buffer
	root := newRootCommand(commandEnv{lookup: env, stdout: io.Discard, stderr: &stderr})
	if environ != nil {
		root = newRootCommand(commandEnv{lookup: env, environ: func() []string { return environ }, stdout: io.Discard, stderr: &stderr})
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cli.Execute(ctx, root, []string{"run"}) }()
	select {
	case err := <-done:
		return stderr.String(), err
	case <-time.After(20 * time.Second):
		cancel()
		<-done
		t.Fatalf("run still running after 20s; it logged:\n%s", stderr.String())
		return "", nil
	}
}

// takenPort listens on a loopback port until the test ends and returns its
// address.
func takenPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

func TestRunWithTheEmbeddedNATSPortTakenFailsAtOnceNamingTheSetting(t *testing.T) {
	t.Parallel()
	addr := takenPort(t)
	env := envFrom(t, map[string]string{
		"PLEG_NODE_NAME":            "n",
		"PLEG_CRI_ENDPOINT":         filepath.Join(t.TempDir(), "cri.sock"),
		"PLEG_EMBEDDED_NATS_LISTEN": addr,
		"PLEG_LISTEN_ADDRESS":       "",
		"PLEG_LOG_FORMAT":           "json",
	})
	start := time.Now()
	logs, err := runFailing(t, env, []string{"PLEG_EMBEDDED_NATS_LISTEN=" + addr, "PLEG_MOD=generic"})
	if err == nil {
		t.Fatal("run started with its embedded NATS port taken")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("run took %s to fail", took)
	}
	for _, want := range []string{addr, "address already in use", "PLEG_EMBEDDED_NATS_LISTEN", "PLEG_NATS_URL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// The environment's typo is warned of before anything else.
	if !strings.Contains(logs, `"variable":"PLEG_MOD","did_you_mean":"PLEG_MODE"`) || !strings.Contains(logs, `"level":"WARN"`) {
		t.Errorf("no warning of PLEG_MOD naming PLEG_MODE in the logs:\n%s", logs)
	}
}

func TestRunWithTheMetricsPortTakenNamesTheSetting(t *testing.T) {
	t.Parallel()
	addr := takenPort(t)
	_, err := runFailing(t, envFrom(t, map[string]string{
		"PLEG_NODE_NAME":      "n",
		"PLEG_CRI_ENDPOINT":   filepath.Join(t.TempDir(), "cri.sock"),
		"PLEG_LISTEN_ADDRESS": addr,
		"PLEG_LOG_FORMAT":     "json",
	}), nil)
	if err == nil {
		t.Fatal("run started with its metrics port taken")
	}
	for _, want := range []string{addr, "address already in use", "PLEG_LISTEN_ADDRESS"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestRunListsEveryConfigurationErrorTogether(t *testing.T) {
	t.Parallel()
	_, err := runFailing(t, envFrom(t, map[string]string{
		"PLEG_NODE_NAME":     "n",
		"PLEG_STREAM_MANAGE": "yes",
		"PLEG_MODE":          "fast",
		"PLEG_RELIST_PERIOD": "1",
		"PLEG_STREAM":        "a.b",
	}), nil)
	if err == nil {
		t.Fatal("accepted")
	}
	var stderr strings.Builder
	if code := report(err, &stderr); code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	want := `pleg-bridge: invalid configuration:
PLEG_STREAM_MANAGE="yes": want true or false
PLEG_MODE="fast": unknown mode "fast" (want auto, evented, containerd-events or generic)
PLEG_RELIST_PERIOD="1": not a duration (like 500ms, 30s or 3m)
PLEG_STREAM="a.b": a stream name must be non-empty without . * > / \ or whitespace
`
	if stderr.String() != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", stderr.String(), want)
	}
}

func TestAnUnwritableDataDirectoryNamesTheVariable(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig() // PLEG_DATA_DIR=/var/lib/pleg-bridge, root's
	for _, path := range []string{"/var/lib/pleg-bridge", "/var/lib", "/var/lib/pleg-bridge/nats"} {
		err := withSetting(fmt.Errorf("create data directory: %w", &fs.PathError{Op: "mkdir", Path: path, Err: syscall.EACCES}), cfg)
		if !strings.Contains(err.Error(), "permission denied; set PLEG_DATA_DIR") {
			t.Errorf("mkdir %s refused: %v, want PLEG_DATA_DIR named", path, err)
		}
	}
	for _, err := range []error{
		&fs.PathError{Op: "open", Path: "/etc/pleg/creds", Err: syscall.EACCES},            // elsewhere
		&fs.PathError{Op: "open", Path: "/var/lib/pleg-bridge/state.db", Err: syscall.EIO}, // not a permission
	} {
		if got := withSetting(err, cfg); got != err {
			t.Errorf("withSetting(%v) = %v, want it unchanged", err, got)
		}
	}
}
