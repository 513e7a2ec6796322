package generator

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/pleg-bridge/pleg-bridge/statecache"
)

const (
	// backfillInterval is the least time between two backfills. While the
	// sink stays full each one rebuilds unsent events only to have them
	// refused, so trying more often would cost CPU without bringing NATS
	// back sooner; once it is back, a second is little against the outage.
	backfillInterval = time.Second
	// backfillChunk bounds the events rebuilt for one Send of a backfill. A
	// long outage on a busy node holds tens of thousands; a sink that is
	// still full refuses the first chunk, and the rest is not rebuilt for
	// nothing.
	backfillChunk = 1024
)

// heldState is the generator's half of store-and-forward: nothing is lost
// while NATS is away, however long.
// The sink never blocks: when its outbox and spool are full it records a
// prefix of the events and returns *SinkFullError. The events it did not
// record are not kept as such: their records are marked (containerRecord.
// unsent), and so is every event produced after them, so that nothing of a
// container overtakes an unsent event, while relisting and the stream go on
// merging. A backfill, at most every backfillInterval while anything is
// unsent, rebuilds the unsent events from their records in the order they
// were produced (with what the record knows now: what the event said, or
// more) and sends them; what the sink records is cleared, the rest waits for
// the next backfill. When nothing is unsent, events are sent as they come.
//
// A record that expires (TombstoneTTL) with unsent events loses them: they
// are counted in pleg_bridge_events_unreported_total and logged. Unsent
// events live only in memory: after a restart the checkpoint does not have
// them, so a container still there is reported again from the runtime's
// view, one gone whose Started was acknowledged is reported Died and
// Removed, and one that started and went away entirely while the sink was
// full and before the restart is not reported at all.
//
// Only the merge goroutine (or Relist, when Run is not running) uses it.
type heldState struct {
	// queue names the unsent events in the order they were produced, so
	// that a backfill refused by a sink still full costs one chunk, not a
	// walk of everything held. An entry whose event is no longer unsent
	// (its record expired) is skipped.
	queue []heldRef
	count int // unsent events
	// due fires when the next backfill may run; nil while none is armed.
	due <-chan time.Time
	// since, sent and lost describe the current episode of a full sink, for
	// the log line that ends it.
	since      time.Time
	sent, lost int
}

// heldRef names one unsent event: the record it is rebuilt from.
type heldRef struct {
	podUID, containerID string
	t                   LifecycleEventType
}

// hold marks events unsent on their records and arms the backfill.
func (m *merger) hold(events []Event) {
	if len(events) == 0 {
		return
	}
	if m.held.count == 0 {
		m.held.queue = m.held.queue[:0] // only expired entries are left
		m.held.since, m.held.sent, m.held.lost = time.Now(), 0, 0
		m.logger.Warn("sink full: recording state only, will backfill", "events", len(events))
	}
	lost := m.rewrite(events, func(uid string, rec *containerRecord, ev Event) {
		var h [3]heldEvent
		if rec.held != nil {
			h = *rec.held
		}
		h[typeIndex(ev.Type)] = heldEvent{at: ev.ObservedAt, src: ev.DetectedBy}
		rec.held = &h
		rec.unsent |= bit(ev.Type)
		m.held.queue = append(m.held.queue, heldRef{podUID: uid, containerID: rec.info.ID, t: ev.Type})
		m.held.count++
	})
	for _, ev := range lost {
		m.lose(ev.Pod.UID, ev.Container.ID, ev.Type, "its container's record is gone")
	}
	m.metrics.unsent.Set(float64(m.held.count))
	if m.held.count > 0 && m.held.due == nil {
		m.held.due = time.After(backfillInterval)
	}
}

