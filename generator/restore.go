package generator

import (
	"time"
)

// restore builds cache records from events already delivered (a checkpoint),
// so that a restarted generator neither reports them again nor forgets a
// container that went away while it was down. A restored container has no
// sighting time: the first relist that does not list it declares it gone.
func restore(published []Event) map[string]*podRecord {
	pods := make(map[string]*podRecord)
	for _, ev := range published {
		if ev.Pod.UID == "" || ev.Container.ID == "" || bit(ev.Type) == 0 {
			continue
		}
		p := pods[ev.Pod.UID]
		if p == nil {
			p = &podRecord{pod: ev.Pod, containers: map[string]*containerRecord{}}
			pods[ev.Pod.UID] = p
		}
		rec := p.containers[ev.Container.ID]
		if rec == nil {
			rec = &containerRecord{sighting: sighting{info: ev.Container, state: stateCreated}}
			if ev.Container.Sandbox {
				rec.sandboxID = ev.Container.ID
			}
			p.containers[ev.Container.ID] = rec
		}
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
			if ev.State == StateExited {
				rec.sawExited = true
				rec.exitCode = ev.ExitCode
				rec.reason, rec.message = ev.Reason, ev.Message
				rec.finishedAt = ev.FinishedAt
			}
		case ContainerRemoved:
			rec.state = stateGone
			rec.goneAt = orTime(ev.ObservedAt, ev.Time)
		}
	}
	return pods
}

// seed loads restored records into the cache with no observation time, so
// that any real observation is newer.
func (g *Generator) seed(published []Event) {
	for uid, p := range restore(published) {
		g.cache.Set(uid, p, time.Time{})
	}
}
