package generatortest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/taskevent"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// FakeRuntime implements generator.Runtime directly over a crisim.Runtime
// model. Tests drive the model (Model) to create, start, stop and remove
// containers; the fake returns copies, really implements the event stream,
// and can fail the next call to a method or end open streams with a status.
// Safe for concurrent use.
type FakeRuntime struct {
	model *crisim.Runtime

	mu      sync.Mutex
	failing map[string][]error              // guarded by mu; queued failures per method
	streams map[int]context.CancelCauseFunc // guarded by mu; open WatchEvents calls
	nextID  int                             // guarded by mu
	hang    chan struct{}                   // guarded by mu; non-nil: list calls block on it
	opened  chan struct{}                   // one signal per WatchEvents call that subscribed
	muted   bool                            // guarded by mu; streams stay open but deliver nothing
	calls   map[string][]string             // guarded by mu; the sandbox filter of each list call
	latency map[string]time.Duration        // guarded by mu; how long each call of a method takes
	// taskStreams counts the open WatchTaskEvents calls, which are in
	// streams too.
	taskStreams int // guarded by mu
}

// streamOpenedBuffer bounds the stream openings a test has not waited for
// yet; more are not signalled.
const streamOpenedBuffer = 64

var (
	_ generator.Runtime         = (*FakeRuntime)(nil)
	_ generator.TaskEventSource = (*FakeRuntime)(nil)
)

// NewFakeRuntime returns a fake over a new model with opts.
func NewFakeRuntime(opts crisim.Options) *FakeRuntime {
	return &FakeRuntime{model: crisim.NewRuntime(opts), failing: map[string][]error{}, streams: map[int]context.CancelCauseFunc{},
		opened: make(chan struct{}, streamOpenedBuffer), calls: map[string][]string{}, latency: map[string]time.Duration{}}
}

// Model is the in-memory runtime the test drives.
func (f *FakeRuntime) Model() *crisim.Runtime { return f.model }

// FailNext makes the next call to method (e.g. "ListContainers",
// "ContainerStatus", "WatchEvents") fail with err. Calls queue.
func (f *FakeRuntime) FailNext(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing[method] = append(f.failing[method], err)
}

// SetLatency makes every later call to method (e.g. "ListContainers",
// "ContainerStatus") take d before it is answered, or until its ctx ends,
// as a runtime on a saturated CPU does; 0 removes the delay. The call reads
// the model after the wait, so it sees what changed meanwhile. Inside a
// synctest bubble the wait is virtual.
func (f *FakeRuntime) SetLatency(method string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d <= 0 {
		delete(f.latency, method)
		return
	}
	f.latency[method] = d
}

// EndStreams ends every open WatchEvents and WatchTaskEvents call with a
// gRPC status of code, as a runtime that restarts does. It returns how many
// it ended.
func (f *FakeRuntime) EndStreams(code codes.Code) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cancel := range f.streams {
		cancel(status.Error(code, "stream ended by FakeRuntime"))
	}
	return len(f.streams)
}

// OpenTaskStreams returns how many WatchTaskEvents calls are open.
func (f *FakeRuntime) OpenTaskStreams() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.taskStreams
}

// OpenStreams returns how many WatchEvents calls are open.
func (f *FakeRuntime) OpenStreams() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.streams) - f.taskStreams
}

// StreamOpened receives once for every WatchEvents call that subscribed to
// the model, in order: a test waits on it for the generator to (re)connect.
func (f *FakeRuntime) StreamOpened() <-chan struct{} { return f.opened }

// Mute makes open and future streams deliver nothing while staying
// connected, as a runtime whose event stream silently broke; Unmute ends it.
func (f *FakeRuntime) Mute() { f.setMuted(true) }

// Unmute lets streams deliver events again.
func (f *FakeRuntime) Unmute() { f.setMuted(false) }

func (f *FakeRuntime) setMuted(m bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.muted = m
}

// Hang makes list calls block until Unhang or their ctx ends, as a runtime
// that stops answering.
func (f *FakeRuntime) Hang() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hang == nil {
		f.hang = make(chan struct{})
	}
}

// Unhang releases the calls blocked by Hang.
func (f *FakeRuntime) Unhang() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hang != nil {
		close(f.hang)
		f.hang = nil
	}
}

// ListCalls returns, for each call made so far to method ("ListPodSandbox"
// or "ListContainers"), the sandbox ID it filtered on, "" for a call that
// listed everything: a test tells full relists from targeted ones by it.
func (f *FakeRuntime) ListCalls(method string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls[method])
}

