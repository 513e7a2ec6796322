package cri_test

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/generator/generatortest"
)

var cmpSorted = cmp.Transformer("sort", func(in []string) []string { return slices.Sorted(slices.Values(in)) })

// TestAContainerListedRunningIsReportedStartedThoughItsStatusWasNeverRead:
// a relist lists a container running as the runtime stops serving, so its
// status call fails; when the runtime answers again the container is gone.
// It ran (a CRI container is listed running only once started), so its
// ContainerStarted comes before its Died and Removed, at the time of the
// listing that showed it running, with no started_at (unknown, not
// invented). One first listed exited may never have started (containerd
// lists a container whose start failed as exited, with no started_at): it
// is reported Died and Removed only. Over the CRI socket, as in production.
func TestAContainerListedRunningIsReportedStartedThoughItsStatusWasNeverRead(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Containerd17Options())
	srv, ep := crisimtest.Serve(t, model)
	rec := generatortest.NewRecorder()
	gen := generator.New(newClient(t, ep, cri.Options{}), rec, generator.Options{Logger: slog.New(slog.DiscardHandler)})
	ctx := t.Context()
	sb := must(model.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
	run := must(model.CreateContainer(sb, crisim.ContainerConfig{Name: "run"}))
	must(0, model.StartContainer(run))
	exit := must(model.CreateContainer(sb, crisim.ContainerConfig{Name: "exit"}))
	must(0, model.StartContainer(exit))
	must(0, model.StopContainer(exit, 3, "Error", ""))
	names := map[string]string{sb: "sb", run: "run", exit: "exit"}

	// The runtime stops answering between the listing and the status calls.
	srv.FailNext("ContainerStatus", codes.Unavailable)
	srv.FailNext("ContainerStatus", codes.Unavailable)
	listedAfter := time.Now()
	if err := gen.Relist(ctx); err != nil {
		t.Fatal(err)
	}
	listedBefore := time.Now()
	if diff := cmp.Diff([]string{"ContainerStarted sb running - relist"}, generatortest.Lines(rec.Events(), names)); diff != "" {
		t.Fatalf("events of the relist whose status calls failed (-want +got):\n%s", diff)
	}
	// Back, without them.
	must(0, model.RemoveContainer(run))
	must(0, model.RemoveContainer(exit))
	if err := gen.Relist(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ContainerStarted sb running - relist",
		"ContainerStarted run running - relist",
		"ContainerDied run unknown - relist",
		"ContainerRemoved run removed - relist",
		"ContainerDied exit unknown - relist",
		"ContainerRemoved exit removed - relist",
	}
	if diff := cmp.Diff(want, generatortest.Lines(rec.Events(), names), cmpSorted); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	var ofRun []generator.Event
	for _, e := range rec.Events() {
		if e.Container.ID == run {
			ofRun = append(ofRun, e)
		}
	}
	if diff := cmp.Diff(want[1:4], generatortest.Lines(ofRun, names)); diff != "" {
		t.Fatalf("the container's events out of order (-want +got):\n%s", diff)
	}
	for _, e := range ofRun {
		if e.Type != generator.ContainerStarted {
			continue
		}
		if e.Time.Before(listedAfter) || e.Time.After(listedBefore) || !e.StartedAt.IsZero() {
			t.Errorf("start at %v with startedAt %v, want the time of the relist that listed it running (%v to %v) and no startedAt",
				e.Time, e.StartedAt, listedAfter, listedBefore)
		}
	}
}
