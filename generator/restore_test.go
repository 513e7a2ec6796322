package generator_test

import (
	"testing"

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
	restarted := generator.New(f.rt, rec, generator.Options{Published: published})
	if err := restarted.Relist(t.Context()); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{sb: "sb", keep: "keep", done: "done", vanish: "vanish", crash: "crash", fresh: "fresh"}
	got := lines(rec.Events(), names)
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
