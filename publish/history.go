package publish

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// One stream's history.
//
// The checkpoint (Options.Restart.Checkpoint) holds what JetStream acknowledged,
// and the generator, seeded with it, never reports those events again. That
// is right only while the stream is the one that acknowledged them. The
// node's data directory outlives an uninstall, and a stream can be deleted
// and created again under its name, or the bridge pointed at another NATS:
// a generator seeded with the old stream's acks then publishes only what
// changed since, and a container running across the change has its
// ContainerDied and ContainerRemoved in the new stream and its
// ContainerStarted only in the old one.
//
// So the checkpoint names its stream (datadir.StreamIdentity: name and
// creation time), and before anything is published the read of what an
// earlier run stored (readback.go) compares it with the stream it finds.
// The stream is another history when its identity differs, when it ends
// before the checkpoint's sequence (it was recreated and has fewer
// messages, or restored from a backup older than the checkpoint: a
// restore keeps the creation time), or when the checkpoint names no
// stream because an earlier run was carrying it into a new one and
// stopped. A checkpoint that names none because it was written before
// checkpoints named their stream (or is fresh) adopts the stream if it
// covers the checkpoint's sequence. A purged stream is the same history
// (same creation time, and a purge keeps the sequence numbers): nothing is
// published again for it, as nothing is for messages its max age deleted.
//
// For another history, Run logs one warning naming the stream, the old and
// the new identity and what it does, and starts the stream's history:
//
//  1. The checkpoint is disowned (datadir.Checkpoint.Disown): its sequence,
//     a position in the old stream, is dropped, and its store names no
//     stream, so a crash from here on repeats these steps.
//  2. Every message this node stored in the new stream is read back, from
//     its first sequence (an earlier attempt's, or this node's history
//     in a stream it published to before), and recognised as for any
//     restart. A stream just created holds none; one this node published
//     to before (switched back to an earlier NATS) costs a read of what it
//     holds of the node, held in memory for the run as any read is.
//  3. The history the checkpoint holds is carried into the stream before
//     anything else (carryHistory): for each container the checkpoint or
//     the spool knows and the stream holds nothing of, its events as the
//     checkpoint recorded them (ContainerStarted of a running container,
//     and ContainerDied of an exited one), unless the checkpoint holds its
//     ContainerRemoved: such a container was gone before, and belongs to
//     the old history only. A container the stream holds some events of
//     gets the checkpoint's events after the latest of those. The events
//     keep their own times, observedAt included; the pod's labels, which
//     the checkpoint does not keep, come from the generator
//     (Options.Restart.PodMeta), or from the pod's spooled events.
//  4. Once those are delivered, the checkpoint adopts the stream
//     (datadir.Checkpoint.Adopt).
//
// The generator is not told anything: what it holds as published becomes
// true of the new stream with step 3. Events waiting in memory or in the
// spool, never acknowledged anywhere, are real transitions and go out
// after the carried events of their containers, so no container's
// ContainerDied or ContainerRemoved reaches the new stream without its
// ContainerStarted. One case has no such ContainerStarted in the
// checkpoint: an earlier run's ack lost in a crash (the last 100 ms before
// it) whose message was in the old stream only, followed by a spooled
// ContainerDied. The runtime's started_at, which every event of a started
// container carries, gives that ContainerStarted back (time = started_at,
// as the generator fills in a start it did not see); a ContainerRemoved
// whose ContainerDied is missing the same way gets one from its exit code
// and finished_at.

// carryMetaWait bounds the wait for the generator's first relist, which
// knows the labels of the pods whose events are carried into a new stream:
// the relist takes well under a second, also on a full node, and a runtime
// that does not answer must not hold publishing back for long.
const carryMetaWait = 10 * time.Second

// carryMetaPoll is how often the labels are asked for while they cannot be
// known yet.
const carryMetaPoll = 100 * time.Millisecond

// renewal returns why the stream id, whose last sequence is last, is not
// the one the checkpoint ck belongs to, or "" if it is or may be adopted.
func renewal(ck *datadir.Checkpoint, id datadir.StreamIdentity, last uint64) string {
	own, named := ck.Stream()
	switch {
	case named && own.IsZero():
		return "an earlier run was carrying the checkpoint into a new stream and stopped"
	case named && !own.Equal(id):
		return "the stream was created anew: deleted and created again, or another server's"
	case ck.Sequence() > last:
		return "the stream ends before the checkpoint's sequence: created anew, or restored from a backup older than the checkpoint"
	}
	return ""
}

