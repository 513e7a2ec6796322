package fleet_test

import (
	"cmp"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/fleet"
)

// The same 1,800 messages (600 pods of 3 events over 10 nodes and 5
// namespaces) in every layout land on as many subjects as the layout
// makes: one per pod and event type with the type token, one per pod
// without it, one per node and namespace for an archive; each server,
// restarted on its store, is measured.
func TestSubjectMemoryStoresEachLayoutOnItsSubjects(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and restarts a nats-server process six times, about 12 s; not in -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var progress strings.Builder
	rep, err := fleet.MeasureSubjectMemory(ctx, fleet.SubjectMemOptions{
		Pods: 600, Nodes: 10, Namespaces: 5,
		Layouts:          fleet.AllLayouts,
		DuplicateWindows: []time.Duration{2 * time.Minute},
		Runs:             1,
		Settle:           500 * time.Millisecond,
		Dir:              t.TempDir(),
		ChildCommand:     []string{os.Args[0]},
		Stdout:           &progress,
	})
	if err != nil {
		t.Fatalf("measure: %v\nprogress:\n%s", err, progress.String())
	}
	var table strings.Builder
	if err := rep.Table(&table); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		fleet.LayoutLegacy:        1800, // 600 pods × 3 types
		fleet.LayoutCurrent:       1800,
		fleet.LayoutPod:           600,
		fleet.LayoutNodeNamespace: 50, // pod p on node p%10 in namespace (p/10)%5: every pair
		// The stream keeps the last 1800/7 = 257 messages, each on a
		// subject of its own; the archive all 1,800 on 50 pairs × 3 types.
		fleet.LayoutArchive: 257 + 150,
	}
	wantMessages := map[string]uint64{fleet.LayoutArchive: 257 + 1800}
	if len(rep.Runs) != len(want) || len(rep.Baselines) != 1 {
		t.Fatalf("%d measurements and %d baselines, want %d and 1\n%s", len(rep.Runs), len(rep.Baselines), len(want), table.String())
	}
	for _, r := range rep.Runs {
		msgs := cmp.Or(wantMessages[r.Layout], 1800)
		if r.Subjects != want[r.Layout] || r.Messages != msgs {
			t.Errorf("%s: %d messages on %d subjects, want %d on %d", r.Layout, r.Messages, r.Subjects, msgs, want[r.Layout])
		}
		if r.RestartRSS <= 0 || r.LastRSS <= 0 || r.PeakRSS <= 0 || r.Ingest <= 0 {
			t.Errorf("%s: RSS after restart %d (last %d), peak %d, ingest %v: want all measured", r.Layout, r.RestartRSS, r.LastRSS, r.PeakRSS, r.Ingest)
		}
		if !strings.Contains(table.String(), "\n"+r.Layout+" ") && !strings.Contains(table.String(), " "+r.Layout+"  ") {
			t.Errorf("the table has no row for %s", r.Layout)
		}
	}
	if b := rep.Baselines[0]; b.Messages != 0 || b.Subjects != 0 || b.RestartRSS <= 0 {
		t.Errorf("baseline: %d messages, %d subjects, RSS %d: want an empty stream, measured", b.Messages, b.Subjects, b.RestartRSS)
	}
	if t.Failed() {
		t.Logf("progress:\n%s\n%s", progress.String(), table.String())
	}
}

// Options that make no sense are refused together, each by its flag's
// name, before any server starts.
func TestSubjectMemoryRefusesBadOptionsByTheirFlags(t *testing.T) {
	t.Parallel()
	_, err := fleet.MeasureSubjectMemory(context.Background(), fleet.SubjectMemOptions{
		Pods:             -1,
		Layouts:          []string{fleet.LayoutPod, "per-container", fleet.LayoutPod},
		DuplicateWindows: []time.Duration{time.Millisecond},
		ChildCommand:     []string{os.Args[0]},
	})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"--pods=-1", `unknown layout "per-container"`, "pod named twice", "--duplicate-windows: 1ms", "--dir is empty"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
