// Package generator is the Pod Lifecycle Event Generator: it reads container
// state from the node's CRI runtime and produces Lifecycle events
// (ContainerStarted, ContainerDied, ContainerRemoved).
//
// It owns the Event type, the Runtime and Sink interfaces, the CRI gRPC
// client (cri.go, the only code that touches the generated client), the
// relist source (relist.go), the evented source (evented.go), the merge of
// both into the pod-status cache (merge.go), the modes and their fallback
// (mode.go, evented.go), and the restoration of state from a checkpoint
// (restore.go).
//
// One goroutine merges. Relists and stream messages become observations;
// each is applied per container, forward only (created, running, exited,
// gone), so duplicated, late and reordered observations produce nothing,
// and a relist declares a container gone only if nothing saw it after the
// relist began. Each (container, event type) is produced at most once.
//
// It imports statecache and the CRI API; it must not import publish, NATS or
// anything under cmd.
package generator
