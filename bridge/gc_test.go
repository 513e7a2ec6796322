package bridge_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// TestTheGCTargetIsLowUntilTheFirstRelistIsAcked: the start-up target
// holds until the first relist's events are all acked, then the steady one
// is set. Generic mode's default depends on the live heap, which is the
// whole test process's here: TestGenericModeTakesALowerTargetOnABigNode
// covers it.
func TestTheGCTargetIsLowUntilTheFirstRelistIsAcked(t *testing.T) {
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC is set: the bridge leaves the target alone")
	}
	t.Parallel()
	for _, tc := range []struct {
		mode         generator.Mode
		opts, steady int
	}{
		{generator.ModeEvented, 0, bridge.DefaultGCPercent},
		{generator.ModeGeneric, 61, 61},
	} {
		t.Run(fmt.Sprintf("%s %d", tc.mode, tc.opts), func(t *testing.T) {
			t.Parallel()
			n := newTestNode(t)
			n.startPod(t, "app", "sidecar", "proxy")
			opts := testOptions(n.endpoint, n.url, t.TempDir())
			opts.Mode, opts.GCPercent = tc.mode, tc.opts
			type set struct {
				percent int
				status  bridge.Status
			}
			sets := make(chan set, 4)
			var b *bridge.Bridge
			ready := make(chan struct{})
			opts.Hooks.OnGCPercent = func(p int) {
				<-ready
				sets <- set{p, b.Status()}
			}
			b, _ = runBridge(t, opts)
			close(ready)
			if got := <-sets; got.percent != bridge.DefaultStartupGCPercent {
				t.Fatalf("first target %d, want the start-up one, %d", got.percent, bridge.DefaultStartupGCPercent)
			}
			got := <-sets
			if got.percent != tc.steady {
				t.Errorf("second target %d, want %d", got.percent, tc.steady)
			}
			if !got.status.Synced || got.status.Pending != 0 {
				t.Errorf("steady target set at %+v: before the first relist's events were acked", got.status)
			}
		})
	}
}

// TestGenericModeTakesALowerTargetOnABigNode: from a live heap of 8 MiB
// after the first relist (about 500 pods), generic mode's relists every
// second would double a big heap.
func TestGenericModeTakesALowerTargetOnABigNode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode generator.Mode
		opt  int
		heap uint64
		want int
	}{
		{generator.ModeGeneric, 0, 8<<20 - 1, bridge.DefaultGCPercent},
		{generator.ModeGeneric, 0, 8 << 20, bridge.DefaultGenericGCPercent},
		{generator.ModeEvented, 0, 200 << 20, bridge.DefaultGCPercent},
		{generator.ModeGeneric, 80, 200 << 20, 80},
	} {
		if got := bridge.SteadyGCPercent(bridge.Options{Mode: tc.mode, GCPercent: tc.opt}, tc.heap); got != tc.want {
			t.Errorf("%s mode, GCPercent %d, live heap %d MiB: target %d, want %d", tc.mode, tc.opt, tc.heap>>20, got, tc.want)
		}
	}
}

// listedItems returns pleg_bridge_listed_items_total{how} in reg.
func listedItems(t *testing.T, reg *prometheus.Registry, how string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != "pleg_bridge_listed_items_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "how" && l.GetValue() == how {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no pleg_bridge_listed_items_total{how=%q}", how)
	return 0
}

// TestListingsAreReusedOnceTheStartUpIsOver: the CRI client reuses what a
// full listing decoded only from the end of the start-up (the first
// relist's events acked), and then every steady relist does.
func TestListingsAreReusedOnceTheStartUpIsOver(t *testing.T) {
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC is set: no hook marks the end of the start-up")
	}
	t.Parallel()
	n := newTestNode(t)
	n.startPod(t, "app", "sidecar")
	opts := testOptions(n.endpoint, n.url, t.TempDir())
	opts.Registry = prometheus.NewRegistry()
	steady := make(chan float64, 1)
	calls := 0
	opts.Hooks.OnGCPercent = func(int) {
		// Called at the start, then at the end of the start-up, right
		// after the client was told to reuse listings.
		if calls++; calls == 2 {
			steady <- listedItems(t, opts.Registry, "reused")
		}
	}
	runBridge(t, opts)
	if reused := <-steady; reused != 0 {
		t.Fatalf("%v items reused before the end of the start-up, want none", reused)
	}
	// Relists every 100 ms: the next full one fills the memo, the one after
	// reuses the pod's sandbox and two containers.
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for listedItems(t, opts.Registry, "reused") < 3 {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("after 10 s of relists, %v items reused, %v decoded; want the pod's 3 reused",
				listedItems(t, opts.Registry, "reused"), listedItems(t, opts.Registry, "decoded"))
		}
	}
	if problems, err := testutil.GatherAndLint(opts.Registry, "pleg_bridge_listed_items_total"); err != nil || len(problems) > 0 {
		t.Errorf("lint pleg_bridge_listed_items_total: %v %v", problems, err)
	}
}
