package soak

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// A rollout on a node replaces its oldest pods, each ended by the
// kubelet's usual path and followed by a new pod, amid the churn, and
// records exactly the transitions the runtime made.
// It runs in a bubble so that the runtime's timestamps equal the
// driver's.
func TestNodeChurnRolloutReplacesTheOldestPodsAndRecordsEveryTransition(t *testing.T) {
	synctest.Test(t, testNodeChurnRollout)
}

func testNodeChurnRollout(t *testing.T) {
	rt := crisim.NewRuntime(crisim.Options{EventBuffer: 1 << 16})
	if err := rt.PopulateKubelet(4, 8); err != nil {
		t.Fatal(err)
	}
	uids := func() map[string]bool {
		m := map[string]bool{}
		for _, sb := range rt.ListPodSandbox(nil) {
			if sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
				m[sb.GetMetadata().GetUid()] = true
			}
		}
		return m
	}
	before := uids()
	subCtx, endSub := context.WithCancel(t.Context())
	sub := rt.Subscribe(subCtx)
	n := NewNodeChurn(rt, ChurnOptions{ContainersPerPod: 2, Lifetime: time.Hour, Seed: 3})

	pods, calls := n.Replace(3)
	if pods != 3 || calls != 3*(1+2+2+2+2) {
		t.Fatalf("Replace(3) = %d pods, %d calls; want 3 pods, 27 calls", pods, calls)
	}
	made := 0
	for i := 0; ; i++ {
		if i%3 == 0 { // the steady churn goes on between the rollout's calls
			if _, err := n.Step(); err != nil {
				t.Fatalf("Step: %v", err)
			}
		}
		m, ok, err := n.Roll()
		if err != nil {
			t.Fatalf("Roll: %v", err)
		}
		if !ok {
			break
		}
		made += m
	}
	if made != calls {
		t.Errorf("the rollout made %d transitions in %d calls, want one a call", made, calls)
	}
	endSub()
	var evs []*runtimeapi.ContainerEventResponse
	for ev := range sub.Events() {
		evs = append(evs, ev)
	}
	if diff := cmp.Diff(transitionsFromEvents(evs), n.Transitions(), cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); diff != "" {
		t.Errorf("recorded transitions differ from the runtime's events (-runtime +recorded):\n%s", diff)
	}

	after := uids()
	kept, gone := 0, 0
	for uid := range before {
		if after[uid] {
			kept++
		} else {
			gone++
		}
	}
	if kept != 1 || gone != 3 {
		t.Errorf("of the 4 populated pods %d still run and %d are gone, want 1 and 3", kept, gone)
	}
	// Each replaced pod's containers died before they were removed, and
	// its sandbox died after them and was removed last.
	died := map[string]bool{}
	for _, tr := range n.Transitions() {
		switch tr.Type {
		case ContainerDied:
			died[tr.ContainerID] = true
		case ContainerRemoved:
			if !died[tr.ContainerID] {
				t.Errorf("%s removed before it died", tr.ContainerID)
			}
		}
	}
	if pods, _ := n.Replace(10); pods != 4 {
		t.Errorf("a second Replace(10) plans %d pods, want the 4 that stand", pods)
	}
}

// A drain evicts every standing pod of one node, each ended by the
// kubelet's usual path, and another node adopts as many new pods; both
// record exactly the transitions their runtimes made.
func TestNodeChurnDrainEvictsEveryStandingPodAndAnotherNodeAdoptsThem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		drained := crisim.NewRuntime(crisim.Options{EventBuffer: 1 << 16})
		if err := drained.PopulateKubelet(4, 8); err != nil {
			t.Fatal(err)
		}
		adopter := crisim.NewRuntime(crisim.Options{EventBuffer: 1 << 16})
		subCtx, endSub := context.WithCancel(t.Context())
		subs := []*crisim.Subscription{drained.Subscribe(subCtx), adopter.Subscribe(subCtx)}
		from := NewNodeChurn(drained, ChurnOptions{ContainersPerPod: 2, Lifetime: time.Hour, Seed: 5})
		to := NewNodeChurn(adopter, ChurnOptions{ContainersPerPod: 2, Lifetime: time.Hour, Seed: 6})

		pods, calls := from.Evict()
		if pods != 4 || calls != 4*(2+2+2) {
			t.Fatalf("Evict() = %d pods, %d calls; want 4 pods, 24 calls", pods, calls)
		}
		if adopted := to.Adopt(pods); adopted != 4*(1+2) {
			t.Fatalf("Adopt(4) = %d calls, want 12", adopted)
		}
		for _, n := range []*NodeChurn{from, to} {
			for {
				_, ok, err := n.Roll()
				if err != nil {
					t.Fatalf("Roll: %v", err)
				}
				if !ok {
					break
				}
			}
		}
		endSub()
		for i, n := range []*NodeChurn{from, to} {
			var evs []*runtimeapi.ContainerEventResponse
			for ev := range subs[i].Events() {
				evs = append(evs, ev)
			}
			if diff := cmp.Diff(transitionsFromEvents(evs), n.Transitions(), cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); diff != "" {
				t.Errorf("node %d: recorded transitions differ from the runtime's events (-runtime +recorded):\n%s", i, diff)
			}
		}
		if got := len(drained.ListPodSandbox(nil)) + len(drained.ListContainers(nil)); got != 0 {
			t.Errorf("the drained node still has %d sandboxes and containers, want none", got)
		}
		ready := &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}
		if got := len(adopter.ListPodSandbox(ready)); got != 4 {
			t.Errorf("the adopting node runs %d pods, want 4", got)
		}
		if pods, _ := from.Evict(); pods != 0 {
			t.Errorf("a second Evict plans %d pods, want none: the node stands empty", pods)
		}
		if pods, _ := to.Replace(10); pods != 4 {
			t.Errorf("Replace(10) on the adopting node plans %d pods, want its 4 adopted ones", pods)
		}
	})
}
