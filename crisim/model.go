package crisim

import (
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The labels the kubelet puts on every sandbox and container it creates. The
// bridge falls back to them when a sandbox is missing.
const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelContainerName = "io.kubernetes.container.name"
)

const (
	defaultRuntimeName    = "containerd"
	defaultRuntimeVersion = "v2.4.2"
	defaultNamespace      = "default"
	defaultContainerName  = "app"
	defaultImage          = "registry.example/app:1.0"
)

// Options configures a Runtime. The zero value behaves like containerd 2.x
// (every subscriber gets every event) with event replay disabled.
type Options struct {
	// RuntimeName and RuntimeVersion are reported by Version. Defaults:
	// "containerd" and "v2.4.2".
	RuntimeName    string
	RuntimeVersion string

	// OmitKubeletLabels leaves out the io.kubernetes.* labels the kubelet
	// sets, as on pods created directly through CRI (crictl, tests).
	OmitKubeletLabels bool

	// EventBuffer is the number of events buffered per subscriber; 0 means
	// 4096. See Subscribe for what happens when it fills up.
	EventBuffer int

	// SharedEventChannel makes every event go to one subscriber only, as
	// containerd 1.7 serves all GetContainerEvents callers from one shared
	// channel: a second subscriber steals events from the first. containerd
	// hands an event to whichever caller receives first; the model takes
	// the subscribers in turn, so tests are repeatable.
	SharedEventChannel bool

	// ReplayWhileDisconnected keeps the events emitted while nobody is
	// subscribed, for up to this long, and hands them to the next subscriber
	// (containerd 2.x keeps them for 5 minutes). 0 drops them.
	ReplayWhileDisconnected time.Duration

	// NilSandboxStatusOnSandboxDelete sends a sandbox's DELETED event without
	// a pod sandbox status, as containerd 1.7 does.
	NilSandboxStatusOnSandboxDelete bool

	// GarbageSandboxCreatedAtOnDelete puts a large negative created_at (the
	// zero time.Time in nanoseconds) in the sandbox status of a sandbox's
	// DELETED event, as containerd 2.4 does.
	GarbageSandboxCreatedAtOnDelete bool
}

// Containerd17Options returns Options that behave like containerd v1.7.35:
// one shared event channel and no sandbox status on a sandbox's DELETED event.
func Containerd17Options() Options {
	return Options{
		RuntimeVersion:                  "v1.7.35",
		SharedEventChannel:              true,
		NilSandboxStatusOnSandboxDelete: true,
	}
}

// Containerd24Options returns Options that behave like containerd v2.4.2:
// events fan out to every subscriber, are replayed for 5 minutes to the next
// subscriber when nobody listens, and a sandbox's DELETED event carries a
// garbage created_at.
func Containerd24Options() Options {
	return Options{
		RuntimeVersion:                  "v2.4.2",
		ReplayWhileDisconnected:         5 * time.Minute,
		GarbageSandboxCreatedAtOnDelete: true,
	}
}

// PodConfig describes a pod sandbox to run. Empty fields get defaults: Name
// "pod-<n>", Namespace "default", UID a random UUID.
type PodConfig struct {
	Name        string
	Namespace   string
	UID         string
	Attempt     uint32
	Labels      map[string]string
	Annotations map[string]string
}

// ContainerConfig describes a container to create. Empty fields get
// defaults: Name "app", Image "registry.example/app:1.0", ImageRef the
// image's fake digest "sha256:<hex>".
type ContainerConfig struct {
	Name        string
	Attempt     uint32
	Image       string
	ImageRef    string
	Labels      map[string]string
	Annotations map[string]string
}

// Stats counts what a Runtime holds and has done since NewRuntime.
type Stats struct {
	Sandboxes  int // sandboxes held now
	Containers int // containers held now

	SandboxesCreated  int // by RunPodSandbox and Populate
	ContainersCreated int // by CreateContainer and Populate

	Events          int // events emitted, InjectEvent included
	Undelivered     int // events emitted while nobody listened and not kept for replay
	Subscribers     int // current subscriptions
	TaskSubscribers int // current subscriptions to containerd's events
	SlowSubscribers int // subscriptions ended because their buffer was full
}

