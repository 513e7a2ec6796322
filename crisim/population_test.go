package crisim

import (
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestPopulateKubeletBuildsANodeAsTheKubeletLabelsIt(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	sub := rt.Subscribe(t.Context())
	if err := rt.PopulateKubelet(110, 330); err != nil {
		t.Fatal(err)
	}
	if evs := drain(sub); len(evs) != 0 {
		t.Errorf("PopulateKubelet emitted %d events, want none", len(evs))
	}
	sbs := rt.ListPodSandbox(nil)
	ctrs := rt.ListContainers(&runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}})
	if len(sbs) != 110 || len(ctrs) != 330 {
		t.Fatalf("listed %d sandboxes and %d running containers, want 110 and 330", len(sbs), len(ctrs))
	}
	lastApplied := 0
	for _, sb := range sbs {
		if sb.GetLabels()[labelPodUID] != sb.GetMetadata().GetUid() || sb.GetLabels()["app"] == "" {
			t.Fatalf("sandbox %s lacks the kubelet's or the workload's labels: %v", sb.GetId(), sb.GetLabels())
		}
		if len(sb.GetAnnotations()["kubectl.kubernetes.io/last-applied-configuration"]) > 2000 {
			lastApplied++
		}
	}
	if lastApplied != 110/lastAppliedEvery {
		t.Errorf("%d pods carry a last-applied-configuration of over 2 KB, want %d", lastApplied, 110/lastAppliedEvery)
	}
	size := 0
	for _, c := range ctrs {
		if c.GetAnnotations()["io.kubernetes.container.hash"] == "" || c.GetLabels()[labelContainerName] != c.GetMetadata().GetName() {
			t.Fatalf("container %s lacks the kubelet's labels or annotations: %v %v", c.GetId(), c.GetLabels(), c.GetAnnotations())
		}
		size += proto.Size(c)
	}
	if avg := size / len(ctrs); avg < 800 || avg > 1400 {
		t.Errorf("a container lists at %d bytes on average, want about 1 KB", avg)
	}
}

func TestPopulateKubeletSpreadsTheContainersOverThePods(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	if err := rt.PopulateKubelet(3, 7); err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, sb := range rt.ListPodSandbox(nil) {
		got = append(got, len(rt.ListContainers(&runtimeapi.ContainerFilter{PodSandboxId: sb.GetId()})))
	}
	if len(got) != 3 || got[0] != 3 || got[1] != 2 || got[2] != 2 {
		t.Errorf("containers per pod = %v, want [3 2 2]", got)
	}
	if err := rt.PopulateKubelet(0, 1); err == nil {
		t.Error("PopulateKubelet(0, 1) succeeded, want an error")
	}
}
