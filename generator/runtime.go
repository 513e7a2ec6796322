package generator

import (
	"context"

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
// Send returns once the events are accepted for delivery (not necessarily
// delivered); it blocks while the sink is full, until ctx is done.
type Sink interface {
	Send(ctx context.Context, events []Event) error
}
