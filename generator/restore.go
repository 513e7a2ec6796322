package generator

import (
	"sync"
	"time"
)

// restore builds cache records from events already delivered (a checkpoint),
// so that a restarted generator neither reports them again nor forgets a
// container that went away while it was down. A restored container has no
// sighting time: the first relist that does not list it declares it gone.
func restore(published []Event) map[string]*podRecord {
	pods := make(map[string]*podRecord)
	for _, ev := range published {
		if !restorable(ev) {
			continue
		}
		p := pods[ev.Pod.UID]
		if p == nil {
			p = &podRecord{pod: ev.Pod, containers: map[string]*containerRecord{}}
			pods[ev.Pod.UID] = p
		}
		rec := p.containers[ev.Container.ID]
		if rec == nil {
			rec = newRestoredRecord(ev)
			p.containers[ev.Container.ID] = rec
		}
		rec.restoreEvent(ev)
	}
	return pods
}

// restorable reports whether ev names what a record needs: a pod, a
// container and a published type.
func restorable(ev Event) bool {
	return ev.Pod.UID != "" && ev.Container.ID != "" && bit(ev.Type) != 0
}

// newRestoredRecord returns the record of a container known only from
// its delivered event ev: created, never sighted.
func newRestoredRecord(ev Event) *containerRecord {
	rec := &containerRecord{sighting: sighting{info: ev.Container, state: stateCreated}}
	if ev.Container.Sandbox {
		rec.sandboxID = ev.Container.ID
	}
	return rec
}

// restoreEvent takes into rec, a record not stored yet, that ev was
// delivered: it is not reported again, and the state moves forward to what
// ev reports.
func (rec *containerRecord) restoreEvent(ev Event) {
	rec.emitted |= bit(ev.Type)
	if rec.startedAt.IsZero() {
		rec.startedAt = ev.StartedAt
	}
	switch ev.Type {
	case ContainerStarted:
		rec.state = max(rec.state, stateRunning)
		if ev.Container.Sandbox && rec.createdAt.IsZero() {
			rec.createdAt = ev.Time
		}
	case ContainerDied:
		rec.state = max(rec.state, stateExited)
		if ev.State == StateExited && !rec.sawExited {
			rec.sawExited = true
			rec.exitCode = ev.ExitCode
			rec.reason, rec.message = ev.Reason, ev.Message
			rec.finishedAt = ev.FinishedAt
		}
	case ContainerRemoved:
		if rec.state != stateGone {
			rec.state = stateGone
			rec.goneAt = orTime(ev.ObservedAt, ev.Time)
		}
	}
}

// start takes in, at the first Run or Relist, what Restore was given
// before it: the state the generator starts from.
func (m *merger) start() {
	if m.started {
		return
	}
	m.started = true
	m.seed(m.restored.take())
}

// seed loads restored records into the cache with no observation time, so
// that any real observation is newer.
func (m *merger) seed(published []Event) {
	for uid, p := range restore(published) {
		m.cache.Set(uid, p, time.Time{})
	}
}

// Restore adds events that an earlier run delivered to the generator's
// state: they are not reported again, and a container among them that is
// gone now is reported Died (with what its delivered events say) and
// Removed by the next full relist.
//
// Events given before Run or the first Relist starts (a checkpoint) are the
// state the generator starts from: that start takes them in before its
// first relist lists. Events given later are taken in by Run's merge
// goroutine before its next merge, in the order Restore was called, and a
// full relist is asked for. That is how a bridge takes in what the stream
// stored after its checkpoint (publish.Restart.OnStored): without it, a
// container whose ContainerStarted was stored and not yet checkpointed when
// the bridge was killed, and which went away while it was down, would never
// get its ContainerDied and ContainerRemoved.
//
// Restore does not block. It is safe for concurrent use.
func (g *Generator) Restore(events []Event) {
	if len(events) == 0 {
		return
	}
	g.merge.restored.add(events)
}

// restoredEvents holds what Restore was given until the merge goroutine
// takes it (mergeRestored), and tells it when there is something to take.
// Its methods are safe for concurrent use.
type restoredEvents struct {
	mu     sync.Mutex
	events []Event // guarded by mu
	// due (capacity 1) fires once events were added and not yet taken.
	due chan struct{}
}

func newRestoredEvents() restoredEvents {
	return restoredEvents{due: make(chan struct{}, 1)}
}

// add keeps events and tells the merge goroutine. It does not block.
func (r *restoredEvents) add(events []Event) {
	r.mu.Lock()
	r.events = append(r.events, events...)
	r.mu.Unlock()
	select {
	case r.due <- struct{}{}:
	default:
	}
}

func (r *restoredEvents) take() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	events := r.events
	r.events = nil
	return events
}

// mergeRestored runs in the merge goroutine: it merges what Restore was
// given into the cache, copying each record it changes (records are
// immutable once stored), and asks for a full relist to find which of those
// containers are gone. A container the cache knows keeps what was observed
// of it; only the events delivered and the state they imply are added.
func (m *merger) mergeRestored() {
	events := m.restored.take()
	if len(events) == 0 {
		return
	}
	m.mergingOther()
	changed := map[string]*podRecord{}
	modified := map[string]time.Time{}
	for _, ev := range events {
		if !restorable(ev) {
			continue
		}
		uid := ev.Pod.UID
		p := changed[uid]
		if p == nil {
			if e, ok := m.cache.Get(uid); ok {
				p = &podRecord{pod: e.Status.pod, containers: make(map[string]*containerRecord, len(e.Status.containers)+1)}
				for id, rec := range e.Status.containers {
					p.containers[id] = rec
				}
				modified[uid] = e.Modified
			} else {
				p = &podRecord{pod: ev.Pod, containers: map[string]*containerRecord{}}
			}
			changed[uid] = p
		}
		rec := p.containers[ev.Container.ID]
		if rec == nil {
			rec = newRestoredRecord(ev)
		} else {
			cp := *rec
			rec = &cp
		}
		rec.restoreEvent(ev)
		p.containers[ev.Container.ID] = rec
	}
	for uid, p := range changed {
		m.cache.Set(uid, p, modified[uid])
	}
	m.logger.Info("took in what the stream stored after the checkpoint; a full relist finds which of those containers are gone",
		"events", len(events), "pods", len(changed))
	m.requestRelist()
}

// PodMeta returns the labels and allowlisted annotations the generator
// holds for the pod, and whether it can know them: false until its first
// full relist is merged. With true, a nil PodMeta means no sandbox of the
// pod was seen (the pod is gone, or known only from a checkpoint). It is
// for events rebuilt from a checkpoint, which keeps no labels: a bridge
// that carries them into a new stream (publish.Restart.PodMeta). The
// PodMeta is shared with the generator's state: read it, never modify
// it. It is safe for concurrent use, also while Run runs.
func (g *Generator) PodMeta(podUID string) (*PodMeta, bool) {
	if !g.Synced() {
		return nil, false
	}
	return g.merge.lookupMeta(podUID), true
}
