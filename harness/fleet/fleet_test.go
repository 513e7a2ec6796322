package fleet_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/fleet"
)

// TestMain runs this test binary as a fleet child when the fleet under
// test starts it so (fleet.ChildEnv set): the servers and bridge
// processes of the test are real processes of this same binary.
func TestMain(m *testing.M) {
	if spec := os.Getenv(fleet.ChildEnv); spec != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		err := fleet.RunChild(ctx, spec, os.Stdin, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleet child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A tiny fleet goes through a rolling deployment of a tenth of its pods,
// the drain of a node, a rolling restart of its three servers, each a process of its own, and
// the kill of its stream's leader, and every transition its nodes made is
// stored once, in order, and the state bucket matches every runtime.
func TestTinyFleetLosesNothingThroughARolloutADrainAServerRestartAndALeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 3 server and 2 bridge processes for about 40 s; not in -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress strings.Builder
	rep, err := fleet.Run(ctx, fleet.Options{
		Nodes:        6,
		Procs:        2,
		Pods:         5,
		Rate:         12,
		Lifetime:     3 * time.Second,
		Duration:     25 * time.Second,
		RolloutSpan:  3 * time.Second,
		DrainSpan:    2 * time.Second,
		Faults:       []string{fleet.FaultRollingDeploy, fleet.FaultNodeDrain, fleet.FaultServerRestart, fleet.FaultLeaderKill},
		Dir:          t.TempDir(),
		ChildCommand: []string{os.Args[0]},
		Stdout:       &progress,
	})
	if err != nil {
		t.Fatalf("run the fleet: %v\nprogress:\n%s", err, progress.String())
	}
	var table strings.Builder
	if err := rep.Table(&table); err != nil {
		t.Fatal(err)
	}
	if rep.Failed() {
		t.Fatalf("the fleet lost, duplicated or reordered transitions:\n%s", table.String())
	}
	if got, populated := rep.Total.Found, 6*(5+5*2); got <= populated {
		t.Errorf("stored %d transitions, want more than the %d of the populated pods: the churn made none\n%s", got, populated, table.String())
	}
	if len(rep.Faults) != 4 || !rep.Faults[0].Drained || !rep.Faults[1].Drained || !rep.Faults[2].Drained || !rep.Faults[3].Drained {
		t.Errorf("faults %+v, want a rollout, a node drain, a server restart and a leader kill, drained\n%s", rep.Faults, table.String())
	} else {
		// 30 populated pods and the few the churn runs: a tenth, rounded up.
		if ro := rep.Faults[0]; ro.Pods < 30 || ro.Replaced != (ro.Pods+9)/10 {
			t.Errorf("rollout: %d of %d pods replaced, want a tenth of at least 30, rounded up\n%s", ro.Replaced, ro.Pods, table.String())
		}
		// The drained node's 5 standing pods (replacements of the rollout
		// included) end: 6 transitions each (2 containers and the sandbox,
		// each Died and Removed), and 5 new pods start elsewhere (3 each).
		if dr := rep.Faults[1]; dr.Name != fleet.FaultNodeDrain || dr.Replaced != 5 || dr.Rolled != 5*6+5*3 {
			t.Errorf("node drain: %s evicted %d pods with %d transitions, want 5 pods and 45 transitions\n%s", dr.Name, dr.Replaced, dr.Rolled, table.String())
		}
		if lk := rep.Faults[3]; lk.Election <= 0 || lk.Stalls.Nodes == 0 {
			t.Errorf("leader kill: election %v, stalls %+v: want both measured\n%s", lk.Election, lk.Stalls, table.String())
		}
	}
	if rep.State.Keys != rep.State.Want || len(rep.State.Diffs) > 0 {
		t.Errorf("state bucket: %d keys for %d containers, differences %q", rep.State.Keys, rep.State.Want, rep.State.Diffs)
	}
	// The baseline window's publish→ack figures: the bridges' from their
	// histograms, the raw publisher's from its own acks.
	if b := rep.Figures[1]; rep.Windows[1].Name != "baseline" || b.Acks == 0 || b.AckP99 <= 0 || b.RawAcks == 0 || b.RawBucketP99 <= 0 || b.RawP99 <= 0 {
		t.Errorf("window %q: bridge acks %d (p99 %v), raw acks %d (p99 %v, %v by buckets): want all measured\n%s",
			rep.Windows[1].Name, b.Acks, b.AckP99, b.RawAcks, b.RawP99, b.RawBucketP99, table.String())
	}
	if rep.Figures[1].ServerCores <= 0 {
		t.Errorf("baseline: the servers' CPU is %v cores, want it measured", rep.Figures[1].ServerCores)
	}
	if rep.Stream.Subjects == 0 || rep.Servers[0].PeakRSS == 0 {
		t.Errorf("stream subjects %d, server peak RSS %d: want both measured", rep.Stream.Subjects, rep.Servers[0].PeakRSS)
	}
}
