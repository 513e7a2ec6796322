package generator_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	"github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/generator/generatortest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// startTriggered runs a generator in auto mode on a containerd 1.7 model,
// with a safety-net relist too slow to matter, and waits for it to
// subscribe to containerd's events. It returns the fixture and a stop
// function.
func startTriggered(t *testing.T, gopts generator.Options) (*fixture, func()) {
	t.Helper()
	if gopts.Mode == "" {
		gopts.Mode = generator.ModeAuto
	}
	if gopts.EventedRelistPeriod == 0 {
		gopts.EventedRelistPeriod = time.Hour
	}
	f := newFixture(t, crisim.Containerd17Options(), gopts)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- f.gen.Run(ctx) }()
	advance(2 * time.Second) // past the settle relist
	return f, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}
}

// runningPod starts a pod with one container and waits for both starts to
// be reported.
func runningPod(t *testing.T, f *fixture) (sandbox, container string) {
	t.Helper()
	m := f.rt.Model()
	sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
	c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
	must(0, m.StartContainer(c))
	f.rec.Wait(t, 2, time.Second)
	return sb, c
}

// runningPods starts n pods of one container each, waits for their starts
// to be reported and a second more, and returns the containers' IDs.
func runningPods(t *testing.T, f *fixture, n int) []string {
	t.Helper()
	m := f.rt.Model()
	var ids []string
	for range n {
		sb := must(m.RunPodSandbox(crisim.PodConfig{}))
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
		must(0, m.StartContainer(c))
		ids = append(ids, c)
	}
	f.rec.Wait(t, 2*n, 5*time.Second)
	advance(time.Second)
	return ids
}

// fullRelists counts the ListContainers calls that listed the whole node.
func fullRelists(f *fixture) int {
	n := 0
	for _, sb := range f.rt.ListCalls("ListContainers") {
		if sb == "" {
			n++
		}
	}
	return n
}

// targetedRelistsOf counts the ListContainers calls that listed sandbox sb.
func targetedRelistsOf(f *fixture, sb string) int {
	n := 0
	for _, s := range f.rt.ListCalls("ListContainers") {
		if s == sb {
			n++
		}
	}
	return n
}

func TestAutoModeOnContainerd17FollowsContainerdsEventsWithoutTheCRIStream(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		if n := f.rt.OpenStreams(); n != 0 {
			t.Errorf("auto mode on containerd 1.7 has %d CRI event streams open, want none", n)
		}
		if n := f.rt.OpenTaskStreams(); n != 1 {
			t.Errorf("auto mode on containerd 1.7 has %d containerd event subscriptions, want 1", n)
		}
		if f.gen.Mode() != generator.ModeEvented {
			t.Errorf("mode = %s, want evented (events drive targeted relists)", f.gen.Mode())
		}
		full := fullRelists(f)

		// A pod's whole life, each step a few milliseconds after the last:
		// every transition must be reported by a targeted relist within
		// milliseconds of its step, long before the next full relist.
		m := f.rt.Model()
		step := func(what string, n int, fn func() error) {
			t.Helper()
			advance(5 * time.Millisecond)
			if err := fn(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			took := time.Now()
			f.rec.Wait(t, n, time.Second)
			if d := time.Since(took); d > 10*time.Millisecond {
				t.Errorf("%s reported after %v, want within 10ms", what, d)
			}
		}
		var sb, c string
		step("sandbox start", 1, func() (err error) { sb, err = m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}); return })
		c = must(m.CreateContainer(sb, crisim.ContainerConfig{}))
		step("container start", 2, func() error { return m.StartContainer(c) })
		step("container exit", 3, func() error { return m.StopContainer(c, 3, "Error", "") })
		step("container removal", 4, func() error { return m.RemoveContainer(c) })
		step("sandbox stop", 5, func() error { return m.StopPodSandbox(sb) })
		step("sandbox removal", 6, func() error { return m.RemovePodSandbox(sb) })
		advance(time.Minute)

		got := generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c: "c"})
		want := []string{
			"ContainerStarted sb running - relist",
			"ContainerStarted c running - relist",
			"ContainerDied c exited 3 evented", // from the task's exit
			"ContainerRemoved c removed 3 relist",
			"ContainerDied sb exited - evented",
			"ContainerRemoved sb removed - relist",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
		if n := fullRelists(f) - full; n != 0 {
			t.Errorf("%d full relists during the pod's life, want none: targeted relists report it", n)
		}
		if n := f.rt.OpenStreams(); n != 0 {
			t.Errorf("%d CRI event streams opened", n)
		}
	})
}