// Runtime is the in-memory model of a node's container runtime: pod
// sandboxes, containers and the CRI container event stream. Its operations
// follow containerd's CRI plugin, including the events they emit (see the
// recordings in testdata/cri-events), and take their timestamps from
// time.Now in nanoseconds, so a Runtime runs on synctest's virtual clock.
//
// Every method is safe for concurrent use. Read methods return deep copies:
// callers may change what they get. Errors are gRPC status errors
// (codes.NotFound for an unknown id, codes.FailedPrecondition for an
// operation the object's state does not allow) that name the id at fault.
type Runtime struct {
	opts Options

	// Stored protos, and everything they point to (metadata, image, the
	// label and annotation maps), are never changed in place once stored:
	// an operation replaces a record's proto with a changed shallow copy
	// (see the copy functions in copy.go), which shares what did not
	// change. Only Populate and PopulateKubelet change a record they have
	// just made, before anything could see it. So a record's protos and
	// maps can be shared: a container's Container and ContainerStatus share
	// their labels, and the events the Runtime emits point to the statuses
	// that were current then (see eventLocked). What a caller gets is a
	// deep copy, except on a shared subscription (see subscribeShared).
	mu         sync.RWMutex
	seq        uint64                        // creation order; guarded by mu
	sandboxes  map[string]*sandboxRecord     // guarded by mu
	containers map[string]*containerRecord   // guarded by mu
	byPod      map[string][]*containerRecord // by sandbox id, orphans included, in creation order; guarded by mu
	names      map[string]string             // reserved name -> id, as containerd reserves them; guarded by mu
	subs       []*Subscription               // guarded by mu
	emitting   []*Subscription               // emitLocked's copy of subs, kept to spare an allocation; guarded by mu
	taskSubs   []*TaskSubscription           // containerd event subscribers; guarded by mu
	nextShared int                           // round robin for SharedEventChannel; guarded by mu
	backlog    []replayEvent                 // guarded by mu
	populated  int                           // pods made by Populate; guarded by mu
	stats      Stats                         // guarded by mu
}

type sandboxRecord struct {
	seq     uint64
	sb      *runtimeapi.PodSandbox
	status  *runtimeapi.PodSandboxStatus
	nameKey string // empty for injected sandboxes
}

type containerRecord struct {
	seq     uint64
	ctr     *runtimeapi.Container
	status  *runtimeapi.ContainerStatus
	nameKey string // empty for injected containers
	// exitedAt is when ExitTask published the task's exit, in unix ns,
	// until the container's CRI status shows it (0: none published).
	exitedAt int64
}

// NewRuntime returns an empty Runtime.
func NewRuntime(opts Options) *Runtime {
	if opts.RuntimeName == "" {
		opts.RuntimeName = defaultRuntimeName
	}
	if opts.RuntimeVersion == "" {
		opts.RuntimeVersion = defaultRuntimeVersion
	}
	if opts.EventBuffer <= 0 {
		opts.EventBuffer = defaultEventBuffer
	}
	return &Runtime{
		opts:       opts,
		sandboxes:  make(map[string]*sandboxRecord),
		containers: make(map[string]*containerRecord),
		byPod:      make(map[string][]*containerRecord),
		names:      make(map[string]string),
	}
}

// RunPodSandbox creates a pod sandbox in state SANDBOX_READY and emits its
// CREATED and STARTED events (container id = sandbox id). It returns
// codes.AlreadyExists if a sandbox with the same name, namespace, UID and
// attempt exists.
func (r *Runtime) RunPodSandbox(cfg PodConfig) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now().UnixNano()
	sb, err := r.addSandboxLocked(cfg, now)
	if err != nil {
		return "", err
	}
	id := sb.sb.Id
	r.emitLocked(r.eventLocked(now, id, id, runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT))
	r.emitLocked(r.eventLocked(now, id, id, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT))
	return id, nil
}

