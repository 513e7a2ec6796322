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
	DetectedBy string    `json:"detectedBy"`
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