func TestAnExitTheListingDoesNotShowYetIsLookedAtAgainBounded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// Exits left to CRI: the trigger's own path.
		f, stop := startTriggered(t, generator.Options{ExitsFromCRI: true})
		defer stop()
		m := f.rt.Model()
		sb, c := runningPod(t, f)

		// containerd publishes the exit; its CRI plugin updates the status
		// 150 ms later.
		advance(10 * time.Second) // past every look the starts asked for
		before := targetedRelistsOf(f, sb)
		exit := &eventtypes.TaskExit{ContainerID: c, ID: c, ExitStatus: 1, ExitedAt: timestamppb.Now()}
		must(0, m.InjectTaskEvent(crisim.K8sNamespace, crisim.TopicTaskExit, exit))
		advance(150 * time.Millisecond)
		if n := targetedRelistsOf(f, sb) - before; n < 3 || n > 5 {
			t.Errorf("%d targeted relists in the 150 ms before CRI showed the exit, want 3 to 5 (at 0, 25, 75 ms, ...)", n)
		}
		must(0, m.StopContainer(c, 1, "Error", ""))
		stopped := time.Now()
		evs := f.rec.Wait(t, 3, 10*time.Second)
		if d := time.Since(stopped); d > 200*time.Millisecond {
			t.Errorf("the exit reported %v after CRI showed it, want within the next look (200 ms)", d)
		}
		if last := evs[len(evs)-1]; last.Type != generator.ContainerDied || last.DetectedBy != generator.SourceRelist {
			t.Errorf("last event %s, want ContainerDied by relist", generatortest.Line(last))
		}

		// An exit CRI never shows (a container that does not stop) is looked
		// at a bounded number of times, then left to the periodic relist.
		c2 := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "other"}))
		must(0, m.StartContainer(c2))
		f.rec.Wait(t, 4, time.Second)
		advance(10 * time.Second) // past every look the first exit asked for
		before = targetedRelistsOf(f, sb)
		exit2 := &eventtypes.TaskExit{ContainerID: c2, ID: c2, ExitStatus: 1, ExitedAt: timestamppb.Now()}
		must(0, m.InjectTaskEvent(crisim.K8sNamespace, crisim.TopicTaskExit, exit2))
		advance(time.Minute)
		if n := targetedRelistsOf(f, sb) - before; n != 8 {
			t.Errorf("%d targeted relists for an exit CRI never shows, want 8", n)
		}
		if got := triggerCount(t, f, "unconfirmed"); got != 1 {
			t.Errorf("pleg_bridge_containerd_triggers_total{result=\"unconfirmed\"} = %v, want 1", got)
		}
	})
}

func TestContainerdEventsThatReportNothingAskForNothing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		_, c := runningPod(t, f)
		advance(10 * time.Second)
		calls := len(f.rt.ListCalls("ListContainers"))
		// The pod's own starts count as requested or known, by whether the
		// targeted relist of the first found the second already: count from
		// here.
		before := map[string]float64{"exec": triggerCount(t, f, "exec"), "known": triggerCount(t, f, "known")}

		// An exec's exit, the same start again, another namespace's exit
		// (filtered out by the subscription), and the removal of a
		// container never seen.
		for _, ev := range []struct {
			ns, topic string
			msg       proto.Message
		}{
			{crisim.K8sNamespace, crisim.TopicTaskExit, &eventtypes.TaskExit{ContainerID: c, ID: "exec-1", ExitStatus: 2}},
			{crisim.K8sNamespace, crisim.TopicTaskStart, &eventtypes.TaskStart{ContainerID: c}},
			{"moby", crisim.TopicTaskExit, &eventtypes.TaskExit{ContainerID: c, ID: c}},
			{crisim.K8sNamespace, crisim.TopicContainerDelete, &eventtypes.ContainerDelete{ID: "never-seen"}},
		} {
			must(0, m.InjectTaskEvent(ev.ns, ev.topic, ev.msg))
		}
		advance(10 * time.Second)
		if n := len(f.rt.ListCalls("ListContainers")) - calls; n != 0 {
			t.Errorf("%d listings after events that report nothing new, want none", n)
		}
		if n := len(f.rec.Events()); n != 2 {
			t.Errorf("%d events, want the 2 starts:\n%s", n, strings.Join(generatortest.Lines(f.rec.Events(), nil), "\n"))
		}
		for result, want := range map[string]float64{"exec": 1, "known": 2} {
			if got := triggerCount(t, f, result) - before[result]; got != want {
				t.Errorf("pleg_bridge_containerd_triggers_total{result=%q} rose by %v, want %v", result, got, want)
			}
		}
	})
}

