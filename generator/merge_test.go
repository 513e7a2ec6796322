package generator

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

func code(c int32) *int32 { return &c }

// brief is the part of an Event that the merge tables compare.
type brief struct {
	Type  LifecycleEventType
	ID    string
	State State
	Exit  string
	Time  time.Time
	Src   Source
}

func briefs(evs []Event) []brief {
	var out []brief
	for _, e := range evs {
		exit := "-"
		if e.ExitCode != nil {
			exit = fmt.Sprint(*e.ExitCode)
		}
		out = append(out, brief{e.Type, e.Container.ID, e.State, exit, e.Time, e.DetectedBy})
	}
	return out
}

var testPod = Pod{UID: "uid-1", Namespace: "default", Name: "web-0"}

func running(id string, started time.Time) sighting {
	return sighting{info: Container{ID: id, Name: "app"}, sandboxID: "sb", state: stateRunning, startedAt: started}
}

func exited(id string, started, finished time.Time, exit int32) sighting {
	return sighting{info: Container{ID: id, Name: "app"}, sandboxID: "sb", state: stateExited,
		startedAt: started, finishedAt: finished, exitCode: code(exit), reason: "Error"}
}

func created(id string) sighting {
	return sighting{info: Container{ID: id, Name: "app"}, sandboxID: "sb", state: stateCreated}
}

// listedRunning is a container a relist at listed running, whose status
// call failed (see relister.inspect).
func listedRunning(id string, listed time.Time) sighting {
	s := created(id)
	s.listedRunningAt = listed
	return s
}

func gone(id string) sighting {
	return sighting{info: Container{ID: id}, sandboxID: "sb", state: stateGone}
}

type step struct {
	src            Source
	at             time.Time
	complete       bool
	scope          map[string]bool
	containersOnly bool
	seen           []sighting
}

func relistStep(when time.Time, seen ...sighting) step {
	return step{src: SourceRelist, at: when, complete: true, seen: seen}
}

func streamStep(when time.Time, seen ...sighting) step {
	return step{src: SourceEvented, at: when, seen: seen}
}

func runSteps(steps []step) []Event {
	var rec *podRecord
	var all []Event
	for _, s := range steps {
		var evs []Event
		rec, evs = mergePod(rec, podObservation{pod: testPod, containers: s.seen, complete: s.complete, scope: s.scope, containersOnly: s.containersOnly}, s.src, s.at)
		all = append(all, evs...)
	}
	return all
}

