package bridge_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
)

// TestStartupOverComesOnceTheFirstRelistIsAcked: Options.StartupOver,
// where the process moves the collector's target off its start-up value,
// is called after the first relist's events are all acked, in both modes.
func TestStartupOverComesOnceTheFirstRelistIsAcked(t *testing.T) {
	t.Parallel()
	for _, mode := range []generator.Mode{generator.ModeEvented, generator.ModeGeneric} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			n := newTestNode(t)
			n.startPod(t, "app", "sidecar", "proxy")
			opts := testOptions(n.endpoint, n.url, t.TempDir())
			opts.Mode = mode
			calls := make(chan bridge.Status, 4)
			var b *bridge.Bridge
			ready := make(chan struct{})
			opts.StartupOver = func() {
				<-ready
				calls <- b.Status()
			}
			b, _ = runBridge(t, opts)
			close(ready)
			got := <-calls
			if !got.Synced || got.Pending != 0 {
				t.Errorf("StartupOver called at %+v: before the first relist's events were acked", got)
			}
		})
	}
}

// TestListingsAreReusedOnceTheStartUpIsOver: the CRI client reuses what a
// full listing decoded only from the end of the start-up (the first
// relist's events acked), and then every steady relist does.
func TestListingsAreReusedOnceTheStartUpIsOver(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	n.startPod(t, "app", "sidecar")
	opts := testOptions(n.endpoint, n.url, t.TempDir())
	opts.Registry = prometheus.NewRegistry()
	listed := func(how string) float64 {
		return metricstest.Value(t, opts.Registry, "pleg_bridge_listed_items_total", map[string]string{"how": how})
	}
	steady := make(chan float64, 1)
	opts.StartupOver = func() {
		// Called at the end of the start-up, right before the client is
		// told to reuse listings.
		steady <- listed("reused")
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
