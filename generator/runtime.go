package generator

import (
	"context"
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Runtime is the part of the CRI RuntimeService that the generator uses. It
// holds only read methods: the bridge never creates, stops or removes
// anything. Implementations must be safe for concurrent use.
type Runtime interface {
	// Version reports the runtime's name and version.
	Version(ctx context.Context) (*runtimeapi.VersionResponse, error)
	// ListPodSandbox lists the sandboxes matching filter (nil: all).
	ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error)
	// ListContainers lists the containers matching filter (nil: all).
	ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error)
	// ContainerStatus reads one container's status.
	ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error)
	// WatchEvents calls fn for each container event until ctx is done or the
	// stream ends. It always returns a non-nil error.
	WatchEvents(ctx context.Context, fn func(*runtimeapi.ContainerEventResponse)) error
}

// Sink receives the events of one relist, or of one stream message, in order.
// Send returns once the events are recorded for delivery (not necessarily
// delivered); it does not block for room. It returns *SinkFullError (match it
// with errors.As) when some of the events were not recorded.
type Sink interface {
	Send(ctx context.Context, events []Event) error
}

// SinkFullError is returned by Sink.Send when the sink recorded only the
// first Recorded events of the call and has no room for the rest (its memory
// outbox and disk spool are full, or it has no spool). The sink never blocks
// for room. The generator keeps the unrecorded events in its state and sends
// them again later (a backfill).
type SinkFullError struct{ Recorded int }

func (e *SinkFullError) Error() string {
	return fmt.Sprintf("send events: sink full after %d recorded", e.Recorded)
}
