package generator

import (
	"fmt"
	"slices"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Pod identity labels the kubelet puts on every sandbox and container.
const (
	labelPodUID        = "io.kubernetes.pod.uid"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodName       = "io.kubernetes.pod.name"
	labelContainerName = "io.kubernetes.container.name"
)

// criSandbox is what a listed sandbox (*runtimeapi.PodSandbox, read by a
// relist) and a sandbox status (*runtimeapi.PodSandboxStatus, carried by a
// stream message) both say about a sandbox. It is not a seam for fakes: it
// lets both sources build their sightings with one constructor, so that they
// cannot come to disagree about what a sandbox looks like.
type criSandbox interface {
	GetId() string
	GetMetadata() *runtimeapi.PodSandboxMetadata
	GetLabels() map[string]string
	GetAnnotations() map[string]string
	GetState() runtimeapi.PodSandboxState
	GetCreatedAt() int64
}

// criContainer is what a listed container (*runtimeapi.Container) and a
// container status (*runtimeapi.ContainerStatus) both say about a container;
// see criSandbox.
type criContainer interface {
	GetId() string
	GetMetadata() *runtimeapi.ContainerMetadata
	GetLabels() map[string]string
	GetImage() *runtimeapi.ImageSpec
	GetImageRef() string
	GetState() runtimeapi.ContainerState
	GetCreatedAt() int64
}

// sandboxSighting is a sandbox as a listing or a status shows it. now stands
// against absurd timestamps (see validTime).
func sandboxSighting(sb criSandbox, now time.Time) sighting {
	return sighting{
		info:      Container{ID: sb.GetId(), Attempt: sb.GetMetadata().GetAttempt(), Sandbox: true},
		sandboxID: sb.GetId(),
		state:     sandboxState(sb.GetState()),
		createdAt: validTime(sb.GetCreatedAt(), now),
	}
}

// containerSighting is a container of sandbox sandboxID as a listing or a
// status shows it, before a status call adds what only a status holds (see
// applyStatus).
func containerSighting(c criContainer, sandboxID string, now time.Time) sighting {
	return sighting{
		info:      newContainer(c),
		sandboxID: sandboxID,
		state:     containerState(c.GetState()),
		createdAt: validTime(c.GetCreatedAt(), now),
	}
}

// newContainer describes a container from a listing or a status: the
// metadata where the runtime keeps it, else the kubelet's labels.
func newContainer(c criContainer) Container {
	return Container{
		ID:       c.GetId(),
		Name:     containerName(c.GetMetadata(), c.GetLabels()),
		Attempt:  c.GetMetadata().GetAttempt(),
		Image:    imageName(c.GetImage()),
		ImageRef: c.GetImageRef(),
	}
}

// applyStatus completes a listed container's sighting with its status. The
// status was read after the listing, so a later state in it wins; the
// listing's description stands where it says something.
func applyStatus(s *sighting, st *runtimeapi.ContainerStatus, now time.Time) {
	if cs := containerState(st.GetState()); cs > s.state {
		s.state = cs
	}
	s.startedAt = validTime(st.GetStartedAt(), now)
	if s.createdAt.IsZero() {
		s.createdAt = validTime(st.GetCreatedAt(), now)
	}
	s.fillInfo(newContainer(st))
	if s.state == stateExited {
		s.finishedAt = validTime(st.GetFinishedAt(), now)
		code := st.GetExitCode()
		s.exitCode = &code
		s.reason = st.GetReason()
		s.message = st.GetMessage()
	}
}

// streamBatch converts one GetContainerEvents message into a partial view of
// its pod, with the pod's metadata as meta reads it from the sandbox status
// (or as known holds it, see metaFilter.sandboxMeta), and the sandbox to
// relist if the event calls for confirmation. now stands in for a missing
// or absurd timestamp. The view is written into into, reusing its room
// (see batch.recycle), or into a new batch if into is nil.
func streamBatch(into *batch, ev *runtimeapi.ContainerEventResponse, now time.Time, meta metaFilter, known func(podUID string) *PodMeta) (*batch, *relistScope, error) {
	if ev.GetContainerId() == "" {
		return nil, nil, fmt.Errorf("event %s has no container ID", ev.GetContainerEventType())
	}
	at := validTime(ev.GetCreatedAt(), now)
	if at.IsZero() {
		at = now
	}
	evState := eventState(ev.GetContainerEventType())
	b := into
	if b == nil {
		b = &batch{}
	}
	var room []sighting
	if cap(b.pods) > 0 {
		room = b.pods[:1][0].containers[:0]
	}
	*b = batch{source: SourceEvented, at: at, pods: b.pods[:0]}
	sbs := ev.GetPodSandboxStatus()
	if sbs == nil {
		// containerd 1.7 sends a sandbox's DELETED event without a sandbox
		// status. The pod is left for the merge to find by container ID.
		obs := podObservation{containers: append(room, sighting{info: Container{ID: ev.GetContainerId()}, state: evState})}
		b.pods = append(b.pods, obs)
		if evState >= stateRunning {
			b.subject = ev.GetContainerId()
		}
		return b, nil, nil
	}
	pod := sandboxPod(sbs)
	if pod.UID == "" {
		return nil, nil, fmt.Errorf("event %s for container %s: sandbox %s has no pod UID", ev.GetContainerEventType(), ev.GetContainerId(), sbs.GetId())
	}
	sbID := sbs.GetId()
	if sbID != "" {
		pod.Meta = meta.sandboxMeta(known, pod.UID, sbs, now)
	}
	// Room for the sandbox, every status and the event's own container.
	obs := podObservation{pod: pod, containers: slices.Grow(room, len(ev.GetContainersStatuses())+2)}
	if sbID != "" {
		s := sandboxSighting(sbs, now)
		if ev.GetContainerId() == sbID && evState > s.state {
			s.state = evState
		}
		obs.containers = append(obs.containers, s)
	}
	own := -1
	for _, st := range ev.GetContainersStatuses() {
		if st == nil || st.GetId() == "" {
			continue
		}
		s := containerSighting(st, sbID, now)
		applyStatus(&s, st, now)
		if st.GetId() == ev.GetContainerId() {
			own = len(obs.containers)
		}
		obs.containers = append(obs.containers, s)
	}
	if ev.GetContainerId() != sbID {
		if own < 0 {
			obs.containers = append(obs.containers, sighting{info: Container{ID: ev.GetContainerId()}, sandboxID: sbID, state: evState})
		} else if evState > obs.containers[own].state {
			obs.containers[own].state = evState
		}
	}
	var scope *relistScope
	switch ev.GetContainerEventType() {
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
		if sbID != "" {
			// A container's stop or removal is confirmed by listing the
			// sandbox's containers; a sandbox's by listing it too.
			scope = &relistScope{podUID: pod.UID, sandboxID: sbID, containersOnly: ev.GetContainerId() != sbID}
		}
	}
	b.pods = append(b.pods, obs)
	if evState >= stateRunning {
		b.subject = ev.GetContainerId()
	}
	return b, scope, nil
}

// sandboxPod is the pod a sandbox belongs to: its metadata, else the
// kubelet's labels.
func sandboxPod(sb criSandbox) Pod {
	md, labels := sb.GetMetadata(), sb.GetLabels()
	p := Pod{UID: md.GetUid(), Namespace: md.GetNamespace(), Name: md.GetName()}
	if p.UID == "" {
		p.UID = labels[labelPodUID]
	}
	if p.Namespace == "" {
		p.Namespace = labels[labelPodNamespace]
	}
	if p.Name == "" {
		p.Name = labels[labelPodName]
	}
	return p
}

func podFromLabels(labels map[string]string) Pod {
	return Pod{UID: labels[labelPodUID], Namespace: labels[labelPodNamespace], Name: labels[labelPodName]}
}

func containerName(md *runtimeapi.ContainerMetadata, labels map[string]string) string {
	if n := md.GetName(); n != "" {
		return n
	}
	return labels[labelContainerName]
}

// imageName is the image as the pod spec names it where the runtime keeps
// that, else the image the runtime reports.
func imageName(spec *runtimeapi.ImageSpec) string {
	if u := spec.GetUserSpecifiedImage(); u != "" {
		return u
	}
	return spec.GetImage()
}

func containerState(s runtimeapi.ContainerState) cstate {
	switch s {
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return stateCreated
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return stateRunning
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return stateExited
	}
	return stateUnknown
}

func sandboxState(s runtimeapi.PodSandboxState) cstate {
	switch s {
	case runtimeapi.PodSandboxState_SANDBOX_READY:
		return stateRunning
	case runtimeapi.PodSandboxState_SANDBOX_NOTREADY:
		return stateExited
	}
	return stateUnknown
}

func eventState(t runtimeapi.ContainerEventType) cstate {
	switch t {
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		return stateRunning
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		return stateExited
	case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
		return stateGone
	}
	return stateCreated
}

// earliestValid is the earliest runtime timestamp taken at face value.
var earliestValid = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// maxClockSkew is how far in the future a runtime timestamp may lie.
const maxClockSkew = time.Minute

// validTime converts a CRI timestamp in nanoseconds to a time, or the zero
// time (unknown) if it is zero, negative or absurd: before 2000 or more than
// maxClockSkew after now. containerd 2.x sends a large negative created_at
// on a sandbox's DELETED event.
func validTime(ns int64, now time.Time) time.Time {
	if ns <= 0 {
		return time.Time{}
	}
	t := time.Unix(0, ns).UTC()
	if t.Before(earliestValid) || t.After(now.Add(maxClockSkew)) {
		return time.Time{}
	}
	return t
}
