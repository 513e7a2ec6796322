package generator_test

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// TestTheFirstRelistSaysWhatItFoundOnce: one Info line after the first
// relist, with the pods, sandboxes and containers it found and the mode,
// and none after the later relists.
func TestTheFirstRelistSaysWhatItFoundOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f, logs := newLoggedFixture(t, generator.Options{Mode: generator.ModeGeneric, RelistPeriod: time.Second})
		m := f.rt.Model()
		for _, uid := range []string{"uid-1", "uid-2"} {
			sb := must(m.RunPodSandbox(crisim.PodConfig{UID: uid}))
			c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
			must(0, m.StartContainer(c))
			must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "init"})) // created, not running
		}
		stop := f.start(t)
		advance(5 * time.Second) // the first relist and four more
		stop()

		var lines []string
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "first relist") {
				lines = append(lines, l)
			}
		}
		if len(lines) != 1 {
			t.Fatalf("%d first-relist lines, want 1:\n%s", len(lines), logs.String())
		}
		for _, want := range []string{"level=INFO", "pods=2", "sandboxes=2", "containers=4", "running=2", "mode=generic", "configured_mode=generic"} {
			if !strings.Contains(lines[0], want) {
				t.Errorf("first relist line %q does not say %s", lines[0], want)
			}
		}
	})
}
