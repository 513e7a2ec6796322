package crisim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// drain returns the events buffered in sub. The model delivers events while
// the operation runs, so after it returns they are all buffered.
func drain(sub *Subscription) []*runtimeapi.ContainerEventResponse {
	var out []*runtimeapi.ContainerEventResponse
	for {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				return out
			}
			out = append(out, ev)
		default:
			return out
		}
	}
}

// eventLine summarizes an event: who, what, the sandbox state and the
// state of each container in the payload.
func eventLine(names map[string]string, ev *runtimeapi.ContainerEventResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s sandbox=%s [", names[ev.ContainerId], ev.ContainerEventType, ev.GetPodSandboxStatus().GetState())
	for i, st := range ev.ContainersStatuses {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%s", names[st.Id], st.State)
	}
	b.WriteString("]")
	return b.String()
}

func mustCode(t *testing.T, err error, want codes.Code, id string) {
	t.Helper()
	if status.Code(err) != want {
		t.Fatalf("got error %v, want code %s", err, want)
	}
	if id != "" && !strings.Contains(err.Error(), id) {
		t.Errorf("error %q does not name %q", err, id)
	}
}

func TestLifecycleEmitsTheEventsContainerdDoes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(Options{})
		sub := rt.Subscribe(t.Context())
		start := time.Now().UnixNano()

		pod, err := Lifecycle(t.Context(), rt, LifecycleOptions{
			Pod:        PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1"},
			Containers: []ContainerConfig{{Name: "app"}, {Name: "sidecar"}},
			RunFor:     3 * time.Second,
			Exit:       Exit{Code: 3},
		})
		if err != nil {
			t.Fatalf("Lifecycle: %v", err)
		}
		evs := drain(sub)

		names := map[string]string{pod.SandboxID: "sandbox", pod.ContainerIDs[0]: "app", pod.ContainerIDs[1]: "sidecar"}
		var got []string
		for _, ev := range evs {
			got = append(got, eventLine(names, ev))
		}
		want := []string{
			"sandbox CONTAINER_CREATED_EVENT sandbox=SANDBOX_READY []",
			"sandbox CONTAINER_STARTED_EVENT sandbox=SANDBOX_READY []",
			"app CONTAINER_CREATED_EVENT sandbox=SANDBOX_READY [app:CONTAINER_CREATED]",
			"app CONTAINER_STARTED_EVENT sandbox=SANDBOX_READY [app:CONTAINER_RUNNING]",
			"sidecar CONTAINER_CREATED_EVENT sandbox=SANDBOX_READY [app:CONTAINER_RUNNING sidecar:CONTAINER_CREATED]",
			"sidecar CONTAINER_STARTED_EVENT sandbox=SANDBOX_READY [app:CONTAINER_RUNNING sidecar:CONTAINER_RUNNING]",
			"app CONTAINER_STOPPED_EVENT sandbox=SANDBOX_READY [app:CONTAINER_EXITED sidecar:CONTAINER_RUNNING]",
			"sidecar CONTAINER_STOPPED_EVENT sandbox=SANDBOX_READY [app:CONTAINER_EXITED sidecar:CONTAINER_EXITED]",
			"app CONTAINER_DELETED_EVENT sandbox=SANDBOX_READY []",
			"sidecar CONTAINER_DELETED_EVENT sandbox=SANDBOX_READY []",
			"sandbox CONTAINER_STOPPED_EVENT sandbox=SANDBOX_NOTREADY []",
			"sandbox CONTAINER_DELETED_EVENT sandbox=SANDBOX_NOTREADY []",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("events (-want +got):\n%s", diff)
		}

		// Timestamps are nanoseconds from time.Now; the containers ran 3s.
		end := start + (3 * time.Second).Nanoseconds()
		if evs[0].CreatedAt != start || evs[6].CreatedAt != end {
			t.Errorf("created_at = %d and %d, want %d and %d", evs[0].CreatedAt, evs[6].CreatedAt, start, end)
		}
		wantExited := &runtimeapi.ContainerStatus{
			Id:         pod.ContainerIDs[0],
			Metadata:   &runtimeapi.ContainerMetadata{Name: "app"},
			State:      runtimeapi.ContainerState_CONTAINER_EXITED,
			CreatedAt:  start,
			StartedAt:  start,
			FinishedAt: end,
			ExitCode:   3,
			Reason:     "Error",
		}
		ignore := protocmp.IgnoreFields(&runtimeapi.ContainerStatus{}, "image", "image_ref", "image_id", "labels", "log_path")
		if diff := cmp.Diff(wantExited, evs[6].ContainersStatuses[0], protocmp.Transform(), ignore); diff != "" {
			t.Errorf("status in STOPPED event (-want +got):\n%s", diff)
		}
		wantSandbox := &runtimeapi.PodSandboxStatus{
			Id:        pod.SandboxID,
			Metadata:  &runtimeapi.PodSandboxMetadata{Name: "web-0", Namespace: "shop", Uid: "uid-1"},
			State:     runtimeapi.PodSandboxState_SANDBOX_READY,
			CreatedAt: start,
			Labels: map[string]string{
				"io.kubernetes.pod.name": "web-0", "io.kubernetes.pod.namespace": "shop", "io.kubernetes.pod.uid": "uid-1",
			},
		}
		ignoreNet := protocmp.IgnoreFields(&runtimeapi.PodSandboxStatus{}, "network", "linux")
		if diff := cmp.Diff(wantSandbox, evs[0].PodSandboxStatus, protocmp.Transform(), ignoreNet); diff != "" {
			t.Errorf("sandbox status in CREATED event (-want +got):\n%s", diff)
		}
		if s := rt.Stats(); s.Sandboxes != 0 || s.Containers != 0 || s.Events != len(want) {
			t.Errorf("Stats() = %+v, want an empty runtime after %d events", s, len(want))
		}
	})
}

