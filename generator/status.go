package generator

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// PodStatus is what the generator holds of one pod: its identity and each
// of its containers and sandboxes, removed ones included until their
// tombstones expire (Options.TombstoneTTL).
type PodStatus struct {
	// Pod.Meta is shared with the generator's state: read it, never modify
	// it.
	Pod Pod
	// Containers lists the sandboxes first, then the containers, each group
	// by ID.
	Containers []ContainerStatus
	// ObservedAt is when the newest observation of the pod that changed it
	// was made: a relist's start or a stream event's timestamp. It is the
	// zero time for a pod known only from the checkpoint.
	ObservedAt time.Time
}

// ContainerStatus is one container or sandbox of a PodStatus.
type ContainerStatus struct {
	Container Container
	State     State
	// ExitCode is set once the container was seen exited with a code.
	ExitCode *int32
}

// PodStatusNewerThan returns the pod's status once the generator holds an
// observation of the pod made after t, or once a full relist that began
// after t was merged; in that second case the pod may be unknown (no relist
// found it and nothing of it is kept), and PodStatusNewerThan returns false.
// It returns at once if that already holds. Otherwise it blocks until then
// or until ctx is done, and then returns ctx.Err(). It is the kubelet's
// GetNewerThan: a caller that changed a pod at t waits here for the
// generator to have seen the change, or to have seen that nothing changed.
// It is safe for concurrent use, also while Run runs.
func (g *Generator) PodStatusNewerThan(ctx context.Context, podUID string, t time.Time) (PodStatus, bool, error) {
	e, ok, err := g.merge.cache.GetNewerThan(ctx, podUID, t)
	if err != nil || !ok || e.Status == nil {
		return PodStatus{}, false, err
	}
	// The record is immutable once cached, so reading it needs no lock.
	st := PodStatus{Pod: e.Status.pod, ObservedAt: e.Modified, Containers: make([]ContainerStatus, 0, len(e.Status.containers))}
	for _, rec := range e.Status.containers {
		c := ContainerStatus{Container: rec.info, State: rec.state.published()}
		if rec.exitCode != nil {
			code := *rec.exitCode // a copy: the caller must not reach into the cache
			c.ExitCode = &code
		}
		st.Containers = append(st.Containers, c)
	}
	slices.SortFunc(st.Containers, func(a, b ContainerStatus) int {
		if a.Container.Sandbox != b.Container.Sandbox {
			if a.Container.Sandbox {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Container.ID, b.Container.ID)
	})
	return st, true, nil
}

// published names a tracked state as the State the API reports.
func (s cstate) published() State {
	switch s {
	case stateCreated:
		return StateCreated
	case stateRunning:
		return StateRunning
	case stateExited:
		return StateExited
	case stateGone:
		return StateRemoved
	}
	return StateUnknown
}
