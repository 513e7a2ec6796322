// Package publish turns generator Lifecycle events into CloudEvents and
// delivers them to NATS JetStream.
//
// It owns three things: the Event → CloudEvent encoding (Encoder, the wire
// contract: subjects, headers and CloudEvent attributes, as the README's
// "Subjects" and "Events" sections give them), the stream setup (EnsureStream) and the
// delivery (Publisher): asynchronous, in order per pod, and exactly once in
// the stream. The Publisher never blocks its caller for room: events wait in
// a bounded memory outbox, then in the disk spool (durable.Spool) while NATS
// is away, and what fits in neither is refused with a
// generator.SinkFullError, for the generator to send again. Exactly once
// holds past the stream's duplicate window too: before it publishes
// anything, a restarted Publisher reads back what this node stored after
// the checkpoint's sequence, does not publish those events again, and hands
// them to the checkpoint and the generator (Options.OnStored), so that a
// container whose start was stored just before a crash and which is gone
// now still gets its end (reconcile.go, stored.go); a retry that could come after the window is
// checked against the stream before it is published (verify.go). The
// checkpoint names the stream it belongs to: a Publisher that finds
// another (deleted and created again, another server's) starts that
// stream's history, putting the checkpoint's events into it before
// anything else, so that no container's end is published without its
// start in the same stream (history.go). A
// stalled publication (a leader election, a server or cluster that is
// down) is logged once when it starts and once when acks resume.
//
// Beside the stream, a StateWriter (state.go) keeps the node's containers in
// a JetStream key-value bucket, one key per container holding its latest
// event, deleted on ContainerRemoved: the current state a reader lists and
// then watches without replaying the stream. It is written only with what
// the stream acked (it takes OnAck's events), after the stream and never in
// its way: its own queue coalesces by key and retries while NATS is away,
// and a write it loses costs the bucket a stale key until the next
// reconcile, never an event.
//
// publish imports generator for the Event type, the Sink interface and
// SinkFullError only, schemas for the CloudEvent types, data schemas and the
// subject encoding (the data's Go type is written by hand, see cejson.go),
// durable for the spool and the checkpoint's stream, and consumer to decode what it reads back from the
// stream as any subscriber does (one decoder of the wire format). It must not import CRI, gRPC or any other
// generator internals, and it starts no NATS server (natsembed does).
package publish
