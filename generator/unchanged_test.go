package generator

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
)

// unchangedNode is a simulated runtime and a generator reading it through
// a runtime whose listings have a version (listedRuntime), as the bridge's
// CRI client's do once its start-up is over: its full relists can come back
// unchanged.
type unchangedNode struct {
	model *crisim.Runtime
	rt    *listedRuntime
	reg   *prometheus.Registry
	sink  *sliceSink
	g     *Generator
}

// newUnchangedNode builds a generator over model, reusing listings if
// reuse.
func newUnchangedNode(t *testing.T, model *crisim.Runtime, reuse bool) *unchangedNode {
	t.Helper()
	rt := &listedRuntime{model: model}
	if reuse {
		rt.ReuseListings()
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	n := &unchangedNode{model: model, rt: rt, reg: reg, sink: &sliceSink{}}
	n.g = New(InstrumentRuntime(rt, m), n.sink, Options{Logger: slog.New(slog.DiscardHandler), Metrics: m, Listings: rt})
	return n
}

// listedRuntime serves model's calls in-process, as Runtime, with a
// listing version as Listings promises it: the number moves on every full
// listing, of containers or of sandboxes, that does not list exactly what
// the one before it did (the same IDs, each in the same state and with the
// same creation time), and means nothing until ReuseListings. The CRI
// client (package cri) keeps its version so, by its listing memo; these
// tests cannot use it, for it imports the generator. A call to
// ContainerStatus fails with the codes failStatus holds, one per call.
// Safe for concurrent use.
type listedRuntime struct {
	model *crisim.Runtime

	mu         sync.Mutex
	reuse      bool                  // guarded by mu
	version    uint64                // guarded by mu
	containers map[string]listedItem // the last full listing's; guarded by mu
	sandboxes  map[string]listedItem // the last full listing's; guarded by mu
	failStatus []codes.Code          // guarded by mu
}

// listedItem is what tells a listed item changed.
type listedItem struct {
	state     int32
	createdAt int64
}

var (
	_ Runtime  = (*listedRuntime)(nil)
	_ Listings = (*listedRuntime)(nil)
)

// failNextStatus makes the next ContainerStatus call fail with code.
func (r *listedRuntime) failNextStatus(code codes.Code) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failStatus = append(r.failStatus, code)
}

// ReuseListings implements Listings.
func (r *listedRuntime) ReuseListings() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reuse = true
}

// ListingVersion implements Listings.
func (r *listedRuntime) ListingVersion() (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version, r.reuse
}

// listed records a full listing of items in *last, moving the version
// unless it lists what *last holds.
func (r *listedRuntime) listed(last *map[string]listedItem, items map[string]listedItem) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reuse && *last != nil && maps.Equal(*last, items) {
		return
	}
	r.version++
	if r.reuse {
		*last = items
	}
}

func (r *listedRuntime) Version(context.Context) (*runtimeapi.VersionResponse, error) {
	return r.model.Version(), nil
}

func (r *listedRuntime) ListPodSandbox(_ context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	out := r.model.ListPodSandbox(filter)
	if filter == nil {
		items := make(map[string]listedItem, len(out))
		for _, sb := range out {
			items[sb.GetId()] = listedItem{int32(sb.GetState()), sb.GetCreatedAt()}
		}
		r.listed(&r.sandboxes, items)
	}
	return out, nil
}

func (r *listedRuntime) ListContainers(_ context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	out := r.model.ListContainers(filter)
	if filter == nil {
		items := make(map[string]listedItem, len(out))
		for _, c := range out {
			items[c.GetId()] = listedItem{int32(c.GetState()), c.GetCreatedAt()}
		}
		r.listed(&r.containers, items)
	}
	return out, nil
}

func (r *listedRuntime) ContainerStatus(_ context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	r.mu.Lock()
	var fail codes.Code
	if len(r.failStatus) > 0 {
		fail, r.failStatus = r.failStatus[0], r.failStatus[1:]
	}
	r.mu.Unlock()
	if fail != codes.OK {
		return nil, status.Errorf(fail, "get status of container %s: injected", id)
	}
	return r.model.ContainerStatus(id)
}

