// Package statebucket keeps each node's containers in a JetStream
// key-value bucket, the state bucket: one key per container
// (schemas.StateKey) holding its latest Lifecycle event as a structured
// CloudEvent, deleted on ContainerRemoved. It is the current state a
// reader lists and then watches (consumer.ListState, consumer.WatchState)
// without replaying the stream.
//
// It owns the bucket's set-up (Ensure) and its writer (Writer). The Writer
// is written only with what the stream acked (it takes the events of
// publish.Options.OnAck), after the stream and never in its way: its own
// queue coalesces by key and retries while NATS is away, and a write it
// loses costs the bucket a stale key until the next reconcile, never an
// event.
//
// It is a package of its own, not part of publish, because it is a reader
// of publish's results rather than part of the delivery: it needs the
// Encoder (EncodeStructured, Node), the stream's event ids (EventID) and
// the contract's metadata (ContractMetadata), and publish needs nothing of
// it. The wiring (bridge) connects the two through OnAck.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// statebucket imports publish, generator for the Event type, schemas for
// the keys, nats.go and the Prometheus client. publish must not import it;
// it must not import CRI, gRPC or datadir.
package statebucket