func TestContainerLabelsAndDefaults(t *testing.T) {
	t.Parallel()
	for _, omit := range []bool{false, true} {
		t.Run(fmt.Sprintf("kubelet labels omitted=%v", omit), func(t *testing.T) {
			t.Parallel()
			rt := NewRuntime(Options{OmitKubeletLabels: omit})
			sb, err := rt.RunPodSandbox(PodConfig{Name: "db-0", UID: "u-9", Labels: map[string]string{"team": "x"}})
			if err != nil {
				t.Fatal(err)
			}
			id, err := rt.CreateContainer(sb, ContainerConfig{Name: "pg", Image: "postgres:17", Labels: map[string]string{"tier": "db"}})
			if err != nil {
				t.Fatal(err)
			}
			ctrs := rt.ListContainers(&runtimeapi.ContainerFilter{Id: id})
			if len(ctrs) != 1 {
				t.Fatalf("listed %d containers, want 1", len(ctrs))
			}
			want := map[string]string{"tier": "db"}
			if !omit {
				want["io.kubernetes.container.name"] = "pg"
				want["io.kubernetes.pod.name"] = "db-0"
				want["io.kubernetes.pod.namespace"] = "default"
				want["io.kubernetes.pod.uid"] = "u-9"
			}
			if diff := cmp.Diff(want, ctrs[0].Labels); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}
			if got := ctrs[0].GetImage().GetImage(); got != "postgres:17" {
				t.Errorf("image = %q, want postgres:17", got)
			}
			if ref := ctrs[0].ImageRef; !strings.HasPrefix(ref, "sha256:") || len(ref) != len("sha256:")+64 {
				t.Errorf("image ref = %q, want a sha256 digest", ref)
			}
			if len(id) != 64 || strings.Trim(id, "0123456789abcdef") != "" {
				t.Errorf("container id %q is not 64 hex digits", id)
			}
		})
	}
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{OmitKubeletLabels: true})
	web, _ := rt.RunPodSandbox(PodConfig{Name: "web", Labels: map[string]string{"app": "web"}})
	job, _ := rt.RunPodSandbox(PodConfig{Name: "job"})
	names := map[string]string{}
	add := func(sb, name string, labels map[string]string, states ...func(string) error) {
		t.Helper()
		id, err := rt.CreateContainer(sb, ContainerConfig{Name: name, Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		names[id] = name
		for _, f := range states {
			if err := f(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop := func(id string) error { return rt.StopContainer(id, 0, "", "") }
	add(web, "a", map[string]string{"role": "main", "app": "web"}, rt.StartContainer)
	add(web, "b", map[string]string{"role": "side"})
	add(job, "c", map[string]string{"role": "main"}, rt.StartContainer, stop)
	if err := rt.StopPodSandbox(job); err != nil {
		t.Fatal(err)
	}
	var aID string
	for id, n := range names {
		if n == "a" {
			aID = id
		}
	}

	containerTests := []struct {
		name   string
		filter *runtimeapi.ContainerFilter
		want   []string
	}{
		{"a nil filter lists all in creation order", nil, []string{"a", "b", "c"}},
		{"an id selects one container", &runtimeapi.ContainerFilter{Id: aID}, []string{"a"}},
		{"an unknown id selects none", &runtimeapi.ContainerFilter{Id: "nope"}, nil},
		{"a state selects running containers", &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}, []string{"a"}},
		{"a state selects exited containers", &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_EXITED}}, []string{"c"}},
		{"a sandbox id selects its containers", &runtimeapi.ContainerFilter{PodSandboxId: web}, []string{"a", "b"}},
		{"a label selector ANDs its labels", &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"role": "main", "app": "web"}}, []string{"a"}},
		{"a label selector matches across pods", &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"role": "main"}}, []string{"a", "c"}},
		{"sandbox id and state combine", &runtimeapi.ContainerFilter{PodSandboxId: web, State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_CREATED}}, []string{"b"}},
		{"an id in another sandbox than the filter's selects none", &runtimeapi.ContainerFilter{Id: aID, PodSandboxId: job}, nil},
	}
	for _, tc := range containerTests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range rt.ListContainers(tc.filter) {
				got = append(got, names[c.Id])
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ListContainers (-want +got):\n%s", diff)
			}
		})
	}

	sandboxName := map[string]string{web: "web", job: "job"}
	sandboxTests := []struct {
		name   string
		filter *runtimeapi.PodSandboxFilter
		want   []string
	}{
		{"a nil filter lists all sandboxes", nil, []string{"web", "job"}},
		{"an id selects one sandbox", &runtimeapi.PodSandboxFilter{Id: job}, []string{"job"}},
		{"a state selects not ready sandboxes", &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY}}, []string{"job"}},
		{"a label selector selects labelled sandboxes", &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "web"}}, []string{"web"}},
		{"a label selector with a wrong value selects none", &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "db"}}, nil},
	}
	for _, tc := range sandboxTests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, sb := range rt.ListPodSandbox(tc.filter) {
				got = append(got, sandboxName[sb.Id])
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ListPodSandbox (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCallersGetCopies(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(Options{})
		sub1, sub2 := rt.Subscribe(t.Context()), rt.Subscribe(t.Context())
		sb, _ := rt.RunPodSandbox(PodConfig{Name: "p"})
		id, _ := rt.CreateContainer(sb, ContainerConfig{})

		for _, c := range rt.ListContainers(nil) {
			c.State = runtimeapi.ContainerState_CONTAINER_EXITED
			c.Labels["io.kubernetes.pod.name"] = "changed"
		}
		for _, s := range rt.ListPodSandbox(nil) {
			s.Metadata.Name = "changed"
		}
		st, _ := rt.ContainerStatus(id)
		st.ExitCode = 99
		ps, _ := rt.PodSandboxStatus(sb)
		ps.Status.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		ps.ContainersStatuses[0].Reason = "changed"
		for _, ev := range drain(sub1) {
			ev.PodSandboxStatus.Labels["io.kubernetes.pod.name"] = "changed"
			for _, cs := range ev.ContainersStatuses {
				cs.State = runtimeapi.ContainerState_CONTAINER_EXITED
			}
		}

		c := rt.ListContainers(nil)[0]
		if c.State != runtimeapi.ContainerState_CONTAINER_CREATED || c.Labels["io.kubernetes.pod.name"] != "p" {
			t.Errorf("listed container changed by a caller: state %s, labels %v", c.State, c.Labels)
		}
		if got := rt.ListPodSandbox(nil)[0].Metadata.Name; got != "p" {
			t.Errorf("sandbox name = %q, want p", got)
		}
		if st, _ := rt.ContainerStatus(id); st.ExitCode != 0 || st.Reason != "" {
			t.Errorf("container status changed by a caller: %v", st)
		}
		if ps, _ := rt.PodSandboxStatus(sb); ps.Status.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			t.Errorf("sandbox state = %s, want SANDBOX_READY", ps.Status.State)
		}
		evs := drain(sub2)
		if len(evs) != 3 {
			t.Fatalf("second subscriber got %d events, want 3", len(evs))
		}
		if got := evs[2].PodSandboxStatus.Labels["io.kubernetes.pod.name"]; got != "p" {
			t.Errorf("second subscriber sees label %q changed by the first", got)
		}
		if got := evs[2].ContainersStatuses[0].State; got != runtimeapi.ContainerState_CONTAINER_CREATED {
			t.Errorf("second subscriber sees state %s changed by the first", got)
		}
	})
}