// CreateContainer creates a container in state CONTAINER_CREATED in a ready
// sandbox and emits its CREATED event.
func (r *Runtime) CreateContainer(sandboxID string, cfg ContainerConfig) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now().UnixNano()
	c, err := r.addContainerLocked(sandboxID, cfg, now)
	if err != nil {
		return "", err
	}
	r.emitLocked(r.eventLocked(now, c.ctr.Id, sandboxID, runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT))
	return c.ctr.Id, nil
}

// StartContainer moves a created container to CONTAINER_RUNNING, sets its
// started_at and emits STARTED. It returns codes.FailedPrecondition if the
// container is not in the created state or its sandbox is not ready.
func (r *Runtime) StartContainer(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return notFound("container", id)
	}
	if sb, ok := r.sandboxes[c.ctr.PodSandboxId]; ok && sb.sb.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return status.Errorf(codes.FailedPrecondition, "start container %q: sandbox %q is not ready", id, sb.sb.Id)
	}
	if c.ctr.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		return status.Errorf(codes.FailedPrecondition, "start container %q: container is in state %s, not CONTAINER_CREATED", id, c.ctr.State)
	}
	now := time.Now().UnixNano()
	c.start(now)
	r.emitLocked(r.eventLocked(now, id, c.ctr.PodSandboxId, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT))
	return nil
}

// StopContainer moves a running container to CONTAINER_EXITED with the
// given exit code, reason and message, sets its finished_at and emits
// STOPPED. An empty reason becomes "Completed" for exit code 0 and "Error"
// otherwise, as containerd reports them. Like CRI's StopContainer it is
// idempotent: a container that is not running is left alone, without error
// or event.
func (r *Runtime) StopContainer(id string, exitCode int32, reason, message string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return notFound("container", id)
	}
	if c.ctr.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil
	}
	now := time.Now().UnixNano()
	finished := now
	if c.exitedAt != 0 {
		finished = c.exitedAt // the exit ExitTask published
	}
	c.exit(finished, exitCode, reason, message)
	r.emitLocked(r.eventLocked(now, id, c.ctr.PodSandboxId, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
	return nil
}

// ExitTask publishes containerd's task events of a running container's
// process ending with exitCode (/tasks/oom first if oom, then /tasks/exit,
// exited now), without changing its CRI state: containerd's shim
// publishes them before the CRI plugin updates the container's status,
// which is seconds later in a burst. A later StopContainer is that update:
// it takes this exit's time as finished_at and publishes no second exit.
// It returns the exit's time. A container that is not running, or whose
// exit was published already, is an error.
func (r *Runtime) ExitTask(id string, exitCode int32, oom bool) (time.Time, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return time.Time{}, notFound("container", id)
	}
	if c.ctr.State != runtimeapi.ContainerState_CONTAINER_RUNNING || c.exitedAt != 0 {
		return time.Time{}, fmt.Errorf("crisim: container %s: its task has exited already", id)
	}
	at := time.Now()
	c.exitedAt = at.UnixNano()
	r.publishExitLocked(at, id, exitCode, oom)
	return at, nil
}

// RemoveContainer removes a container and emits DELETED, with no container
// statuses as containerd sends it. A running container is killed first
// (exit code 137, STOPPED event), as CRI requires.
func (r *Runtime) RemoveContainer(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return notFound("container", id)
	}
	r.removeContainerLocked(time.Now().UnixNano(), c)
	return nil
}

// StopPodSandbox kills the sandbox's running containers (exit code 137,
// reason "Error", a STOPPED event each), then moves the sandbox to
// SANDBOX_NOTREADY and emits its STOPPED event. Containers that never
// started stay created. Stopping a sandbox that is not ready does nothing.
func (r *Runtime) StopPodSandbox(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[id]
	if !ok {
		return notFound("pod sandbox", id)
	}
	r.stopSandboxLocked(time.Now().UnixNano(), sb)
	return nil
}

