package soak_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/soak"
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

// TestShortSoakLosesNothing is the soak of CI: 24 seconds of churn through a
// NATS outage longer than the duplicate window and the outbox, a SIGKILL of
// the bridge, a runtime restart and stream drops, on one NATS server. Every
// transition must be stored exactly once and in order.
func TestShortSoakLosesNothing(t *testing.T) {
	bin := buildBridge(t)
	dir := t.TempDir()
	var progress bytes.Buffer
	rep, err := soak.Run(t.Context(), soak.Options{
		Duration:        24 * time.Second,
		Rate:            100,
		Faults:          []string{soak.FaultNATSOutage, soak.FaultBridgeKill, soak.FaultRuntimeRestart, soak.FaultStreamDrop},
		Dir:             dir,
		BridgeBinary:    bin,
		Lifetime:        time.Second,
		DuplicateWindow: time.Second,
		FaultLength:     time.Second,
		SettleTimeout:   30 * time.Second,
		Stdout:          &progress,
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
	}
	// Every window saw churn, so each fault was tested with transitions
	// in flight.
	for _, w := range rep.Windows {
		if w.Expected < 50 {
			t.Errorf("window %s: only %d transitions made", w.Name, w.Expected)
		}
	}
	if got := len(rep.Windows); got != 6 {
		t.Errorf("%d windows, want 6: baseline, four faults, recovery", got)
	}
}