// backfill sends the unsent events, rebuilt from their records, in the order
// they were produced, until the sink is full again, and clears what it
// records. It re-arms itself while anything stays unsent. It returns an error
// only if the sink failed for a reason other than being full.
func (m *merger) backfill(ctx context.Context) error {
	m.held.due = nil
	m.mergingOther() // it rewrites records
	for len(m.held.queue) > 0 {
		events := make([]Event, 0, min(len(m.held.queue), backfillChunk))
		var from []int // the queue index of each event
		i := 0
		for ; i < len(m.held.queue) && len(events) < backfillChunk; i++ {
			ref := m.held.queue[i]
			e, ok := m.cache.Get(ref.podUID)
			if !ok {
				continue
			}
			rec := e.Status.containers[ref.containerID]
			if rec == nil || !rec.unsent.has(ref.t) {
				continue // expired, and counted
			}
			events = append(events, rec.rebuild(ref.t, e.Status.pod))
			from = append(from, i)
		}
		n := len(events)
		if n > 0 {
			var err error
			if n, err = m.sendSome(ctx, events); err != nil {
				return err
			}
		}
		m.rewrite(events[:n], func(_ string, rec *containerRecord, ev Event) {
			rec.unsent &^= bit(ev.Type)
			if rec.unsent == 0 {
				rec.held = nil
			}
			m.held.count--
			m.held.sent++
		})
		if n < len(events) {
			m.held.queue = slices.Delete(m.held.queue, 0, from[n])
			break
		}
		m.held.queue = slices.Delete(m.held.queue, 0, i)
	}
	m.metrics.unsent.Set(float64(m.held.count))
	if m.held.count > 0 {
		m.held.due = time.After(backfillInterval)
		return nil
	}
	m.held.queue = nil // let a long outage's queue go
	m.logger.Info("backfill complete: sending events as they come again", "events", m.held.sent,
		"unreported", m.held.lost, "full_for", time.Since(m.held.since).Round(time.Millisecond))
	return nil
}

// rewrite replaces the records the events name, pod by pod, with copies that
// fn changed, one call per event in order. It returns the events whose
// record is not cached, which it skips; there should be none, as events come
// from records that the merge goroutine just stored or read.
func (m *merger) rewrite(events []Event, fn func(uid string, rec *containerRecord, ev Event)) (missing []Event) {
	type pod struct {
		e          statecache.Entry[*podRecord]
		containers map[string]*containerRecord
	}
	pods := make(map[string]*pod)
	var order []string
	for _, ev := range events {
		uid := ev.Pod.UID
		p, ok := pods[uid]
		if !ok {
			p = &pod{}
			if e, found := m.cache.Get(uid); found {
				p.e, p.containers = e, maps.Clone(e.Status.containers)
			}
			pods[uid] = p
			order = append(order, uid)
		}
		rec := p.containers[ev.Container.ID]
		if rec == nil {
			missing = append(missing, ev)
			continue
		}
		n := *rec
		fn(uid, &n, ev)
		p.containers[ev.Container.ID] = &n
	}
	for _, uid := range order {
		if p := pods[uid]; p.containers != nil {
			m.cache.Set(uid, &podRecord{pod: p.e.Status.pod, containers: p.containers}, p.e.Modified)
		}
	}
	return missing
}

// unreported counts and logs the unsent events of a record that garbage
// collection drops.
func (m *merger) unreported(uid string, rec *containerRecord) {
	for _, t := range LifecycleEventTypes {
		if rec.unsent.has(t) {
			m.held.count--
			m.lose(uid, rec.info.ID, t, "its container's record expired while the sink was full")
		}
	}
	m.metrics.unsent.Set(float64(m.held.count))
}

// lose counts and logs an event that will never be sent.
func (m *merger) lose(uid, containerID string, t LifecycleEventType, why string) {
	m.held.lost++
	m.metrics.unreported.WithLabelValues(string(t)).Inc()
	m.logger.Warn("event unreported: "+why, "pod_uid", uid, "container_id", containerID, "event_type", t)
}

// rebuild makes the record's unsent event of type t again: what
// pendingEvents produces for a copy of the record that has produced every
// other event, in the state that produced it, with the time and source it
// was produced with. What the record learnt since (a finished_at, an exit
// code) is included.
func (r *containerRecord) rebuild(t LifecycleEventType, pod Pod) Event {
	n := *r
	switch t {
	case ContainerStarted:
		// It may have exited since, without a started_at to synthesize a
		// start from: it was running when the event was produced.
		n.state, n.emitted = stateRunning, 0
	case ContainerDied:
		n.state, n.emitted = max(n.state, stateExited), bit(ContainerStarted)|bit(ContainerRemoved)
	case ContainerRemoved:
		n.state, n.emitted = stateGone, bit(ContainerStarted)|bit(ContainerDied)
	}
	h := r.held[typeIndex(t)]
	return n.pendingEvents(pod, h.src, h.at)[0]
}
