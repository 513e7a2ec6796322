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
			startupOver := make(chan struct{})
			opts.StartupOver = func() { close(startupOver) }
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

			// From the end of the start-up the CRI client reuses its
			// listings; a few full relists later, one must have come back
			// unchanged.
			deadline := time.After(readyTimeout)
			select {
			case <-startupOver:
			case <-deadline:
				t.Fatalf("no end of start-up within %v", readyTimeout)
			}
			full := map[string]string{"kind": "full", "result": "ok"}
			atEnd, _ := metricstest.Find(t, reg, "pleg_bridge_relists_total", full)
			tick := time.NewTicker(readyPoll)
			defer tick.Stop()
			for relists := atEnd; relists < atEnd+5; relists, _ = metricstest.Find(t, reg, "pleg_bridge_relists_total", full) {
				select {
				case <-deadline:
					t.Fatalf("%v full relists within %v of the start, %v of them after the start-up; want 5 after it", relists, readyTimeout, relists-atEnd)
				case <-tick.C:
				}
			}
			if n := metricstest.Value(t, reg, "pleg_bridge_relists_unchanged_total", nil); n == 0 {
				t.Errorf("no full relist came back unchanged in the 5 after the start-up; want the production pipeline's shortcut taken")
			}
		})
	}
}