func (r *listedRuntime) WatchEvents(ctx context.Context, _ func(*runtimeapi.ContainerEventResponse)) error {
	<-ctx.Done()
	return status.Error(codes.Unavailable, "no event stream")
}

// relist takes one full relist and returns the events it sent, each as
// "type container state exit".
func (n *unchangedNode) relist(t *testing.T) []string {
	t.Helper()
	from := len(n.sink.events)
	if err := n.g.Relist(t.Context()); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range n.sink.events[from:] {
		exit := "-"
		if ev.ExitCode != nil {
			exit = fmt.Sprint(*ev.ExitCode)
		}
		out = append(out, fmt.Sprintf("%s %s %s %s", ev.Type, ev.Container.ID, ev.State, exit))
	}
	return out
}

func (n *unchangedNode) unchanged(t *testing.T) float64 {
	t.Helper()
	return metricstest.Value(t, n.reg, "pleg_bridge_relists_unchanged_total", nil)
}

// newQuietPod returns a node of one pod sandbox, "web" (UID uid-web), with
// no container, relisted twice: the second relist came back unchanged.
func newQuietPod(t *testing.T) (*unchangedNode, *crisim.Runtime, string) {
	t.Helper()
	model := crisim.NewRuntime(crisim.Options{})
	sb := must(model.RunPodSandbox(crisim.PodConfig{Name: "web", Namespace: "default", UID: "uid-web"}))
	n := newUnchangedNode(t, model, true)
	n.relist(t)
	n.relist(t)
	if n.unchanged(t) != 1 {
		t.Fatalf("%v unchanged relists of a quiet node, want 1", n.unchanged(t))
	}
	return n, model, sb
}

// mergeTargeted takes a targeted relist of pod uid-web's sandbox sb (of its
// containers only, if containersOnly) and merges it.
func (n *unchangedNode) mergeTargeted(t *testing.T, sb string, containersOnly bool) {
	t.Helper()
	b, err := n.g.relister.relist(t.Context(), &relistScope{podUID: "uid-web", sandboxID: sb, containersOnly: containersOnly})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.g.merge.apply(t.Context(), b); err != nil {
		t.Fatal(err)
	}
}

