package cri_test

import (
	"context"
	"strings"
	"testing"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	containerdtypes "github.com/containerd/containerd/api/types"
	"github.com/containerd/typeurl/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// envelopeOf packs msg as containerd does.
func envelopeOf(t *testing.T, ns, topic string, msg proto.Message) *containerdtypes.Envelope {
	t.Helper()
	b, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &containerdtypes.Envelope{
		Timestamp: timestamppb.New(time.Unix(1700000000, 5)), Namespace: ns, Topic: topic,
		Event: &anypb.Any{TypeUrl: string(msg.ProtoReflect().Descriptor().FullName()), Value: b},
	}
}

// TestDecodeEnvelopeAgreesWithTypeurl holds the hand-written decoding to
// typeurl, containerd's own: for every topic, the same IDs come out.
func TestDecodeEnvelopeAgreesWithTypeurl(t *testing.T) {
	cases := []struct {
		topic string
		msg   proto.Message
		want  generator.TaskEvent
	}{
		{generator.TopicTaskStart, &eventtypes.TaskStart{ContainerID: "c1", Pid: 7}, generator.TaskEvent{ID: "c1"}},
		{generator.TopicTaskExit, &eventtypes.TaskExit{ContainerID: "c1", ID: "c1", ExitStatus: 3, ExitedAt: timestamppb.New(time.Unix(1700000000, 123456789))},
			generator.TaskEvent{ID: "c1", ExitStatus: 3, ExitedAt: time.Unix(1700000000, 123456789).UTC()}},
		{generator.TopicTaskExit, &eventtypes.TaskExit{ContainerID: "c1", ID: "exec-9", ExitStatus: 3}, generator.TaskEvent{ID: "c1", ExecID: "exec-9", ExitStatus: 3}},
		{generator.TopicTaskOOM, &eventtypes.TaskOOM{ContainerID: "c3"}, generator.TaskEvent{ID: "c3"}},
		{generator.TopicTaskDelete, &eventtypes.TaskDelete{ContainerID: "c1", ID: "c1"}, generator.TaskEvent{ID: "c1"}},
		{generator.TopicTaskDelete, &eventtypes.TaskDelete{ContainerID: "c1"}, generator.TaskEvent{ID: "c1"}},
		{generator.TopicContainerDelete, &eventtypes.ContainerDelete{ID: "c2"}, generator.TaskEvent{ID: "c2"}},
	}
	for _, tc := range cases {
		env := envelopeOf(t, "k8s.io", tc.topic, tc.msg)
		got, err := cri.DecodeEnvelope(env)
		if err != nil {
			t.Fatalf("%s: %v", tc.topic, err)
		}
		tc.want.Topic, tc.want.At = tc.topic, env.GetTimestamp().AsTime()
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.topic, diff)
		}
		v, err := typeurl.UnmarshalAny(env.GetEvent())
		if err != nil {
			t.Fatalf("typeurl: %s: %v", tc.topic, err)
		}
		if !proto.Equal(v.(proto.Message), tc.msg) {
			t.Errorf("%s: typeurl decodes %v, the payload was %v", tc.topic, v, tc.msg)
		}
		var lib string
		switch m := v.(type) {
		case *eventtypes.TaskStart:
			lib = m.GetContainerID()
		case *eventtypes.TaskExit:
			lib = m.GetContainerID()
		case *eventtypes.TaskDelete:
			lib = m.GetContainerID()
		case *eventtypes.TaskOOM:
			lib = m.GetContainerID()
		case *eventtypes.ContainerDelete:
			lib = m.GetID()
		}
		if lib != got.ID {
			t.Errorf("%s: ID %q, typeurl's payload names %q", tc.topic, got.ID, lib)
		}
	}
}

func TestDecodeEnvelopeNamesWhatIsWrong(t *testing.T) {
	good := envelopeOf(t, "k8s.io", generator.TopicTaskExit, &eventtypes.TaskExit{ContainerID: "c1", ID: "c1"})
	cases := map[string]struct {
		env  *containerdtypes.Envelope
		want string
	}{
		"another namespace": {envelopeOf(t, "moby", generator.TopicTaskExit, &eventtypes.TaskExit{ContainerID: "c1"}), `namespace "moby", want "k8s.io"`},
		"another topic":     {envelopeOf(t, "k8s.io", "/images/update", &eventtypes.TaskExit{ContainerID: "c1"}), `unexpected topic "/images/update"`},
		"no payload":        {&containerdtypes.Envelope{Namespace: "k8s.io", Topic: generator.TopicTaskExit}, "no payload"},
		"wrong payload":     {envelopeOf(t, "k8s.io", generator.TopicTaskExit, &eventtypes.TaskStart{ContainerID: "c1"}), `payload type "containerd.events.TaskStart", want containerd.events.TaskExit`},
		"garbage":           {&containerdtypes.Envelope{Namespace: "k8s.io", Topic: generator.TopicTaskExit, Event: &anypb.Any{TypeUrl: good.GetEvent().GetTypeUrl(), Value: []byte{0xff, 0xff}}}, "decode containerd.events.TaskExit"},
		"no ID":             {envelopeOf(t, "k8s.io", generator.TopicTaskStart, &eventtypes.TaskStart{Pid: 1}), "no container ID"},
	}
	for name, tc := range cases {
		if _, err := cri.DecodeEnvelope(tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to say %q", name, err, tc.want)
		}
	}
	// A type URL with containerd's prefix decodes too.
	prefixed := proto.CloneOf(good)
	prefixed.Event.TypeUrl = "types.containerd.io/" + prefixed.Event.TypeUrl
	if _, err := cri.DecodeEnvelope(prefixed); err != nil {
		t.Errorf("prefixed type URL: %v", err)
	}
}

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