func TestEventDistribution(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		shared bool
		// wantEach is the number of the 4 events each subscriber gets.
		wantEach int
	}{
		{"containerd 2.x fans every event out to every subscriber", false, 4},
		{"containerd 1.7 hands each event to one subscriber in turn", true, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				rt := NewRuntime(Options{SharedEventChannel: tc.shared})
				subs := []*Subscription{rt.Subscribe(t.Context()), rt.Subscribe(t.Context())}
				for _, name := range []string{"a", "b"} {
					if _, err := rt.RunPodSandbox(PodConfig{Name: name}); err != nil {
						t.Fatal(err)
					}
				}
				seen := map[string]int{}
				for i, sub := range subs {
					evs := drain(sub)
					if len(evs) != tc.wantEach {
						t.Errorf("subscriber %d got %d events, want %d", i, len(evs), tc.wantEach)
					}
					for _, ev := range evs {
						seen[ev.ContainerId+ev.ContainerEventType.String()]++
					}
				}
				if len(seen) != 4 {
					t.Errorf("subscribers saw %d distinct events, want all 4", len(seen))
				}
			})
		})
	}
}

func TestReplayWhileDisconnected(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		replay time.Duration
		wait   time.Duration
		want   int
	}{
		{"events emitted while nobody listens reach the next subscriber", 5 * time.Minute, 4 * time.Minute, 2},
		{"events older than the replay window are dropped", 5 * time.Minute, 6 * time.Minute, 0},
		{"without replay nobody gets them", 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				rt := NewRuntime(Options{ReplayWhileDisconnected: tc.replay})
				// A first subscriber that leaves: replay covers the gap after it.
				ctx, cancel := context.WithCancel(t.Context())
				_ = rt.Subscribe(ctx)
				cancel()
				synctest.Wait()

				if _, err := rt.RunPodSandbox(PodConfig{}); err != nil {
					t.Fatal(err)
				}
				<-time.After(tc.wait)
				sub := rt.Subscribe(t.Context())
				evs := drain(sub)
				if len(evs) != tc.want {
					t.Fatalf("new subscriber got %d events, want %d", len(evs), tc.want)
				}
				if tc.want > 0 && evs[0].ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT {
					t.Errorf("first replayed event is %s, want CONTAINER_CREATED_EVENT", evs[0].ContainerEventType)
				}
				// Replayed once only.
				if evs := drain(rt.Subscribe(t.Context())); len(evs) != 0 {
					t.Errorf("a later subscriber got %d replayed events, want 0", len(evs))
				}
			})
		})
	}
}

