package crisim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	containerdtypes "github.com/containerd/containerd/api/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerd's own event service.
//
// containerd serves its API on the CRI socket too, and its event service
// (containerd.services.events.v1.Events) is an exchange: every subscriber
// gets its own queue, on 1.7 as on 2.x, and nothing is kept for a
// subscriber that is not there yet. The model publishes, for the CRI
// plugin's namespace k8s.io, the envelopes containerd does for what it does:
// /containers/create when a container or sandbox is created, /tasks/start
// when it starts, /tasks/exit (after /tasks/oom for an OOM kill) and then
// /tasks/delete when it stops, and /containers/delete when it is removed,
// each naming the CRI ID. A task exit carries the exit status and time
// the container's CRI status shows (none is published for a container
// stopped with reason Unknown: containerd's CRI plugin says that of a task
// it lost); Runtime.ExitTask publishes one ahead
// of the CRI status, as containerd's shim does.

// K8sNamespace is the containerd namespace of the CRI plugin.
const K8sNamespace = "k8s.io"

// containerd's topics the model publishes.
const (
	TopicContainerCreate = "/containers/create"
	TopicTaskStart       = "/tasks/start"
	TopicTaskExit        = "/tasks/exit"
	TopicTaskOOM         = "/tasks/oom"
	TopicTaskDelete      = "/tasks/delete"
	TopicContainerDelete = "/containers/delete"
)

// TaskSubscription is one listener on the Runtime's containerd events.
type TaskSubscription struct {
	stream[*containerdtypes.Envelope]
}

// SubscribeTasks starts a subscription to the containerd envelopes published
// from now on (containerd keeps none for later subscribers). Like
// Subscribe, it ends when ctx is done or when an envelope finds its buffer
// full (ErrSlowSubscriber); it never takes an event from another subscriber.
func (r *Runtime) SubscribeTasks(ctx context.Context) *TaskSubscription {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &TaskSubscription{stream[*containerdtypes.Envelope]{events: make(chan *containerdtypes.Envelope, r.opts.EventBuffer)}}
	r.taskSubs = append(r.taskSubs, s)
	s.stop = context.AfterFunc(ctx, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.endTaskSubscriptionLocked(s, context.Cause(ctx))
	})
	return s
}

func (r *Runtime) endTaskSubscriptionLocked(s *TaskSubscription, err error) {
	r.taskSubs = endLocked(r, r.taskSubs, s, err)
}

// InjectTaskEvent publishes one containerd event as given, without changing
// the model: an event the CRI state does not show yet (containerd publishes
// a task's exit before its CRI plugin updates the container's status), or
// one of another namespace. msg is the payload (a type from
// github.com/containerd/containerd/api/events).
func (r *Runtime) InjectTaskEvent(namespace, topic string, msg proto.Message) error {
	env, err := envelope(time.Now(), namespace, topic, msg)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.publishTaskLocked(env)
	return nil
}

// publishTasksLocked publishes the containerd envelopes that go with the
// CRI event ev.
func (r *Runtime) publishTasksLocked(ev *runtimeapi.ContainerEventResponse) {
	if len(r.taskSubs) == 0 {
		return
	}
	id := ev.GetContainerId()
	at := time.Unix(0, ev.GetCreatedAt())
	publish := func(topic string, msg proto.Message) {
		env, err := envelope(at, K8sNamespace, topic, msg)
		if err != nil {
			panic(err) // the model's own messages always marshal
		}
		r.publishTaskLocked(env)
	}
	switch ev.GetContainerEventType() {
	case runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT:
		publish(TopicContainerCreate, &eventtypes.ContainerCreate{ID: id})
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		publish(TopicTaskStart, &eventtypes.TaskStart{ContainerID: id, Pid: pidOf(id)})
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		var code int32
		var oom, lost bool
		exitedAt := at
		for _, st := range ev.GetContainersStatuses() {
			if st.GetId() == id {
				code = st.GetExitCode()
				oom = st.GetReason() == "OOMKilled"
				// containerd's CRI plugin says Unknown for a task it lost
				// (its shim gone): no exit was published for it.
				lost = st.GetReason() == "Unknown"
				exitedAt = time.Unix(0, st.GetFinishedAt())
			}
		}
		if c := r.containers[id]; lost || (c != nil && c.exitedAt != 0) {
			// ExitTask published the exit already (or none came);
			// containerd deletes the task once its CRI plugin handled it.
			if c != nil && c.exitedAt != 0 {
				exitedAt = time.Unix(0, c.exitedAt)
				c.exitedAt = 0
			}
		} else {
			r.publishExitLocked(exitedAt, id, code, oom)
		}
		publish(TopicTaskDelete, &eventtypes.TaskDelete{ContainerID: id, Pid: pidOf(id), ExitStatus: uint32(code), ExitedAt: timestamppb.New(exitedAt)})
	case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
		publish(TopicContainerDelete, &eventtypes.ContainerDelete{ID: id})
	}
}

