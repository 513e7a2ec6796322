package generator

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
)

type sliceSink struct{ events []Event }

func (s *sliceSink) Send(_ context.Context, evs []Event) error {
	s.events = append(s.events, evs...)
	return nil
}

// expectFromRecording derives, from the raw runtime events alone, what the
// contract prescribes for each container: Started if it was started (a
// sandbox is started by its creation), Died with the exit code the runtime
// reported if it stopped, Removed if it was deleted.
func expectFromRecording(evs []*runtimeapi.ContainerEventResponse) map[string][]string {
	want := map[string][]string{}
	add := func(id, line string) {
		if !slices.Contains(want[id], line) {
			want[id] = append(want[id], line)
		}
	}
	for _, ev := range evs {
		id := ev.GetContainerId()
		sandbox := id == ev.GetPodSandboxStatus().GetId() || ev.GetPodSandboxStatus() == nil
		switch ev.GetContainerEventType() {
		case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
			add(id, "ContainerStarted running -")
		case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
			exit := "-"
			if !sandbox {
				for _, st := range ev.GetContainersStatuses() {
					if st.GetId() == id {
						exit = fmt.Sprint(st.GetExitCode())
					}
				}
			}
			add(id, "ContainerDied exited "+exit)
		case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
			add(id, "ContainerRemoved removed")
		}
	}
	return want
}

func TestReplayRecordedContainerdStreams(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/cri-events/*.jsonl")
	if err != nil || len(files) < 2 {
		t.Fatalf("recordings missing: %v %v", files, err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			t.Parallel()
			evs := crisimtest.ReadRecording(t, path)
			sink := &sliceSink{}
			g := New(nil, sink, Options{})
			for i, ev := range evs {
				now := time.Unix(0, ev.GetCreatedAt()).Add(time.Millisecond)
				b, _, err := streamBatch(nil, ev, now, metaFilter{}, nil)
				if err != nil {
					t.Fatalf("event %d: %v", i+1, err)
				}
				if err := g.merge.apply(t.Context(), b); err != nil {
					t.Fatalf("event %d: %v", i+1, err)
				}
			}
			got := map[string][]string{}
			for _, e := range sink.events {
				exit := ""
				if e.Type != ContainerRemoved {
					exit = " -"
					if e.ExitCode != nil {
						exit = fmt.Sprintf(" %d", *e.ExitCode)
					}
				}
				got[e.Container.ID] = append(got[e.Container.ID], fmt.Sprintf("%s %s%s", e.Type, e.State, exit))
				if e.DetectedBy != SourceEvented || e.Pod.UID == "" || e.Time.IsZero() || e.Time.Year() < 2020 {
					t.Errorf("event %s of %s: detectedBy %s, pod %q, time %v", e.Type, e.Container.ID, e.DetectedBy, e.Pod.UID, e.Time)
				}
			}
			if diff := cmp.Diff(expectFromRecording(evs), got); diff != "" {
				t.Errorf("events per container (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReplayRecordingFacts(t *testing.T) {
	t.Parallel()
	// Facts of the v2.4.2 recording stated in its README: one container
	// exits with 3 and three with 1, all are removed.
	evs := crisimtest.ReadRecording(t, "testdata/cri-events/containerd-v2.4.2.jsonl")
	sink := &sliceSink{}
	g := New(nil, sink, Options{})
	for _, ev := range evs {
		b, _, err := streamBatch(nil, ev, time.Unix(0, ev.GetCreatedAt()), metaFilter{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.merge.apply(t.Context(), b); err != nil {
			t.Fatal(err)
		}
	}
	var exits []int32
	removed := map[bool]int{}
	for _, e := range sink.events {
		if e.Type == ContainerDied && !e.Container.Sandbox {
			exits = append(exits, *e.ExitCode)
		}
		if e.Type == ContainerRemoved {
			removed[e.Container.Sandbox]++
		}
	}
	slices.Sort(exits)
	if diff := cmp.Diff([]int32{1, 1, 1, 3}, exits); diff != "" {
		t.Errorf("exit codes (-want +got):\n%s", diff)
	}
	if removed[false] != 4 || removed[true] != 5 {
		t.Errorf("removed %d containers and %d sandboxes, want 4 and 5", removed[false], removed[true])
	}
}