// RemovePodSandbox stops the sandbox if it is ready (see StopPodSandbox),
// removes its containers (a DELETED event each) and then the sandbox itself
// (DELETED).
func (r *Runtime) RemovePodSandbox(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[id]
	if !ok {
		return notFound("pod sandbox", id)
	}
	now := time.Now().UnixNano()
	r.stopSandboxLocked(now, sb)
	for _, c := range r.podContainersLocked(id) {
		r.removeContainerLocked(now, c)
	}
	ev := r.eventLocked(now, id, id, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
	switch {
	case r.opts.NilSandboxStatusOnSandboxDelete:
		ev.PodSandboxStatus = nil
	case r.opts.GarbageSandboxCreatedAtOnDelete && ev.PodSandboxStatus != nil:
		// What containerd 2.4 sends: the sandbox's creation time is already
		// forgotten, and the zero time.Time converts to this negative number.
		// The status is the stored one: change a copy.
		ev.PodSandboxStatus = copySandboxStatus(ev.PodSandboxStatus)
		ev.PodSandboxStatus.CreatedAt = time.Time{}.UnixNano()
	}
	delete(r.sandboxes, id)
	delete(r.names, sb.nameKey)
	r.emitLocked(ev)
	return nil
}

// Populate adds pods sandboxes, named "pod-<n>" in namespace "default",
// each with containersPerPod running containers, without emitting any event.
// It builds large nodes quickly: 30,000 containers take about 0.3s.
func (r *Runtime) Populate(pods, containersPerPod int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now().UnixNano()
	for range pods {
		r.populated++
		sb, err := r.addSandboxLocked(PodConfig{Name: fmt.Sprintf("pod-%d", r.populated)}, now)
		if err != nil {
			return fmt.Errorf("populate: %w", err)
		}
		for i := range containersPerPod {
			c, err := r.addContainerLocked(sb.sb.Id, ContainerConfig{Name: containerName(i)}, now)
			if err != nil {
				return fmt.Errorf("populate: %w", err)
			}
			// Nobody has seen this record yet: change it in place rather
			// than copy it (start does), which halves the time for a big node.
			c.ctr.State = runtimeapi.ContainerState_CONTAINER_RUNNING
			c.status.State = runtimeapi.ContainerState_CONTAINER_RUNNING
			c.status.StartedAt = now
		}
	}
	return nil
}

// InjectSandbox stores a copy of sb exactly as given, for tests of malformed
// runtime data (nil metadata, no labels, a zero created_at). Its status is
// derived from it. It replaces a sandbox with the same id and emits no event.
func (r *Runtime) InjectSandbox(sb *runtimeapi.PodSandbox) error {
	if sb == nil {
		return status.Error(codes.InvalidArgument, "inject sandbox: nil sandbox")
	}
	sb = proto.CloneOf(sb)
	st := &runtimeapi.PodSandboxStatus{
		Id:             sb.Id,
		Metadata:       sb.Metadata,
		State:          sb.State,
		CreatedAt:      sb.CreatedAt,
		Labels:         sb.Labels,
		Annotations:    sb.Annotations,
		RuntimeHandler: sb.RuntimeHandler,
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.sandboxes[sb.Id]; ok {
		delete(r.names, old.nameKey)
	}
	r.seq++
	r.sandboxes[sb.Id] = &sandboxRecord{seq: r.seq, sb: sb, status: proto.CloneOf(st)}
	return nil
}

// InjectContainer stores copies of c and st exactly as given, for tests of
// malformed runtime data: no labels, nil metadata, an orphan whose
// PodSandboxId names no sandbox. A nil st is derived from c. It replaces a
// container with the same id and emits no event.
func (r *Runtime) InjectContainer(c *runtimeapi.Container, st *runtimeapi.ContainerStatus) error {
	if c == nil {
		return status.Error(codes.InvalidArgument, "inject container: nil container")
	}
	c = proto.CloneOf(c)
	if st == nil {
		st = &runtimeapi.ContainerStatus{
			Id:          c.Id,
			Metadata:    c.Metadata,
			State:       c.State,
			CreatedAt:   c.CreatedAt,
			Image:       c.Image,
			ImageRef:    c.ImageRef,
			Labels:      c.Labels,
			Annotations: c.Annotations,
			ImageId:     c.ImageId,
		}
	}
	st = proto.CloneOf(st)
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.containers[c.Id]; ok {
		r.forgetContainerLocked(old)
	}
	r.seq++
	r.storeContainerLocked(&containerRecord{seq: r.seq, ctr: c, status: st})
	return nil
}

// InjectEvent sends a copy of ev to the subscribers as if the runtime had
// emitted it, for tests of malformed or stale stream events. The model's
// state does not change.
func (r *Runtime) InjectEvent(ev *runtimeapi.ContainerEventResponse) {
	ev = proto.CloneOf(ev)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.emitLocked(ev)
}

// ListPodSandbox returns copies of the sandboxes matching filter (nil: all)
// in creation order. It honours the filter's id, state and label selector.
func (r *Runtime) ListPodSandbox(filter *runtimeapi.PodSandboxFilter) []*runtimeapi.PodSandbox {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var recs []*sandboxRecord
	if id := filter.GetId(); id != "" {
		if sb, ok := r.sandboxes[id]; ok {
			recs = append(recs, sb)
		}
	} else {
		recs = make([]*sandboxRecord, 0, len(r.sandboxes))
		for _, sb := range r.sandboxes {
			recs = append(recs, sb)
		}
	}

	recs = slices.DeleteFunc(recs, func(sb *sandboxRecord) bool {
		if s := filter.GetState(); s != nil && sb.sb.State != s.State {
			return true
		}
		return !matchLabels(sb.sb.Labels, filter.GetLabelSelector())
	})
	slices.SortFunc(recs, func(a, b *sandboxRecord) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]*runtimeapi.PodSandbox, len(recs))
	for i, sb := range recs {
		out[i] = proto.CloneOf(sb.sb)
	}
	return out
}

// ListContainers returns copies of the containers matching filter (nil: all)
// in creation order. It honours the filter's id, state, pod sandbox id and
// label selector, and takes time linear in the number of containers.
func (r *Runtime) ListContainers(filter *runtimeapi.ContainerFilter) []*runtimeapi.Container {
	// Records change in place under the write lock: filter and copy them
	// under the read lock.
	r.mu.RLock()
	defer r.mu.RUnlock()
	var recs []*containerRecord
	switch {
	case filter.GetId() != "":
		if c, ok := r.containers[filter.GetId()]; ok {
			recs = append(recs, c)
		}
	case filter.GetPodSandboxId() != "":
		recs = slices.Clone(r.byPod[filter.GetPodSandboxId()]) // a copy: filtered below
	default:
		recs = make([]*containerRecord, 0, len(r.containers))
		for _, c := range r.containers {
			recs = append(recs, c)
		}
	}

	recs = slices.DeleteFunc(recs, func(c *containerRecord) bool {
		if id := filter.GetPodSandboxId(); id != "" && c.ctr.PodSandboxId != id {
			return true
		}
		if s := filter.GetState(); s != nil && c.ctr.State != s.State {
			return true
		}
		return !matchLabels(c.ctr.Labels, filter.GetLabelSelector())
	})
	slices.SortFunc(recs, func(a, b *containerRecord) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]*runtimeapi.Container, len(recs))
	for i, c := range recs {
		out[i] = proto.CloneOf(c.ctr)
	}
	return out
}