// publishExitLocked publishes a container's task exit at at: /tasks/oom
// first if oom, as containerd's shim reports the kernel's OOM kill before
// the process's end.
func (r *Runtime) publishExitLocked(at time.Time, id string, code int32, oom bool) {
	publish := func(topic string, msg proto.Message) {
		env, err := envelope(at, K8sNamespace, topic, msg)
		if err != nil {
			panic(err) // the model's own messages always marshal
		}
		r.publishTaskLocked(env)
	}
	if oom {
		publish(TopicTaskOOM, &eventtypes.TaskOOM{ContainerID: id})
	}
	publish(TopicTaskExit, &eventtypes.TaskExit{ContainerID: id, ID: id, Pid: pidOf(id), ExitStatus: uint32(code), ExitedAt: timestamppb.New(at)})
}

// publishTaskLocked hands env to every task subscriber, ending those too
// slow for it.
func (r *Runtime) publishTaskLocked(env *containerdtypes.Envelope) {
	for _, s := range append([]*TaskSubscription(nil), r.taskSubs...) {
		select {
		case s.events <- env:
		default:
			r.endTaskSubscriptionLocked(s, ErrSlowSubscriber)
		}
	}
}

// envelope packs msg as containerd does: the payload's type URL is its
// full protobuf name.
func envelope(at time.Time, namespace, topic string, msg proto.Message) (*containerdtypes.Envelope, error) {
	b, err := proto.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("marshal %s: %w", topic, err)
	}
	return &containerdtypes.Envelope{
		Timestamp: timestamppb.New(at),
		Namespace: namespace,
		Topic:     topic,
		Event:     &anypb.Any{TypeUrl: string(msg.ProtoReflect().Descriptor().FullName()), Value: b},
	}, nil
}

// pidOf makes up a stable pid for a container ID.
func pidOf(id string) uint32 {
	var h uint32 = 2166136261
	for i := 0; i < len(id); i++ {
		h = (h ^ uint32(id[i])) * 16777619
	}
	return 1000 + h%30000
}

// taskFilter is one of Subscribe's filters: every term must match. The
// model understands containerd's equality terms on the fields the bridge
// uses (namespace, topic), with quoted or bare values; anything else is
// refused with InvalidArgument, rather than silently matching everything.
type taskFilter []struct{ field, value string }

func parseTaskFilters(filters []string) ([]taskFilter, error) {
	var out []taskFilter
	for _, f := range filters {
		var tf taskFilter
		for _, term := range strings.Split(f, ",") {
			field, value, ok := strings.Cut(strings.TrimSpace(term), "==")
			if !ok {
				return nil, fmt.Errorf("filter %q: term %q is not field==value (the simulated runtime supports no other)", f, term)
			}
			field = strings.TrimSpace(field)
			if field != "namespace" && field != "topic" {
				return nil, fmt.Errorf("filter %q: field %q not supported (namespace, topic)", f, field)
			}
			value = strings.TrimSpace(value)
			if strings.HasPrefix(value, `"`) {
				v, err := strconv.Unquote(value)
				if err != nil {
					return nil, fmt.Errorf("filter %q: value %s: %w", f, value, err)
				}
				value = v
			}
			tf = append(tf, struct{ field, value string }{field, value})
		}
		out = append(out, tf)
	}
	return out, nil
}

func matchTaskFilters(fs []taskFilter, env *containerdtypes.Envelope) bool {
	if len(fs) == 0 {
		return true
	}
	for _, f := range fs {
		ok := true
		for _, t := range f {
			v := env.GetTopic()
			if t.field == "namespace" {
				v = env.GetNamespace()
			}
			if v != t.value {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// eventsService is the gRPC face of the Runtime's containerd events for one
// Serve call: Subscribe only; Publish and Forward answer Unimplemented.
type eventsService struct {
	eventsapi.UnimplementedEventsServer
	srv     *Server
	serving *serving
}

func (svc *eventsService) Publish(context.Context, *eventsapi.PublishRequest) (*emptypb.Empty, error) {
	return nil, status.Error(codes.Unimplemented, "crisim: Publish is not served")
}

func (svc *eventsService) Forward(context.Context, *eventsapi.ForwardRequest) (*emptypb.Empty, error) {
	return nil, status.Error(codes.Unimplemented, "crisim: Forward is not served")
}

// Subscribe streams the envelopes matching the request's filters until the
// client goes away; DropStreams, the end of Serve and a subscriber too slow
// for its buffer end it with codes.Unavailable, as for GetContainerEvents.
func (svc *eventsService) Subscribe(req *eventsapi.SubscribeRequest, stream eventsapi.Events_SubscribeServer) error {
	filters, err := parseTaskFilters(req.GetFilters())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	st := &openStream{srv: svc.serving, cancel: cancel}
	if !svc.srv.addStream(st) {
		return status.Error(codes.Unavailable, errServerStopping.Error())
	}
	defer svc.srv.removeStream(st)

	sub := svc.srv.rt.SubscribeTasks(ctx)
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	for env := range sub.Events() {
		if !matchTaskFilters(filters, env) {
			continue
		}
		if err := stream.Send(env); err != nil {
			return err
		}
	}
	return streamEnd(stream.Context(), sub.Err())
}
