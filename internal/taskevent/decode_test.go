package taskevent_test

import (
	"strings"
	"testing"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	containerdtypes "github.com/containerd/containerd/api/types"
	"github.com/containerd/typeurl/v2"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/taskevent"
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

// TestDecodeAgreesWithTypeurl holds the hand-written decoding to
// typeurl, containerd's own: for every topic, the same IDs come out.
func TestDecodeAgreesWithTypeurl(t *testing.T) {
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
		got, err := taskevent.Decode(env)
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

func TestDecodeNamesWhatIsWrong(t *testing.T) {
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
		if _, err := taskevent.Decode(tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to say %q", name, err, tc.want)
		}
	}
	// A type URL with containerd's prefix decodes too.
	prefixed := proto.CloneOf(good)
	prefixed.Event.TypeUrl = "types.containerd.io/" + prefixed.Event.TypeUrl
	if _, err := taskevent.Decode(prefixed); err != nil {
		t.Errorf("prefixed type URL: %v", err)
	}
}
