package generator_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	"github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/generator/generatortest"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// mismatches reads pleg_bridge_task_event_mismatches_total{field}.
func mismatches(t *testing.T, f *fixture, field string) float64 {
	t.Helper()
	return metricstest.Value(t, f.reg, "pleg_bridge_task_event_mismatches_total", map[string]string{"field": field})
}

// noMismatches fails unless every field's mismatch counter is 0.
func noMismatches(t *testing.T, f *fixture) {
	t.Helper()
	for _, field := range []string{"exit_code", "finished_at", "reason"} {
		if n := mismatches(t, f, field); n != 0 {
			t.Errorf("pleg_bridge_task_event_mismatches_total{field=%q} = %v, want 0", field, n)
		}
	}
}

// TestATaskExitIsReportedAtOnceAndCRIChecksIt: containerd publishes a
// container's exit while its CRI plugin still shows it running. The Died
// comes at once, from the exit, with its exit code and finish time to the
// nanosecond, the reason CRI will give and the rest from the cache; once
// CRI shows the exit, its status is read and agrees, and nothing more is
// published.
func TestATaskExitIsReportedAtOnceAndCRIChecksIt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1", Name: "web-0", Namespace: "shop"}))
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app", Image: "registry.example/app:1.2"}))
		must(0, m.StartContainer(c))
		started := f.rec.Wait(t, 2, time.Second)[1]
		advance(10 * time.Second) // past every look the starts asked for

		// Exited 137 ns past a second: the event's time must be kept whole.
		time.Sleep(137 * time.Nanosecond)
		exited := must(m.ExitTask(c, 3, false))
		took := time.Now()
		evs := f.rec.Wait(t, 3, time.Second)
		if d := time.Since(took); d != 0 {
			t.Errorf("the Died came %v after the task's exit, want at once", d)
		}
		died := evs[2]
		if got := generatortest.Line(died); got != "ContainerDied "+c+" exited 3 evented" {
			t.Errorf("got %s, want ContainerDied exited 3 evented", got)
		}
		if !died.FinishedAt.Equal(exited) || died.FinishedAt.UnixNano() != exited.UnixNano() || !died.Time.Equal(exited) {
			t.Errorf("Died finishedAt %v time %v, want the exit's %v to the nanosecond", died.FinishedAt, died.Time, exited)
		}
		if died.Reason != "Error" || died.Pod != started.Pod || died.Container != started.Container || !died.StartedAt.Equal(started.StartedAt) {
			t.Errorf("Died reason %q pod %+v container %+v startedAt %v; want Error and the Started's %+v %+v %v",
				died.Reason, died.Pod, died.Container, died.StartedAt, started.Pod, started.Container, started.StartedAt)
		}

		// CRI is late: the exit is looked at again until it shows it.
		advance(200 * time.Millisecond)
		if n := triggerCount(t, f, "relooked"); n == 0 {
			t.Error("no targeted relist looked again while CRI did not show the exit yet")
		}
		confirmed := triggerCount(t, f, "confirmed")
		must(0, m.StopContainer(c, 3, "Error", ""))
		advance(10 * time.Second)
		if n := triggerCount(t, f, "confirmed") - confirmed; n != 1 {
			t.Errorf("%v exits confirmed once CRI showed it, want 1", n)
		}
		noMismatches(t, f)
		if n := len(f.rec.Events()); n != 3 {
			t.Errorf("%d events, want 3 (CRI's view of the exit publishes nothing):\n%s", n, generatortest.Summary(f.rec.Events()))
		}
		must(0, m.RemoveContainer(c))
		evs = f.rec.Wait(t, 4, time.Second)
		if got := generatortest.Line(evs[3]); got != "ContainerRemoved "+c+" removed 3 relist" {
			t.Errorf("got %s, want ContainerRemoved removed 3 relist", got)
		}
	})
}

// TestATaskExitCRIContradictsIsCountedAndNotPublishedAgain: where CRI's
// status says otherwise than the task exit did, each field that differs
// is counted and logged with both values, and nothing is published again.
func TestATaskExitCRIContradictsIsCountedAndNotPublishedAgain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var logs strings.Builder
		f, stop := startTriggered(t, generator.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		defer stop()
		m := f.rt.Model()
		_, c := runningPod(t, f)
		advance(10 * time.Second)
		must(m.ExitTask(c, 3, false))
		f.rec.Wait(t, 3, time.Second)
		must(0, m.StopContainer(c, 4, "Error", ""))
		advance(10 * time.Second)
		for field, want := range map[string]float64{"exit_code": 1, "finished_at": 0, "reason": 0} {
			if got := mismatches(t, f, field); got != want {
				t.Errorf("pleg_bridge_task_event_mismatches_total{field=%q} = %v, want %v", field, got, want)
			}
		}
		if !strings.Contains(logs.String(), "field=exit_code published=3 cri=4") {
			t.Errorf("no Warn with both exit codes; logs:\n%s", logs.String())
		}
		evs := f.rec.Events()
		if len(evs) != 3 || *evs[2].ExitCode != 3 {
			t.Errorf("events %v, want Started, Started and one Died with the task's exit code 3", generatortest.Lines(evs, nil))
		}
	})
}