func TestAMalformedContainerdEventIsSkippedAndRelisted(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var logs strings.Builder
		f, stop := startTriggered(t, generator.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		defer stop()
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		f.rec.Wait(t, 1, time.Second)
		full := fullRelists(f)
		// A task exit whose payload is a TaskStart: the type URL says so.
		must(0, m.InjectTaskEvent(crisim.K8sNamespace, crisim.TopicTaskExit, &eventtypes.TaskStart{ContainerID: sb}))
		advance(time.Second)
		if n := fullRelists(f) - full; n != 1 {
			t.Errorf("%d full relists after a malformed event, want 1", n)
		}
		if !strings.Contains(logs.String(), `payload type \"containerd.events.TaskStart\", want containerd.events.TaskExit`) {
			t.Errorf("the log does not name what was wrong:\n%s", logs.String())
		}
		// The subscription goes on.
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
		must(0, m.StartContainer(c))
		f.rec.Wait(t, 2, 100*time.Millisecond)
	})
}

func TestContainerdEventsModeFallsBackAndReturns(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Containerd17Options(), generator.Options{
			Mode: generator.ModeContainerdEvents, RelistPeriod: time.Second, EventedRelistPeriod: time.Hour,
			StreamFailureLimit: 3, StreamHealthyAfter: 10 * time.Second,
		})
		for range 3 {
			f.rt.FailNext("WatchTaskEvents", status.Error(codes.Unavailable, "containerd restarting"))
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		defer func() { cancel(); <-done }()
		advance(5 * time.Second)
		if f.gen.Mode() != generator.ModeGeneric {
			t.Fatalf("after 3 failed subscriptions mode = %s, want generic", f.gen.Mode())
		}
		// Relisting at the normal period meanwhile: a container started now
		// is reported by a full relist within a second.
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		evs := f.rec.Wait(t, 1, 1100*time.Millisecond)
		if evs[0].Container.ID != sb {
			t.Errorf("first event %v", evs[0])
		}
		advance(time.Minute)
		if f.gen.Mode() != generator.ModeEvented || f.rt.OpenTaskStreams() != 1 {
			t.Errorf("after the subscription held %v: mode %s with %d subscriptions, want evented with 1",
				time.Minute, f.gen.Mode(), f.rt.OpenTaskStreams())
		}
		if n := f.rt.OpenStreams(); n != 0 {
			t.Errorf("containerd-events mode opened %d CRI event streams", n)
		}
	})
}

func TestContainerdEventsModeNeverTriesARuntimeThatIsNotContainerd(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var logs strings.Builder
		f := newFixture(t, crisim.Options{RuntimeName: "cri-o", RuntimeVersion: "1.31.0"}, generator.Options{
			Mode: generator.ModeContainerdEvents, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		advance(time.Minute)
		cancel()
		<-done
		if f.gen.Mode() != generator.ModeGeneric || f.rt.OpenTaskStreams() != 0 || f.rt.OpenStreams() != 0 {
			t.Errorf("mode %s with %d subscriptions and %d streams, want generic with none", f.gen.Mode(), f.rt.OpenTaskStreams(), f.rt.OpenStreams())
		}
		if !strings.Contains(logs.String(), `runtime \"cri-o\" is not containerd`) {
			t.Errorf("the log does not say why:\n%s", logs.String())
		}
	})
}