// TestAnUnchangedRelistSendsWhatAFullMergeWould runs a node through random
// steps, many of which change nothing, and relists it after each with two
// generators: one whose relists come back unchanged when nothing changed,
// and one that merges every pod every time. They must send the same events
// at every step.
func TestAnUnchangedRelistSendsWhatAFullMergeWould(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Options{})
	if err := model.PopulateKubelet(4, 12); err != nil {
		t.Fatal(err)
	}
	fast := newUnchangedNode(t, model, true)
	full := newUnchangedNode(t, model, false)
	rng := rand.New(rand.NewPCG(13, 1))
	pods := 0
	states := func() (running, exited []*runtimeapi.Container, ready, notReady []string) {
		for _, c := range model.ListContainers(nil) {
			switch c.GetState() {
			case runtimeapi.ContainerState_CONTAINER_RUNNING:
				running = append(running, c)
			case runtimeapi.ContainerState_CONTAINER_EXITED:
				exited = append(exited, c)
			}
		}
		for _, sb := range model.ListPodSandbox(nil) {
			if sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
				ready = append(ready, sb.GetId())
			} else {
				notReady = append(notReady, sb.GetId())
			}
		}
		return running, exited, ready, notReady
	}
	changes := 0
	for step := range 80 {
		running, exited, ready, notReady := states()
		what := "nothing"
		switch op := rng.IntN(10); {
		case op < 5:
		case op == 5 && len(running) > 0:
			c := running[rng.IntN(len(running))]
			must(0, model.StopContainer(c.GetId(), rng.Int32N(3), "Error", ""))
			what = "stop " + c.GetId()
		case op == 6 && len(exited) > 0:
			c := exited[rng.IntN(len(exited))]
			must(0, model.RemoveContainer(c.GetId()))
			what = "remove " + c.GetId()
		case op == 7 && len(ready) > 0:
			id := must(model.CreateContainer(ready[rng.IntN(len(ready))], crisim.ContainerConfig{Name: fmt.Sprint("c", step)}))
			must(0, model.StartContainer(id))
			what = "start " + id
		case op == 8:
			pods++
			sb := must(model.RunPodSandbox(crisim.PodConfig{Name: fmt.Sprint("p", pods), Namespace: "default", UID: fmt.Sprint("uid-", pods)}))
			what = "run pod " + sb
		case op == 9 && len(ready) > 0:
			sb := ready[rng.IntN(len(ready))]
			must(0, model.StopPodSandbox(sb))
			what = "stop pod " + sb
		case len(notReady) > 0:
			sb := notReady[rng.IntN(len(notReady))]
			for _, c := range model.ListContainers(&runtimeapi.ContainerFilter{PodSandboxId: sb}) {
				must(0, model.RemoveContainer(c.GetId()))
			}
			must(0, model.RemovePodSandbox(sb))
			what = "remove pod " + sb
		}
		if what != "nothing" {
			changes++
		}
		// A relist's events are in order for each container, not across.
		got, want := byContainer(fast.relist(t)), byContainer(full.relist(t))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("step %d (%s): events (-merged every pod, +unchanged relists):\n%s", step, what, diff)
		}
	}
	if n := fast.unchanged(t); n == 0 || changes < 20 {
		t.Fatalf("%d unchanged relists, %d steps that changed something: the test exercised too little", int(n), changes)
	}
	if n := full.unchanged(t); n != 0 {
		t.Fatalf("a client that does not reuse listings had %d unchanged relists", int(n))
	}
}

// byContainer groups events as unchangedNode.relist returns them by
// container, in order.
func byContainer(events []string) map[string][]string {
	out := map[string][]string{}
	for _, e := range events {
		id := strings.Fields(e)[1]
		out[id] = append(out[id], e)
	}
	return out
}

// TestARelistAfterAFailedStatusCallIsNotUnchanged: a status call that fails
// leaves the container at its cached state for the next relist to see the
// change again. That relist lists what the one before did, and must merge
// it all the same.
func TestARelistAfterAFailedStatusCallIsNotUnchanged(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Options{})
	sb := must(model.RunPodSandbox(crisim.PodConfig{Name: "web", Namespace: "default", UID: "uid-web"}))
	c := must(model.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
	must(0, model.StartContainer(c))
	n := newUnchangedNode(t, model, true)
	n.relist(t) // fills the memo
	if got := n.relist(t); len(got) != 0 || n.unchanged(t) != 1 {
		t.Fatalf("a relist of a node that did not change: events %v, %v unchanged relists; want none, 1", got, n.unchanged(t))
	}

	must(0, model.StopContainer(c, 3, "Error", ""))
	n.rt.failNextStatus(codes.Unavailable)
	if got := n.relist(t); len(got) != 0 {
		t.Fatalf("a relist whose status call failed sent %v; want nothing until the status is read", got)
	}
	want := []string{"ContainerDied " + c + " exited 3"}
	if got := n.relist(t); !slices.Equal(got, want) {
		t.Fatalf("the relist after the failed status call sent %v, want %v", got, want)
	}
	if got := n.relist(t); len(got) != 0 || n.unchanged(t) != 2 {
		t.Fatalf("then nothing changed: events %v, %v unchanged relists; want none, 2", got, n.unchanged(t))
	}
}