// TestAnOOMKillIsReportedOOMKilledFromTheTaskEvents: containerd's shim
// reports /tasks/oom before the exit; the Died says OOMKilled, as CRI will.
func TestAnOOMKillIsReportedOOMKilledFromTheTaskEvents(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		_, c := runningPod(t, f)
		advance(10 * time.Second)
		must(m.ExitTask(c, 137, true))
		died := f.rec.Wait(t, 3, time.Second)[2]
		if died.DetectedBy != generator.SourceEvented || died.Reason != "OOMKilled" || *died.ExitCode != 137 {
			t.Errorf("Died %s reason %q, want exit 137 OOMKilled from the events", generatortest.Line(died), died.Reason)
		}
		must(0, m.StopContainer(c, 137, "OOMKilled", ""))
		advance(10 * time.Second)
		noMismatches(t, f)
		if n := triggerCount(t, f, "oom"); n != 1 {
			t.Errorf("pleg_bridge_containerd_triggers_total{result=\"oom\"} = %v, want 1", n)
		}
	})
}

// TestReplayedAndReorderedTaskExitsPublishNothingTwice: the same exit twice,
// an exit of a container the cache knows only created (its start not seen
// yet), and an exit of a removed container publish no second Died and no
// Died before its Started.
func TestReplayedAndReorderedTaskExitsPublishNothingTwice(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		sb, c := runningPod(t, f)
		advance(10 * time.Second)
		exitOf := func(id string, code uint32) *eventtypes.TaskExit {
			return &eventtypes.TaskExit{ContainerID: id, ID: id, ExitStatus: code, ExitedAt: timestamppb.Now()}
		}

		// The same exit twice, as a second subscriber or a replay gives it.
		must(m.ExitTask(c, 0, false))
		f.rec.Wait(t, 3, time.Second)
		must(0, m.InjectTaskEvent(crisim.K8sNamespace, crisim.TopicTaskExit, exitOf(c, 0)))
		advance(time.Second)
		must(0, m.StopContainer(c, 0, "Completed", ""))
		advance(10 * time.Second)

		// An exit that comes before the container's start is seen: the
		// cache holds it created.
		c2 := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "late"}))
		f.gen.RequestRelist()
		advance(time.Second)
		f.rt.Mute() // its start's own events come late
		must(0, m.StartContainer(c2))
		f.rt.Unmute()
		must(0, m.InjectTaskEvent(crisim.K8sNamespace, crisim.TopicTaskExit, exitOf(c2, 1)))
		advance(time.Millisecond)
		if got := generatortest.Lines(f.rec.Events()[3:], map[string]string{c2: "c2"}); !cmp.Equal(got, []string{"ContainerStarted c2 running - relist"}) {
			t.Errorf("after an exit that came before its start was seen: %v, want only its Started (from CRI)", got)
		}
		must(0, m.StopContainer(c2, 1, "Error", ""))
		advance(10 * time.Second)

		// An exit of a container removed meanwhile.
		must(0, m.RemoveContainer(c))
		advance(time.Second)
		must(0, m.InjectTaskEvent(crisim.K8sNamespace, crisim.TopicTaskExit, exitOf(c, 2)))
		advance(10 * time.Second)

		got := generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c: "c", c2: "c2"})
		want := []string{
			"ContainerStarted sb running - relist",
			"ContainerStarted c running - relist",
			"ContainerDied c exited 0 evented",
			"ContainerStarted c2 running - relist",
			"ContainerDied c2 exited 1 evented", // from its stop's task exit
			"ContainerRemoved c removed 0 relist",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
		noMismatches(t, f)
	})
}

// TestATaskExitOfAContainerNotCachedIsResolvedAsBefore: an exit that names
// a container the cache does not hold yet is left to CRI, through the
// trigger's lookup and targeted relists: its start is reported first.
func TestATaskExitOfAContainerNotCachedIsResolvedAsBefore(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		f.rt.Mute()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
		must(0, m.StartContainer(c))
		f.rt.Unmute()
		must(m.ExitTask(c, 2, false))
		advance(100 * time.Millisecond)
		must(0, m.StopContainer(c, 2, "Error", ""))
		advance(10 * time.Second)
		got := generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c: "c"})
		want := []string{
			"ContainerStarted sb running - relist",
			"ContainerStarted c running - relist",
			"ContainerDied c exited 2 relist",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
	})
}