func TestSandboxDeletedEventQuirks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		opts          Options
		wantNil       bool
		wantCreatedAt func(real int64) int64
	}{
		{"by default the status is the sandbox's", Options{}, false, func(real int64) int64 { return real }},
		{"containerd 1.7 sends no sandbox status", Containerd17Options(), true, nil},
		{"containerd 2.4 sends a garbage created_at", Containerd24Options(), false, func(int64) int64 { return -6795364578871345152 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rt := NewRuntime(tc.opts)
			sub := rt.Subscribe(t.Context())
			sb, _ := rt.RunPodSandbox(PodConfig{})
			created := rt.ListPodSandbox(nil)[0].CreatedAt
			if err := rt.RemovePodSandbox(sb); err != nil {
				t.Fatal(err)
			}
			evs := drain(sub)
			last := evs[len(evs)-1]
			if last.ContainerId != sb || last.ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
				t.Fatalf("last event is %s for %s, want the sandbox's DELETED", last.ContainerEventType, last.ContainerId)
			}
			if tc.wantNil {
				if last.PodSandboxStatus != nil {
					t.Errorf("sandbox status = %v, want nil", last.PodSandboxStatus)
				}
				return
			}
			if got, want := last.GetPodSandboxStatus().GetCreatedAt(), tc.wantCreatedAt(created); got != want {
				t.Errorf("created_at = %d, want %d", got, want)
			}
			if got := last.GetPodSandboxStatus().GetState(); got != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
				t.Errorf("state = %s, want SANDBOX_NOTREADY", got)
			}
		})
	}
}