// PodSandboxStatus returns a copy of the sandbox's status with the statuses
// of its containers and the time of the answer, as containerd 2.x fills the
// response. It returns codes.NotFound for an unknown id.
func (r *Runtime) PodSandboxStatus(id string) (*runtimeapi.PodSandboxStatusResponse, error) {
	r.mu.RLock()
	defer r.mu.RUnlock() // records change in place: copy them under the lock
	sb, ok := r.sandboxes[id]
	var ctrs []*containerRecord
	if ok {
		ctrs = r.podContainersLocked(id)
	}
	if !ok {
		return nil, notFound("pod sandbox", id)
	}
	resp := &runtimeapi.PodSandboxStatusResponse{
		Status:    proto.CloneOf(sb.status),
		Timestamp: time.Now().UnixNano(),
	}
	for _, c := range ctrs {
		resp.ContainersStatuses = append(resp.ContainersStatuses, proto.CloneOf(c.status))
	}
	return resp, nil
}

// ContainerStatus returns a copy of the container's status. It returns
// codes.NotFound for an unknown id.
func (r *Runtime) ContainerStatus(id string) (*runtimeapi.ContainerStatus, error) {
	r.mu.RLock()
	defer r.mu.RUnlock() // records change in place: copy them under the lock
	c, ok := r.containers[id]
	if !ok {
		return nil, notFound("container", id)
	}
	return proto.CloneOf(c.status), nil
}

