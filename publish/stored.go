package publish

import (
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// decodeStored turns a message this node stored back into the event it
// reports: what the read of an earlier run's messages gives the generator
// and the checkpoint (readback.go). It decodes with the consumer package,
// as any subscriber reads the stream, in either content mode, and checks
// that the message id is the one this bridge derives for the event: a
// message that is not one of its events is refused, naming what is wrong.
func decodeStored(m jetstream.Msg) (generator.Event, error) {
	ce, err := consumer.Decode(m.Subject(), m.Headers(), m.Data())
	if err != nil {
		return generator.Event{}, err
	}
	typ := generator.LifecycleEventType(ce.LifecycleType())
	if want := EventID(ce.ContainerID, typ); ce.ID != want {
		return generator.Event{}, fmt.Errorf("message on %s: id %s is not the id %s of container %s's %s",
			m.Subject(), ce.ID, want, ce.ContainerID, typ)
	}
	if id := m.Headers().Get(jetstream.MsgIDHeader); id != ce.ID {
		return generator.Event{}, fmt.Errorf("message on %s: %s %q differs from the CloudEvent id %s",
			m.Subject(), jetstream.MsgIDHeader, id, ce.ID)
	}
	d := ce.Data
	var meta *generator.PodMeta
	if d.Pod.Labels != nil {
		meta = generator.NewPodMeta(d.Pod.Labels, d.Pod.Annotations)
	}
	ev := generator.Event{
		Type: typ,
		Pod:  generator.Pod{UID: ce.PodUID, Namespace: d.Pod.Namespace, Name: d.Pod.Name, Meta: meta},
		Container: generator.Container{
			ID: ce.ContainerID, Name: d.Container.Name, Attempt: d.Container.Attempt, Sandbox: d.Container.Sandbox,
			Image: d.Container.Image, ImageRef: d.Container.ImageRef,
		},
		State:      generator.State(d.State),
		ExitCode:   d.ExitCode,
		Reason:     d.Reason,
		Message:    d.Message,
		Time:       ce.Time,
		DetectedBy: generator.Source(d.DetectedBy),
		ObservedAt: d.ObservedAt,
	}
	if d.StartedAt != nil {
		ev.StartedAt = *d.StartedAt
	}
	if d.FinishedAt != nil {
		ev.FinishedAt = *d.FinishedAt
	}
	return ev, nil
}