func TestSlowSubscriberIsDisconnected(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{EventBuffer: 2})
	sub := rt.Subscribe(t.Context())
	sb, _ := rt.RunPodSandbox(PodConfig{}) // 2 events fill the buffer
	if _, err := rt.CreateContainer(sb, ContainerConfig{}); err != nil {
		t.Fatalf("CreateContainer with a full subscriber: %v", err)
	}
	evs := drain(sub)
	if len(evs) != 2 {
		t.Errorf("got %d events before the disconnect, want 2", len(evs))
	}
	if _, open := <-sub.Events(); open {
		t.Error("events channel still open")
	}
	if !errors.Is(sub.Err(), ErrSlowSubscriber) {
		t.Errorf("Err() = %v, want ErrSlowSubscriber", sub.Err())
	}
	if s := rt.Stats(); s.SlowSubscribers != 1 || s.Subscribers != 0 {
		t.Errorf("Stats() = %+v, want 1 slow and 0 current subscribers", s)
	}
}

func TestSubscriptionEndsWithContext(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := NewRuntime(Options{})
		ctx, cancel := context.WithCancel(t.Context())
		sub := rt.Subscribe(ctx)
		if sub.Err() != nil {
			t.Fatalf("Err() of an active subscription = %v", sub.Err())
		}
		cancel()
		synctest.Wait()
		if _, open := <-sub.Events(); open {
			t.Fatal("events channel still open after cancel")
		}
		if !errors.Is(sub.Err(), context.Canceled) {
			t.Errorf("Err() = %v, want context.Canceled", sub.Err())
		}
		if n := rt.Stats().Subscribers; n != 0 {
			t.Errorf("%d subscribers left", n)
		}
	})
}

func TestOperationErrors(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	const missing = "0123456789abcdef"
	for name, err := range map[string]error{
		"StartContainer":   rt.StartContainer(missing),
		"StopContainer":    rt.StopContainer(missing, 0, "", ""),
		"RemoveContainer":  rt.RemoveContainer(missing),
		"StopPodSandbox":   rt.StopPodSandbox(missing),
		"RemovePodSandbox": rt.RemovePodSandbox(missing),
	} {
		t.Run(name+" of an unknown id is NotFound", func(t *testing.T) { mustCode(t, err, codes.NotFound, missing) })
	}
	_, err := rt.CreateContainer(missing, ContainerConfig{})
	mustCode(t, err, codes.NotFound, missing)
	_, err = rt.ContainerStatus(missing)
	mustCode(t, err, codes.NotFound, missing)
	_, err = rt.PodSandboxStatus(missing)
	mustCode(t, err, codes.NotFound, missing)

	sb, _ := rt.RunPodSandbox(PodConfig{Name: "p", UID: "u"})
	_, err = rt.RunPodSandbox(PodConfig{Name: "p", UID: "u"})
	mustCode(t, err, codes.AlreadyExists, "")
	id, _ := rt.CreateContainer(sb, ContainerConfig{Name: "c"})
	_, err = rt.CreateContainer(sb, ContainerConfig{Name: "c"})
	mustCode(t, err, codes.AlreadyExists, "")
	if err := rt.StartContainer(id); err != nil {
		t.Fatal(err)
	}
	mustCode(t, rt.StartContainer(id), codes.FailedPrecondition, id)
	if err := rt.StopPodSandbox(sb); err != nil {
		t.Fatal(err)
	}
	_, err = rt.CreateContainer(sb, ContainerConfig{Name: "d"})
	mustCode(t, err, codes.FailedPrecondition, sb)
}

