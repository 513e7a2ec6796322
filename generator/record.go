package generator

import (
	"time"
)

// cstate is a container's lifecycle state as the generator tracks it. States
// only move forward, in this order: a CRI container never runs again after it
// exits (a restart is a new container ID), so an observation that would move a
// container backwards is stale and ignored. unknown sits between created and
// running: a runtime that briefly reports unknown has not un-started anything.
type cstate uint8

const (
	stateCreated cstate = iota
	stateUnknown
	stateRunning
	stateExited
	stateGone
)

func (s cstate) String() string {
	switch s {
	case stateCreated:
		return "created"
	case stateUnknown:
		return "unknown"
	case stateRunning:
		return "running"
	case stateExited:
		return "exited"
	case stateGone:
		return "gone"
	}
	return "invalid"
}

// emittedSet records which Lifecycle events a container has produced; each
// (container, type) is produced at most once.
type emittedSet uint8

func bit(t LifecycleEventType) emittedSet {
	switch t {
	case ContainerStarted:
		return 1
	case ContainerDied:
		return 2
	case ContainerRemoved:
		return 4
	}
	return 0
}

func (e emittedSet) has(t LifecycleEventType) bool { return e&bit(t) != 0 }

// containerRecord is what the cache knows of one container or sandbox: the
// sighting it has merged so far (for a sandbox, sandboxID is its own ID; a
// targeted relist of one sandbox is complete only for that sandbox's
// records) and what the merge keeps beyond it. Records are immutable once
// stored: the merge copies before changing.
type containerRecord struct {
	sighting
	// sawExited is set once the container was observed exited (not merely
	// found gone), so its Died event reports state exited.
	sawExited bool
	// unverified is set when the record's Died came from containerd's
	// task exit, until CRI showed the container exited with its status
	// (exits.go).
	unverified bool
	// lastSeen is the newest observation in which the container existed. A
	// relist may declare it gone only if lastSeen is older than the relist.
	lastSeen time.Time
	// goneAt is when it was declared gone; the record stays as a tombstone
	// so that late stream events for it are recognised as stale.
	goneAt  time.Time
	emitted emittedSet
	// unsent marks the events produced for this record that the sink did
	// not record (it was full): the backfill rebuilds them from the record
	// and sends them again (backfill.go). Nothing is sent while any event is
	// unsent, so a container's unsent events are always its last ones.
	unsent emittedSet
	// held says when and by which source each unsent event was produced,
	// indexed by typeIndex; nil while nothing is unsent. Like the record, it
	// is never modified once stored.
	held *[3]heldEvent
}

// heldEvent is what the backfill needs, beyond the record, to rebuild an
// unsent event as it was produced.
type heldEvent struct {
	at  time.Time
	src Source
}

// typeIndex numbers the Lifecycle event types in per-container order.
func typeIndex(t LifecycleEventType) int {
	switch t {
	case ContainerDied:
		return 1
	case ContainerRemoved:
		return 2
	}
	return 0
}

// podRecord is the cache's status of one pod. It is immutable once stored in
// the cache.
type podRecord struct {
	pod        Pod
	containers map[string]*containerRecord
}

// sighting is one source's view of one container at one time.
type sighting struct {
	info       Container
	sandboxID  string
	state      cstate
	createdAt  time.Time
	startedAt  time.Time
	finishedAt time.Time
	exitCode   *int32
	reason     string
	message    string
	// listedRunningAt is when a relist listed the container running but
	// could not read its status (see relister.inspect): the sighting
	// keeps the state the cache held, so that the next relist reads the
	// status again, and this says that the container did start, and by
	// when. A record keeps the first such time: if the status is never
	// read (the container is gone by then), its ContainerStarted is
	// reported at that time, with no started_at.
	listedRunningAt time.Time
	// fromTask marks a sighting taken from containerd's task exit rather
	// than from CRI (exits.go); a record keeps it false.
	fromTask bool
}

// podObservation is one source's view of one pod at one time.
type podObservation struct {
	pod        Pod
	containers []sighting
	// complete says containers lists every container and sandbox of the pod
	// that exists (a relist view); a container of the record missing from it
	// is gone, unless it was seen after at. Stream payloads are partial.
	complete bool
	// scope, when set with complete, limits completeness to the records of
	// these sandboxes (a targeted relist of one sandbox).
	scope map[string]bool
	// containersOnly, with scope, leaves the sandboxes' own records out of
	// completeness: they were not listed.
	containersOnly bool
}
