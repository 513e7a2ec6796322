package durable

import (
	"sync"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// Checkpoint records what JetStream acknowledged, per container and event
// type, so that a restarted bridge neither re-publishes everything as new
// nor forgets what changed while it was down.
//
// RecordAck only notes the ack in memory; the Store's Run writes the acks
// noted since its last write, within 500 ms, in one transaction. Acks not
// yet written are lost by a crash, and re-published after it, which the
// event ids make harmless within the stream's duplicate window. Records are
// keyed by container and type, so recording an ack twice changes nothing.
//
// It is safe for concurrent use.
type Checkpoint struct {
	restored []generator.Event // read at Open; never modified

	mu      sync.Mutex
	pending map[string]record // guarded by mu; by ckptKey, acked but not yet written
	// removed holds when each removed container's removal was observed,
	// for the collection that drops it keepRemoved later. Guarded by mu.
	removed map[string]time.Time
}

func newCheckpoint(restored []generator.Event, removed map[string]time.Time) *Checkpoint {
	return &Checkpoint{restored: restored, pending: map[string]record{}, removed: removed}
}

// Restored returns the events the checkpoint held at Open, one per
// container and type, in no particular order; removed containers are kept
// generator.DefaultTombstoneTTL after their removal was observed. Every
// call returns the same slice: do not modify it.
func (c *Checkpoint) Restored() []generator.Event { return c.restored }

// RecordAck records an event JetStream acknowledged. It does no I/O and is
// safe for concurrent use.
func (c *Checkpoint) RecordAck(ev generator.Event) {
	r := toRecord(ev)
	k := ckptKey(r.ID, r.Type)
	at := r.ObservedAt
	if r.Type == generator.ContainerRemoved && at.IsZero() {
		at = time.Now() // see removedAt
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending[k] = r
	if r.Type == generator.ContainerRemoved {
		c.removed[r.ID] = at
	}
}

// take returns, for a flush, the acks not yet written (if acks), and the
// containers removed more than keepRemoved before now (if collect). It
// takes them together: a collection writes the pending acks of the
// containers it deletes in its own transaction, else they would be written
// after it and stay in the file until a restart (the acks of events
// delivered late, from the spool after a long outage, may be due for
// collection when they come).
func (c *Checkpoint) take(acks, collect bool, now time.Time) (map[string]record, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	if collect {
		acks = true
		for id, at := range c.removed {
			if now.Sub(at) > keepRemoved {
				ids = append(ids, id)
			}
		}
	}
	if !acks || len(c.pending) == 0 {
		return nil, ids
	}
	p := c.pending
	c.pending = make(map[string]record, len(p))
	return p, ids
}

// putBack returns the acks of a failed flush to the pending ones. An ack
// of the same key that came in since is the same event (one per container
// and type), so either may stay.
func (c *Checkpoint) putBack(acks map[string]record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, r := range acks {
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
	}
}
