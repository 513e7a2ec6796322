package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	eventtypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	containerdtypes "github.com/containerd/containerd/api/types"
	"google.golang.org/protobuf/proto"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// criNamespace is the containerd namespace of the CRI plugin's containers.
const criNamespace = "k8s.io"

// taskEventFilters are the Subscribe filters: the k8s.io namespace and the
// trigger's topics, so that containerd sends nothing else (image pulls,
// snapshots, other namespaces). containerd ORs the filters and ANDs the
// comma-separated terms of each.
var taskEventFilters = func() []string {
	var fs []string
	for _, topic := range []string{generator.TopicTaskStart, generator.TopicTaskExit, generator.TopicTaskDelete, generator.TopicContainerDelete, generator.TopicTaskOOM} {
		fs = append(fs, fmt.Sprintf(`namespace==%q,topic==%q`, criNamespace, topic))
	}
	return fs
}()

// DecodeEnvelope reduces one of containerd's envelopes to a TaskEvent. It
// unmarshals the payload into the type the topic names, after checking that
// the payload's type URL names that type: the generated types are all it
// needs, and typeurl's registry lookup would cost an allocation and a map
// read per event for the same result (the differential test in
// taskevents_test.go holds it to typeurl). An envelope of another namespace
// or topic, or whose payload does not decode, is an error naming it.
func DecodeEnvelope(env *containerdtypes.Envelope) (generator.TaskEvent, error) {
	if ns := env.GetNamespace(); ns != criNamespace {
		return generator.TaskEvent{}, fmt.Errorf("containerd event %s: namespace %q, want %q", env.GetTopic(), ns, criNamespace)
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

// WatchTaskEvents implements TaskEventSource on the CRI socket: containerd
// serves its own API there too. Only Events/Subscribe is called (the
// read-only guard refuses anything else).
func (c *Client) WatchTaskEvents(ctx context.Context, fn func(generator.TaskEvent, error)) error {
	stream, err := eventsapi.NewEventsClient(c.conn).Subscribe(ctx, &eventsapi.SubscribeRequest{Filters: taskEventFilters})
	if err != nil {
		return fmt.Errorf("subscribe to containerd events: %w", err)
	}
	for {
		env, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("receive containerd event: subscription closed by containerd: %w", io.ErrUnexpectedEOF)
			}
			return fmt.Errorf("receive containerd event: %w", err)
		}
		fn(DecodeEnvelope(env))
	}
}
