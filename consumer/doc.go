// Package consumer is what downstream Go services import to read the
// pleg-bridge event stream: it decodes the CloudEvents pleg-bridge publishes
// (structured and binary mode) into Event, builds JetStream filter subjects
// for a node, a namespace, a pod or a Lifecycle event type and selects by
// labels and failures (Filter), follows live events
// (Subscribe), reads history (Replay), consumes durably as a member of a
// group of replicas (Consume), lists the current containers of a node, a
// namespace, a pod or the cluster and then follows their changes from the
// bridges' state bucket (ListState, WatchState), and renders an event as
// one line of text (Format).
//
// # Durable groups
//
// Consume gives a service at-least-once delivery that survives restarts and
// is split across the service's replicas, while the events of one pod are
// handled one at a time and in stream order. A group, named by
// DurableOptions.Name, consists of:
//
//   - A work stream, "<stream>_<name>", that sources the event stream on the
//     server. The source's subject transforms are the group's filter (node,
//     namespace, pod, type as literal tokens) and prefix each copied
//     subject with a partition number, {{partition(N,…)}} of the pod UID
//     token: "pleg.node-1.shop.<uid>.ContainerDied" becomes
//     "5.pleg.node-1.shop.<uid>.ContainerDied". So all events of a pod land
//     in one partition, in stream order. A second transform in the same
//     source copies the events of the legacy layout (without the namespace
//     token) the same way. The work stream has work-queue
//     retention: it holds the group's backlog, and an acknowledged event
//     leaves it. It keeps sourcing while no member runs, so a group
//     restarted hours later resumes where it stopped (within the event
//     stream's own limits).
//   - One durable pull consumer per partition, "<name>-<k>", filtered on
//     "<k>.>", with explicit acks and at most one unacknowledged event
//     (MaxAckPending 1).
//
// Every member pulls from every partition. Because a partition hands out
// its next event only once the previous one is acknowledged, the members
// race for each partition's next event and no two of them ever hold events
// of the same partition: per-pod order holds across members with no
// membership protocol, leases or member indexes, and replicas of a
// Deployment may come and go. A member that crashes holding an event
// delays that partition by DurableOptions.AckWait; a running handler keeps
// its event by reporting progress (unless its member is cut off from the
// server for longer than AckWait: then another member gets the event while
// the first may still be handling it). The price of this design: up to N
// events are handled at once in the whole group (N = Partitions), each
// costs a round trip to the server, and a pod's events may be handled by
// different members in turn, so per-pod state belongs in shared storage
// (examples/crashloop keeps it in a KV bucket) or must tolerate that.
//
// The handler's nil acknowledges the event. An error brings it back after
// DurableOptions.Backoff; the MaxDeliveries-th failure, or a last delivery
// that a crash cut short, dead-letters it: it is published to
// DeadLetterSubject and/or reported to OnDeadLetter, then removed. A
// message that does not decode is dead-lettered at once. Nothing is
// dropped silently. Deliveries are at least once; Event.Sequence (the
// event stream's sequence) and Event.ID let the handler skip what it has
// done before.
//
// # Repeats
//
// NATS servers acknowledge a write before it is on disk, so a power loss or
// an OS crash can lose events they acknowledged; the bridges keep what was
// acknowledged for a while and publish again what the stream lost, with
// the same CloudEvent id. A reader that read such an event before it was
// lost then finds it again at a later sequence. Subscribe, Replay, Consume
// and WatchState drop such a repeat by its id (RepeatOptions): the first
// three keep the ids they delivered for a window of the stream's storage
// time, bounded in count, in memory; a group's work stream also has that
// window as its duplicate window, so that the server keeps a repeat from
// the whole group; WatchState keeps each followed container's last event
// id.
//
// # Rollbacks
//
// The same loss can roll a stream back: its servers come back with an
// older store, whose last sequence is below what readers had read, and
// store new messages (other nodes' events, the bridges' republished ones)
// at those sequences again. A reader that resumes after the last sequence
// it read would never see them. Subscribe remembers where its last 64
// messages were read (sequence, Nats-Msg-Id, storage time) and checks that
// the stream still holds the last one: before it hands on the first
// message of a consumer nats.go recreated, at once after a reconnect, and
// every Options.RollbackCheck. On a difference it reads again
// from the sequence after the last message still held as read (or, if
// none is, from the first message stored after the last one read), drops
// what it delivered before as repeats, and reports the rollback to
// Options.OnRollback. A durable group's work stream copies the event
// stream through a source, which the server resumes after the last
// sequence it copied: each member remembers where the events it handled
// were, checks the same way (by id only: it knows the work stream's
// storage times, not the event stream's), and on a difference has the
// source start again there (DurableOptions.RollbackCheck, OnRollback).
//
// It owns the subscriber's view of the wire contract (subjects and
// CloudEvents, as the README's Subjects and Events sections describe them);
// the encoding side lives in publish and the shared wire details (token
// encoding, subjects, the data type, the default stream and prefix) in
// schemas.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// It imports only the standard library, schemas and nats.go (with its
// jetstream package). It must not import CRI, gRPC, the CloudEvents SDK or
// any other pleg-bridge package, directly or through another package, so
// that a downstream service pulls in nothing of the node agent.
package consumer