// Version returns the runtime's name and version from Options, and CRI API
// version "v1".
func (r *Runtime) Version() *runtimeapi.VersionResponse {
	return &runtimeapi.VersionResponse{
		Version:           "0.1.0",
		RuntimeName:       r.opts.RuntimeName,
		RuntimeVersion:    r.opts.RuntimeVersion,
		RuntimeApiVersion: "v1",
	}
}

// Status reports the runtime and its network as ready.
func (r *Runtime) Status() *runtimeapi.StatusResponse {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}}
}

// Stats returns the current counts.
func (r *Runtime) Stats() Stats {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s := r.stats
	s.Sandboxes = len(r.sandboxes)
	s.Containers = len(r.containers)
	s.Subscribers = len(r.subs)
	s.TaskSubscribers = len(r.taskSubs)
	return s
}

func (r *Runtime) addSandboxLocked(cfg PodConfig, now int64) (*sandboxRecord, error) {
	r.seq++
	if cfg.Name == "" {
		cfg.Name = fmt.Sprintf("pod-%d", r.seq)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = defaultNamespace
	}
	if cfg.UID == "" {
		cfg.UID = newUID()
	}
	key := fmt.Sprintf("%s_%s_%s_%d", cfg.Name, cfg.Namespace, cfg.UID, cfg.Attempt)
	if other, ok := r.names[key]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "run pod sandbox %s/%s: name %q is reserved for sandbox %q", cfg.Namespace, cfg.Name, key, other)
	}
	labels := maps.Clone(cfg.Labels)
	if !r.opts.OmitKubeletLabels {
		labels = withLabels(labels, labelPodName, cfg.Name, labelPodNamespace, cfg.Namespace, labelPodUID, cfg.UID)
	}
	annotations := maps.Clone(cfg.Annotations)
	id := newID()
	meta := &runtimeapi.PodSandboxMetadata{Name: cfg.Name, Uid: cfg.UID, Namespace: cfg.Namespace, Attempt: cfg.Attempt}
	sb := &sandboxRecord{
		seq: r.seq,
		sb: &runtimeapi.PodSandbox{
			Id:          id,
			Metadata:    meta,
			State:       runtimeapi.PodSandboxState_SANDBOX_READY,
			CreatedAt:   now,
			Labels:      labels,
			Annotations: annotations,
		},
		status: &runtimeapi.PodSandboxStatus{
			Id:          id,
			Metadata:    meta,
			State:       runtimeapi.PodSandboxState_SANDBOX_READY,
			CreatedAt:   now,
			Network:     &runtimeapi.PodSandboxNetworkStatus{},
			Linux:       &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{}}},
			Labels:      labels,
			Annotations: annotations,
		},
		nameKey: key,
	}
	r.sandboxes[id] = sb
	r.names[key] = id
	r.stats.SandboxesCreated++
	return sb, nil
}

