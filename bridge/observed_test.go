package bridge_test

import (
	"slices"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// TestAnEventFoundAfterARestartIsObservedAfterIt: a container exits while
// no bridge runs. The restarted bridge reports its ContainerDied with the
// runtime's time of the exit (time, finishedAt), before the restart, and
// observedAt when this bridge first saw it exited: at or after the
// restart. In generic mode the first relist finds it; on containerd 2.4 in
// auto mode the runtime replays the exit it kept while nobody listened,
// stamped with the runtime's time of the exit, and the first relist races
// it: whichever reports the exit first, observedAt must follow the
// definition.
func TestAnEventFoundAfterARestartIsObservedAfterIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		runtime    crisim.Options
		mode       generator.Mode
		detectedBy []string // either, where the replay and the first relist race
	}{
		{"generic mode, found by the first relist", crisim.Options{}, generator.ModeGeneric, []string{"relist"}},
		{"auto mode on containerd 2.4, replayed by the runtime", crisim.Containerd24Options(), generator.ModeAuto, []string{"evented", "relist"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			model := crisim.NewRuntime(tc.runtime)
			_, endpoint := crisimtest.Serve(t, model)
			_, url := publishtest.NewServer(t)
			_, js := publishtest.Connect(t, url)
			opts := testOptions(endpoint, url, t.TempDir())
			opts.Mode = tc.mode
			n := &testNode{model: model, endpoint: endpoint, url: url, js: js}
			_, ids := n.startPod(t, "app")
			_, stop := runBridge(t, opts)
			readEvents(t, js, "PLEG", 2)
			stop()

			if err := model.StopContainer(ids[0], 3, "Error", ""); err != nil {
				t.Fatal(err)
			}
			restart := time.Now()
			_, stop = runBridge(t, opts)
			died := readEvents(t, js, "PLEG", 3)[2]
			stop()
			if died.LifecycleType() != "ContainerDied" || died.ContainerID != ids[0] {
				t.Fatalf("the third event is %s of %s, want the ContainerDied of %s", died.LifecycleType(), died.ContainerID, ids[0])
			}
			d := died.Data
			if !slices.Contains(tc.detectedBy, d.DetectedBy) {
				t.Errorf("detectedBy %s, want one of %v", d.DetectedBy, tc.detectedBy)
			}
			if d.FinishedAt == nil || !died.Time.Equal(*d.FinishedAt) || !died.Time.Before(restart) {
				t.Errorf("time %v, finishedAt %v: want the runtime's time of the exit, before the restart at %v", died.Time, d.FinishedAt, restart)
			}
			if d.ObservedAt.Before(restart) {
				t.Errorf("observedAt %v is before the restart at %v: no bridge saw the exit then", d.ObservedAt, restart)
			}
		})
	}
}