func TestStopPodSandboxKillsRunningContainers(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	sb, _ := rt.RunPodSandbox(PodConfig{})
	running, _ := rt.CreateContainer(sb, ContainerConfig{Name: "run"})
	created, _ := rt.CreateContainer(sb, ContainerConfig{Name: "idle"})
	if err := rt.StartContainer(running); err != nil {
		t.Fatal(err)
	}
	if err := rt.StopPodSandbox(sb); err != nil {
		t.Fatal(err)
	}
	st, _ := rt.ContainerStatus(running)
	if st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 137 || st.Reason != "Error" || st.FinishedAt == 0 {
		t.Errorf("running container after sandbox stop: %s exit %d %q finished %d, want EXITED 137 \"Error\"", st.State, st.ExitCode, st.Reason, st.FinishedAt)
	}
	if st, _ := rt.ContainerStatus(created); st.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		t.Errorf("created container after sandbox stop: %s, want CONTAINER_CREATED", st.State)
	}
	if ps, _ := rt.PodSandboxStatus(sb); ps.Status.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY || len(ps.ContainersStatuses) != 2 {
		t.Errorf("sandbox after stop: %s with %d container statuses, want NOTREADY with 2", ps.Status.State, len(ps.ContainersStatuses))
	}
}

func TestRemoveRunningContainerStopsItFirst(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	sb, _ := rt.RunPodSandbox(PodConfig{})
	id, _ := rt.CreateContainer(sb, ContainerConfig{})
	if err := rt.StartContainer(id); err != nil {
		t.Fatal(err)
	}
	sub := rt.Subscribe(t.Context())
	if err := rt.RemoveContainer(id); err != nil {
		t.Fatal(err)
	}
	evs := drain(sub)
	if len(evs) != 2 {
		t.Fatalf("got %d events, want STOPPED and DELETED", len(evs))
	}
	if evs[0].ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT || evs[0].ContainersStatuses[0].ExitCode != 137 {
		t.Errorf("first event: %s with exit %d, want STOPPED with 137", evs[0].ContainerEventType, evs[0].ContainersStatuses[0].ExitCode)
	}
	if evs[1].ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT || len(evs[1].ContainersStatuses) != 0 || evs[1].PodSandboxStatus.GetId() != sb {
		t.Errorf("second event: %s with %d statuses, sandbox %q; want DELETED, none, %q", evs[1].ContainerEventType, len(evs[1].ContainersStatuses), evs[1].PodSandboxStatus.GetId(), sb)
	}
	if _, err := rt.ContainerStatus(id); status.Code(err) != codes.NotFound {
		t.Errorf("ContainerStatus after remove: %v, want NotFound", err)
	}
}

