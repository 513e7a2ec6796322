package generator

import (
	"context"
	"fmt"
	"time"

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

// Listings is what a runtime's client may offer for its full listings
// beyond the CRI calls; the CRI client implements it. The generator does
// not look for it on a Runtime (a decorator would hide it): it is given
// explicitly, as Options.Listings, and must be the client the Runtime lists
// through, under any decorators.
type Listings interface {
	// ListingVersion returns a number that stays the same for as long as
	// every full listing lists exactly what the one before it did, and
	// whether the number means anything (false before ReuseListings). A
	// relist whose listings have the version of the last one merged, with
	// nothing else merged since, has nothing to merge (see lastFullMerge).
	ListingVersion() (version uint64, ok bool)
	// ReuseListings makes the listings from now on reuse what the last
	// full listing decoded, which makes a steady relist cheap but costs
	// memory that lives on. Generator.EndStartup calls it.
	ReuseListings()
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

// TaskEvent is one of containerd's own task or container events, reduced to
// what the trigger uses. containerd publishes them on its event service
// (containerd.services.events.v1.Events), beside CRI on the same socket, for
// the CRI plugin's containers and sandboxes under the IDs CRI uses. They
// carry no pod identity and no CRI state: the generator uses them to ask
// for targeted relists (trigger.go), and a task's exit, which carries its
// exit status and time, to report the death of a container the cache holds
// running at once (exits.go).
type TaskEvent struct {
	// Topic is containerd's topic, one of the Topic* constants.
	Topic string
	// ID names the container or sandbox: a task event's container_id, a
	// container event's id.
	ID string
	// ExecID is set on a task exit of a process other than the container's
	// init (an exec): such an exit ends nothing the bridge reports.
	ExecID string
	// At is when containerd published the event.
	At time.Time
	// ExitStatus and ExitedAt are a task exit's exit status and time
	// (the shim's exited_at, to the nanosecond); zero for other topics.
	ExitStatus uint32
	ExitedAt   time.Time
}

// containerd's topics the trigger subscribes to.
const (
	TopicTaskStart       = "/tasks/start"
	TopicTaskExit        = "/tasks/exit"
	TopicTaskDelete      = "/tasks/delete"
	TopicContainerDelete = "/containers/delete"
	// TopicTaskOOM says the kernel's OOM killer hit a container's cgroup;
	// containerd's CRI plugin then reports its exit with reason OOMKilled.
	TopicTaskOOM = "/tasks/oom"
)

// TaskEventSource is a runtime that also serves containerd's event service.
// The CRI client implements it on the CRI socket.
type TaskEventSource interface {
	// WatchTaskEvents subscribes to containerd's events for the k8s.io
	// namespace on the trigger's topics and calls fn for each, in order,
	// until ctx is done or the subscription ends; an envelope that does not
	// decode is passed as an error naming what was wrong, and the
	// subscription goes on. It always returns a non-nil error;
	// codes.Unimplemented means the socket does not serve containerd's
	// event service.
	WatchTaskEvents(ctx context.Context, fn func(TaskEvent, error)) error
}