func (r *Runtime) addContainerLocked(sandboxID string, cfg ContainerConfig, now int64) (*containerRecord, error) {
	sb, ok := r.sandboxes[sandboxID]
	if !ok {
		return nil, notFound("pod sandbox", sandboxID)
	}
	if sb.sb.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, status.Errorf(codes.FailedPrecondition, "create container in sandbox %q: sandbox is not ready", sandboxID)
	}
	if cfg.Name == "" {
		cfg.Name = defaultContainerName
	}
	if cfg.Image == "" {
		cfg.Image = defaultImage
	}
	if cfg.ImageRef == "" {
		sum := sha256.Sum256([]byte(cfg.Image))
		cfg.ImageRef = "sha256:" + hex.EncodeToString(sum[:])
	}
	key := fmt.Sprintf("%s/%s_%d", sandboxID, cfg.Name, cfg.Attempt)
	if other, ok := r.names[key]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "create container %q attempt %d in sandbox %q: name is reserved for container %q", cfg.Name, cfg.Attempt, sandboxID, other)
	}
	labels := maps.Clone(cfg.Labels)
	pod := sb.sb.GetMetadata()
	if !r.opts.OmitKubeletLabels {
		labels = withLabels(labels, labelContainerName, cfg.Name,
			labelPodName, pod.GetName(), labelPodNamespace, pod.GetNamespace(), labelPodUID, pod.GetUid())
	}
	annotations := maps.Clone(cfg.Annotations)
	id := newID()
	meta := &runtimeapi.ContainerMetadata{Name: cfg.Name, Attempt: cfg.Attempt}
	image := &runtimeapi.ImageSpec{Image: cfg.Image, UserSpecifiedImage: cfg.Image}
	r.seq++
	c := &containerRecord{
		seq: r.seq,
		ctr: &runtimeapi.Container{
			Id:           id,
			PodSandboxId: sandboxID,
			Metadata:     meta,
			Image:        image,
			ImageRef:     cfg.ImageRef,
			State:        runtimeapi.ContainerState_CONTAINER_CREATED,
			CreatedAt:    now,
			Labels:       labels,
			Annotations:  annotations,
			ImageId:      cfg.ImageRef,
		},
		status: &runtimeapi.ContainerStatus{
			Id:          id,
			Metadata:    meta,
			State:       runtimeapi.ContainerState_CONTAINER_CREATED,
			CreatedAt:   now,
			Image:       image,
			ImageRef:    cfg.ImageRef,
			Labels:      labels,
			Annotations: annotations,
			LogPath:     fmt.Sprintf("/var/log/pods/%s_%s_%s/%s/%d.log", pod.GetNamespace(), pod.GetName(), pod.GetUid(), cfg.Name, cfg.Attempt),
			ImageId:     cfg.ImageRef,
		},
		nameKey: key,
	}
	r.storeContainerLocked(c)
	r.names[key] = id
	r.stats.ContainersCreated++
	return c, nil
}

// storeContainerLocked adds c, which is newer than every container held
// (c.seq is the largest), so byPod stays in creation order.
func (r *Runtime) storeContainerLocked(c *containerRecord) {
	r.containers[c.ctr.Id] = c
	r.byPod[c.ctr.PodSandboxId] = append(r.byPod[c.ctr.PodSandboxId], c)
}

func (r *Runtime) forgetContainerLocked(c *containerRecord) {
	delete(r.containers, c.ctr.Id)
	delete(r.names, c.nameKey)
	pod := slices.DeleteFunc(r.byPod[c.ctr.PodSandboxId], func(x *containerRecord) bool { return x == c })
	if len(pod) == 0 {
		delete(r.byPod, c.ctr.PodSandboxId)
		return
	}
	r.byPod[c.ctr.PodSandboxId] = pod
}

