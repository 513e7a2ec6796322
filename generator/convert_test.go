package generator

import (
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestBothSourcesSeeAContainerAlike reads one exited container and its
// sandbox the way a relist does (listings, then a status call) and the way
// the stream does (the STOPPED event's payload): both must describe them
// alike, or the merge would record whichever source came last.
func TestBothSourcesSeeAContainerAlike(t *testing.T) {
	t.Parallel()
	m := crisim.NewRuntime(crisim.Containerd24Options())
	sub := m.Subscribe(t.Context())
	sb := must(m.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1", Attempt: 2}))
	c := must(m.CreateContainer(sb, crisim.ContainerConfig{Name: "app", Attempt: 3, Image: "registry.example/app:1.2"}))
	must(0, m.StartContainer(c))
	must(0, m.StopContainer(c, 137, "OOMKilled", "out of memory"))
	now := time.Now()

	var stopped *runtimeapi.ContainerEventResponse
	for len(sub.Events()) > 0 {
		if ev := <-sub.Events(); ev.GetContainerId() == c && ev.GetContainerEventType() == runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
			stopped = ev
		}
	}
	if stopped == nil {
		t.Fatal("the model emitted no STOPPED event")
	}
	b, _, err := streamBatch(nil, stopped, now, metaFilter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fromStream := map[string]sighting{}
	for _, s := range b.pods[0].containers {
		fromStream[s.info.ID] = s
	}

	sandboxes := m.ListPodSandbox(nil)
	containers := m.ListContainers(nil)
	if len(sandboxes) != 1 || len(containers) != 1 {
		t.Fatalf("listed %d sandboxes and %d containers, want 1 of each", len(sandboxes), len(containers))
	}
	listed := containerSighting(containers[0], containers[0].GetPodSandboxId(), now)
	applyStatus(&listed, must(m.ContainerStatus(c)), now)
	fromRelist := map[string]sighting{sb: sandboxSighting(sandboxes[0], now), c: listed}

	if diff := cmp.Diff(fromRelist, fromStream, cmp.AllowUnexported(sighting{})); diff != "" {
		t.Errorf("sightings (-relist +stream):\n%s", diff)
	}
	if got := fromRelist[c].info; got.Name != "app" || got.Attempt != 3 || got.Image != "registry.example/app:1.2" || got.ImageRef == "" {
		t.Errorf("container described as %+v", got)
	}
	if got := fromRelist[sb].info; !got.Sandbox || got.Attempt != 2 {
		t.Errorf("sandbox described as %+v", got)
	}
	listedPod := sandboxPod(sandboxes[0])
	listedPod.Meta = metaFilter{}.podMeta(sandboxes[0], now)
	if pod := b.pods[0].pod; !cmp.Equal(pod, listedPod) || pod.UID != "uid-1" {
		t.Errorf("the stream's pod %+v, the listing's %+v", pod, listedPod)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestValidTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		ns   int64
		want time.Time
	}{
		{"zero is unknown", 0, time.Time{}},
		{"negative is unknown", -6795364578871345152, time.Time{}},
		{"before 2000 is unknown", time.Date(1999, 12, 31, 0, 0, 0, 0, time.UTC).UnixNano(), time.Time{}},
		{"more than a minute in the future is unknown", now.Add(2 * time.Minute).UnixNano(), time.Time{}},
		{"a plausible time keeps its nanoseconds", now.Add(-time.Second + 7).UnixNano(), now.Add(-time.Second + 7)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := validTime(tt.ns, now); !got.Equal(tt.want) {
				t.Errorf("validTime(%d) = %v, want %v", tt.ns, got, tt.want)
			}
		})
	}
}

func TestStreamEventsAskForTargetedRelists(t *testing.T) {
	t.Parallel()
	sandbox := &runtimeapi.PodSandboxStatus{Id: "sb", Metadata: &runtimeapi.PodSandboxMetadata{Uid: "uid-1"}}
	const (
		created = runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT
		started = runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT
		stopped = runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT
		deleted = runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT
	)
	tests := []struct {
		name      string
		container string
		typ       runtimeapi.ContainerEventType
		sandbox   *runtimeapi.PodSandboxStatus
		want      *relistScope
	}{
		{"a container's stop asks for its sandbox's containers", "c", stopped, sandbox, &relistScope{podUID: "uid-1", sandboxID: "sb", containersOnly: true}},
		{"a container's removal asks for its sandbox's containers", "c", deleted, sandbox, &relistScope{podUID: "uid-1", sandboxID: "sb", containersOnly: true}},
		{"a sandbox's stop asks for the sandbox too", "sb", stopped, sandbox, &relistScope{podUID: "uid-1", sandboxID: "sb"}},
		{"a sandbox's removal asks for the sandbox too", "sb", deleted, sandbox, &relistScope{podUID: "uid-1", sandboxID: "sb"}},
		{"a creation asks for nothing", "c", created, sandbox, nil},
		{"a start asks for nothing", "c", started, sandbox, nil},
		{"a removal without a sandbox status (containerd 1.7) asks for nothing", "sb", deleted, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ev := &runtimeapi.ContainerEventResponse{ContainerId: tt.container, ContainerEventType: tt.typ, PodSandboxStatus: tt.sandbox}
			_, got, err := streamBatch(nil, ev, time.Now(), metaFilter{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(relistScope{})); diff != "" {
				t.Errorf("targeted relist (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStreamBatchReusesItsRoom: converting every message into one batch,
// recycled after each, gives what converting each into a new batch does,
// and takes no new room for the sightings once it has enough.
func TestStreamBatchReusesItsRoom(t *testing.T) {
	t.Parallel()
	var into batch
	now := time.Unix(1_800_000_000, 0)
	opts := []cmp.Option{cmp.AllowUnexported(batch{}, podObservation{}, sighting{}, relistScope{}, PodMeta{}), cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })}
	var room *sighting
	reused := 0
	for i, ev := range crisimtest.KubeletEvents(t, 3, 9) {
		want, _, wantErr := streamBatch(nil, ev, now, metaFilter{}, nil)
		got, _, err := streamBatch(&into, ev, now, metaFilter{}, nil)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("message %d: error %v, want %v", i, err, wantErr)
		}
		if err != nil {
			continue
		}
		if diff := cmp.Diff(want, got, opts...); diff != "" {
			t.Fatalf("message %d into a recycled batch (-new batch +recycled):\n%s", i, diff)
		}
		if p := unsafe.SliceData(got.pods[0].containers); p == room {
			reused++
		} else {
			room = p
		}
		into.recycle()
		if s := into.pods[:1][0].containers[:1][0]; s != (sighting{}) {
			t.Fatalf("message %d: a recycled batch still holds %+v", i, s)
		}
	}
	if reused < 20 {
		t.Errorf("the sightings' room was reused %d times, want nearly every message", reused)
	}
}
