// Package datadir owns the bridge's node-local durable state, under the data
// directory (PLEG_DATA_DIR): the checkpoint (what JetStream acknowledged,
// per container and event type, so that a restart neither re-publishes
// everything nor forgets what changed while the bridge was down) and the
// spool (a bounded FIFO of the events that did not fit the publisher's
// memory outbox during a NATS outage, delivered before newer events once
// NATS is back). Both live in one bbolt file, state.db, in three buckets:
// meta (format version, node name, the checkpoint's stream sequence, up
// to which the publisher vouches that every message this node stored was
// acked and recorded, and the identity of the stream that sequence and
// those acks belong to: StreamIdentity), checkpoint (key: the container's slot, 8 bytes
// big-endian, given in the order of the containers' first acks, then the
// container ID, NUL, event type; value: the event record as JSON) and spool
// (key: big-endian sequence number; value: the same record). A store of
// format "1", whose checkpoint keys had no slot, is rewritten at Open; a
// bridge of that format sets a store of this one aside as corrupt, and
// re-publishes what it held (the event ids make that harmless within the
// stream's duplicate window).
//
// The users never wait on the disk: Checkpoint.RecordAck and Spool.Append
// only note in memory, and Store.Run writes what was noted within 100 ms,
// in one bbolt transaction per flush (a few when there are more than 1,024
// acks or a megabyte of appends). The crash windows follow from that:
//
//   - Acks not yet written are lost by a crash, and the sequence with
//     them. Their messages were stored after the sequence last written
//     (which goes with the last of the acks it vouches for, never before
//     them; a crash between the transactions of one flush leaves acks
//     newer than the sequence, which only makes the publisher read a
//     little more of the stream), so the restarted publisher
//     reads them back from the stream and recognises those events when the
//     generator reports them again: not stored twice, even after the
//     stream's duplicate window.
//   - Spool appends not yet written are lost by a crash; the restarted
//     generator derives them again from the checkpoint and the runtime, for
//     the containers that still exist.
//   - A spool entry Done but not yet removed is found again at the
//     restart. If its ack was written (a flush writes an entry's ack no
//     later than its removal), Take drops it; if not, it comes back marked
//     Earlier, and the publisher's reading of the stream recognises it.
//   - A bbolt commit is all or nothing, so no crash leaves half a flush.
//   - A change of stream (Checkpoint.Disown, then Adopt once the
//     checkpoint's events are in the new stream) not yet written is lost
//     by a crash: the restarted bridge finds the store naming the old
//     stream (or, after the Disown was written, none) and carries its
//     history into the new stream again; what the first attempt stored
//     there is read back and not published twice. The Disown drops the
//     old stream's sequence in the transaction that names no stream, so
//     no crash leaves a sequence of one stream under the other's name.
//
// Why bbolt and not the snapshot and journal the bridge kept before: the
// same guarantees (crash-safe writes, records keyed by container and type,
// a bounded write per flush) took about 650 lines of hand-written storage
// (fsync and rename, generations, compaction, torn lines) that a spool
// would have needed again. bbolt gives them, and ordered keys for the
// spool's append and delete-from-front, in one file; containerd keeps its
// own metadata in it. Measured at 30,000 containers (bench_test.go)
// against the journal's benchmarks, in rounds interleaved on the same 2
// cores (six rounds at load 3, and six at load 9 in brackets):
//
//   - a flush of 100 new acks: 4.5-7.6 ms [10-15] where the journal took
//     1.1-3.6 ms [3.2-8.7] with its compactions amortised (0.7-2.9 ms for
//     the append alone): about 4 [1.6] times the journal, and still a
//     sixtieth [thirtieth] of the 500 ms a flush kept within then;
//   - a flush that also collects removed containers: 6.5-12 ms [12-26];
//     the journal collected only by rewriting its snapshot, 106-162 ms
//     [171-388];
//   - the restore at Open: 193-231 ms [352-517]; the journal 206-239 ms
//     [242-677] from its snapshot, 0.5-0.7 s [0.9-2.5] with a full journal;
//   - the file: 60 MB with one record per container, up to 94 MB with two,
//     where the journal kept a 18.6 MB snapshot and up to as much journal:
//     bbolt leaves its B+tree pages partly empty and grows the file in
//     16 MB steps.
//
// A flush rewrites the pages of the records it changes (about 230 pages
// for 100 acks of random container IDs) where the journal appended 70 KB;
// both are far inside the interval, and bbolt has no compaction to pause
// for. The checkpoint is no longer held in memory either, only what Open
// restored.
//
// The import rules below are checked by internal/layers/layers_test.go
// (TestImportRules).
//
// It imports generator, for the Event type, internal/jsonenc, for the
// records' JSON, and bbolt; nothing else but the standard library. It must
// not import NATS, the CRI API (generator brings it along, unused here),
// publish, the wiring package or anything under cmd: it is storage, and
// knows nothing of where the events come from or go.
package datadir