func TestATriggerForANewPodResolvesItsSandbox(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		// Twenty pods at once, two containers each.
		var ids []string
		for range 20 {
			sb := must(m.RunPodSandbox(crisim.PodConfig{}))
			ids = append(ids, sb)
			for j := range 2 {
				c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: []string{"a", "b"}[j]}))
				must(0, m.StartContainer(c))
				ids = append(ids, c)
			}
		}
		start := time.Now()
		evs := f.rec.Wait(t, 60, 5*time.Second)
		if d := time.Since(start); d > time.Second {
			t.Errorf("60 starts reported in %v, want within a second (rate limit bursts)", d)
		}
		var got []string
		for _, e := range evs {
			if e.Type != generator.ContainerStarted {
				t.Errorf("unexpected %s", generatortest.Line(e))
			}
			got = append(got, e.Container.ID)
		}
		slices.Sort(got)
		slices.Sort(ids)
		if !slices.Equal(got, ids) {
			t.Errorf("started %d of %d, or some twice", len(got), len(ids))
		}
	})
}

// triggerCount reads pleg_bridge_containerd_triggers_total{result}.
func triggerCount(t *testing.T, f *fixture, result string) float64 {
	t.Helper()
	families, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != "pleg_bridge_containerd_triggers_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestABurstOverManyPodsIsTakenAsOneFullRelist(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		ids := runningPods(t, f, 40)
		full, targeted := fullRelists(f), len(f.rt.ListCalls("ListContainers"))-fullRelists(f)

		// A node draining: every container exits at once.
		for i, c := range ids {
			must(0, m.StopContainer(c, int32(i%3), "Error", ""))
		}
		stopped := time.Now()
		f.rec.Wait(t, 120, 5*time.Second)
		if d := time.Since(stopped); d > 50*time.Millisecond {
			t.Errorf("40 exits reported in %v, want within 50ms", d)
		}
		advance(time.Minute)
		fulls := fullRelists(f) - full
		targets := len(f.rt.ListCalls("ListContainers")) - fullRelists(f) - targeted
		t.Logf("40 exits: %d full relists, %d targeted listings", fulls, targets)
		// synctest fixes the clock, not the interleaving: how many of the
		// exits the trigger goroutine has queued when the targeted one
		// takes the first decides how many are listed one by one before
		// the rest are coalesced. Under load (three copies of the package's
		// tests at once) that was 6 to 14 targeted listings and 1 to 4 full
		// relists; without coalescing it is one per pod, 40 or more.
		if fulls < 1 || fulls > 4 || targets > 20 {
			t.Errorf("40 exits took %d full relists and %d targeted listings; want 1 to 4 full relists and at most half as many targeted ones as pods", fulls, targets)
		}
		if n := len(f.rec.Events()); n != 120 {
			t.Errorf("%d events, want 120 (each once)", n)
		}
	})
}

// TestABurstCRIDoesNotShowYetIsLookedAtAgain: a burst of exits that the
// full relist it coalesces into does not show yet (containerd publishes
// them before its CRI plugin updates the statuses) is looked at again,
// not left to the safety-net relist.
func TestABurstCRIDoesNotShowYetIsLookedAtAgain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		ids := runningPods(t, f, 20)
		for _, c := range ids {
			exit := &eventtypes.TaskExit{ContainerID: c, ID: c, ExitStatus: 1, ExitedAt: timestamppb.Now()}
			must(0, m.InjectTaskEvent(crisim.K8sNamespace, crisim.TopicTaskExit, exit))
		}
		advance(60 * time.Millisecond)
		// The stops' own events are not delivered: only looking again
		// finds them.
		f.rt.Mute()
		for _, c := range ids {
			must(0, m.StopContainer(c, 1, "Error", ""))
		}
		f.rt.Unmute()
		stopped := time.Now()
		f.rec.Wait(t, 60, 10*time.Second)
		if d := time.Since(stopped); d > 500*time.Millisecond {
			t.Errorf("20 exits reported %v after CRI showed them, want within the next looks (500 ms)", d)
		}
	})
}

