package generator

import "time"

// LifecycleEventType names a container lifecycle transition, as the kubelet's
// PLEG names it. Only the three published types exist here; the kubelet's
// ContainerChanged (created or unknown states) is deliberately not modelled:
// it is not published.
type LifecycleEventType string

// The published Lifecycle event types.
const (
	ContainerStarted LifecycleEventType = "ContainerStarted"
	ContainerDied    LifecycleEventType = "ContainerDied"
	ContainerRemoved LifecycleEventType = "ContainerRemoved"
)

// LifecycleEventTypes lists every published type in per-container order.
var LifecycleEventTypes = [...]LifecycleEventType{ContainerStarted, ContainerDied, ContainerRemoved}

// Source says which input an event was derived from.
type Source string

// Sources of observations.
const (
	// SourceRelist is anything a relist found, including a relist the event
	// stream triggered.
	SourceRelist Source = "relist"
	// SourceEvented is taken from a GetContainerEvents payload.
	SourceEvented Source = "evented"
)

// State is the container state an event reports.
type State string

// Published states.
const (
	StateRunning State = "running"
	StateExited  State = "exited"
	StateUnknown State = "unknown"
	StateRemoved State = "removed"
)

// StateCreated is a container that exists and has not run. A PodStatus
// reports it; an Event never does, since creation is not a Lifecycle event.
const StateCreated State = "created"

// Pod identifies the pod a container belongs to.
type Pod struct {
	UID       string
	Namespace string
	Name      string
	// Meta holds the pod's labels and allowlisted annotations; nil while
	// no sandbox of the pod was seen (a container found through its own
	// labels), for labels are then unknown. A pointer, shared and never
	// modified (see PodMeta), which also keeps Pod comparable.
	Meta *PodMeta
}

// Container describes a container or a pod sandbox.
type Container struct {
	ID      string
	Name    string // empty for a sandbox
	Attempt uint32
	Sandbox bool
	// Image is the image as the pod spec names it; ImageRef the resolved
	// reference where the runtime gives one.
	Image    string
	ImageRef string
}

// Event is one Lifecycle event of one container. Unknown values are zero:
// a nil ExitCode and zero times mean "the runtime did not say".
type Event struct {
	Type      LifecycleEventType
	Pod       Pod
	Container Container
	State     State
	ExitCode  *int32
	Reason    string
	Message   string
	StartedAt time.Time
	// FinishedAt is when the container exited.
	FinishedAt time.Time
	// Time is when the transition happened, by the runtime's clock where it
	// gives one, else the observation's (the CloudEvent's time attribute).
	Time       time.Time
	DetectedBy Source
	// ObservedAt is when the bridge first saw the state the event reports:
	// the start of the relist that found it or the stream event's
	// timestamp, never before the bridge process started (docs/events.md).
	ObservedAt time.Time
}
