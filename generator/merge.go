package generator

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// mergePod applies one observation of a pod, taken by src at time at, to the
// pod's cached record and returns the new record and the Lifecycle events the
// change produces, in per-container order (Started, Died, Removed). It never
// modifies old. A nil old means the pod is not cached. It is a pure function:
// the caller supplies time.
func mergePod(old *podRecord, obs podObservation, src Source, at time.Time) (*podRecord, []Event) {
	if old == nil && len(obs.containers) == 0 {
		return nil, nil
	}
	cur := &podRecord{pod: obs.pod}
	if old != nil {
		cur.pod = mergePodIdentity(old.pod, obs.pod)
		cur.containers = old.containers
	}
	changed := old == nil || cur.pod != old.pod
	// set stores a changed record, cloning the map on the first change so
	// that old stays intact and an unchanged pod costs no allocation.
	cloned := false
	set := func(id string, rec *containerRecord) {
		if !cloned {
			m := make(map[string]*containerRecord, len(cur.containers)+1)
			maps.Copy(m, cur.containers)
			cur.containers = m
			cloned = true
		}
		cur.containers[id] = rec
		changed = true
	}
	var events []Event
	var seen map[string]struct{}
	if obs.complete {
		seen = make(map[string]struct{}, len(obs.containers))
	}
	for i := range obs.containers {
		s := &obs.containers[i]
		if seen != nil {
			seen[s.info.ID] = struct{}{}
		}
		rec, evs := mergeContainer(cur.containers[s.info.ID], s, cur.pod, src, at)
		if rec != nil {
			set(s.info.ID, rec)
		}
		events = append(events, evs...)
	}
	if obs.complete {
		var missing []*containerRecord
		for id, rec := range cur.containers {
			if _, ok := seen[id]; ok || rec.state == stateGone {
				continue
			}
			if obs.scope != nil && (!obs.scope[rec.sandboxID] || (obs.containersOnly && rec.info.Sandbox)) {
				continue
			}
			missing = append(missing, rec)
		}
		// Containers go before their sandbox, as they do in the runtime.
		slices.SortFunc(missing, func(a, b *containerRecord) int {
			if a.info.Sandbox != b.info.Sandbox {
				if a.info.Sandbox {
					return 1
				}
				return -1
			}
			return strings.Compare(a.info.ID, b.info.ID)
		})
		for _, rec := range missing {
			nrec, evs := declareGone(rec, cur.pod, src, at)
			if nrec != nil {
				set(rec.info.ID, nrec)
				events = append(events, evs...)
			}
		}
	}
	if !changed {
		return old, nil
	}
	if cur.containers == nil {
		cur.containers = map[string]*containerRecord{}
	}
	return cur, events
}

// mergePodIdentity keeps the identity already known and fills in what a newer
// observation adds: pod identity never changes for a UID, but a partial view
// (a container's labels) may lack the namespace or name. The metadata is
// that of the pod's newest sandbox seen (PodMeta.supersedes); a view without
// it keeps what is known.
func mergePodIdentity(old, obs Pod) Pod {
	if old.Namespace == "" {
		old.Namespace = obs.Namespace
	}
	if old.Name == "" {
		old.Name = obs.Name
	}
	if obs.Meta.supersedes(old.Meta) {
		old.Meta = obs.Meta
	}
	return old
}

// declareGone marks a container that a complete observation at time at did
// not list as gone, if it was not seen after at. It returns nil if nothing
// changes.
func declareGone(rec *containerRecord, pod Pod, src Source, at time.Time) (*containerRecord, []Event) {
	if rec.state == stateGone || !rec.lastSeen.Before(at) {
		return nil, nil
	}
	n := *rec
	n.state = stateGone
	n.goneAt = at
	return &n, n.pendingEvents(pod, src, at)
}

// mergeContainer applies one sighting to a container's record (nil: not
// known) and returns the new record (nil: unchanged) and the events produced.
//
// lastSeen moves with stream sightings and is set on a record's creation: a
// relist compares it with its own timestamp only to learn whether the stream
// saw the container after the relist started, so a relist need not refresh
// it, and an unchanged container costs a relist no allocation.
func mergeContainer(rec *containerRecord, s *sighting, pod Pod, src Source, at time.Time) (*containerRecord, []Event) {
	if rec != nil && rec.state == stateGone {
		return nil, nil // a tombstone: anything said of it now is stale
	}
	if s.state == stateGone {
		if rec == nil {
			// Gone before we knew anything of it (a lone DELETED event): keep
			// a tombstone so that a late replay of its earlier events is
			// ignored, but invent nothing.
			return &containerRecord{sighting: sighting{info: s.info, sandboxID: s.sandboxID, state: stateGone}, goneAt: at, lastSeen: at,
				emitted: bit(ContainerStarted) | bit(ContainerDied) | bit(ContainerRemoved)}, nil
		}
		n := *rec
		n.fill(s)
		n.state = stateGone
		n.goneAt = at
		return &n, n.pendingEvents(pod, src, at)
	}
	if s.fromTask && (rec == nil || rec.state < stateRunning) {
		// A task's exit reports the death of a container known running,
		// never more: a Died without its Started would break the order.
		return nil, nil
	}
	var n containerRecord
	if rec == nil {
		n = containerRecord{sighting: sighting{info: s.info, sandboxID: s.sandboxID, state: s.state}}
		n.fill(s)
	} else {
		n = *rec
		n.fillInfo(s.info)
		if n.sandboxID == "" {
			n.sandboxID = s.sandboxID
		}
		if s.state > n.state {
			n.state = s.state
		}
		n.fill(s)
	}
	if n.state == stateExited {
		if s.fromTask && !n.sawExited && !n.info.Sandbox {
			n.unverified = true
		}
		n.sawExited = true
	}
	if verifies(rec, s) {
		n.unverified = false
	}
	if (rec == nil || src == SourceEvented) && at.After(n.lastSeen) {
		n.lastSeen = at
	}
	evs := n.pendingEvents(pod, src, at)
	if rec != nil && n == *rec {
		return nil, nil
	}
	out := n // only a changed record reaches the heap
	return &out, evs
}

