package soak_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/soak"
)

// buildBridge builds the pleg-bridge binary into the test's directory: the
// soak runs the bridge as a child process, as the command does.
func buildBridge(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pleg-bridge")
	out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "github.com/pleg-bridge/pleg-bridge/cmd/pleg-bridge").CombinedOutput()
	if err != nil {
		t.Fatalf("build pleg-bridge: %v\n%s", err, out)
	}
	return bin
}

// TestShortSoakLosesNothing is the soak of CI: 42 seconds of churn through a
// NATS outage longer than the duplicate window and the outbox, a SIGKILL of
// the bridge, a SIGKILL in the middle of a NATS outage, a runtime restart and
// stream drops, on one NATS server. Every
// transition must be stored exactly once and in order.
func TestShortSoakLosesNothing(t *testing.T) {
	bin := buildBridge(t)
	dir := t.TempDir()
	var progress bytes.Buffer
	rep, err := soak.Run(t.Context(), soak.Options{
		Duration:        42 * time.Second,
		Rate:            100,
		Faults:          []string{soak.FaultNATSOutage, soak.FaultBridgeKill, soak.FaultOutageBridgeKill, soak.FaultRuntimeRestart, soak.FaultStreamDrop},
		Dir:             dir,
		BridgeBinary:    bin,
		Lifetime:        time.Second,
		DuplicateWindow: time.Second,
		FaultLength:     time.Second,
		SettleTimeout:   30 * time.Second,
		Stdout:          &progress,
		// Every event and stream message in the log, for logFindings.
		BridgeEnv: []string{"PLEG_LOG_LEVEL=debug"},
	})
	if err != nil {
		t.Fatalf("soak: %v\nprogress:\n%s", err, progress.String())
	}
	var table strings.Builder
	if err := rep.Table(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("progress:\n%s\n%s", progress.String(), table.String())
	if rep.Failed() {
		t.Errorf("the soak found loss, duplication or disorder (bridge log: %s)", filepath.Join(dir, "bridge.log"))
		logFindings(t, filepath.Join(dir, "bridge.log"), rep)
	}
	// Every window saw churn, so each fault was tested with transitions
	// in flight.
	for _, w := range rep.Windows {
		if w.Expected < 50 {
			t.Errorf("window %s: only %d transitions made", w.Name, w.Expected)
		}
	}
	if got := len(rep.Windows); got != 7 {
		t.Errorf("%d windows, want 7: baseline, five faults, recovery", got)
	}
}

// logFindings logs the bridge's log lines that name a container or pod at
// fault, since the test's directory, and the log in it, is removed when the
// test ends: a failure in CI must be explainable from its output alone.
func logFindings(t *testing.T, logPath string, rep soak.Report) {
	t.Helper()
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Logf("read the bridge log: %v", err)
		return
	}
	var ids []string
	for _, list := range [][]soak.Finding{rep.Missing, rep.Duplicated, rep.OutOfOrder} {
		for _, f := range list {
			ids = append(ids, f.ContainerID, f.PodUID)
		}
	}
	const maxLines = 200
	var lines []string
	for line := range strings.Lines(string(data)) {
		for _, id := range ids {
			if id != "" && strings.Contains(line, id) {
				lines = append(lines, strings.TrimRight(line, "\n"))
				break
			}
		}
		if len(lines) == maxLines {
			break
		}
	}
	t.Logf("bridge log lines naming what is at fault (%d, at most %d):\n%s", len(lines), maxLines, strings.Join(lines, "\n"))
}
