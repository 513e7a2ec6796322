package datadir

import (
	"slices"
	"sync"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// Checkpoint records what JetStream acknowledged, per container and event
// type, so that a restarted bridge neither re-publishes everything as new
// nor forgets what changed while it was down.
//
// With the acks it keeps a stream sequence: the highest the publisher
// reported with them (publish.Options.OnAck), written in the transaction
// of the last acks it came with (a flush writes its acks in key order, a
// transaction per 1,024). The publisher's promise is that
// every message this node stored up to that sequence was acked and
// reported before it, so the messages a checkpoint may not know of are
// those stored after it: a restarted publisher reads them back from the
// stream (publish.Restart.From) instead of trusting the stream's
// duplicate window.
//
// RecordAck only notes the ack in memory; the Store's Run writes the acks
// noted since its last write, within 100 ms, in one transaction. Acks not
// yet written are lost by a crash; their messages were stored after the
// sequence written last, so the restarted publisher finds them in the
// stream and does not publish them again. Records are keyed by container
// and type, so recording an ack twice changes nothing.
//
// It is safe for concurrent use.
type Checkpoint struct {
	restored    []generator.Event // read at Open; never modified
	restoredSeq uint64            // read at Open; never modified
	created     time.Time         // read at Open; never modified
	stream      StreamIdentity    // read at Open; never modified
	streamKnown bool              // read at Open; never modified

	mu      sync.Mutex
	pending map[string]record // guarded by mu; by ckptKey, acked but not yet written
	// slots gives the slot of each container with a record in the file
	// or pending (see ckptKey). Guarded by mu.
	slots slots
	// seq is the highest sequence recorded with the pending acks; 0 with
	// none. Guarded by mu.
	seq uint64
	// removed holds when each removed container's removal was observed,
	// for the collection that drops it keepRemoved later. Guarded by mu.
	removed map[string]time.Time
	// streamChange is the change of stream (Adopt, Disown) not yet
	// written; nil: none. Guarded by mu.
	streamChange *streamChange
	// rewound is the sequence Rewind set and no write took yet; nil:
	// none. Guarded by mu.
	rewound *uint64
	// disowns counts the calls of Disown: a failed write that took the
	// sequence before one does not put that sequence back. Guarded by mu.
	disowns uint64
	// wake is the Store's: it is given a value, without waiting, when an
	// ack is recorded. Nil outside a Store.
	wake chan<- struct{}
}

func newCheckpoint(restored []generator.Event, seq uint64, removed map[string]time.Time, slots slots) *Checkpoint {
	return &Checkpoint{restored: restored, restoredSeq: seq, pending: map[string]record{}, removed: removed, slots: slots}
}

// slots gives containers their slots (see ckptKey): each the next of a
// counter, at the container's first record.
type slots struct {
	of   map[string]uint64
	next uint64 // the next slot given; slots start at 1
}

func newSlots() slots { return slots{of: map[string]uint64{}, next: 1} }

// get returns the slot of container id, giving it the next if it has none.
func (s *slots) get(id string) uint64 {
	slot, ok := s.of[id]
	if !ok {
		slot = s.next
		s.next++
		s.of[id] = slot
	}
	return slot
}

// found records that container id has slot, as read from the file.
func (s *slots) found(id string, slot uint64) {
	s.of[id] = slot
	s.next = max(s.next, slot+1)
}

// keyLocked returns the key of the record of container id and type typ,
// giving the container the next slot if it has none. The caller holds mu.
func (c *Checkpoint) keyLocked(id string, typ generator.LifecycleEventType) string {
	return ckptKey(c.slots.get(id), id, typ)
}

// slot returns the slot of container id, if it has one.
func (c *Checkpoint) slot(id string) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	slot, ok := c.slots.of[id]
	return slot, ok
}

// Restored returns the events the checkpoint held at Open, one per
// container and type, in no particular order; removed containers are kept
// generator.DefaultTombstoneTTL after their removal was observed. Every
// call returns the same slice: do not modify it.
func (c *Checkpoint) Restored() []generator.Event { return c.restored }

// Sequence returns the stream sequence the checkpoint held at Open: the
// highest recorded with an ack that was written. Zero means none is known
// (a fresh store, or one written before the checkpoint kept sequences).
func (c *Checkpoint) Sequence() uint64 { return c.restoredSeq }

// Created returns when the store was created, as it recorded then; zero
// for a store created before it recorded it. With Sequence zero, it bounds
// what this node may have stored without the checkpoint knowing: the
// messages stored since (a bridge killed before its first checkpoint
// write).
func (c *Checkpoint) Created() time.Time { return c.created }

