package cri_test

import (
	"context"
	"testing"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	"github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCRIClientFollowsContainerdsEventsOnTheCRISocket subscribes over a real
// gRPC socket with the client's filters: the k8s.io events of the trigger's
// topics arrive decoded, others are filtered out by the runtime, a dropped
// subscription ends with Unavailable, and nothing but Subscribe is called.
func TestCRIClientFollowsContainerdsEventsOnTheCRISocket(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Containerd17Options())
	srv, ep := crisimtest.Serve(t, model)
	cli := newClient(t, ep, cri.Options{})
	got := make(chan generator.TaskEvent, 64)
	done := make(chan error, 1)
	go func() {
		done <- cli.WatchTaskEvents(t.Context(), func(ev generator.TaskEvent, err error) {
			if err != nil {
				t.Errorf("event does not decode: %v", err)
				return
			}
			got <- ev
		})
	}()
	// containerd keeps nothing for a subscriber that is not there yet: make
	// sandboxes until the first one's start arrives.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	var first generator.TaskEvent
wait:
	for {
		select {
		case first = <-got:
			break wait
		case <-tick.C:
			must(model.RunPodSandbox(crisim.PodConfig{}))
		case <-deadline:
			t.Fatal("no containerd event within 10s")
		}
	}
	if first.Topic != generator.TopicTaskStart || first.At.IsZero() {
		t.Errorf("first event %+v, want a task start with a time", first)
	}
	drain := func() {
		for {
			select {
			case <-got:
			default:
				return
			}
		}
	}
	drain()
	sb := must(model.RunPodSandbox(crisim.PodConfig{}))
	c := must(model.CreateContainer(sb, crisim.ContainerConfig{}))
	must(0, model.StartContainer(c))
	must(0, model.InjectTaskEvent("moby", crisim.TopicTaskExit, &eventtypes.TaskExit{ContainerID: c, ID: c}))
	must(0, model.StopContainer(c, 3, "Error", ""))
	must(0, model.RemoveContainer(c))
	var seen []string
	for len(seen) < 5 {
		select {
		case ev := <-got:
			// A start of a sandbox made while waiting for the first may come
			// after the drain: only sb's and c's count.
			if name, ok := map[string]string{sb: "sb", c: "c"}[ev.ID]; ok {
				seen = append(seen, ev.Topic+" "+name)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("got %v, want 5 events", seen)
		}
	}
	want := []string{"/tasks/start sb", "/tasks/start c", "/tasks/exit c", "/tasks/delete c", "/containers/delete c"}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if n := srv.DropStreams(); n != 1 {
		t.Fatalf("DropStreams ended %d streams", n)
	}
	select {
	case err := <-done:
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("WatchTaskEvents = %v, want Unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchTaskEvents did not return after the subscription was dropped")
	}
	if m := srv.MutatingCalls(); len(m) != 0 {
		t.Errorf("the client made mutating calls: %v", m)
	}
	if n := srv.Calls()["/containerd.services.events.v1.Events/Subscribe"]; n != 1 {
		t.Errorf("Subscribe called %d times, want 1", n)
	}
}

func TestCRIClientOnARuntimeWithoutContainerdsEventService(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Options{RuntimeName: "cri-o", RuntimeVersion: "1.31.0"})
	_, ep := crisimtest.Serve(t, model)
	cli := newClient(t, ep, cri.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := cli.WatchTaskEvents(ctx, func(generator.TaskEvent, error) {})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("WatchTaskEvents = %v, want Unimplemented", err)
	}
}
