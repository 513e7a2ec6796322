package generator_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/generator/generatortest"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// start starts the generator's Run in the test's bubble and returns a
// function that stops it and checks it returned nil.
func (f *fixture) start(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- f.gen.Run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	}
}

// newLoggedFixture is newFixture with the generator's log kept.
func newLoggedFixture(t *testing.T, gopts generator.Options) (*fixture, *logtest.Buffer) {
	t.Helper()
	logs := &logtest.Buffer{}
	f := &fixture{rt: generatortest.NewFakeRuntime(crisim.Options{}), rec: generatortest.NewRecorder(), reg: prometheus.NewRegistry()}
	gopts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	if gopts.Mode == "" {
		gopts.Mode = generator.ModeGeneric
	}
	gopts.Metrics = mustMetrics(t, f.reg)
	f.gen = generator.New(f.rt, f.rec, gopts)
	return f, logs
}

// checkOnce fails the test if a (container, type) was sent twice, or if a
// container's events are out of order.
func checkOnce(t *testing.T, evs []generator.Event) {
	t.Helper()
	seen := map[string]generator.LifecycleEventType{}
	rank := map[generator.LifecycleEventType]int{generator.ContainerStarted: 1, generator.ContainerDied: 2, generator.ContainerRemoved: 3}
	for _, e := range evs {
		if last, ok := seen[e.Container.ID]; ok && rank[last] >= rank[e.Type] {
			t.Errorf("%s %s after %s", e.Type, e.Container.ID, last)
		}
		seen[e.Container.ID] = e.Type
	}
}

func TestAContainerThatLivedWhileTheSinkWasFullIsBackfilledInOrder(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Options{}, generator.Options{RelistPeriod: time.Second})
		stop := f.start(t)
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		f.rec.Wait(t, 1, 5*time.Second)

		f.rec.SetRoom(0) // NATS down, outbox and spool full
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
		must(0, m.StartContainer(c))
		advance(2 * time.Second)
		must(0, m.StopContainer(c, 3, "Error", "boom"))
		advance(2 * time.Second)
		must(0, m.RemoveContainer(c))
		advance(2 * time.Second)
		if n := len(f.rec.Events()); n != 1 {
			t.Fatalf("a full sink recorded %d events, want the sandbox's 1", n)
		}
		if got := metricstest.Value(t, f.reg, "pleg_bridge_events_unsent", nil); got != 3 {
			t.Errorf("pleg_bridge_events_unsent = %v, want 3", got)
		}

		f.rec.SetRoom(-1) // room again
		evs := f.rec.Wait(t, 4, 2*time.Second)
		synctest.Wait()
		want := []string{
			"ContainerStarted sb running - relist",
			"ContainerStarted c running - relist",
			"ContainerDied c exited 3 relist",
			"ContainerRemoved c removed 3 relist",
		}
		if diff := cmp.Diff(want, generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c: "c"})); diff != "" {
			t.Fatalf("events (-want +got):\n%s", diff)
		}
		died := evs[2]
		if died.Reason != "Error" || died.Message != "boom" || died.FinishedAt.IsZero() || !died.Time.Equal(died.FinishedAt) {
			t.Errorf("backfilled Died = %+v, want the runtime's reason, message and finished_at", died)
		}
		if got := metricstest.Value(t, f.reg, "pleg_bridge_events_unsent", nil); got != 0 {
			t.Errorf("after the backfill pleg_bridge_events_unsent = %v, want 0", got)
		}

		// Sending as they come again.
		c2 := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "next"}))
		must(0, m.StartContainer(c2))
		f.rec.Wait(t, 5, 2*time.Second)
		checkOnce(t, f.rec.Events())
		stop()
	})
}