// TestExitsFromCRILeavesTaskExitsToRelists: with Options.ExitsFromCRI a
// task exit only asks for targeted relists, as before, so the Died waits
// for CRI.
func TestExitsFromCRILeavesTaskExitsToRelists(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{ExitsFromCRI: true})
		defer stop()
		m := f.rt.Model()
		_, c := runningPod(t, f)
		advance(10 * time.Second)
		must(m.ExitTask(c, 3, false))
		advance(time.Second)
		if n := len(f.rec.Events()); n != 2 {
			t.Errorf("%d events before CRI showed the exit, want 2", n)
		}
		must(0, m.StopContainer(c, 3, "Error", ""))
		died := f.rec.Wait(t, 3, 10*time.Second)[2]
		if got := generatortest.Line(died); got != "ContainerDied "+c+" exited 3 relist" {
			t.Errorf("got %s, want ContainerDied exited 3 relist", got)
		}
	})
}

// TestABurstOfTaskExitsIsReportedBeforeCRIShowsAny: a hundred containers
// exiting together are all reported from their exits while CRI shows none
// of them; CRI's later view agrees with each, and publishes nothing.
func TestABurstOfTaskExitsIsReportedBeforeCRIShowsAny(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		const n = 100
		ids := runningPods(t, f, n)
		advance(10 * time.Second)
		for i, c := range ids {
			must(m.ExitTask(c, int32(i%3), false))
		}
		took := time.Now()
		evs := f.rec.Wait(t, 3*n, time.Second)
		if d := time.Since(took); d != 0 {
			t.Errorf("%d exits reported %v after they happened, want at once", n, d)
		}
		for _, e := range evs[2*n:] {
			if e.Type != generator.ContainerDied || e.DetectedBy != generator.SourceEvented {
				t.Errorf("%s, want ContainerDied from the events", generatortest.Line(e))
			}
		}
		for i, c := range ids {
			reason := "Error"
			if i%3 == 0 {
				reason = "Completed"
			}
			must(0, m.StopContainer(c, int32(i%3), reason, ""))
		}
		advance(time.Minute)
		if got := len(f.rec.Events()); got != 3*n {
			t.Errorf("%d events, want %d (each once)", got, 3*n)
		}
		noMismatches(t, f)
	})
}

// TestTheModeLineSaysWhichPathExitsTake: containerd's event service gives
// exits from the task's exit (unless ExitsFromCRI); a runtime without it
// (CRI-O, whose CRI stream auto mode follows) leaves them to CRI, and a
// runtime's task exits there change nothing.
func TestTheModeLineSaysWhichPathExitsTake(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		mopts crisim.Options
		gopts generator.Options
		want  string
	}{
		{"containerd 1.7", crisim.Containerd17Options(), generator.Options{}, "exits=containerd-task-exit"},
		{"containerd 1.7, exits from CRI", crisim.Containerd17Options(), generator.Options{ExitsFromCRI: true}, "exits=cri"},
		{"containerd 2.4, containerd-events", crisim.Options{}, generator.Options{Mode: generator.ModeContainerdEvents}, "exits=containerd-task-exit"},
		{"containerd 2.4, CRI stream", crisim.Options{}, generator.Options{}, "exits=containerd-task-exit"},
		{"containerd 2.4, CRI stream, exits from CRI", crisim.Options{}, generator.Options{ExitsFromCRI: true}, "exits=cri"},
		{"CRI-O", crisim.Options{RuntimeName: "cri-o", RuntimeVersion: "1.31.0"}, generator.Options{}, "exits=cri"},
		{"CRI-O, containerd-events", crisim.Options{RuntimeName: "cri-o", RuntimeVersion: "1.31.0"}, generator.Options{Mode: generator.ModeContainerdEvents}, "exits=cri"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs strings.Builder
				if tc.gopts.Mode == "" {
					tc.gopts.Mode = generator.ModeAuto
				}
				tc.gopts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				f := newFixture(t, tc.mopts, tc.gopts)
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				go func() { done <- f.gen.Run(ctx) }()
				advance(2 * time.Second)
				m := f.rt.Model()
				c := must(m.CreateContainer(must(m.RunPodSandbox(crisim.PodConfig{})), crisim.ContainerConfig{}))
				must(0, m.StartContainer(c))
				f.rec.Wait(t, 2, 5*time.Second) // by the stream, a trigger or the relist
				advance(10 * time.Second)
				must(m.ExitTask(c, 1, false))
				advance(time.Millisecond)
				died := len(f.rec.Events()) == 3
				cancel()
				<-done
				var line string
				for _, l := range strings.Split(logs.String(), "\n") {
					if strings.Contains(l, "following the runtime's events") || strings.Contains(l, "relisting only") {
						line = l
					}
				}
				if !strings.Contains(line, tc.want) {
					t.Errorf("mode line %q, want it to say %s", line, tc.want)
				}
				if wantDied := tc.want == "exits=containerd-task-exit"; died != wantDied {
					t.Errorf("Died reported from the task's exit alone: %v, want %v", died, wantDied)
				}
			})
		})
	}
}

