// Package publish turns generator Lifecycle events into CloudEvents and
// delivers them to NATS JetStream, exactly once in the stream.
//
// It owns four things:
//
//   - The Event → CloudEvent encoding (Encoder, cloudevent.go and
//     cejson.go): the wire contract of subjects, headers and CloudEvent
//     attributes, as the README's "Subjects" and "Events" sections give
//     them, in either content mode, with ids derived from the container
//     and the event type alone (EventID).
//   - The set-up of the streams: the event stream (EnsureStream) and its
//     longer-lived archive (EnsureArchive), with the contract version in
//     their metadata (ContractMetadata).
//   - The delivery (Publisher, publisher.go; Run's loop, delivery.go):
//     asynchronous, in order per pod, and never blocking its caller for
//     room. New takes the *nats.Conn and makes its own JetStream handles.
//     The outbox (outbox.go) holds what Send accepted until Run takes it:
//     a bounded memory queue and, behind it, the disk spool
//     (datadir.Spool), as one FIFO under one lock; once an event went to
//     the spool every later one follows it there until the spool is
//     drained, so each pod's order holds either way. What fits in neither
//     is refused with a generator.SinkFullError, for the generator to send
//     again. Each ack goes to Options.OnAck with the event's stream
//     sequence. A stalled publication (a leader election, a server or
//     cluster that is down) is logged once when it starts and once when
//     acks resume.
//   - Exactly once across restarts and past the stream's duplicate
//     window. What a run takes over from an earlier one comes in
//     Options.Restart. Before it publishes anything, a restarted Publisher
//     reads back what this node stored after the checkpoint's sequence,
//     does not publish those events again, and hands them to the
//     checkpoint and the generator (Restart.OnStored), so that a container
//     whose start was stored just before a crash and which is gone now
//     still gets its end (readback.go, stored.go). The checkpoint names
//     the stream it belongs to: a Publisher that finds another (deleted
//     and created again, another server's) starts that stream's history,
//     putting the checkpoint's events into it before anything else, so
//     that no container's end is published without its start in the same
//     stream (history.go). Run's side of both, the start-up protocol, is
//     one type beside the delivery (startup.go). A retry that could come
//     after the duplicate window is checked against the stream before it
//     is published (verify.go), and with Options.Repair what the servers
//     lost after acking it is published again (repair.go).
//
// The state bucket, the node's current containers kept from the acked
// events, is package statebucket's: it builds on the Encoder and OnAck,
// and publish knows nothing of it.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// publish imports generator for the Event type, the Sink interface and
// SinkFullError only, schemas for the CloudEvent types, data schemas and the
// subject encoding (the data's Go type is written by hand, see cejson.go,
// with internal/jsonenc), durable for the spool and the checkpoint's stream,
// and consumer to decode what it reads back from the stream as any
// subscriber does (one decoder of the wire format); of the module, nothing
// else. It must not import CRI, gRPC, statebucket or any other
// generator internals, and it starts no NATS server (natsembed does).
package publish