func (r *Runtime) removeContainerLocked(now int64, c *containerRecord) {
	id, podID := c.ctr.Id, c.ctr.PodSandboxId
	if c.ctr.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
		c.exit(now, exitKilled, "", "")
		r.emitLocked(r.eventLocked(now, id, podID, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
	}
	r.forgetContainerLocked(c)
	r.emitLocked(r.eventLocked(now, id, podID, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT))
}

func (r *Runtime) stopSandboxLocked(now int64, sb *sandboxRecord) {
	if sb.sb.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return
	}
	id := sb.sb.Id
	for _, c := range r.podContainersLocked(id) {
		if c.ctr.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			c.exit(now, exitKilled, "", "")
			r.emitLocked(r.eventLocked(now, c.ctr.Id, id, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
		}
	}
	sb.sb = copySandbox(sb.sb)
	sb.sb.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	sb.status = copySandboxStatus(sb.status)
	sb.status.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	r.emitLocked(r.eventLocked(now, id, id, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
}

// podContainersLocked returns the containers whose PodSandboxId is
// sandboxID, in creation order, in a slice of the caller's.
func (r *Runtime) podContainersLocked(sandboxID string) []*containerRecord {
	return slices.Clone(r.byPod[sandboxID])
}

// eventLocked builds an event the way containerd 2.x does: the pod sandbox
// status (nil if the sandbox is unknown) and the statuses of all the pod's
// current containers, none for a DELETED event. The statuses are the
// stored ones, not copies: they are never changed in place (see Runtime),
// so the event keeps showing the state at its time, and neither may the
// event's holders change them (see emitLocked).
func (r *Runtime) eventLocked(now int64, containerID, sandboxID string, typ runtimeapi.ContainerEventType) *runtimeapi.ContainerEventResponse {
	ev := &runtimeapi.ContainerEventResponse{
		ContainerId:        containerID,
		ContainerEventType: typ,
		CreatedAt:          now,
	}
	if sb, ok := r.sandboxes[sandboxID]; ok {
		ev.PodSandboxStatus = sb.status
	}
	if pod := r.byPod[sandboxID]; typ != runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT && len(pod) > 0 {
		ev.ContainersStatuses = make([]*runtimeapi.ContainerStatus, len(pod))
		for i, c := range pod {
			ev.ContainersStatuses[i] = c.status
		}
	}
	return ev
}

// exitKilled is the exit code of a container killed with SIGKILL (128+9),
// what containerd reports for containers it stops on a sandbox stop or a
// forced remove.
const exitKilled = 137

func (c *containerRecord) start(now int64) {
	c.ctr = copyContainer(c.ctr)
	c.ctr.State = runtimeapi.ContainerState_CONTAINER_RUNNING
	c.status = copyContainerStatus(c.status)
	c.status.State = runtimeapi.ContainerState_CONTAINER_RUNNING
	c.status.StartedAt = now
}

func (c *containerRecord) exit(now int64, code int32, reason, message string) {
	if reason == "" {
		reason = "Error"
		if code == 0 {
			reason = "Completed"
		}
	}
	c.ctr = copyContainer(c.ctr)
	c.ctr.State = runtimeapi.ContainerState_CONTAINER_EXITED
	c.status = copyContainerStatus(c.status)
	c.status.State = runtimeapi.ContainerState_CONTAINER_EXITED
	c.status.FinishedAt = now
	c.status.ExitCode = code
	c.status.Reason = reason
	c.status.Message = message
}

func matchLabels(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// withLabels returns labels with the given key-value pairs set.
func withLabels(labels map[string]string, kv ...string) map[string]string {
	if labels == nil {
		labels = make(map[string]string, len(kv)/2)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		labels[kv[i]] = kv[i+1]
	}
	return labels
}

func containerName(i int) string {
	if i == 0 {
		return defaultContainerName
	}
	return fmt.Sprintf("sidecar-%d", i)
}

func notFound(kind, id string) error {
	return status.Errorf(codes.NotFound, "%s %q not found", kind, id)
}

// newID returns a random 64-hex-digit id, the form containerd uses.
func newID() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b[:])
}

// newUID returns a random version 4 UUID, the form of Kubernetes UIDs.
func newUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return formatUUID(b)
}

func formatUUID(b [16]byte) string {
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
