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

// transitionsFromEvents derives the transitions from the runtime's own event
// stream, independently of the driver's bookkeeping: STARTED, STOPPED and
// DELETED of a container or sandbox are its Started, Died and Removed.
func transitionsFromEvents(evs []*runtimeapi.ContainerEventResponse) []Transition {
	var out []Transition
	for _, ev := range evs {
		var typ string
		switch ev.ContainerEventType {
		case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
			typ = ContainerStarted
		case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
			typ = ContainerDied
		case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
			typ = ContainerRemoved
		default:
			continue
		}
		sb := ev.GetPodSandboxStatus()
		out = append(out, Transition{
			ContainerID: ev.ContainerId,
			PodUID:      sb.GetMetadata().GetUid(),
			Sandbox:     ev.ContainerId == sb.GetId(),
			Type:        typ,
			At:          time.Unix(0, ev.CreatedAt),
		})
	}
	return out
}

func TestDriverRecordsEveryTransitionTheRuntimeMakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := crisim.NewRuntime(crisim.Options{EventBuffer: 1 << 20})
		subCtx, endSub := context.WithCancel(t.Context())
		sub := rt.Subscribe(subCtx)
		ctx, cancel := context.WithCancel(t.Context())
		d := newDriver(rt, driverOptions{Rate: 100, ContainersPerPod: 2, Lifetime: time.Second, Seed: 1})
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		time.Sleep(20 * time.Second)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		// Only once the driver stopped: a transition it makes as it is
		// cancelled must still reach the subscription.
		endSub()
		var evs []*runtimeapi.ContainerEventResponse
		for ev := range sub.Events() {
			evs = append(evs, ev)
		}

		got := d.transitions()
		if diff := cmp.Diff(transitionsFromEvents(evs), got, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); diff != "" {
			t.Errorf("recorded transitions differ from the runtime's events (-runtime +recorded):\n%s", diff)
		}
		// 100 a second for 20 s, give or take a tick at each end.
		if len(got) < 1990 || len(got) > 2010 {
			t.Errorf("made %d transitions in 20s at 100/s, want about 2000", len(got))
		}
		// Every path that ends a container was taken: a container that died
		// and went in one call, a sandbox that died with its containers, and
		// a pod removed in one call.
		ended := map[string]bool{}
		at := map[transitionKey]time.Time{}
		for _, tr := range got {
			at[transitionKey{tr.ContainerID, tr.Type}] = tr.At
		}
		for _, tr := range got {
			if tr.Type != ContainerRemoved {
				continue
			}
			died, ok := at[transitionKey{tr.ContainerID, ContainerDied}]
			switch {
			case !ok:
				t.Errorf("%s removed without dying", tr.ContainerID)
			case tr.Sandbox && died.Equal(tr.At):
				ended["pod removed in one call"] = true
			case !tr.Sandbox && died.Equal(tr.At):
				ended["container removed while running"] = true
			case !tr.Sandbox:
				ended["container stopped, then removed"] = true
			}
		}
		if len(ended) != 3 {
			t.Errorf("pod endings seen: %v, want all three", ended)
		}
	})
}

func TestDriverMakesNoTransitionWhilePaused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := crisim.NewRuntime(crisim.Options{})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		d := newDriver(rt, driverOptions{Rate: 200, ContainersPerPod: 1, Lifetime: time.Second, Seed: 2})
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		time.Sleep(time.Second)
		d.pause()
		before := d.count()
		time.Sleep(5 * time.Second)
		if n := d.count(); n != before {
			t.Errorf("made %d transitions while paused", n-before)
		}
		d.resume()
		time.Sleep(time.Second)
		// After the pause the rate starts again: no burst making up for it.
		if n := d.count() - before; n < 180 || n > 220 {
			t.Errorf("made %d transitions in the second after resume at 200/s, want about 200", n)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	})
}
