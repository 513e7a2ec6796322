package bridge_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
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
	listed := func(how string) float64 {
		return metricstest.Value(t, opts.Registry, "pleg_bridge_listed_items_total", map[string]string{"how": how})
	}
	steady := make(chan float64, 1)
	calls := 0
	opts.Hooks.OnGCPercent = func(int) {
		// Called at the start, then at the end of the start-up, right
		// after the client was told to reuse listings.
		if calls++; calls == 2 {
			steady <- listed("reused")
		}
	}
	full := make(chan struct{}, 64)
	opts.Hooks.WrapRuntime = func(rt generator.Runtime) generator.Runtime { return fullListings{rt, full} }
	runBridge(t, opts)
	if reused := <-steady; reused != 0 {
		t.Fatalf("%v items reused before the end of the start-up, want none", reused)
	}
	// Relists every 100 ms: one may have begun before the end of the
	// start-up, the next fills the memo, the one after reuses the pod's
	// sandbox and two containers.
	for len(full) > 0 {
		<-full
	}
	deadline := time.After(10 * time.Second)
	for i := range 3 {
		select {
		case <-full:
		case <-deadline:
			t.Fatalf("%d full relists within 10 s of the end of the start-up, want 3", i)
		}
	}
	if reused := listed("reused"); reused < 3 {
		t.Errorf("%v items reused (%v decoded) after three full relists, want at least the pod's 3", reused, listed("decoded"))
	}
	if problems, err := testutil.GatherAndLint(opts.Registry, "pleg_bridge_listed_items_total"); err != nil || len(problems) > 0 {
		t.Errorf("lint pleg_bridge_listed_items_total: %v %v", problems, err)
	}
}

// fullListings signals on done after each full container listing (no
// filter) that returned.
type fullListings struct {
	generator.Runtime
	done chan<- struct{}
}

func (f fullListings) ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	cs, err := f.Runtime.ListContainers(ctx, filter)
	if filter == nil && err == nil {
		select {
		case f.done <- struct{}{}:
		default:
		}
	}
	return cs, err
}
