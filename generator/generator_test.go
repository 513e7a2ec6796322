package generator_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/generator/generatortest"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// advance moves a synctest bubble's virtual clock on by d and returns once
// every goroutine in the bubble is blocked again. Nothing waits in real time:
// inside a bubble, time.Sleep is how the clock moves.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

type fixture struct {
	rt  *generatortest.FakeRuntime
	rec *generatortest.Recorder
	gen *generator.Generator
	reg *prometheus.Registry
}

func newFixture(t *testing.T, mopts crisim.Options, gopts generator.Options) *fixture {
	t.Helper()
	f := &fixture{rt: generatortest.NewFakeRuntime(mopts), rec: generatortest.NewRecorder(), reg: prometheus.NewRegistry()}
	if gopts.Logger == nil {
		gopts.Logger = slog.New(slog.DiscardHandler)
	}
	if gopts.Mode == "" {
		gopts.Mode = generator.ModeGeneric // relisting only, unless the test names a mode
	}
	gopts.Metrics = mustMetrics(t, f.reg)
	if gopts.TaskEvents == nil {
		gopts.TaskEvents = f.rt // the fake serves containerd's events too, as the CRI client does
	}
	f.gen = generator.New(f.rt, f.rec, gopts)
	return f
}

// mustMetrics returns the generator's metrics registered on reg.
func mustMetrics(t *testing.T, reg prometheus.Registerer) *generator.Metrics {
	t.Helper()
	m, err := generator.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (f *fixture) relist(t *testing.T) {
	t.Helper()
	if err := f.gen.Relist(t.Context()); err != nil {
		t.Fatalf("Relist: %v", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestRelistReportsWhatIsAlreadyRunning(t *testing.T) {
	t.Parallel()
	f := newFixture(t, crisim.Options{}, generator.Options{})
	m := f.rt.Model()
	sb := must(m.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1"}))
	c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app", Image: "registry.example/app:1.2"}))
	if err := m.StartContainer(c); err != nil {
		t.Fatal(err)
	}
	st := must(m.ContainerStatus(c))

	f.relist(t)

	evs := f.rec.Events()
	want := []string{"ContainerStarted sb running - relist", "ContainerStarted c running - relist"}
	if diff := cmp.Diff(want, generatortest.Lines(evs, map[string]string{sb: "sb", c: "c"}), cmpSorted); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	for _, e := range evs {
		// A pod without labels of its own has empty labels: known, none.
		if want := (generator.Pod{UID: "uid-1", Namespace: "shop", Name: "web-0", Meta: generator.NewPodMeta(nil, nil)}); !cmp.Equal(e.Pod, want) {
			t.Errorf("pod = %+v, meta %+v", e.Pod, e.Pod.Meta)
		}
		if e.Container.ID == c {
			if e.Container.Name != "app" || e.Container.Image != "registry.example/app:1.2" || e.Container.Sandbox {
				t.Errorf("container = %+v", e.Container)
			}
			if want := time.Unix(0, st.StartedAt); !e.Time.Equal(want) || !e.StartedAt.Equal(want) {
				t.Errorf("time = %v, startedAt = %v, want the runtime's started_at %v", e.Time, e.StartedAt, want)
			}
		}
	}
}

// cmpSorted compares lists of lines without regard to order, for events of
// different containers, which have no promised order among themselves.
var cmpSorted = cmp.Transformer("sort", func(in []string) []string { return slices.Sorted(slices.Values(in)) })

func TestRelistFollowsALifecycle(t *testing.T) {
	t.Parallel()
	f := newFixture(t, crisim.Options{}, generator.Options{})
	m := f.rt.Model()
	sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
	f.relist(t)
	c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
	f.relist(t) // created: nothing
	if err := m.StartContainer(c); err != nil {
		t.Fatal(err)
	}
	f.relist(t)
	if err := m.StopContainer(c, 137, "OOMKilled", ""); err != nil {
		t.Fatal(err)
	}
	f.relist(t)
	f.relist(t) // nothing new
	if err := m.RemoveContainer(c); err != nil {
		t.Fatal(err)
	}
	if err := m.StopPodSandbox(sb); err != nil {
		t.Fatal(err)
	}
	if err := m.RemovePodSandbox(sb); err != nil {
		t.Fatal(err)
	}
	f.relist(t)

	got := generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c: "c"})
	want := []string{
		"ContainerStarted sb running - relist",
		"ContainerStarted c running - relist",
		"ContainerDied c exited 137 relist",
		"ContainerRemoved c removed 137 relist",
		"ContainerDied sb unknown - relist",
		"ContainerRemoved sb removed - relist",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	var died generator.Event
	for _, e := range f.rec.Events() {
		if e.Type == generator.ContainerDied && e.Container.ID == c {
			died = e
		}
	}
	if died.Reason != "OOMKilled" || died.FinishedAt.IsZero() || !died.Time.Equal(died.FinishedAt) {
		t.Errorf("died = reason %q finishedAt %v time %v, want OOMKilled at finished_at", died.Reason, died.FinishedAt, died.Time)
	}
}

func TestRelistRetriesAFailedStatusCall(t *testing.T) {
	t.Parallel()
	f := newFixture(t, crisim.Options{}, generator.Options{})
	m := f.rt.Model()
	sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
	c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
	must(0, m.StartContainer(c))
	must(0, m.StopContainer(c, 3, "Error", ""))
	f.rt.FailNext("ContainerStatus", status.Error(codes.DeadlineExceeded, "slow"))
	f.relist(t)
	if got := generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c: "c"}); len(got) != 1 {
		t.Fatalf("after a failed status call got %v, want only the sandbox start", got)
	}
	f.relist(t)
	got := generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c: "c"})
	want := []string{"ContainerStarted sb running - relist", "ContainerStarted c running - relist", "ContainerDied c exited 3 relist"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

func TestRelistSurvivesMalformedRuntimeData(t *testing.T) {
	t.Parallel()
	f := newFixture(t, crisim.Options{}, generator.Options{})
	m := f.rt.Model()
	// A sandbox with no metadata but kubelet labels, and a container with no
	// labels in it: the container takes the sandbox's identity.
	must(0, m.InjectSandbox(&runtimeapi.PodSandbox{Id: "sb-labels", State: runtimeapi.PodSandboxState_SANDBOX_READY,
		CreatedAt: time.Now().UnixNano(), Labels: map[string]string{"io.kubernetes.pod.uid": "uid-l", "io.kubernetes.pod.namespace": "ns", "io.kubernetes.pod.name": "p"}}))
	must(0, m.InjectContainer(&runtimeapi.Container{Id: "c-nolabels", PodSandboxId: "sb-labels", State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		&runtimeapi.ContainerStatus{Id: "c-nolabels", State: runtimeapi.ContainerState_CONTAINER_RUNNING, StartedAt: time.Now().UnixNano()}))
	// An orphan container whose sandbox does not exist: identity from labels.
	must(0, m.InjectContainer(&runtimeapi.Container{Id: "c-orphan", PodSandboxId: "missing", State: runtimeapi.ContainerState_CONTAINER_EXITED,
		Metadata: &runtimeapi.ContainerMetadata{Name: "job"},
		Labels:   map[string]string{"io.kubernetes.pod.uid": "uid-o", "io.kubernetes.pod.namespace": "ns", "io.kubernetes.pod.name": "o"}},
		&runtimeapi.ContainerStatus{Id: "c-orphan", State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: 1, FinishedAt: time.Now().UnixNano()}))
	// Objects with no pod UID at all: skipped, counted once.
	must(0, m.InjectSandbox(&runtimeapi.PodSandbox{Id: "sb-anon", State: runtimeapi.PodSandboxState_SANDBOX_READY}))
	must(0, m.InjectContainer(&runtimeapi.Container{Id: "c-anon", State: runtimeapi.ContainerState_CONTAINER_RUNNING}, nil))
	// A state the enum does not know.
	must(0, m.InjectContainer(&runtimeapi.Container{Id: "c-weird", PodSandboxId: "sb-labels", State: runtimeapi.ContainerState(42)}, nil))

	f.relist(t)
	f.relist(t)

	got := generatortest.Lines(f.rec.Events(), nil)
	want := []string{
		"ContainerStarted sb-labels running - relist",
		"ContainerStarted c-nolabels running - relist",
		"ContainerDied c-orphan exited 1 relist",
	}
	if diff := cmp.Diff(want, got, cmpSorted); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	for _, e := range f.rec.Events() {
		if e.Container.ID == "c-nolabels" && e.Pod.UID != "uid-l" {
			t.Errorf("container without labels got pod %+v, want the sandbox's", e.Pod)
		}
		if e.Container.ID == "c-orphan" && (e.Pod.UID != "uid-o" || e.Container.Name != "job") {
			t.Errorf("orphan got pod %+v name %q", e.Pod, e.Container.Name)
		}
	}
	const wantMetric = `
# HELP pleg_bridge_runtime_objects_skipped_total Malformed runtime objects skipped (no ID or no pod UID), by kind.
# TYPE pleg_bridge_runtime_objects_skipped_total counter
pleg_bridge_runtime_objects_skipped_total{kind="container"} 1
pleg_bridge_runtime_objects_skipped_total{kind="sandbox"} 1
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(wantMetric), "pleg_bridge_runtime_objects_skipped_total"); err != nil {
		t.Error(err)
	}
}

func TestHealthFollowsTheRelistThreshold(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Options{}, generator.Options{RelistPeriod: time.Second, RelistThreshold: time.Minute})
		if err := f.gen.Healthy(time.Now()); err == nil || err.Error() != "pleg has yet to be successful" {
			t.Fatalf("before the first relist Healthy = %v", err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		advance(10 * time.Second) // virtual time: ten relist periods
		if err := f.gen.Healthy(time.Now()); err != nil {
			t.Fatalf("while relisting Healthy = %v", err)
		}
		f.rt.Hang()
		advance(59 * time.Second)
		if err := f.gen.Healthy(time.Now()); err != nil {
			t.Fatalf("within the threshold Healthy = %v", err)
		}
		advance(11 * time.Second)
		err := f.gen.Healthy(time.Now())
		if err == nil || err.Error() != "pleg was last seen active 1m10s ago; threshold is 1m0s" {
			t.Fatalf("with a hung runtime Healthy = %v", err)
		}
		f.rt.Unhang()
		advance(2 * time.Second)
		if err := f.gen.Healthy(time.Now()); err != nil {
			t.Fatalf("after the runtime answered again Healthy = %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	})
}

func TestGenericModeNeverOpensTheStream(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Options{}, generator.Options{Mode: generator.ModeGeneric})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		since := time.Now()
		sb := must(f.rt.Model().RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		st, ok, err := f.gen.PodStatusNewerThan(ctx, "uid-1", since) // a relist after the sandbox ran
		if err != nil || !ok || len(st.Containers) != 1 || st.Containers[0].Container.ID != sb || st.Containers[0].State != generator.StateRunning {
			t.Fatalf("PodStatusNewerThan = %+v, %v, %v; want the sandbox running", st, ok, err)
		}
		synctest.Wait()
		if n := f.rt.OpenStreams(); n != 0 {
			t.Errorf("generic mode has %d event streams open", n)
		}
		if f.gen.Mode() != generator.ModeGeneric {
			t.Errorf("mode = %s", f.gen.Mode())
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

// criOnly hides a runtime's containerd event service: the generator sees a
// CRI runtime and nothing else.
type criOnly struct{ generator.Runtime }

func TestAutoModeDoesNotSubscribeOnContainerd17WithoutItsEventService(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Containerd17Options(), generator.Options{Mode: generator.ModeAuto})
		f.gen = generator.New(criOnly{f.rt}, f.rec, generator.Options{Mode: generator.ModeAuto, Logger: slog.New(slog.DiscardHandler)})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		advance(time.Minute)
		if n := f.rt.OpenStreams(); n != 0 {
			t.Errorf("auto mode on containerd 1.7 has %d event streams open", n)
		}
		if f.gen.Mode() != generator.ModeGeneric {
			t.Errorf("mode = %s, want generic", f.gen.Mode())
		}
		cancel()
		<-done
	})
}

func TestEventedModeReportsAContainerThatLivedBetweenRelists(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Containerd24Options(), generator.Options{Mode: generator.ModeAuto, EventedRelistPeriod: time.Hour})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		// The relist that follows the connection is held until its replay
		// is over, a quiet moment without messages: let it pass first. Held
		// past the pod's first message, it would find the listing stale,
		// list again, and could report the container's start before its
		// STARTED message is merged.
		advance(time.Second)
		if f.gen.Mode() != generator.ModeEvented || f.rt.OpenStreams() != 1 {
			t.Fatalf("mode = %s with %d streams, want evented with 1", f.gen.Mode(), f.rt.OpenStreams())
		}
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
		must(0, m.StartContainer(c))
		advance(100 * time.Millisecond) // it runs for a moment
		must(0, m.StopContainer(c, 2, "Error", ""))
		must(0, m.RemoveContainer(c))
		evs := f.rec.Wait(t, 4, time.Second)
		synctest.Wait()
		got := generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c: "c"})
		want := []string{
			"ContainerStarted sb running - evented",
			"ContainerStarted c running - evented",
			"ContainerDied c exited 2 evented",
			"ContainerRemoved c removed 2 evented",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("events (-want +got):\n%s", diff)
		}
		_ = evs
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

// TestATerminatingPodIsConfirmedByOneTargetedRelist ends a pod's three
// containers and its sandbox within a few milliseconds, as a pod deletion
// does: their STOPPED and DELETED events ask for targeted relists of the
// same sandbox, which coalesce into one listing of its containers and one
// of the sandbox, asked for by the sandbox's own event whether it comes
// before or after its containers' events. It counts runtime calls because
// the load is the behaviour here: coalescing exists to spare the runtime,
// and only the calls show that the events, the queue and the relister
// together list one sandbox once (TestTargetedQueue covers the queue alone).
func TestATerminatingPodIsConfirmedByOneTargetedRelist(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  func(m *crisim.Runtime, sb string, cs []string) error
		want int // events after the pod's end
	}{{
		name: "containers stopped, then the sandbox",
		end: func(m *crisim.Runtime, sb string, cs []string) error {
			for _, c := range cs {
				if err := m.StopContainer(c, 0, "Completed", ""); err != nil {
					return err
				}
				advance(time.Millisecond)
			}
			return m.StopPodSandbox(sb)
		},
		want: 4, // three containers and the sandbox died
	}, {
		name: "sandbox stopped, then its containers removed",
		end: func(m *crisim.Runtime, sb string, cs []string) error {
			if err := m.StopPodSandbox(sb); err != nil {
				return err
			}
			for _, c := range cs {
				advance(time.Millisecond)
				if err := m.RemoveContainer(c); err != nil {
					return err
				}
			}
			return nil
		},
		want: 7, // and three removed
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				f := newFixture(t, crisim.Containerd24Options(), generator.Options{Mode: generator.ModeEvented, EventedRelistPeriod: time.Hour})
				m := f.rt.Model()
				sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
				var cs []string
				for i := range 3 {
					c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: fmt.Sprintf("c%d", i)}))
					must(0, m.StartContainer(c))
					cs = append(cs, c)
				}
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				go func() { done <- f.gen.Run(ctx) }()
				synctest.Wait()
				f.rec.Wait(t, 4, time.Second)
				lists, sandboxLists := len(f.rt.ListCalls("ListContainers")), len(f.rt.ListCalls("ListPodSandbox"))

				if err := tc.end(m, sb, cs); err != nil {
					t.Fatal(err)
				}
				advance(generator.DefaultTargetedRelistDelay)

				if got := f.rt.ListCalls("ListContainers")[lists:]; !slices.Equal(got, []string{sb}) {
					t.Errorf("ListContainers calls after the pod ended filtered on %q, want one on its sandbox %q", got, sb)
				}
				if got := f.rt.ListCalls("ListPodSandbox")[sandboxLists:]; !slices.Equal(got, []string{sb}) {
					t.Errorf("ListPodSandbox calls after the pod ended filtered on %q, want one on its sandbox %q", got, sb)
				}
				if evs := f.rec.Events()[4:]; len(evs) != tc.want {
					t.Errorf("got %d events after the pod ended, want %d:\n%s", len(evs), tc.want, generatortest.Summary(evs))
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatalf("Run = %v", err)
				}
			})
		})
	}
}

// TestAStopAsksForATargetedRelistThatFindsTheRemoval mutes the stream after
// a container's STOPPED event, so that it does not report the removal that
// follows: the targeted relist the stop asked for finds it once
// TargetedRelistDelay has passed, not the safety-net relist an hour later.
// How the queue delays, coalesces and paces requests is TestTargetedQueue's.
func TestAStopAsksForATargetedRelistThatFindsTheRemoval(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const delay = time.Second
		f := newFixture(t, crisim.Containerd24Options(), generator.Options{Mode: generator.ModeEvented, EventedRelistPeriod: time.Hour, TargetedRelistDelay: delay})
		stop := f.start(t)
		// Past the relist the connection asks for once the replay is over:
		// run beside the changes below, it could list them before the stream
		// reports them, and the events would say "relist".
		advance(2 * time.Second)
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
		must(0, m.StartContainer(c))
		f.rec.Wait(t, 2, time.Second)

		must(0, m.StopContainer(c, 0, "Completed", ""))
		synctest.Wait() // the STOPPED event is merged and asks for a targeted relist
		f.rt.Mute()
		must(0, m.RemoveContainer(c))
		advance(delay - time.Millisecond)
		names := map[string]string{sb: "sb", c: "c"}
		want := []string{"ContainerStarted sb running - evented", "ContainerStarted c running - evented", "ContainerDied c exited 0 evented"}
		if diff := cmp.Diff(want, generatortest.Lines(f.rec.Events(), names), cmpSorted); diff != "" {
			t.Fatalf("events before the delay passed (-want +got):\n%s", diff)
		}
		advance(time.Millisecond)
		want = append(want, "ContainerRemoved c removed 0 relist")
		if diff := cmp.Diff(want, generatortest.Lines(f.rec.Events(), names), cmpSorted); diff != "" {
			t.Fatalf("events once the delay passed (-want +got):\n%s", diff)
		}
		stop()
	})
}

func TestEventedModeFallsBackAndReturns(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// The CRI stream alone: containerd's task exits, followed beside
		// it, would be a second stream to end and to wait for.
		f := newFixture(t, crisim.Options{}, generator.Options{
			Mode: generator.ModeEvented, StreamFailureLimit: 3, StreamHealthyAfter: 10 * time.Second,
			StreamBackoffMin: time.Second, StreamBackoffMax: 4 * time.Second, ExitsFromCRI: true,
		})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		synctest.Wait()
		if f.gen.Mode() != generator.ModeEvented {
			t.Fatalf("mode = %s at start", f.gen.Mode())
		}
		// Three connections that die at once: fall back to relisting.
		for i := range 3 {
			<-f.rt.StreamOpened() // the backoff passes in virtual time
			if n := f.rt.EndStreams(codes.Unavailable); n != 1 {
				t.Fatalf("round %d: ended %d streams", i, n)
			}
			synctest.Wait()
		}
		if f.gen.Mode() != generator.ModeGeneric {
			t.Fatalf("mode = %s after three failures, want generic", f.gen.Mode())
		}
		// While in generic mode a container changes: the relist finds it.
		since := time.Now()
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		if st, ok, err := f.gen.PodStatusNewerThan(ctx, "uid-1", since); err != nil || !ok || len(st.Containers) != 1 || st.Containers[0].State != generator.StateRunning {
			t.Fatalf("PodStatusNewerThan = %+v, %v, %v; want the sandbox running", st, ok, err)
		}
		// The stream comes back and stays up; events make it healthy.
		advance(30 * time.Second)
		if f.gen.Mode() != generator.ModeEvented {
			t.Fatalf("mode = %s after a healthy stream, want evented", f.gen.Mode())
		}
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
		must(0, m.StartContainer(c))
		evs := f.rec.Wait(t, 2, time.Second)
		if last := evs[len(evs)-1]; last.Container.ID != c || last.DetectedBy != generator.SourceEvented {
			t.Errorf("last event %s, want the start from the stream", generatortest.Line(last))
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

func TestASilentStreamIsDemotedUntilItDeliversAgain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Options{}, generator.Options{
			Mode: generator.ModeEvented, EventedRelistPeriod: 10 * time.Second, StreamHealthyAfter: 5 * time.Second,
			StreamBackoffMin: time.Second, StreamBackoffMax: time.Second,
		})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		advance(5 * time.Second)
		if f.gen.Mode() != generator.ModeEvented {
			t.Fatalf("mode = %s at start", f.gen.Mode())
		}
		// The stream stays connected but reports nothing; the node changes.
		f.rt.Mute()
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		f.rec.Wait(t, 1, 15*time.Second) // found by the safety-net relist
		synctest.Wait()
		if f.gen.Mode() != generator.ModeGeneric {
			t.Fatalf("mode = %s after a relist found what a connected stream did not report, want generic", f.gen.Mode())
		}
		if got := f.rec.Events()[0]; got.DetectedBy != generator.SourceRelist {
			t.Fatalf("first event %s, want it from the relist", generatortest.Line(got))
		}
		// Reconnected but still silent: it does not return however long.
		advance(time.Minute)
		if f.gen.Mode() != generator.ModeGeneric {
			t.Fatalf("a silent stream returned to evented mode")
		}
		// It delivers again: evented mode returns.
		f.rt.Unmute()
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
		must(0, m.StartContainer(c))
		advance(time.Second)
		if f.gen.Mode() != generator.ModeEvented {
			t.Fatalf("mode = %s after the stream delivered again, want evented", f.gen.Mode())
		}
		const wantMetric = `
# HELP pleg_bridge_stream_missed_transitions_total Transitions a relist found that the event stream should have reported first.
# TYPE pleg_bridge_stream_missed_transitions_total counter
pleg_bridge_stream_missed_transitions_total 1
`
		if err := testutil.GatherAndCompare(f.reg, strings.NewReader(wantMetric), "pleg_bridge_stream_missed_transitions_total"); err != nil {
			t.Error(err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

func TestTheStreamReconnectsAsSoonAsTheRuntimeIsBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Options{}, generator.Options{
			Mode: generator.ModeEvented, RelistPeriod: time.Second, StreamFailureLimit: 1,
			StreamBackoffMin: 20 * time.Second, StreamBackoffMax: time.Hour,
		})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		<-f.rt.StreamOpened()
		advance(time.Second)
		// The runtime goes away: the stream ends (the bridge falls back to
		// relisting every second) and a relist fails.
		f.rt.FailNext("ListPodSandbox", status.Error(codes.Unavailable, "runtime restarting"))
		f.rt.EndStreams(codes.Unavailable)
		advance(1500 * time.Millisecond) // the failed relist, then one that succeeds
		if f.gen.Mode() != generator.ModeGeneric {
			t.Fatalf("mode = %s after the stream failed, want generic", f.gen.Mode())
		}
		// The reconnect backoff (20 s and more) has not passed, yet the
		// stream is back because a relist showed the runtime answering.
		if n := f.rt.OpenStreams(); n != 1 {
			t.Fatalf("%d streams open 1.5 s after the runtime came back, want 1", n)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

func TestSinkFailureStopsRun(t *testing.T) {
	t.Parallel()
	rt := generatortest.NewFakeRuntime(crisim.Options{})
	must(rt.Model().RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
	boom := errors.New("boom")
	gen := generator.New(rt, failingSink{boom}, generator.Options{Mode: generator.ModeGeneric})
	if err := gen.Run(t.Context()); !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want the sink's error", err)
	}
}

type failingSink struct{ err error }

func (s failingSink) Send(context.Context, []generator.Event) error { return s.err }

func TestDuplicatedAndStaleStreamEventsProduceNothing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Options{}, generator.Options{Mode: generator.ModeEvented, EventedRelistPeriod: time.Hour})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		synctest.Wait()
		m := f.rt.Model()
		sub := m.Subscribe(ctx) // a second listener keeps copies of the events
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
		must(0, m.StartContainer(c))
		must(0, m.StopContainer(c, 1, "Error", ""))
		f.rec.Wait(t, 3, time.Second)
		var started, stopped *runtimeapi.ContainerEventResponse
		for len(sub.Events()) > 0 {
			ev := <-sub.Events()
			if ev.GetContainerId() != c {
				continue
			}
			switch ev.GetContainerEventType() {
			case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
				started = ev
			case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
				stopped = ev
			}
		}
		if started == nil || stopped == nil {
			t.Fatal("the model did not emit STARTED and STOPPED")
		}
		m.InjectEvent(stopped) // a duplicate
		m.InjectEvent(started) // late: it would move the container backwards
		synctest.Wait()
		got := generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c: "c"})
		want := []string{"ContainerStarted sb running - evented", "ContainerStarted c running - evented", "ContainerDied c exited 1 evented"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("events (-want +got):\n%s", diff)
		}
		// The sandbox's STARTED (its CREATED already showed it ready), the
		// duplicate STOPPED and the late STARTED.
		const wantMetric = `
# HELP pleg_bridge_cache_suppressed_total Stream events reporting a transition the cache already held (duplicates, late or reordered), which produced no event.
# TYPE pleg_bridge_cache_suppressed_total counter
pleg_bridge_cache_suppressed_total{source="evented"} 3
`
		if err := testutil.GatherAndCompare(f.reg, strings.NewReader(wantMetric), "pleg_bridge_cache_suppressed_total"); err != nil {
			t.Error(err)
		}
		cancel()
		<-done
	})
}

func TestAutoModeRelistsWhenTheRuntimeHasNoVersion(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := generatortest.NewFakeRuntime(crisim.Options{})
		rt.FailNext("Version", status.Error(codes.Unimplemented, "no Version here"))
		var logs logtest.Buffer
		gen := generator.New(rt, generatortest.NewRecorder(), generator.Options{
			Mode: generator.ModeAuto, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- gen.Run(ctx) }()
		advance(time.Minute)
		if n := rt.OpenStreams(); n != 0 || gen.Mode() != generator.ModeGeneric {
			t.Errorf("mode %s with %d streams, want generic with none", gen.Mode(), n)
		}
		if !strings.Contains(logs.String(), "auto mode: relisting only") || !strings.Contains(logs.String(), "does not implement Version") {
			t.Errorf("the decision and its reason were not logged:\n%s", logs.String())
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

// replayScenario starts and ends pods on m while the stream is down, enough
// of them that a relist merged anywhere but after the whole replay would
// find some already ended: a sandbox started and stopped (it has no
// started_at to fill a lost start in from), and a container run from
// creation to removal in another pod (nothing left to list). It returns the
// events each container must get, in order.
func replayScenario(t *testing.T, m *crisim.Runtime) map[string][]string {
	t.Helper()
	want := map[string][]string{}
	for i := range 20 {
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: fmt.Sprintf("stopped-%d", i)}))
		must(0, m.StopPodSandbox(sb))
		want[sb] = []string{"ContainerStarted", "ContainerDied"}
		sb = must(m.RunPodSandbox(crisim.PodConfig{UID: fmt.Sprintf("running-%d", i)}))
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
		must(0, m.StartContainer(c))
		must(0, m.StopContainer(c, 1, "Error", ""))
		must(0, m.RemoveContainer(c))
		want[sb] = []string{"ContainerStarted"}
		want[c] = []string{"ContainerStarted", "ContainerDied", "ContainerRemoved"}
	}
	return want
}

func eventTypesByContainer(evs []generator.Event) map[string][]string {
	got := map[string][]string{}
	for _, e := range evs {
		got[e.Container.ID] = append(got[e.Container.ID], string(e.Type))
	}
	return got
}

// TestARelistWaitsForTheStreamsReplay lets a runtime that replays what it
// kept while nobody listened (containerd 2.x) start and end pods while the
// stream is down. The relist after the reconnect lists them ended; merged
// before the replay, it would make the replayed starts stale to the
// forward-only merge, and lose them. Merged after it, every transition is
// reported, in order.
func TestARelistWaitsForTheStreamsReplay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// The CRI stream alone (see TestEventedModeFallsBackAndReturns);
		// TestTaskExitsBesideTheStreamAskForNoRelistDuringItsReplay has
		// the task exits too.
		f := newFixture(t, crisim.Containerd24Options(), generator.Options{
			Mode: generator.ModeEvented, EventedRelistPeriod: time.Hour,
			StreamBackoffMin: 5 * time.Second, StreamBackoffMax: 5 * time.Second, StreamFailureLimit: 10, ExitsFromCRI: true,
		})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		<-f.rt.StreamOpened()
		advance(time.Second)

		// The stream ends and the runtime refuses the immediate reconnect,
		// so the stream stays down for the backoff.
		f.rt.FailNext("WatchEvents", status.Error(codes.Unavailable, "restarting"))
		f.rt.EndStreams(codes.Unavailable)
		advance(time.Second)
		want := replayScenario(t, f.rt.Model())
		<-f.rt.StreamOpened() // the reconnect, after the backoff
		advance(time.Second)

		if diff := cmp.Diff(want, eventTypesByContainer(f.rec.Events())); diff != "" {
			t.Errorf("events per container (-want +got):\n%s", diff)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

// TestARelistWhileTheStreamIsDownWaitsForItsReplay is the same loss through
// another door: the relist the bridge takes when the stream ends lists the
// pods ended before the reconnect brings their replayed starts. It is held
// until the replay is in (at most replayHold, 3 s, longer than this
// reconnect's backoff of 2.5 s).
func TestARelistWhileTheStreamIsDownWaitsForItsReplay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Containerd24Options(), generator.Options{
			Mode: generator.ModeEvented, EventedRelistPeriod: time.Hour,
			StreamBackoffMin: 2500 * time.Millisecond, StreamBackoffMax: 2500 * time.Millisecond, StreamFailureLimit: 10,
		})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		<-f.rt.StreamOpened()
		advance(time.Second)

		// The relist after the stream's end waits in the runtime while the
		// pods come and go, so it lists them ended.
		f.rt.Hang()
		f.rt.FailNext("WatchEvents", status.Error(codes.Unavailable, "restarting"))
		f.rt.EndStreams(codes.Unavailable)
		synctest.Wait()
		want := replayScenario(t, f.rt.Model())
		f.rt.Unhang()
		<-f.rt.StreamOpened() // the reconnect
		advance(5 * time.Second)

		if diff := cmp.Diff(want, eventTypesByContainer(f.rec.Events())); diff != "" {
			t.Errorf("events per container (-want +got):\n%s", diff)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

func TestEventsCarryThePodsLabelsAndAllowlistedAnnotations(t *testing.T) {
	t.Parallel()
	f := newFixture(t, crisim.Options{}, generator.Options{PodAnnotations: []string{"team"}})
	m := f.rt.Model()
	sb := must(m.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1",
		Labels:      map[string]string{"app": "web", "pod-template-hash": "5d8f"},
		Annotations: map[string]string{"team": "payments", "kubectl.kubernetes.io/last-applied-configuration": `{"huge":true}`}}))
	c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app", Labels: map[string]string{"container-only": "x"}}))
	must(0, m.StartContainer(c))

	f.relist(t)

	want := generator.NewPodMeta(map[string]string{"app": "web", "pod-template-hash": "5d8f"}, map[string]string{"team": "payments"})
	evs := f.rec.Events()
	if len(evs) != 2 {
		t.Fatalf("got %d events, want the sandbox's and the container's Started", len(evs))
	}
	for _, e := range evs {
		if diff := cmp.Diff(want, e.Pod.Meta); diff != "" {
			t.Errorf("%s of %s: pod meta (-want +got):\n%s", e.Type, e.Container.ID, diff)
		}
	}
	if evs[0].Pod.Meta != evs[1].Pod.Meta {
		t.Error("the events of one pod carry two copies of its labels")
	}

	// The pod's labels changed and the kubelet made it a new sandbox: its
	// events from now on carry the new sandbox's labels.
	if err := m.StopPodSandbox(sb); err != nil {
		t.Fatal(err)
	}
	sb2 := must(m.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1", Attempt: 1,
		Labels: map[string]string{"app": "web", "pod-template-hash": "77aa"}}))
	f.relist(t)
	later := f.rec.Events()[len(evs):]
	if len(later) == 0 {
		t.Fatal("no events after the new sandbox")
	}
	want2 := generator.NewPodMeta(map[string]string{"app": "web", "pod-template-hash": "77aa"}, map[string]string{})
	for _, e := range later {
		if diff := cmp.Diff(want2, e.Pod.Meta); diff != "" {
			t.Errorf("%s of %s after sandbox %s: pod meta (-want +got):\n%s", e.Type, e.Container.ID, sb2, diff)
		}
	}
}

// TestAStreamThatKeepsFailingDoesNotSlowRelisting: a runtime whose event
// stream fails at every connect (CRI-O without pod events) leaves the
// bridge relisting every second, backing off its reconnects for 20 s. The
// relists are not held for a replay that is 20 s away: a container that
// starts is reported within the relist period.
func TestAStreamThatKeepsFailingDoesNotSlowRelisting(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Containerd24Options(), generator.Options{
			Mode: generator.ModeEvented, RelistPeriod: time.Second,
			StreamBackoffMin: 20 * time.Second, StreamBackoffMax: 20 * time.Second, StreamFailureLimit: 1,
		})
		for range 10 {
			f.rt.FailNext("WatchEvents", status.Error(codes.Unavailable, "stream closed"))
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		advance(5 * time.Second) // the first failures, the fallback to relisting
		if f.gen.Mode() != generator.ModeGeneric {
			t.Fatalf("mode = %s with a failing stream, want generic", f.gen.Mode())
		}
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		advance(1500 * time.Millisecond)
		got := eventTypesByContainer(f.rec.Events())
		if diff := cmp.Diff([]string{"ContainerStarted"}, got[sb]); diff != "" {
			t.Errorf("events of the sandbox 1.5 s after it started (-want +got):\n%s", diff)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

// TestRequestRelistRelistsAtOnce: with the safety-net relist an hour away,
// RequestRelist makes Run list the node in full at once.
func TestRequestRelistRelistsAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Containerd24Options(), generator.Options{Mode: generator.ModeEvented, EventedRelistPeriod: time.Hour})
		stop := f.start(t)
		defer stop()
		advance(time.Second) // the first relist, the stream's, and its replay
		full := func() (n int) {
			for _, sandbox := range f.rt.ListCalls("ListContainers") {
				if sandbox == "" {
					n++
				}
			}
			return n
		}
		before := full()
		advance(time.Minute)
		if n := full(); n != before {
			t.Fatalf("%d full listings in a minute with the relist period an hour, want none", n-before)
		}
		f.gen.RequestRelist()
		synctest.Wait()
		if n := full(); n != before+1 {
			t.Errorf("%d full listings after RequestRelist, want 1", n-before)
		}
	})
}

// TestRelistingGoesOnWhileARelistIsHeldForAReplay: the runtime refuses
// every new event stream (a CRI server restarting its streaming side, or
// the soak's stream-refused fault) while pods come and go. Each refusal
// fails at once, so the reconnects back off in short steps and the replay
// gate stays open for seconds. A relist held for a replay that does not
// come must not hold the node's listing back with it: a pod that starts and
// ends within those seconds is listed running by a relist taken meanwhile,
// so its start is reported, and the replay, when the stream is back,
// repeats nothing.
func TestRelistingGoesOnWhileARelistIsHeldForAReplay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Containerd24Options(), generator.Options{Mode: generator.ModeEvented})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- f.gen.Run(ctx) }()
		<-f.rt.StreamOpened()
		advance(time.Second)

		for range 6 {
			f.rt.FailNext("WatchEvents", status.Error(codes.Unavailable, "refused"))
		}
		f.rt.EndStreams(codes.Unavailable)
		synctest.Wait()
		m := f.rt.Model()
		want := map[string][]string{}
		for i := range 4 {
			advance(500 * time.Millisecond)
			sb := must(m.RunPodSandbox(crisim.PodConfig{UID: fmt.Sprintf("short-%d", i)}))
			c := must(m.CreateContainer(sb, crisim.ContainerConfig{}))
			must(0, m.StartContainer(c))
			advance(1500 * time.Millisecond)
			must(0, m.StopContainer(c, 1, "Error", ""))
			must(0, m.StopPodSandbox(sb))
			want[sb] = []string{"ContainerStarted", "ContainerDied"}
			want[c] = []string{"ContainerStarted", "ContainerDied"}
		}
		advance(time.Minute) // the refusals end; the stream replays what it kept

		if diff := cmp.Diff(want, eventTypesByContainer(f.rec.Events())); diff != "" {
			t.Errorf("events per container (-want +got):\n%s", diff)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}