// TestRelistsAreNotHeldWhileContainerdsSubscriptionFails: containerd's
// event service replays nothing, so while its subscription keeps failing the
// relists at the normal period are all there is, and none may wait for a
// replay. A container living 1.2 s meanwhile is reported.
func TestRelistsAreNotHeldWhileContainerdsSubscriptionFails(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Containerd17Options(), generator.Options{
			Mode: generator.ModeContainerdEvents, RelistPeriod: time.Second, EventedRelistPeriod: time.Hour,
			StreamFailureLimit: 1, StreamBackoffMin: 2 * time.Second, StreamBackoffMax: 2 * time.Second,
		})
		for range 1000 {
			f.rt.FailNext("WatchTaskEvents", status.Error(codes.Unavailable, "containerd busy"))
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		defer func() { cancel(); <-done }()
		advance(5 * time.Second)
		if f.gen.Mode() != generator.ModeGeneric {
			t.Fatalf("mode %s, want generic while the subscription fails", f.gen.Mode())
		}
		m := f.rt.Model()
		var ids []string
		for i := range 10 {
			advance(300 * time.Millisecond)
			sb := must(m.RunPodSandbox(crisim.PodConfig{UID: fmt.Sprintf("uid-%d", i)}))
			c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
			must(0, m.StartContainer(c))
			ids = append(ids, c)
			go func() {
				time.Sleep(600 * time.Millisecond)
				must(0, m.StopContainer(c, 1, "Error", ""))
				time.Sleep(600 * time.Millisecond)
				must(0, m.RemoveContainer(c))
			}()
		}
		advance(10 * time.Second)
		started := map[string]bool{}
		for _, e := range f.rec.Events() {
			if e.Type == generator.ContainerStarted {
				started[e.Container.ID] = true
			}
		}
		for _, c := range ids {
			if !started[c] {
				t.Errorf("container %.12s lived 1.2 s while relisting every second and was never reported", c)
			}
		}
	})
}

// TestAContainerCRIDoesNotListYetIsResolvedAgainBounded: containerd's start
// event can come before CRI lists the container. Its ID is resolved again
// after 25 ms, doubling, 8 times at most: one that appears meanwhile is
// reported; one that never does is left to the periodic relist.
func TestAContainerCRIDoesNotListYetIsResolvedAgainBounded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		sb, _ := runningPod(t, f)
		advance(10 * time.Second)

		must(0, m.InjectTaskEvent(crisim.K8sNamespace, crisim.TopicTaskStart, &eventtypes.TaskStart{ContainerID: "late"}))
		advance(100 * time.Millisecond)
		now := time.Now().UnixNano()
		must(0, m.InjectContainer(&runtimeapi.Container{
			Id: "late", PodSandboxId: sb, State: runtimeapi.ContainerState_CONTAINER_RUNNING, CreatedAt: now,
			Metadata: &runtimeapi.ContainerMetadata{Name: "late"},
		}, &runtimeapi.ContainerStatus{
			Id: "late", State: runtimeapi.ContainerState_CONTAINER_RUNNING, CreatedAt: now, StartedAt: now,
			Metadata: &runtimeapi.ContainerMetadata{Name: "late"},
		}))
		evs := f.rec.Wait(t, 3, 500*time.Millisecond)
		if last := evs[len(evs)-1]; last.Type != generator.ContainerStarted || last.Container.ID != "late" {
			t.Errorf("last event %s, want the late container's start", generatortest.Line(last))
		}

		must(0, m.InjectTaskEvent(crisim.K8sNamespace, crisim.TopicTaskStart, &eventtypes.TaskStart{ContainerID: "ghost"}))
		advance(time.Minute)
		tries := 0
		for _, c := range f.rt.ListCalls("ListContainers") {
			if c == "id=ghost" {
				tries++
			}
		}
		if tries != 8 || triggerCount(t, f, "unresolved") != 1 {
			t.Errorf("an ID CRI never lists was looked up %d times, %v unresolved; want 8 and 1", tries, triggerCount(t, f, "unresolved"))
		}
	})
}

