package generator_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/generator/generatortest"
)

// TestRestartFromCheckpointReportsOnlyWhatChanged restarts a generator from
// the events a first one delivered, after the node changed while no
// generator ran.
func TestRestartFromCheckpointReportsOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	f := newFixture(t, crisim.Options{}, generator.Options{})
	m := f.rt.Model()
	sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
	keep := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "keep"}))
	done := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "done"}))
	vanish := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "vanish"}))
	crash := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "crash"}))
	for _, c := range []string{keep, done, vanish, crash} {
		must(0, m.StartContainer(c))
	}
	must(0, m.StopContainer(done, 0, "Completed", ""))
	f.relist(t)
	published := f.rec.Events()

	// While no bridge runs: one container is removed, one crashes, one is
	// created.
	must(0, m.RemoveContainer(vanish))
	must(0, m.StopContainer(crash, 2, "Error", ""))
	fresh := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "fresh"}))
	must(0, m.StartContainer(fresh))

	rec := generatortest.NewRecorder()
	restarted := generator.New(f.rt, rec, generator.Options{})
	restarted.Restore(published)
	if err := restarted.Relist(t.Context()); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{sb: "sb", keep: "keep", done: "done", vanish: "vanish", crash: "crash", fresh: "fresh"}
	got := generatortest.Lines(rec.Events(), names)
	want := []string{
		"ContainerDied vanish unknown - relist",
		"ContainerRemoved vanish removed - relist",
		"ContainerDied crash exited 2 relist",
		"ContainerStarted fresh running - relist",
	}
	if diff := cmp.Diff(want, got, cmpSorted); diff != "" {
		t.Fatalf("events after restart (-want +got):\n%s", diff)
	}
}

// TestRestoreCompletesWhatTheStreamStoredAfterTheCheckpoint runs a
// generator restored from a checkpoint that missed the last events an
// earlier run delivered, and hands it those events once it runs, as the
// publisher's read of the stream does: a container they name that went
// away meanwhile is reported Died (exit code unknown) and Removed by the
// relist Restore asks for, one that ended but still exists only Died, and
// nothing already delivered is reported again, neither for the containers
// that still run nor for one already removed.
func TestRestoreCompletesWhatTheStreamStoredAfterTheCheckpoint(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, crisim.Options{}, generator.Options{})
		m := f.rt.Model()
		sb := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
		keep := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "keep"}))
		vanish := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "vanish"}))
		ended := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "ended"}))
		gone := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "gone"}))
		other := must(m.RunPodSandbox(crisim.PodConfig{UID: "uid-2"}))
		lost := must(m.CreateContainer(other, crisim.ContainerConfig{Name: "lost"}))
		for _, c := range []string{keep, vanish, ended, gone, lost} {
			must(0, m.StartContainer(c))
		}
		f.relist(t)
		must(0, m.StopContainer(gone, 0, "Completed", ""))
		must(0, m.RemoveContainer(gone))
		advance(time.Second) // a relist declares gone only what it saw before it began
		f.relist(t)
		delivered := f.rec.Events()
		stored := map[string]bool{} // by container and type
		for _, e := range delivered {
			stored[e.Container.ID+" "+string(e.Type)] = true
		}

		// The earlier run was killed: its checkpoint holds the sandbox's
		// and keep's events only. Meanwhile vanish is removed, ended
		// exits, and the other pod goes whole.
		var ckpt []generator.Event
		for _, e := range delivered {
			if e.Container.ID == sb || e.Container.ID == keep {
				ckpt = append(ckpt, e)
			}
		}
		must(0, m.StopContainer(vanish, 1, "Error", ""))
		must(0, m.RemoveContainer(vanish))
		must(0, m.StopContainer(ended, 2, "Error", ""))
		must(0, m.StopContainer(lost, 3, "Error", ""))
		must(0, m.RemoveContainer(lost))
		must(0, m.StopPodSandbox(other))
		must(0, m.RemovePodSandbox(other))

		rec := generatortest.NewRecorder()
		restarted := generator.New(f.rt, rec, generator.Options{Mode: generator.ModeGeneric, RelistPeriod: time.Hour, Logger: slog.New(slog.DiscardHandler)})
		restarted.Restore(ckpt)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- restarted.Run(ctx) }()
		synctest.Wait() // the first relist: it knows nothing of vanish, ended's start, gone or the other pod
		restarted.Restore(slices.DeleteFunc(slices.Clone(delivered), func(e generator.Event) bool {
			return e.Container.ID == sb || e.Container.ID == keep
		}))
		synctest.Wait() // merged, and the relist it asked for
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}

		names := map[string]string{sb: "sb", keep: "keep", vanish: "vanish", ended: "ended", gone: "gone", other: "other", lost: "lost"}
		var got []string
		for _, e := range rec.Events() {
			if stored[e.Container.ID+" "+string(e.Type)] {
				continue // reported again: the publisher recognises it
			}
			got = append(got, generatortest.Lines([]generator.Event{e}, names)...)
		}
		want := []string{
			"ContainerDied vanish unknown - relist",
			"ContainerRemoved vanish removed - relist",
			"ContainerDied ended exited 2 relist",
			"ContainerDied lost unknown - relist",
			"ContainerRemoved lost removed - relist",
			"ContainerDied other unknown - relist",
			"ContainerRemoved other removed - relist",
		}
		if diff := cmp.Diff(want, got, cmpSorted); diff != "" {
			t.Fatalf("events after Restore (-want +got):\n%s", diff)
		}
		checkOnce(t, rec.Events())
		for _, e := range rec.Events() {
			if e.Container.ID == vanish || e.Container.ID == lost || e.Container.ID == gone {
				if stored[e.Container.ID+" "+string(e.Type)] {
					t.Errorf("%s %s reported again, though Restore said it was delivered", e.Type, names[e.Container.ID])
				}
			}
		}
	})
}
