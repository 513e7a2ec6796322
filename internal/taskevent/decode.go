package taskevent

import (
	"fmt"
	"strings"

	eventtypes "github.com/containerd/containerd/api/events"
	containerdtypes "github.com/containerd/containerd/api/types"
	"google.golang.org/protobuf/proto"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// Namespace is the containerd namespace of the CRI plugin's containers:
// the only one whose events Decode accepts.
const Namespace = "k8s.io"

// Decode reduces one of containerd's envelopes to a TaskEvent. It
// unmarshals the payload into the type the topic names, after checking that
// the payload's type URL names that type: the generated types are all it
// needs, and typeurl's registry lookup would cost an allocation and a map
// read per event for the same result (the differential test in
// decode_test.go holds it to typeurl). An envelope of another namespace
// or topic, or whose payload does not decode, is an error naming it.
func Decode(env *containerdtypes.Envelope) (generator.TaskEvent, error) {
	if ns := env.GetNamespace(); ns != Namespace {
		return generator.TaskEvent{}, fmt.Errorf("containerd event %s: namespace %q, want %q", env.GetTopic(), ns, Namespace)
	}
	ev := generator.TaskEvent{Topic: env.GetTopic()}
	if ts := env.GetTimestamp(); ts != nil {
		ev.At = ts.AsTime()
	}
	var msg proto.Message
	switch ev.Topic {
	case generator.TopicTaskStart:
		msg = &eventtypes.TaskStart{}
	case generator.TopicTaskExit:
		msg = &eventtypes.TaskExit{}
	case generator.TopicTaskDelete:
		msg = &eventtypes.TaskDelete{}
	case generator.TopicContainerDelete:
		msg = &eventtypes.ContainerDelete{}
	case generator.TopicTaskOOM:
		msg = &eventtypes.TaskOOM{}
	default:
		return generator.TaskEvent{}, fmt.Errorf("containerd event: unexpected topic %q", ev.Topic)
	}
	any := env.GetEvent()
	if any == nil {
		return generator.TaskEvent{}, fmt.Errorf("containerd event %s: no payload", ev.Topic)
	}
	want := string(msg.ProtoReflect().Descriptor().FullName())
	if url := any.GetTypeUrl(); url != want && !strings.HasSuffix(url, "/"+want) {
		return generator.TaskEvent{}, fmt.Errorf("containerd event %s: payload type %q, want %s", ev.Topic, url, want)
	}
	if err := proto.Unmarshal(any.GetValue(), msg); err != nil {
		return generator.TaskEvent{}, fmt.Errorf("containerd event %s: decode %s: %w", ev.Topic, want, err)
	}
	switch m := msg.(type) {
	case *eventtypes.TaskStart:
		ev.ID = m.GetContainerID()
	case *eventtypes.TaskExit:
		ev.ID = m.GetContainerID()
		if m.GetID() != "" && m.GetID() != m.GetContainerID() {
			ev.ExecID = m.GetID()
		}
		ev.ExitStatus = m.GetExitStatus()
		if ts := m.GetExitedAt(); ts != nil {
			ev.ExitedAt = ts.AsTime()
		}
	case *eventtypes.TaskOOM:
		ev.ID = m.GetContainerID()
	case *eventtypes.TaskDelete:
		ev.ID = m.GetContainerID()
		if m.GetID() != "" && m.GetID() != m.GetContainerID() {
			ev.ExecID = m.GetID()
		}
	case *eventtypes.ContainerDelete:
		ev.ID = m.GetID()
	}
	if ev.ID == "" {
		return generator.TaskEvent{}, fmt.Errorf("containerd event %s: no container ID", ev.Topic)
	}
	return ev, nil
}