// RecordAck records an event JetStream acknowledged, with the stream
// sequence the publisher reported with it (0: none). The checkpoint keeps
// the highest sequence, written with the acks recorded up to it. It does
// no I/O and is safe for concurrent use.
func (c *Checkpoint) RecordAck(ev generator.Event, seq uint64) {
	r := toRecord(ev)
	// The checkpoint only tells the generator what was published; labels
	// would multiply its size by a pod's labels for every container.
	r.PodLabels, r.PodAnnotations = nil, nil
	at := r.ObservedAt
	if r.Type == generator.ContainerRemoved && at.IsZero() {
		at = time.Now() // see removedAt
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending[c.keyLocked(r.ID, r.Type)] = r
	c.seq = max(c.seq, seq)
	if r.Type == generator.ContainerRemoved {
		c.removed[r.ID] = at
		// A removed container's record says all a restart needs: it is
		// gone (see delivered for the spool). The acks of its earlier
		// events that are not written yet need not be: under churn most
		// containers start, die and are removed within one write.
		delete(c.pending, c.keyLocked(r.ID, generator.ContainerStarted))
		delete(c.pending, c.keyLocked(r.ID, generator.ContainerDied))
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Rewind lowers the checkpoint's sequence to seq: the stream went
// backwards (its servers lost acknowledged writes) and gives the
// sequences above seq to new messages, which a restart must read back.
// The next write stores it, even though lower than the one written; acks
// recorded later raise it again as usual. It does no I/O.
func (c *Checkpoint) Rewind(seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rewound = &seq
	c.seq = min(c.seq, seq)
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// waiting reports whether acks or a change of stream wait to be written.
func (c *Checkpoint) waiting() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) > 0 || c.streamChange != nil || c.rewound != nil
}

// ckptWrites is what a flush writes for the checkpoint.
type ckptWrites struct {
	acks map[string]record // by ckptKey
	// seq is the highest sequence recorded with acks since the last
	// write (or the last Disown); 0: none.
	seq uint64
	// expired lists the containers to delete (collect).
	expired []string
	stream  *streamChange
	// disowns is Checkpoint.disowns when the writes were taken.
	disowns uint64
	// rewind, if set, is written as the sequence before seq, even if lower
	// than the one written (Rewind).
	rewind *uint64
}

// writesNothing reports whether w has nothing to write.
func (w ckptWrites) writesNothing() bool {
	return len(w.acks) == 0 && len(w.expired) == 0 && w.stream == nil && w.rewind == nil
}

// take returns, for a flush, the acks not yet written with the highest
// sequence recorded with them, the change of stream not yet written, and
// the containers removed more than keepRemoved before now (if collect).
// It takes them together: a collection writes the pending acks of the
// containers it deletes in its own transaction, else they would be
// written after it and stay in the file until a restart (the acks of
// events delivered late, from the spool after a long outage, may be due
// for collection when they come).
func (c *Checkpoint) take(collect bool, now time.Time) ckptWrites {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := ckptWrites{stream: c.streamChange, disowns: c.disowns, rewind: c.rewound}
	c.streamChange, c.rewound = nil, nil
	if collect {
		for id, at := range c.removed {
			if now.Sub(at) > keepRemoved {
				w.expired = append(w.expired, id)
			}
		}
	}
	if len(c.pending) == 0 {
		return w
	}
	w.acks, w.seq = c.pending, c.seq
	c.pending = make(map[string]record, len(w.acks))
	c.seq = 0
	return w
}

// putBack returns the acks of a failed flush, their sequence and its
// change of stream, to the pending ones. An ack of the same key that came
// in since is the same event (one per container and type), so either may
// stay. A sequence taken before a Disown that came since is the old
// stream's, and is dropped.
func (c *Checkpoint) putBack(w ckptWrites) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.disowns == c.disowns {
		c.seq = max(c.seq, w.seq)
	}
	if w.rewind != nil && c.rewound == nil {
		c.rewound = w.rewind
		c.seq = min(c.seq, *w.rewind)
	}
	c.streamChange = w.stream.merge(c.streamChange)
	for k, r := range w.acks {
		if _, ok := c.pending[k]; !ok {
			c.pending[k] = r
		}
	}
}

// collected forgets the containers a flush deleted.
func (c *Checkpoint) collected(ids []string) {
	if len(ids) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		delete(c.removed, id)
		delete(c.slots.of, id)
	}
}

// prefixes returns the key prefixes (see ckptKey) of the records of the
// containers ids, sorted, so that their deletion walks the file from one
// end; a container without a slot has no record.
func (c *Checkpoint) prefixes(ids []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if slot, ok := c.slots.of[id]; ok {
			out = append(out, ckptPrefix(slot, id))
		}
	}
	slices.Sort(out)
	return out
}
