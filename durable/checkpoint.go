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
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending[k] = r
	if r.Type == generator.ContainerRemoved {
		c.removed[r.ID] = r.ObservedAt
	}
}

// takePending returns the acks not yet written, for a flush, or nil when
// there are none.
func (c *Checkpoint) takePending() map[string]record {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return nil
	}
	p := c.pending
	c.pending = make(map[string]record, len(p))
	return p
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

// expired returns the containers removed more than keepRemoved before now.
func (c *Checkpoint) expired(now time.Time) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for id, at := range c.removed {
		if now.Sub(at) > keepRemoved {
			ids = append(ids, id)
		}
	}
	return ids
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