// fillInfo completes the container's description from another without
// overwriting what is known: a record's from a later sighting, a listed
// container's from its status.
func (s *sighting) fillInfo(info Container) {
	if s.info.Name == "" {
		s.info.Name = info.Name
	}
	if s.info.Image == "" {
		s.info.Image = info.Image
	}
	if s.info.ImageRef == "" {
		s.info.ImageRef = info.ImageRef
	}
}

// fill takes the details a sighting adds. Details describe a point in the
// container's life that never changes once reached (when it started, how it
// exited), so a known value is kept and a missing one filled in; exit details
// are taken only from a sighting of the exited state.
func (r *containerRecord) fill(s *sighting) {
	if r.createdAt.IsZero() {
		r.createdAt = s.createdAt
	}
	if r.startedAt.IsZero() {
		r.startedAt = s.startedAt
	}
	if r.listedRunningAt.IsZero() {
		r.listedRunningAt = s.listedRunningAt
	}
	if s.state != stateExited {
		return
	}
	if r.finishedAt.IsZero() {
		r.finishedAt = s.finishedAt
	}
	if r.exitCode == nil && s.exitCode != nil {
		c := *s.exitCode
		r.exitCode = &c
	}
	if r.reason == "" {
		r.reason = s.reason
	}
	if r.message == "" {
		r.message = s.message
	}
}

// pendingEvents returns the events the record's state calls for that were not
// produced yet, in order, and marks them produced. at is the observation's
// time, used where the runtime gives no time of its own.
//
// The transition table (the kubelet's generateEvents, states moving only
// forward): reaching running produces Started;
// reaching exited produces Died, preceded by a Started synthesized from
// started_at if the start was never seen; reaching gone produces Died (if not
// yet) and Removed. A sandbox has no started_at, so one first seen NOTREADY
// gets no Started. A container that a listing showed running, but whose
// status was never read (listedRunningAt), did start: a Started synthesized
// at the time of that listing precedes its Died.
func (r *containerRecord) pendingEvents(pod Pod, src Source, at time.Time) []Event {
	var out []Event
	emit := func(t LifecycleEventType, ev Event) {
		r.emitted |= bit(t)
		ev.Type = t
		ev.Pod = pod
		ev.Container = r.info
		ev.DetectedBy = src
		ev.ObservedAt = at
		ev.StartedAt = r.startedAt
		out = append(out, ev)
	}
	startTime := r.startedAt
	if r.info.Sandbox {
		startTime = r.createdAt
	}
	// Per-container order is Started, Died, Removed: a start learnt only
	// after the death was reported is not reported at all.
	if !r.emitted.has(ContainerStarted) && !r.emitted.has(ContainerDied) {
		switch {
		case r.state == stateRunning:
			emit(ContainerStarted, Event{State: StateRunning, Time: orTime(startTime, orTime(r.listedRunningAt, at))})
		case r.state > stateRunning && !r.startedAt.IsZero():
			emit(ContainerStarted, Event{State: StateRunning, Time: r.startedAt})
		case r.state > stateRunning && !r.listedRunningAt.IsZero():
			emit(ContainerStarted, Event{State: StateRunning, Time: r.listedRunningAt})
		}
	}
	if r.state >= stateExited && !r.emitted.has(ContainerDied) {
		ev := Event{State: StateUnknown, Time: orTime(r.finishedAt, at)}
		if r.sawExited {
			ev.State = StateExited
			ev.ExitCode = r.exitCode
			ev.Reason = r.reason
			ev.Message = r.message
			ev.FinishedAt = r.finishedAt
		}
		emit(ContainerDied, ev)
	}
	if r.state == stateGone && !r.emitted.has(ContainerRemoved) {
		ev := Event{State: StateRemoved, Time: at, FinishedAt: r.finishedAt, ExitCode: r.exitCode}
		emit(ContainerRemoved, ev)
	}
	return out
}

func orTime(t, fallback time.Time) time.Time {
	if t.IsZero() {
		return fallback
	}
	return t
}
