// Package generator is the Pod Lifecycle Event Generator: it reads container
// state from the node's CRI runtime and produces Lifecycle events
// (ContainerStarted, ContainerDied, ContainerRemoved).
//
// It owns the Event type, the Runtime, Listings, TaskEventSource and Sink
// interfaces, and:
//   - the conversion of CRI data into observations (convert.go): one
//     constructor per kind of object, used by both sources, so that they
//     describe a container alike;
//   - the relist source (relist.go);
//   - the evented source (evented.go): the stream supervisor, which owns the
//     connection, falls back to relisting and returns, and demotes a silent
//     stream;
//   - the targeted relists that stream events ask for (targeted.go): a queue
//     that delays, coalesces and paces them, with its own lock;
//   - containerd's events as triggers (trigger.go), and its task exits as
//     the deaths they report, checked against CRI after (exits.go);
//   - the modes (mode.go);
//   - the merger (merger.go): the one goroutine that merges both sources
//     into the pod-status cache, by the forward-only rule of merge.go, and
//     sends the events to the sink; with it, the backfill of what a full
//     sink could not record (backfill.go) and the restoration of state from
//     a checkpoint (restore.go); and the reader of that cache (status.go:
//     PodStatusNewerThan).
//
// Generator runs the relist loop and wires these parts together (New,
// Run); the merger owns the cache, the held events and the merge
// goroutine's state.
//
// One goroutine merges. Relists and stream messages become observations;
// each is applied per container, forward only (created, running, exited,
// gone), so duplicated, late and reordered observations produce nothing,
// and a relist declares a container gone only if nothing saw it after the
// relist began. Each (container, event type) is produced at most once.
//
// What the generator needs of the runtime's client beyond the Runtime's CRI
// calls (containerd's event service, the listings' version and their reuse)
// is given to New in the open, as Options.TaskEvents and Options.Listings,
// never found on the Runtime by a type assertion that a decorator around
// it would defeat; the owner ends the start-up with Generator.EndStartup.
// Restart state comes in through Generator.Restore.
//
// The CRI client that implements Runtime (its gRPC connection, codecs,
// listing memo and containerd's task events) is package cri, which
// imports this one; the generator reads the runtime only through these
// interfaces.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// Of the module it imports statecache only; beyond it, the CRI API, gRPC's
// status codes (the errors a Runtime returns) and the Prometheus client. It
// must not import cri, publish, NATS or anything under cmd.
package generator