// TestARelistAfterATargetedOneIsNotUnchanged: a container a targeted relist
// found, and gone before the next full relist, leaves the full listings as
// they were. The full relist must still declare it gone.
func TestARelistAfterATargetedOneIsNotUnchanged(t *testing.T) {
	t.Parallel()
	n, model, sb := newQuietPod(t)

	c := must(model.CreateContainer(sb, crisim.ContainerConfig{Name: "job"}))
	must(0, model.StartContainer(c))
	n.mergeTargeted(t, sb, true)
	must(0, model.StopContainer(c, 0, "Completed", ""))
	must(0, model.RemoveContainer(c))

	want := []string{"ContainerDied " + c + " unknown -", "ContainerRemoved " + c + " removed -"}
	if got := n.relist(t); !slices.Equal(got, want) {
		t.Fatalf("full relist after the container went: %v, want %v", got, want)
	}
	if n.unchanged(t) != 1 {
		t.Fatalf("%v unchanged relists, want only the one before the targeted relist", n.unchanged(t))
	}
}

// TestAnUnchangedRelistOvertakenByAMergeIsTakenAgain: something merged
// between an unchanged relist's listing and its turn at the merge makes it
// stale; it is not applied, and the relist is taken again, pods and all.
func TestAnUnchangedRelistOvertakenByAMergeIsTakenAgain(t *testing.T) {
	t.Parallel()
	n, _, sb := newQuietPod(t)
	ctx := t.Context()
	var first *batch
	b, err := n.g.relistFull(ctx, func() {
		n.mergeTargeted(t, sb, false) // after the full relist listed
	}, func(ctx context.Context, b *batch) error {
		if first == nil {
			first = b
		}
		return n.g.merge.apply(ctx, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if first == nil || !first.unchanged || !first.stale {
		t.Fatalf("first batch merged: %+v; want an unchanged relist found stale", first)
	}
	if b.unchanged || len(b.pods) != 1 {
		t.Fatalf("the relist taken again: unchanged %v, %d pods; want the pod merged", b.unchanged, len(b.pods))
	}
	if n.unchanged(t) != 1 {
		t.Fatalf("%v unchanged relists counted, want only the one before", n.unchanged(t))
	}
}

// TestAFullRelistRacedByATargetedOneLeavesNoUnchangedRelist: a container a
// targeted relist found after a full relist listed is kept by that full
// relist (it was seen after the listing). Gone before the next full relist,
// which lists what that one did, it must still be declared gone there.
func TestAFullRelistRacedByATargetedOneLeavesNoUnchangedRelist(t *testing.T) {
	t.Parallel()
	n, model, sb := newQuietPod(t)

	app := must(model.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
	must(0, model.StartContainer(app))
	var job string
	ctx := t.Context()
	_, err := n.g.relistFull(ctx, func() {
		job = must(model.CreateContainer(sb, crisim.ContainerConfig{Name: "job"}))
		must(0, model.StartContainer(job))
		n.mergeTargeted(t, sb, true)
	}, n.g.merge.apply)
	if err != nil {
		t.Fatal(err)
	}
	must(0, model.StopContainer(job, 0, "Completed", ""))
	must(0, model.RemoveContainer(job))

	want := []string{"ContainerDied " + job + " unknown -", "ContainerRemoved " + job + " removed -"}
	if got := n.relist(t); !slices.Equal(got, want) {
		t.Fatalf("full relist after the job went: %v, want %v", got, want)
	}
}

// TestRelistsComeBackUnchangedOnceTheStartUpEnds checks that EndStartup lets
// the runtime's client (Options.Listings) reuse its listings, and only
// then: before, every relist is merged whole; after, a relist of a node
// where nothing changed comes back unchanged.
func TestRelistsComeBackUnchangedOnceTheStartUpEnds(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Options{})
	must(model.RunPodSandbox(crisim.PodConfig{Name: "web", Namespace: "default", UID: "uid-web"}))
	n := newUnchangedNode(t, model, false)
	n.relist(t)
	n.relist(t)
	if got := n.unchanged(t); got != 0 {
		t.Fatalf("%v unchanged relists before the end of the start-up, want 0", got)
	}
	n.g.EndStartup()
	n.relist(t) // fills the client's memo
	n.relist(t)
	if got := n.unchanged(t); got != 1 {
		t.Fatalf("%v unchanged relists after the end of the start-up, want 1", got)
	}
}
