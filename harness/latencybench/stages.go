package latencybench

import (
	"context"
	"errors"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// timeStages sets the bridge's hooks that time each event at the stages
// visible from outside the generator and the publisher (Config.Stages),
// recording them in tr.
func timeStages(h *bridge.Hooks, tr *tracker) {
	h.WrapRuntime = func(rt generator.Runtime) generator.Runtime { return timedRuntime{Runtime: rt, tr: tr} }
	h.WrapSink = func(s generator.Sink) generator.Sink { return timedSink{sink: s, tr: tr} }
}

// timedRuntime is the bridge's Runtime with the arrival of each stream event
// stamped on its transition (Config.Stages).
type timedRuntime struct {
	generator.Runtime
	tr *tracker
}

// WatchEvents implements generator.Runtime.
func (r timedRuntime) WatchEvents(ctx context.Context, fn func(*runtimeapi.ContainerEventResponse)) error {
	return r.Runtime.WatchEvents(ctx, func(ev *runtimeapi.ContainerEventResponse) {
		if typ, ok := lifecycleType(ev.GetContainerEventType()); ok {
			r.tr.stamp(transition{ev.GetContainerId(), typ}, time.Now(), setReceived)
		}
		fn(ev)
	})
}

// lifecycleType is the Lifecycle event a stream event of type t announces.
func lifecycleType(t runtimeapi.ContainerEventType) (generator.LifecycleEventType, bool) {
	switch t {
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		return generator.ContainerStarted, true
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		return generator.ContainerDied, true
	case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
		return generator.ContainerRemoved, true
	}
	return "", false
}

// timedSink hands the generator's events to the publisher one Send call at
// a time, stamping each before and after (Config.Stages). The publisher
// encodes and queues the events of a Send one by one anyway, and only the
// merge goroutine sends, so the order and the work are the same. A refusal
// (*generator.SinkFullError) is passed on with the count of the whole call,
// so that the generator keeps the right events.
type timedSink struct {
	sink generator.Sink
	tr   *tracker
}

// Send implements generator.Sink.
func (s timedSink) Send(ctx context.Context, events []generator.Event) error {
	for i := range events {
		tr := transition{events[i].Container.ID, events[i].Type}
		s.tr.stamp(tr, time.Now(), setHanded)
		if err := s.sink.Send(ctx, events[i:i+1]); err != nil {
			if full, ok := errors.AsType[*generator.SinkFullError](err); ok {
				return &generator.SinkFullError{Recorded: i + full.Recorded}
			}
			return err
		}
		s.tr.stamp(tr, time.Now(), setQueued)
	}
	return nil
}
