package generator

import (
	"context"
	"log/slog"
	"time"
)

// Exits from containerd's task events.
//
// containerd's shim publishes a task's exit (/tasks/exit, with its exit
// status and exited_at) within milliseconds of the process's end, but the
// CRI plugin takes the exits one at a time, each with a task delete of tens
// of milliseconds: in a burst, CRI's status and its own STOPPED event show
// an exit up to seconds late. The exit event holds everything a
// ContainerDied needs that the cache does not: so the exit of a container
// (or sandbox) the cache holds running is merged at once, as an evented
// sighting of the exited state, with
//   - the exit code and finish time from the event: CRI's finished_at and
//     exit code are the event's exited_at and exit status, as containerd's
//     CRI plugin copies them;
//   - the reason as the CRI plugin reports it: OOMKilled if a /tasks/oom
//     for the container came before (the plugin sets it on that event),
//     else Completed for exit status 0 and Error for any other;
//   - everything else (pod, names, image, started_at) from the cache.
//
// A sandbox's Died carries no exit details, as a relist's does not.
//
// CRI stays the check: the record is marked unverified, the exit's
// expectation (trigger.go) keeps asking for targeted relists until one
// reads the container's status exited, and that status, or any later
// relist's or stream message's, is compared field by field with what was
// published (checkExit). A difference is counted and logged, never
// published again: the record keeps the first details it merged.
//
// The exit of a container the cache does not know, or knows only created
// (a Died then would come before any Started), takes the trigger's
// usual path: CRI reports it. So do /tasks/start (it carries no
// started_at: the CRI plugin takes its own clock after the start returns)
// and /containers/delete (a Removed is reported by the relist that no
// longer lists the container, as before).

// The reasons containerd's CRI plugin gives an exited container.
const (
	reasonOOMKilled = "OOMKilled"
	reasonCompleted = "Completed"
	reasonError     = "Error"
)

// The fields checkExit compares, as pleg_bridge_task_event_mismatches_total
// labels them.
const (
	mismatchExitCode   = "exit_code"
	mismatchFinishedAt = "finished_at"
	mismatchReason     = "reason"
)

// oomMemory bounds how long a /tasks/oom waits for its container's exit,
// and oomKeep how many are kept: an OOM kill that the process survives
// leaves an entry until then.
const (
	oomMemory = 10 * time.Minute
	oomKeep   = 4096
)

// exitReason is the reason containerd's CRI plugin gives an exit with the
// exit status code, oom saying whether a /tasks/oom came first.
func exitReason(code int32, oom bool) string {
	switch {
	case oom:
		return reasonOOMKilled
	case code == 0:
		return reasonCompleted
	}
	return reasonError
}

// sawOOM records a /tasks/oom of ev's container until its exit. Only the
// trigger goroutine calls it.
func (t *triggerSet) sawOOM(ev TaskEvent) {
	if t.oom == nil {
		t.oom = make(map[string]time.Time)
	}
	if len(t.oom) >= oomKeep {
		cutoff := time.Now().Add(-oomMemory)
		for id, at := range t.oom {
			if at.Before(cutoff) {
				delete(t.oom, id)
			}
		}
		if len(t.oom) >= oomKeep {
			return // a storm of OOM kills nobody exits from: CRI says it
		}
	}
	t.oom[ev.ID] = time.Now()
}

// takeExit takes a task exit or OOM kill followed beside a CRI stream: an
// exit of a container the cache holds running is reported at once (died),
// and nothing else is done; the stream reports the rest, and its STOPPED
// event carries the status that checks the exit. Only the trigger
// goroutine calls it.
func (t *triggerSet) takeExit(ctx context.Context, ev TaskEvent) {
	switch {
	case ev.Topic == TopicTaskOOM:
		t.results.WithLabelValues(triggerOOM).Inc()
		t.sawOOM(ev)
	case ev.Topic != TopicTaskExit || ev.ExecID != "":
	default:
		if scope, state, found := locate(t.cache, ev.ID); found && state == stateRunning {
			t.died(ctx, ev, scope)
		}
	}
}

// died hands the merge ev, a task exit of a container (or sandbox) in
// scope that the cache held running, as its exited sighting, and says
// whether it did. Only the trigger goroutine calls it.
func (t *triggerSet) died(ctx context.Context, ev TaskEvent, scope relistScope) bool {
	if t.exits == nil || ev.ExitedAt.IsZero() {
		return false
	}
	e, ok := t.cache.Get(scope.podUID)
	if !ok || e.Status == nil {
		return false
	}
	rec := e.Status.containers[ev.ID]
	if rec == nil || rec.state != stateRunning {
		return false
	}
	_, oom := t.oom[ev.ID]
	delete(t.oom, ev.ID)
	at := ev.At
	if at.IsZero() {
		at = time.Now()
	}
	s := sighting{info: rec.info, sandboxID: rec.sandboxID, state: stateExited, fromTask: true}
	if !rec.info.Sandbox {
		code := int32(ev.ExitStatus)
		s.exitCode = &code
		s.finishedAt = ev.ExitedAt.UTC()
		s.reason = exitReason(code, oom)
	}
	b := &batch{source: SourceEvented, at: at, pods: []podObservation{{pod: e.Status.pod, containers: []sighting{s}}}}
	select {
	case t.exits <- b:
	case <-ctx.Done():
		return false
	}
	t.results.WithLabelValues(triggerDied).Inc()
	if t.logger.Enabled(ctx, slog.LevelDebug) {
		t.logger.Debug("containerd task exit: reporting the death", "id", ev.ID, "exit_status", ev.ExitStatus,
			"exited_at", ev.ExitedAt.UTC(), "oom", oom, "age", time.Since(ev.ExitedAt))
	}
	return true
}

// verifies says whether sighting s, from CRI, checks what a task exit put
// in rec: rec's Died came from the task exit, and s shows the container
// exited with its status read.
func verifies(rec *containerRecord, s *sighting) bool {
	return rec != nil && rec.unverified && !s.fromTask && s.state == stateExited && s.exitCode != nil
}

// checkExit compares what CRI says of an exit (s) with what the task exit
// published (rec), field by field, and counts and logs each difference.
// The merge goroutine calls it for a sighting that verifies rec.
func (m *merger) checkExit(pod Pod, rec *containerRecord, s *sighting) {
	diff := func(field string, published, cri any) {
		m.metrics.taskMismatches.WithLabelValues(field).Inc()
		m.logger.Warn("CRI reports a container's exit otherwise than containerd's task exit did; the published event stands",
			"field", field, "published", published, "cri", cri, "container_id", rec.info.ID, "container", rec.info.Name,
			"pod_uid", pod.UID, "pod", pod.Namespace+"/"+pod.Name)
	}
	if rec.exitCode == nil || *rec.exitCode != *s.exitCode {
		var published any
		if rec.exitCode != nil {
			published = *rec.exitCode
		}
		diff(mismatchExitCode, published, *s.exitCode)
	}
	if !rec.finishedAt.Equal(s.finishedAt) {
		diff(mismatchFinishedAt, rec.finishedAt.Format(time.RFC3339Nano), s.finishedAt.Format(time.RFC3339Nano))
	}
	if rec.reason != s.reason {
		diff(mismatchReason, rec.reason, s.reason)
	}
}