func (f *FakeRuntime) recordList(method, sandboxID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method] = append(f.calls[method], sandboxID)
}

func (f *FakeRuntime) enter(ctx context.Context, method string) error {
	f.mu.Lock()
	hang, delay := f.hang, f.latency[method]
	var err error
	if q := f.failing[method]; len(q) > 0 {
		err, f.failing[method] = q[0], q[1:]
	}
	f.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	if err != nil {
		return err
	}
	if hang != nil && method != "WatchEvents" {
		select {
		case <-hang:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return nil
}

// Version implements generator.Runtime.
func (f *FakeRuntime) Version(ctx context.Context) (*runtimeapi.VersionResponse, error) {
	if err := f.enter(ctx, "Version"); err != nil {
		return nil, err
	}
	return f.model.Version(), nil
}

// ListPodSandbox implements generator.Runtime.
func (f *FakeRuntime) ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	f.recordList("ListPodSandbox", filter.GetId())
	if err := f.enter(ctx, "ListPodSandbox"); err != nil {
		return nil, err
	}
	return f.model.ListPodSandbox(filter), nil
}

// ListContainers implements generator.Runtime. A call filtering on a
// container ID is recorded as "id=<ID>".
func (f *FakeRuntime) ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	if filter.GetId() != "" {
		f.recordList("ListContainers", "id="+filter.GetId())
	} else {
		f.recordList("ListContainers", filter.GetPodSandboxId())
	}
	if err := f.enter(ctx, "ListContainers"); err != nil {
		return nil, err
	}
	return f.model.ListContainers(filter), nil
}

// ContainerStatus implements generator.Runtime.
func (f *FakeRuntime) ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	if err := f.enter(ctx, "ContainerStatus"); err != nil {
		return nil, err
	}
	return f.model.ContainerStatus(id)
}

// openStream registers an open stream (a containerd event subscription if
// task), which EndStreams can end through the returned context; done
// unregisters it.
func (f *FakeRuntime) openStream(ctx context.Context, task bool) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	f.mu.Lock()
	id := f.nextID
	f.nextID++
	f.streams[id] = cancel
	if task {
		f.taskStreams++
	}
	f.mu.Unlock()
	return ctx, func() {
		cancel(nil)
		f.mu.Lock()
		delete(f.streams, id)
		if task {
			f.taskStreams--
		}
		f.mu.Unlock()
	}
}

// signalOpened tells StreamOpened's reader that a stream subscribed.
func (f *FakeRuntime) signalOpened() {
	select {
	case f.opened <- struct{}{}:
	default:
	}
}

// WatchEvents implements generator.Runtime over a model subscription.
func (f *FakeRuntime) WatchEvents(ctx context.Context, fn func(*runtimeapi.ContainerEventResponse)) error {
	if err := f.enter(ctx, "WatchEvents"); err != nil {
		return err
	}
	ctx, done := f.openStream(ctx, false)
	defer done()
	sub := f.model.Subscribe(ctx)
	f.signalOpened()
	for ev := range sub.Events() {
		f.mu.Lock()
		muted := f.muted
		f.mu.Unlock()
		if !muted {
			fn(ev)
		}
	}
	err := sub.Err()
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return err
	}
	if err == nil {
		err = context.Cause(ctx)
	}
	return fmt.Errorf("watch events: %w", status.Error(codes.Unavailable, fmt.Sprint(err)))
}

// WatchTaskEvents implements generator.TaskEventSource over the model's
// containerd events, with the filters the CRI client sends: the k8s.io
// namespace and the trigger's topics. Mute silences it too.
func (f *FakeRuntime) WatchTaskEvents(ctx context.Context, fn func(generator.TaskEvent, error)) error {
	if err := f.enter(ctx, "WatchTaskEvents"); err != nil {
		return err
	}
	ctx, done := f.openStream(ctx, true)
	defer done()
	sub := f.model.SubscribeTasks(ctx)
	f.signalOpened()
	for env := range sub.Events() {
		switch env.GetTopic() {
		case generator.TopicTaskStart, generator.TopicTaskExit, generator.TopicTaskDelete, generator.TopicContainerDelete, generator.TopicTaskOOM:
		default:
			continue
		}
		if env.GetNamespace() != crisim.K8sNamespace {
			continue
		}
		f.mu.Lock()
		muted := f.muted
		f.mu.Unlock()
		if !muted {
			fn(taskevent.Decode(env))
		}
	}
	err := sub.Err()
	if err == nil {
		err = context.Cause(ctx)
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return err
	}
	return fmt.Errorf("watch task events: %w", status.Error(codes.Unavailable, fmt.Sprint(err)))
}