func TestAContainerRunningWhenTheSinkFilledIsReportedGoneFromItsState(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Options{}, generator.Options{RelistPeriod: time.Second})
		stop := f.start(t)
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
		must(0, m.StartContainer(c))
		f.rec.Wait(t, 2, 5*time.Second)
		synctest.Wait()

		f.rec.SetRoom(0)
		// Stopped and removed between two relists: the last state known is
		// running, the runtime's view now is gone.
		must(0, m.StopContainer(c, 137, "OOMKilled", ""))
		must(0, m.RemoveContainer(c))
		advance(5 * time.Second)
		if n := len(f.rec.Events()); n != 2 {
			t.Fatalf("a full sink recorded %d events, want 2", n)
		}

		f.rec.SetRoom(-1)
		f.rec.Wait(t, 4, 2*time.Second)
		synctest.Wait()
		want := []string{
			"ContainerStarted sb running - relist",
			"ContainerStarted c running - relist",
			"ContainerDied c unknown - relist",
			"ContainerRemoved c removed - relist",
		}
		if diff := cmp.Diff(want, generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c: "c"}), cmpSorted); diff != "" {
			t.Fatalf("events (-want +got):\n%s", diff)
		}
		checkOnce(t, f.rec.Events())
		stop()
	})
}

func TestRelistingGoesOnWhileTheSinkIsFull(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, logs := newLoggedFixture(t, generator.Options{RelistPeriod: time.Second, RelistThreshold: time.Minute})
		stop := f.start(t)
		m := f.rt.Model()
		f.rec.SetRoom(0)
		// A pod every ten seconds for five minutes, each container living
		// five seconds: none of it can be sent.
		var pods int
		var jobs []string
		for range 30 {
			sb := must(m.RunPodSandbox(crisim.PodConfig{}))
			c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "job"}))
			jobs = append(jobs, c)
			must(0, m.StartContainer(c))
			advance(5 * time.Second)
			must(0, m.StopContainer(c, 0, "Completed", ""))
			advance(5 * time.Second)
			pods++
		}
		if err := f.gen.Healthy(time.Now()); err != nil {
			t.Fatalf("after five minutes of a full sink Healthy = %v", err)
		}
		if n := len(f.rec.Events()); n != 0 {
			t.Fatalf("a full sink recorded %d events", n)
		}
		// Each pod: the sandbox's and the container's Started, the
		// container's Died.
		if got := metricstest.Value(t, f.reg, "pleg_bridge_events_unsent", nil); got != float64(3*pods) {
			t.Errorf("pleg_bridge_events_unsent = %v, want %d", got, 3*pods)
		}
		if !strings.Contains(logs.String(), "sink full: recording state only, will backfill") {
			t.Errorf("the full sink was not logged:\n%s", logs.String())
		}

		f.rec.SetRoom(-1)
		evs := f.rec.Wait(t, 3*pods, 2*time.Second)
		synctest.Wait()
		if len(f.rec.Events()) != 3*pods {
			t.Errorf("backfilled %d events, want %d", len(f.rec.Events()), 3*pods)
		}
		checkOnce(t, evs)
		// Sent in the order they were produced, across pods too.
		var started []string
		for _, e := range evs {
			if e.Type == generator.ContainerStarted && !e.Container.Sandbox {
				started = append(started, e.Container.ID)
			}
		}
		if diff := cmp.Diff(jobs, started); diff != "" {
			t.Errorf("containers started in another order (-want +got):\n%s", diff)
		}
		if !strings.Contains(logs.String(), "backfill complete") || !strings.Contains(logs.String(), "events=90") {
			t.Errorf("the backfill's end was not logged with its count:\n%s", logs.String())
		}
		stop()
	})
}

