package latencybench

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
)

// TestStagesMeasureTheProductionPipeline runs the bridge as the harness
// does, with and without Config.Stages' hooks, on a node where nothing
// changes, and checks that both take the production pipeline's shortcut
// for a full relist that lists what the last one did (counted in
// pleg_bridge_relists_unchanged_total) once the start-up is over: a
// runtime wrapper that hid the CRI client's listing version turned it off
// with the stages only, so that they measured another pipeline.
func TestStagesMeasureTheProductionPipeline(t *testing.T) {
	h, err := Start(t.Context(), Config{Dir: t.TempDir(), Runtime: RuntimeInProcess})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	for _, stages := range []bool{false, true} {
		t.Run(fmt.Sprintf("stages=%v", stages), func(t *testing.T) {
			model := crisim.NewRuntime(crisim.Containerd24Options())
			if err := model.Populate(3, 2); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(t.TempDir(), "cri.sock")
			lis, err := crisim.Listen(sock)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			served := make(chan error, 1)
			go func() { served <- crisim.NewServer(model, crisim.ServerOptions{}).Serve(ctx, lis) }()

			reg := prometheus.NewRegistry()
			opts := h.bridgeOptions()
			opts.CRIEndpoint = "unix://" + sock
			opts.DataDir = t.TempDir()
			opts.Mode = generator.ModeGeneric
			opts.RelistPeriod = 20 * time.Millisecond
			opts.Registry = reg
			if stages {
				timeStages(&opts.Hooks, newTracker(0))
			}
			b, err := bridge.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			ran := make(chan error, 1)
			go func() { ran <- b.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				if err := <-ran; err != nil {
					t.Errorf("bridge Run = %v", err)
				}
				<-served
			})

			// The start-up is over once the CRI client reuses its
			// listings; a few full relists later, one must have come back
			// unchanged.
			full := map[string]string{"kind": "full", "result": "ok"}
			var relistsAtReuse float64
			tick := time.NewTicker(readyPoll)
			defer tick.Stop()
			deadline := time.After(readyTimeout)
			for {
				select {
				case <-deadline:
					t.Fatalf("no end of start-up and 5 full relists after it within %v", readyTimeout)
				case <-tick.C:
				}
				relists := counterValue(t, reg, "pleg_bridge_relists_total", full)
				if relistsAtReuse == 0 {
					if counterValue(t, reg, "pleg_bridge_listed_items_total", map[string]string{"how": "reused"}) > 0 {
						relistsAtReuse = relists
					}
					continue
				}
				if relists >= relistsAtReuse+5 {
					break
				}
			}
			if n := metricstest.Value(t, reg, "pleg_bridge_relists_unchanged_total", nil); n == 0 {
				t.Errorf("no full relist came back unchanged in the 5 after the start-up; want the production pipeline's shortcut taken")
			}
		})
	}
}

// counterValue returns the counter name's series with labels from reg, 0
// while there is none: the bridge registers its metrics as Run builds it.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			n := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok {
					if v != l.GetValue() {
						continue series
					}
					n++
				}
			}
			if n == len(labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
