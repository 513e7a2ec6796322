package schemas

import "time"

// CloudEvent type values, versioned: pleg.<version>.<Lifecycle event type>. A
// change to the data contract bumps the version and adds a schema file.
const (
	TypeContainerStarted = "pleg.v1.ContainerStarted"
	TypeContainerDied    = "pleg.v1.ContainerDied"
	TypeContainerRemoved = "pleg.v1.ContainerRemoved"
)

// EventData is the data of every pleg-bridge CloudEvent, JSON in camelCase as
// Kubernetes writes it. Fields the runtime did not give are left out, never
// invented.
type EventData struct {
	Node       string     `json:"node"`
	Pod        Pod        `json:"pod"`
	Container  Container  `json:"container"`
	State      string     `json:"state"`
	ExitCode   *int32     `json:"exitCode,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	Message    string     `json:"message,omitempty"`
	StartedAt  *time.Time `json:"startedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// DetectedBy is "relist" or "evented".
	DetectedBy string `json:"detectedBy"`
	// ObservedAt is when the bridge on the node first saw the state the
	// event reports: the start of the relist that found it, or, with
	// DetectedBy "evented", the runtime's timestamp of the stream payload
	// that reported it. It is never earlier than the start of the bridge
	// process that saw it: a payload the runtime kept while no bridge
	// listened (containerd 2.x, up to 5 minutes) and replays to a starting
	// bridge is stamped when the bridge took it in. An event published
	// later than it was seen (after a NATS outage, from the spool after a
	// restart, or again into a new stream) keeps it. The CloudEvent time,
	// by contrast, is when the transition happened by the runtime's clock.
	ObservedAt time.Time `json:"observedAt"`
}

// Pod identifies the pod.
type Pod struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// Labels are the pod's labels without the kubelet's io.kubernetes.*
	// keys. Nil (left out) when the bridge saw no sandbox of the pod and so
	// does not know them; empty, not nil, for a pod without labels.
	Labels map[string]string `json:"labels,omitzero"`
	// Annotations are the pod's annotations whose keys the bridge is told
	// to publish (PLEG_POD_ANNOTATIONS). Nil when it is told none.
	Annotations map[string]string `json:"annotations,omitzero"`
}

// Container describes the container or, with Sandbox set, the pod sandbox.
type Container struct {
	ID       string `json:"id"`
	Name     string `json:"name,omitempty"`
	Attempt  uint32 `json:"attempt"`
	Sandbox  bool   `json:"sandbox"`
	Image    string `json:"image,omitempty"`
	ImageRef string `json:"imageRef,omitempty"`
}