func TestARecordExpiredWhileUnsentIsCountedUnreported(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, logs := newLoggedFixture(t, generator.Options{RelistPeriod: time.Second, TombstoneTTL: time.Minute})
		stop := f.start(t)
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		f.rec.Wait(t, 1, 5*time.Second)

		f.rec.SetRoom(0)
		c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
		must(0, m.StartContainer(c))
		advance(2 * time.Second)
		must(0, m.StopContainer(c, 1, "Error", ""))
		must(0, m.RemoveContainer(c))
		advance(2 * time.Minute) // past the tombstone TTL
		const want = `
# HELP pleg_bridge_events_unreported_total Lifecycle events never sent: the sink was full until their container's record expired.
# TYPE pleg_bridge_events_unreported_total counter
pleg_bridge_events_unreported_total{event_type="ContainerDied"} 1
pleg_bridge_events_unreported_total{event_type="ContainerRemoved"} 1
pleg_bridge_events_unreported_total{event_type="ContainerStarted"} 1
`
		if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want), "pleg_bridge_events_unreported_total"); err != nil {
			t.Error(err)
		}
		for _, typ := range []string{"ContainerStarted", "ContainerDied", "ContainerRemoved"} {
			if !strings.Contains(logs.String(), "event_type="+typ) || !strings.Contains(logs.String(), "container_id="+c) {
				t.Errorf("the unreported %s of %s was not logged:\n%s", typ, c, logs.String())
			}
		}

		f.rec.SetRoom(-1)
		c2 := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "next"}))
		must(0, m.StartContainer(c2))
		f.rec.Wait(t, 2, 3*time.Second)
		synctest.Wait()
		got := generatortest.Lines(f.rec.Events(), map[string]string{sb: "sb", c2: "c2"})
		if diff := cmp.Diff([]string{"ContainerStarted sb running - relist", "ContainerStarted c2 running - relist"}, got); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
		if got := metricstest.Value(t, f.reg, "pleg_bridge_events_unsent", nil); got != 0 {
			t.Errorf("pleg_bridge_events_unsent = %v, want 0", got)
		}
		if !strings.Contains(logs.String(), "unreported=3") {
			t.Errorf("the backfill's end did not count the unreported events:\n%s", logs.String())
		}
		stop()
	})
}

func TestAPartlyRecordedBackfillLeavesTheRestInOrder(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Options{}, generator.Options{RelistPeriod: time.Second})
		stop := f.start(t)
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		f.rec.Wait(t, 1, 5*time.Second)

		f.rec.SetRoom(1) // room for one: the first Started of c1 goes, the rest is held
		c1 := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "one"}))
		must(0, m.StartContainer(c1))
		advance(2 * time.Second)
		c2 := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "two"}))
		must(0, m.StartContainer(c2))
		advance(2 * time.Second)
		must(0, m.StopContainer(c1, 1, "Error", ""))
		advance(2 * time.Second)
		must(0, m.RemoveContainer(c1))
		advance(2 * time.Second)
		must(0, m.StopContainer(c2, 2, "Error", ""))
		advance(2 * time.Second)
		names := map[string]string{sb: "sb", c1: "c1", c2: "c2"}
		if diff := cmp.Diff([]string{"ContainerStarted sb running - relist", "ContainerStarted c1 running - relist"},
			generatortest.Lines(f.rec.Events(), names)); diff != "" {
			t.Fatalf("before the backfill (-want +got):\n%s", diff)
		}

		f.rec.SetRoom(2)
		advance(3 * time.Second) // a backfill or more: the sink takes two events
		if n := len(f.rec.Events()); n != 4 {
			t.Fatalf("with room for two more the sink recorded %d events, want 4", n)
		}
		f.rec.SetRoom(-1)
		f.rec.Wait(t, 6, 2*time.Second)
		synctest.Wait()
		want := []string{
			"ContainerStarted sb running - relist",
			"ContainerStarted c1 running - relist",
			// In the order they were produced, c2's start before c1's exit,
			// the first two in one backfill and the rest in a later one.
			"ContainerStarted c2 running - relist",
			"ContainerDied c1 exited 1 relist",
			"ContainerRemoved c1 removed 1 relist",
			"ContainerDied c2 exited 2 relist",
		}
		got := generatortest.Lines(f.rec.Events(), names)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("events (-want +got):\n%s", diff)
		}
		checkOnce(t, f.rec.Events())
		stop()
	})
}