// TestTaskExitsBesideTheStreamAskForNoRelistDuringItsReplay: on containerd
// 2.x the CRI stream is followed, with containerd's task exits beside it.
// While the stream is down, an exit of a container the cache holds running
// is reported at once from its task exit; the exits of the pods that come
// and go meanwhile, which the cache does not know, ask for nothing (a
// relist merged before the stream's replay would lose their starts), and
// the replay reports them whole.
func TestTaskExitsBesideTheStreamAskForNoRelistDuringItsReplay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Containerd24Options(), generator.Options{
			Mode: generator.ModeEvented, EventedRelistPeriod: time.Hour,
			StreamBackoffMin: 5 * time.Second, StreamBackoffMax: 5 * time.Second, StreamFailureLimit: 10,
		})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		advance(time.Second)
		if f.rt.OpenStreams() != 1 || f.rt.OpenTaskStreams() != 1 {
			t.Fatalf("%d CRI streams and %d task subscriptions open, want 1 and 1", f.rt.OpenStreams(), f.rt.OpenTaskStreams())
		}
		m := f.rt.Model()
		sb0, c0 := runningPod(t, f)
		advance(time.Second)

		f.rt.FailNext("WatchEvents", status.Error(codes.Unavailable, "restarting"))
		f.rt.EndStreams(codes.Unavailable)
		advance(time.Second)
		lists := len(f.rt.ListCalls("ListContainers"))
		must(0, m.StopContainer(c0, 7, "Error", ""))
		died := f.rec.Wait(t, 3, time.Second)[2]
		if got := generatortest.Line(died); got != "ContainerDied "+c0+" exited 7 evented" {
			t.Errorf("while the stream is down: %s, want ContainerDied exited 7 from the task's exit", got)
		}
		want := replayScenario(t, m)
		advance(time.Millisecond)
		if n := len(f.rt.ListCalls("ListContainers")) - lists; n != 0 {
			t.Errorf("%d listings while the stream was down, want none before its replay", n)
		}
		for f.rt.OpenStreams() == 0 {
			advance(100 * time.Millisecond)
		}
		advance(time.Second)
		want[sb0] = []string{"ContainerStarted"}
		want[c0] = []string{"ContainerStarted", "ContainerDied"}
		if diff := cmp.Diff(want, eventTypesByContainer(f.rec.Events())); diff != "" {
			t.Errorf("events per container (-want +got):\n%s", diff)
		}
		noMismatches(t, f)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

// TestAnExitFromBeforeTheSubscriptionIsLeftToCRI: containerd's shim
// forwards the exits it could not deliver while containerd was down once
// it is back, and CRI, which recovered the container meanwhile, may report
// them otherwise (255, Unknown). An exit that ended before the
// subscription delivering it was opened is reported by CRI, on containerd
// 1.7 (containerd's events) as on 2.4 (beside the CRI stream).
func TestAnExitFromBeforeTheSubscriptionIsLeftToCRI(t *testing.T) {
	t.Parallel()
	for name, mopts := range map[string]crisim.Options{"1.7": crisim.Containerd17Options(), "2.4": crisim.Containerd24Options()} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture(t, mopts, generator.Options{Mode: generator.ModeAuto, EventedRelistPeriod: time.Hour})
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				go func() { done <- f.gen.Run(ctx) }()
				defer func() {
					cancel()
					<-done
				}()
				before := time.Now()
				advance(2 * time.Second)
				_, c := runningPod(t, f)
				advance(10 * time.Second)
				exit := &eventtypes.TaskExit{ContainerID: c, ID: c, ExitStatus: 7, ExitedAt: timestamppb.New(before.Add(-time.Second))}
				must(0, f.rt.Model().InjectTaskEvent(crisim.K8sNamespace, crisim.TopicTaskExit, exit))
				advance(time.Second)
				if n := len(f.rec.Events()); n != 2 {
					t.Errorf("%d events after an exit from before the subscription, want the 2 starts alone:\n%s", n, generatortest.Summary(f.rec.Events()))
				}
				must(0, f.rt.Model().StopContainer(c, 255, "Unknown", ""))
				died := f.rec.Wait(t, 3, 40*time.Second)[2]
				if *died.ExitCode != 255 || died.Reason != "Unknown" {
					t.Errorf("Died %s reason %q, want CRI's 255 Unknown", generatortest.Line(died), died.Reason)
				}
				noMismatches(t, f)
			})
		})
	}
}