func TestInjectedObjectsAreListedVerbatim(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	sub := rt.Subscribe(t.Context())
	sb := &runtimeapi.PodSandbox{Id: "bare", State: runtimeapi.PodSandboxState_SANDBOX_READY} // nil metadata, no labels, created_at 0
	orphan := &runtimeapi.Container{
		Id:           "orphan",
		PodSandboxId: "gone",
		State:        runtimeapi.ContainerState_CONTAINER_RUNNING,
		Labels:       map[string]string{"io.kubernetes.pod.uid": "u-1"},
	}
	if err := rt.InjectSandbox(sb); err != nil {
		t.Fatal(err)
	}
	if err := rt.InjectContainer(orphan, nil); err != nil {
		t.Fatal(err)
	}
	orphan.Id = "changed after injection"

	want := &runtimeapi.Container{Id: "orphan", PodSandboxId: "gone", State: runtimeapi.ContainerState_CONTAINER_RUNNING, Labels: map[string]string{"io.kubernetes.pod.uid": "u-1"}}
	if diff := cmp.Diff([]*runtimeapi.Container{want}, rt.ListContainers(nil), protocmp.Transform()); diff != "" {
		t.Errorf("ListContainers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]*runtimeapi.PodSandbox{sb}, rt.ListPodSandbox(nil), protocmp.Transform()); diff != "" {
		t.Errorf("ListPodSandbox (-want +got):\n%s", diff)
	}
	if got := rt.ListContainers(&runtimeapi.ContainerFilter{PodSandboxId: "gone"}); len(got) != 1 {
		t.Errorf("filter by the orphan's missing sandbox listed %d containers, want 1", len(got))
	}
	st, err := rt.ContainerStatus("orphan")
	if err != nil || st.State != runtimeapi.ContainerState_CONTAINER_RUNNING || st.Metadata != nil {
		t.Errorf("ContainerStatus(orphan) = %v, %v; want a running status without metadata", st, err)
	}
	// An orphan's events carry no sandbox status.
	if err := rt.StopContainer("orphan", 1, "", ""); err != nil {
		t.Fatal(err)
	}
	evs := drain(sub)
	if len(evs) != 1 || evs[0].PodSandboxStatus != nil || len(evs[0].ContainersStatuses) != 1 {
		t.Errorf("orphan stop events = %v, want one STOPPED without sandbox status", evs)
	}

	rt.InjectEvent(&runtimeapi.ContainerEventResponse{ContainerId: "ghost", CreatedAt: -1})
	if evs := drain(sub); len(evs) != 1 || evs[0].ContainerId != "ghost" || evs[0].CreatedAt != -1 {
		t.Errorf("injected event arrived as %v", evs)
	}
}

func TestPopulateBuildsALargeNodeSilently(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{ReplayWhileDisconnected: time.Minute})
	sub := rt.Subscribe(t.Context())
	if err := rt.Populate(3000, 10); err != nil {
		t.Fatal(err)
	}
	ctrs := rt.ListContainers(nil)
	if len(ctrs) != 30000 {
		t.Fatalf("listed %d containers, want 30000", len(ctrs))
	}
	running := rt.ListContainers(&runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}})
	if len(running) != 30000 {
		t.Errorf("%d containers running, want all 30000", len(running))
	}
	if n := len(rt.ListPodSandbox(nil)); n != 3000 {
		t.Errorf("listed %d sandboxes, want 3000", n)
	}
	if n := len(rt.ListContainers(&runtimeapi.ContainerFilter{PodSandboxId: ctrs[0].PodSandboxId})); n != 10 {
		t.Errorf("first pod has %d containers, want 10", n)
	}
	if evs := drain(sub); len(evs) != 0 {
		t.Errorf("Populate emitted %d events, want none", len(evs))
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		opts      Options
		wantName  string
		wantVer   string
		wantAPIV1 string
	}{
		{"defaults to containerd 2.4.2", Options{}, "containerd", "v2.4.2", "v1"},
		{"reports the configured runtime", Options{RuntimeName: "cri-o", RuntimeVersion: "1.33.0"}, "cri-o", "1.33.0", "v1"},
		{"the 1.7 preset reports 1.7", Containerd17Options(), "containerd", "v1.7.35", "v1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := NewRuntime(tc.opts).Version()
			if v.RuntimeName != tc.wantName || v.RuntimeVersion != tc.wantVer || v.RuntimeApiVersion != tc.wantAPIV1 {
				t.Errorf("Version() = %v, want %s %s %s", v, tc.wantName, tc.wantVer, tc.wantAPIV1)
			}
		})
	}
}

func BenchmarkListContainers30k(b *testing.B) {
	rt := NewRuntime(Options{})
	if err := rt.Populate(3000, 10); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if n := len(rt.ListContainers(nil)); n != 30000 {
			b.Fatalf("listed %d", n)
		}
	}
}
