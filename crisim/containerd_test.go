package crisim

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	eventtypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func eventsClient(t *testing.T, socket string) eventsapi.EventsClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return eventsapi.NewEventsClient(conn)
}

// TestTaskEventsFollowTheModelForEverySubscriber subscribes twice over the
// socket: both subscribers get every envelope of a container's life (an
// exchange, even with containerd 1.7's shared CRI channel), with the
// filters applied and the payloads as containerd packs them.
func TestTaskEventsFollowTheModelForEverySubscriber(t *testing.T) {
	rt := NewRuntime(Containerd17Options())
	ts := serve(t, rt, ServerOptions{})
	ctx := testContext(t)
	cli := eventsClient(t, ts.socket)
	filters := []string{`namespace=="k8s.io",topic=="/tasks/exit"`, `namespace==k8s.io,topic=="/containers/delete"`}
	var subs []eventsapi.Events_SubscribeClient
	for range 2 {
		s, err := cli.Subscribe(ctx, &eventsapi.SubscribeRequest{Filters: filters})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Header(); err != nil { // the server subscribed
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	sb := must(rt.RunPodSandbox(PodConfig{}))
	c := must(rt.CreateContainer(sb, ContainerConfig{}))
	must(0, rt.StartContainer(c))
	must(0, rt.InjectTaskEvent("moby", TopicTaskExit, &eventtypes.TaskExit{ContainerID: c, ID: c}))
	must(0, rt.StopContainer(c, 3, "Error", ""))
	must(0, rt.RemoveContainer(c))
	for i, s := range subs {
		var got []string
		for range 2 {
			env, err := s.Recv()
			if err != nil {
				t.Fatalf("subscriber %d: %v", i, err)
			}
			got = append(got, env.GetNamespace()+" "+env.GetTopic())
			if env.GetTopic() == TopicTaskExit {
				var exit eventtypes.TaskExit
				if env.GetEvent().GetTypeUrl() != "containerd.events.TaskExit" {
					t.Errorf("type URL %q", env.GetEvent().GetTypeUrl())
				}
				if err := proto.Unmarshal(env.GetEvent().GetValue(), &exit); err != nil || exit.GetContainerID() != c || exit.GetExitStatus() != 3 || exit.GetExitedAt() == nil {
					t.Errorf("exit payload %v, %v", &exit, err)
				}
			}
		}
		if want := "k8s.io /tasks/exit,k8s.io /containers/delete"; strings.Join(got, ",") != want {
			t.Errorf("subscriber %d got %v, want %s", i, got, want)
		}
	}
	if m := ts.srv.MutatingCalls(); len(m) != 0 {
		t.Errorf("mutating calls: %v", m)
	}
}

func TestTaskEventsRefuseFiltersTheModelDoesNotUnderstand(t *testing.T) {
	rt := NewRuntime(Containerd17Options())
	ts := serve(t, rt, ServerOptions{})
	cli := eventsClient(t, ts.socket)
	for _, f := range []string{`topic~="/tasks/.*"`, `event.container_id=="x"`, `topic=="unterminated`} {
		s, err := cli.Subscribe(testContext(t), &eventsapi.SubscribeRequest{Filters: []string{f}})
		if err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), strconv.Quote(f)) {
			t.Errorf("filter %s: %v, want InvalidArgument naming it", f, err)
		}
	}
	_, err := cli.Publish(context.Background(), &eventsapi.PublishRequest{Topic: "/x"})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("Publish = %v, want Unimplemented", err)
	}
	if m := ts.srv.MutatingCalls(); len(m) != 1 || !strings.HasSuffix(m[0], "/Publish") {
		t.Errorf("mutating calls %v, want the Publish", m)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestATaskExitComesBeforeCRIAndAnOOMKillBeforeItsExit: ExitTask publishes
// the exit (after /tasks/oom for an OOM kill) while CRI still shows the
// container running; the StopContainer that follows takes the exit's time
// as finished_at and publishes only the task's delete. A container stopped
// OOMKilled without ExitTask gets /tasks/oom before /tasks/exit too.
func TestATaskExitComesBeforeCRIAndAnOOMKillBeforeItsExit(t *testing.T) {
	rt := NewRuntime(Options{})
	sub := rt.SubscribeTasks(testContext(t))
	sb := must(rt.RunPodSandbox(PodConfig{}))
	c1 := must(rt.CreateContainer(sb, ContainerConfig{Name: "a"}))
	c2 := must(rt.CreateContainer(sb, ContainerConfig{Name: "b"}))
	must(0, rt.StartContainer(c1))
	must(0, rt.StartContainer(c2))

	exited := must(rt.ExitTask(c1, 137, true))
	if st := must(rt.ContainerStatus(c1)); st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("after ExitTask CRI shows %s, want still running", st.GetState())
	}
	if _, err := rt.ExitTask(c1, 137, true); err == nil {
		t.Error("a second ExitTask of the same container succeeded")
	}
	must(0, rt.StopContainer(c1, 137, "OOMKilled", ""))
	if st := must(rt.ContainerStatus(c1)); st.GetFinishedAt() != exited.UnixNano() || st.GetReason() != "OOMKilled" {
		t.Errorf("CRI status finished_at %d reason %q, want the task exit's %d and OOMKilled", st.GetFinishedAt(), st.GetReason(), exited.UnixNano())
	}
	must(0, rt.StopContainer(c2, 137, "OOMKilled", ""))

	var got []string
	var exits []*eventtypes.TaskExit
	for env := range sub.Events() {
		if env.GetTopic() == TopicContainerCreate || env.GetTopic() == TopicTaskStart {
			continue
		}
		id := c1
		switch env.GetTopic() {
		case TopicTaskExit:
			var e eventtypes.TaskExit
			must(0, proto.Unmarshal(env.GetEvent().GetValue(), &e))
			exits = append(exits, &e)
			id = e.GetContainerID()
		case TopicTaskOOM:
			var e eventtypes.TaskOOM
			must(0, proto.Unmarshal(env.GetEvent().GetValue(), &e))
			id = e.GetContainerID()
		case TopicTaskDelete:
			var e eventtypes.TaskDelete
			must(0, proto.Unmarshal(env.GetEvent().GetValue(), &e))
			id = e.GetContainerID()
		}
		name := map[string]string{c1: "a", c2: "b"}[id]
		got = append(got, env.GetTopic()+" "+name)
		if len(got) == 6 {
			break
		}
	}
	want := []string{"/tasks/oom a", "/tasks/exit a", "/tasks/delete a", "/tasks/oom b", "/tasks/exit b", "/tasks/delete b"}
	if !slices.Equal(got, want) {
		t.Errorf("task events %v, want %v", got, want)
	}
	if len(exits) == 2 {
		if exits[0].GetExitStatus() != 137 || !exits[0].GetExitedAt().AsTime().Equal(exited) {
			t.Errorf("ExitTask's exit: %v, want 137 at %v", exits[0], exited)
		}
		st := must(rt.ContainerStatus(c2))
		if exits[1].GetExitedAt().AsTime().UnixNano() != st.GetFinishedAt() {
			t.Errorf("StopContainer's exit at %v, CRI finished_at %d", exits[1].GetExitedAt().AsTime(), st.GetFinishedAt())
		}
	}
}