// carryHistory returns the events to publish into a new stream, before
// anything else, so that its history is complete for every container the
// checkpoint and the spool know (see the comment at the top of this file):
// published is what the checkpoint holds (acked in the old stream), one
// event per container and type; spooled the events an earlier run left in
// the spool, in spool order; found the ids of this node's messages the new
// stream holds. Events are grouped by pod, in pod UID order; within a pod
// they come in per-container order (ContainerStarted, Died, Removed), a
// pod's sandbox starting before its containers and dying after them. A
// carried event whose source or observation time the checkpoint did not
// record (written by an old version) is taken as found by a relist, now.
func carryHistory(published, spooled []generator.Event, found map[string]uint64, now time.Time) []generator.Event {
	type history struct {
		known [3]*generator.Event // by typeIndex, from the checkpoint
		first *generator.Event    // the first spooled event
	}
	byID := map[string]*history{}
	get := func(id string) *history {
		h := byID[id]
		if h == nil {
			h = &history{}
			byID[id] = h
		}
		return h
	}
	for i := range published {
		ev := &published[i]
		if t := typeIndex(ev.Type); t >= 0 && ev.Container.ID != "" && ev.Pod.UID != "" {
			get(ev.Container.ID).known[t] = ev
		}
	}
	for i := range spooled {
		ev := &spooled[i]
		if typeIndex(ev.Type) < 0 || ev.Container.ID == "" || ev.Pod.UID == "" {
			continue
		}
		if h := get(ev.Container.ID); h.first == nil {
			h.first = ev
		}
	}
	var out []generator.Event
	for id, h := range byID {
		latest := -1 // the latest type the new stream holds
		for t, typ := range generator.LifecycleEventTypes {
			if _, ok := found[EventID(id, typ)]; ok {
				latest = t
			}
		}
		if latest < 0 && h.known[2] != nil {
			continue // removed before: the old history's only
		}
		var chain [3]*generator.Event
		for t := latest + 1; t < 3; t++ {
			chain[t] = h.known[t]
		}
		if latest < 0 && h.first != nil {
			// The spooled events follow: they need what comes before them.
			fillIn(&chain, h.first)
		}
		for _, ev := range chain {
			if ev != nil {
				out = append(out, carried(*ev, now))
			}
		}
	}
	slices.SortFunc(out, func(a, b generator.Event) int {
		return cmp.Or(strings.Compare(a.Pod.UID, b.Pod.UID), cmp.Compare(typeIndex(a.Type), typeIndex(b.Type)),
			cmp.Compare(sandboxOrder(a), sandboxOrder(b)), strings.Compare(a.Container.ID, b.Container.ID))
	})
	return out
}

// fillIn adds to chain, a container's events up to the spooled event
// first, those that must come before first and are missing: a
// ContainerStarted from the started_at first carries (none without it, as
// the generator reports none for a sandbox or a container whose start it
// never learnt), and before a ContainerRemoved a ContainerDied from its
// exit code and finished_at.
func fillIn(chain *[3]*generator.Event, first *generator.Event) {
	t := typeIndex(first.Type)
	if t >= 1 && chain[0] == nil && chain[1] == nil && !first.StartedAt.IsZero() {
		chain[0] = &generator.Event{
			Type: generator.ContainerStarted, Pod: first.Pod, Container: first.Container, State: generator.StateRunning,
			StartedAt: first.StartedAt, Time: first.StartedAt, DetectedBy: first.DetectedBy, ObservedAt: first.ObservedAt,
		}
	}
	if t == 2 && chain[1] == nil {
		state := generator.StateUnknown
		if first.ExitCode != nil {
			state = generator.StateExited
		}
		at := first.FinishedAt
		if at.IsZero() {
			at = first.Time
		}
		chain[1] = &generator.Event{
			Type: generator.ContainerDied, Pod: first.Pod, Container: first.Container, State: state,
			ExitCode: first.ExitCode, StartedAt: first.StartedAt, FinishedAt: first.FinishedAt, Time: at,
			DetectedBy: first.DetectedBy, ObservedAt: first.ObservedAt,
		}
	}
}

// carried returns ev as it is carried: with a source and an observation
// time where the checkpoint recorded none.
func carried(ev generator.Event, now time.Time) generator.Event {
	if ev.DetectedBy == "" {
		ev.DetectedBy = generator.SourceRelist
	}
	if ev.ObservedAt.IsZero() {
		ev.ObservedAt = now
	}
	return ev
}

// typeIndex numbers the Lifecycle event types in per-container order; -1
// for any other.
func typeIndex(t generator.LifecycleEventType) int {
	return slices.Index(generator.LifecycleEventTypes[:], t)
}

// sandboxOrder puts a pod's sandbox before its containers for a
// ContainerStarted, after them for the other types.
func sandboxOrder(ev generator.Event) int {
	switch {
	case !ev.Container.Sandbox:
		return 0
	case ev.Type == generator.ContainerStarted:
		return -1
	}
	return 1
}
