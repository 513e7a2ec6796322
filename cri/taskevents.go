package cri

import (
	"context"
	"errors"
	"fmt"
	"io"

	eventsapi "github.com/containerd/containerd/api/services/events/v1"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/taskevent"
)

// taskEventFilters are the Subscribe filters: the k8s.io namespace and the
// trigger's topics, so that containerd sends nothing else (image pulls,
// snapshots, other namespaces). containerd ORs the filters and ANDs the
// comma-separated terms of each.
var taskEventFilters = func() []string {
	var fs []string
	for _, topic := range []string{generator.TopicTaskStart, generator.TopicTaskExit, generator.TopicTaskDelete, generator.TopicContainerDelete, generator.TopicTaskOOM} {
		fs = append(fs, fmt.Sprintf(`namespace==%q,topic==%q`, taskevent.Namespace, topic))
	}
	return fs
}()

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
		fn(taskevent.Decode(env))
	}
}