// TestContainerdEventsKeepUpWithASlowRuntime: under CPU load every CRI call
// takes a while. Short-lived pods start at 100 a second while each call
// takes 10 ms; containerd's events name IDs the cache does not know yet,
// faster than they can be looked up one at a time. Every container must
// still be reported, Started, Died and Removed, in order, by the events'
// relists, long before the safety-net relist; none may be looked up only
// once it is gone.
func TestContainerdEventsKeepUpWithASlowRuntime(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		for _, method := range []string{"ListContainers", "ListPodSandbox", "ContainerStatus"} {
			f.rt.SetLatency(method, 10*time.Millisecond)
		}
		m := f.rt.Model()
		const pods = 100
		var ids []string
		for i := range pods {
			advance(10 * time.Millisecond)
			sb := must(m.RunPodSandbox(crisim.PodConfig{UID: fmt.Sprintf("uid-%d", i)}))
			c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
			must(0, m.StartContainer(c))
			ids = append(ids, sb, c)
			time.AfterFunc(time.Second, func() {
				must(0, m.StopContainer(c, 1, "Error", ""))
				must(0, m.RemovePodSandbox(sb))
			})
		}
		f.rec.Wait(t, 6*pods, time.Minute)
		byID := map[string][]string{}
		for _, e := range f.rec.Events() {
			byID[e.Container.ID] = append(byID[e.Container.ID], string(e.Type))
		}
		want := []string{"ContainerStarted", "ContainerDied", "ContainerRemoved"}
		for _, id := range ids {
			if diff := cmp.Diff(want, byID[id]); diff != "" {
				t.Errorf("%.12s (-want +got):\n%s", id, diff)
			}
		}
		if n := triggerCount(t, f, "unresolved"); n != 0 {
			t.Errorf("%v IDs left unresolved, want none", n)
		}
	})
}

// TestUnknownIDsAreLookedUpAgainWhenTheRuntimeFails: the runtime fails the
// call that was to say where a new container is, or the full relist that
// was to list a burst of new pods. The IDs are asked about again within
// milliseconds, not left to the safety-net relist.
func TestUnknownIDsAreLookedUpAgainWhenTheRuntimeFails(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, stop := startTriggered(t, generator.Options{})
		defer stop()
		m := f.rt.Model()
		sb, _ := runningPod(t, f)
		advance(10 * time.Second) // past every look the starts asked for

		// One new container: its lookup fails.
		f.rt.FailNext("ListContainers", status.Error(codes.Unavailable, "runtime busy"))
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "late"}))
		must(0, m.StartContainer(c))
		started := time.Now()
		evs := f.rec.Wait(t, 3, time.Second)
		if last := evs[len(evs)-1]; last.Type != generator.ContainerStarted || last.Container.ID != c {
			t.Errorf("last event %s, want the new container's start", generatortest.Line(last))
		}
		if d := time.Since(started); d > 100*time.Millisecond {
			t.Errorf("a container whose lookup failed reported after %v, want within 100 ms", d)
		}
		advance(10 * time.Second)

		// A burst of new pods, more than are looked up one by one, comes
		// while the trigger waits for a lookup: the full relist that was
		// to list them fails.
		f.rt.Hang()
		c = must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "slow"}))
		must(0, m.StartContainer(c))
		synctest.Wait() // its lookup hangs
		for i := range 10 {
			sb := must(m.RunPodSandbox(crisim.PodConfig{UID: fmt.Sprintf("burst-%d", i)}))
			c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
			must(0, m.StartContainer(c))
		}
		synctest.Wait() // their events wait for the trigger
		f.rt.FailNext("ListPodSandbox", status.Error(codes.Unavailable, "runtime busy"))
		f.rt.Unhang()
		started = time.Now()
		f.rec.Wait(t, 4+20, time.Second)
		if d := time.Since(started); d > 200*time.Millisecond {
			t.Errorf("a burst whose full relist failed reported after %v, want within 200 ms", d)
		}
		if n := triggerCount(t, f, "listed"); n < 20 {
			t.Errorf("pleg_bridge_containerd_triggers_total{result=\"listed\"} = %v, want the burst's 20 IDs left to a full relist", n)
		}
	})
}