func TestMergeTransitions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		steps []step
		want  []brief
	}{
		{
			name:  "a container first seen running is reported started at its start time",
			steps: []step{relistStep(at(10), running("c1", at(3)))},
			want:  []brief{{ContainerStarted, "c1", StateRunning, "-", at(3), SourceRelist}},
		},
		{
			name:  "a container first seen exited gets a synthesized start before its death",
			steps: []step{relistStep(at(10), exited("c1", at(3), at(8), 3))},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(3), SourceRelist},
				{ContainerDied, "c1", StateExited, "3", at(8), SourceRelist},
			},
		},
		{
			name: "a sandbox first seen not ready dies without a synthesized start",
			steps: []step{relistStep(at(10), sighting{info: Container{ID: "sb", Sandbox: true}, sandboxID: "sb",
				state: stateExited, createdAt: at(1)})},
			want: []brief{{ContainerDied, "sb", StateExited, "-", at(10), SourceRelist}},
		},
		{
			name: "a ready sandbox starts at its creation time",
			steps: []step{relistStep(at(10), sighting{info: Container{ID: "sb", Sandbox: true}, sandboxID: "sb",
				state: stateRunning, createdAt: at(1)})},
			want: []brief{{ContainerStarted, "sb", StateRunning, "-", at(1), SourceRelist}},
		},
		{
			name:  "a created container produces nothing while it exists",
			steps: []step{relistStep(at(10), created("c1"))},
		},
		{
			name: "running then exited then gone produces started, died, removed",
			steps: []step{
				relistStep(at(10), running("c1", at(3))),
				relistStep(at(11), exited("c1", at(3), at(10), 0)),
				relistStep(at(12)),
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(3), SourceRelist},
				{ContainerDied, "c1", StateExited, "0", at(10), SourceRelist},
				{ContainerRemoved, "c1", StateRemoved, "0", at(12), SourceRelist},
			},
		},
		{
			name: "a running container found gone dies with state unknown and is removed",
			steps: []step{
				relistStep(at(10), running("c1", at(3))),
				relistStep(at(11)),
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(3), SourceRelist},
				{ContainerDied, "c1", StateUnknown, "-", at(11), SourceRelist},
				{ContainerRemoved, "c1", StateRemoved, "-", at(11), SourceRelist},
			},
		},
		{
			name: "a created container found gone dies and is removed",
			steps: []step{
				relistStep(at(10), created("c1")),
				relistStep(at(11)),
			},
			want: []brief{
				{ContainerDied, "c1", StateUnknown, "-", at(11), SourceRelist},
				{ContainerRemoved, "c1", StateRemoved, "-", at(11), SourceRelist},
			},
		},
		{
			name: "a container listed running whose status was never read, found gone, starts at that listing before it dies",
			steps: []step{
				relistStep(at(10), listedRunning("c1", at(10))),
				relistStep(at(11), listedRunning("c1", at(11))),
				relistStep(at(12)),
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(10), SourceRelist},
				{ContainerDied, "c1", StateUnknown, "-", at(12), SourceRelist},
				{ContainerRemoved, "c1", StateRemoved, "-", at(12), SourceRelist},
			},
		},
		{
			name: "a container listed running whose status is read later starts at its started_at",
			steps: []step{
				relistStep(at(10), listedRunning("c1", at(10))),
				relistStep(at(11), exited("c1", at(3), at(8), 1)),
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(3), SourceRelist},
				{ContainerDied, "c1", StateExited, "1", at(8), SourceRelist},
			},
		},
		{
			name: "a container listed running whose status was never read, seen running without started_at, starts at that listing",
			steps: []step{
				relistStep(at(10), listedRunning("c1", at(10))),
				relistStep(at(11), running("c1", time.Time{})),
			},
			want: []brief{{ContainerStarted, "c1", StateRunning, "-", at(10), SourceRelist}},
		},
		{
			name: "the same transition seen by both sources is reported once",
			steps: []step{
				streamStep(at(5), running("c1", at(5))),
				relistStep(at(6), running("c1", at(5))),
				streamStep(at(7), exited("c1", at(5), at(7), 1)),
				relistStep(at(8), exited("c1", at(5), at(7), 1)),
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(5), SourceEvented},
				{ContainerDied, "c1", StateExited, "1", at(7), SourceEvented},
			},
		},
		{
			name: "a stale running sighting after the exit moves nothing backwards",
			steps: []step{
				streamStep(at(7), exited("c1", at(5), at(7), 1)),
				relistStep(at(6), running("c1", at(5))),
				streamStep(at(5), running("c1", at(5))),
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(5), SourceEvented},
				{ContainerDied, "c1", StateExited, "1", at(7), SourceEvented},
			},
		},
		{
			name: "a relist that began before a newer stream sighting does not declare the container gone",
			steps: []step{
				relistStep(at(10)),
				streamStep(at(12), created("c1")),
				relistStep(at(11)),
			},
		},
		{
			name: "a later relist that no longer lists a stream-seen container removes it",
			steps: []step{
				streamStep(at(12), running("c1", at(12))),
				relistStep(at(13)),
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(12), SourceEvented},
				{ContainerDied, "c1", StateUnknown, "-", at(13), SourceRelist},
				{ContainerRemoved, "c1", StateRemoved, "-", at(13), SourceRelist},
			},
		},
		{
			name: "a container seen only by the stream is reported completely",
			steps: []step{
				relistStep(at(10)),
				streamStep(at(10), created("c1")),
				streamStep(at(11), running("c1", at(11))),
				streamStep(at(12), exited("c1", at(11), at(12), 2)),
				streamStep(at(13), gone("c1")),
				relistStep(at(14)),
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(11), SourceEvented},
				{ContainerDied, "c1", StateExited, "2", at(12), SourceEvented},
				{ContainerRemoved, "c1", StateRemoved, "2", at(13), SourceEvented},
			},
		},
		{
			name: "late and duplicated stream events after removal are ignored",
			steps: []step{
				streamStep(at(11), running("c1", at(11))),
				streamStep(at(13), gone("c1")),
				streamStep(at(12), exited("c1", at(11), at(12), 2)),
				streamStep(at(11), running("c1", at(11))),
				streamStep(at(13), gone("c1")),
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(11), SourceEvented},
				{ContainerDied, "c1", StateUnknown, "-", at(13), SourceEvented},
				{ContainerRemoved, "c1", StateRemoved, "-", at(13), SourceEvented},
			},
		},
		{
			name: "a lone deletion of an unknown container invents nothing",
			steps: []step{
				streamStep(at(13), gone("c1")),
				streamStep(at(11), running("c1", at(11))),
			},
		},
		{
			name: "unknown state produces nothing until the container runs",
			steps: []step{
				relistStep(at(10), sighting{info: Container{ID: "c1"}, sandboxID: "sb", state: stateUnknown}),
				relistStep(at(11), running("c1", at(9))),
			},
			want: []brief{{ContainerStarted, "c1", StateRunning, "-", at(9), SourceRelist}},
		},
		{
			name: "a targeted relist of one sandbox removes nothing of another",
			steps: []step{
				relistStep(at(10), running("c1", at(3)), sighting{info: Container{ID: "c2"}, sandboxID: "sb2", state: stateRunning, startedAt: at(4)}),
				{src: SourceRelist, at: at(11), complete: true, scope: map[string]bool{"sb2": true}},
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(3), SourceRelist},
				{ContainerStarted, "c2", StateRunning, "-", at(4), SourceRelist},
				{ContainerDied, "c2", StateUnknown, "-", at(11), SourceRelist},
				{ContainerRemoved, "c2", StateRemoved, "-", at(11), SourceRelist},
			},
		},
		{
			name: "a targeted relist of a sandbox's containers removes them but not the sandbox",
			steps: []step{
				relistStep(at(10), running("c1", at(3)), sighting{info: Container{ID: "sb", Sandbox: true}, sandboxID: "sb", state: stateRunning, createdAt: at(1)}),
				{src: SourceRelist, at: at(11), complete: true, scope: map[string]bool{"sb": true}, containersOnly: true},
			},
			want: []brief{
				{ContainerStarted, "c1", StateRunning, "-", at(3), SourceRelist},
				{ContainerStarted, "sb", StateRunning, "-", at(1), SourceRelist},
				{ContainerDied, "c1", StateUnknown, "-", at(11), SourceRelist},
				{ContainerRemoved, "c1", StateRemoved, "-", at(11), SourceRelist},
			},
		},
		{
			name: "an exit code learnt after the death was reported does not report it again",
			steps: []step{
				streamStep(at(7), sighting{info: Container{ID: "c1"}, sandboxID: "sb", state: stateExited}),
				relistStep(at(8), exited("c1", at(5), at(7), 1)),
			},
			want: []brief{
				{ContainerDied, "c1", StateExited, "-", at(7), SourceEvented},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := briefs(runSteps(tt.steps))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMergePodLeavesOldRecordUntouched(t *testing.T) {
	t.Parallel()
	old, _ := mergePod(nil, podObservation{pod: testPod, containers: []sighting{running("c1", at(1))}, complete: true}, SourceRelist, at(2))
	before := *old.containers["c1"]
	cur, evs := mergePod(old, podObservation{pod: testPod, complete: true}, SourceRelist, at(3))
	if len(evs) != 2 {
		t.Fatalf("got %d events, want Died and Removed", len(evs))
	}
	if *old.containers["c1"] != before {
		t.Errorf("old record changed: %+v", *old.containers["c1"])
	}
	if cur.containers["c1"].state != stateGone {
		t.Errorf("new record state = %v, want gone", cur.containers["c1"].state)
	}
}

func TestMergePodUnchangedReturnsSameRecord(t *testing.T) {
	t.Parallel()
	obs := podObservation{pod: testPod, containers: []sighting{running("c1", at(1))}, complete: true}
	old, _ := mergePod(nil, obs, SourceRelist, at(2))
	cur, evs := mergePod(old, obs, SourceRelist, at(3))
	if cur != old || len(evs) != 0 {
		t.Errorf("an identical relist changed the record (same=%v) or produced %d events", cur == old, len(evs))
	}
}
