package crisimtest

import (
	"bufio"
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// KubeletEvents returns stream messages of a node the kubelet populated,
// one per container and event type, each with its pod's sandbox status
// and every container status of the pod, as containerd 2.x sends them, with
// what the generator never reads filled in too (network and Linux status,
// mounts, resources, annotations, image IDs), exit codes negative and
// positive.
func KubeletEvents(t testing.TB, pods, containers int) []*runtimeapi.ContainerEventResponse {
	t.Helper()
	rt := crisim.NewRuntime(crisim.Options{})
	if err := rt.PopulateKubelet(pods, containers); err != nil {
		t.Fatal(err)
	}
	byPod := map[string][]*runtimeapi.ContainerStatus{}
	for i, c := range rt.ListContainers(nil) {
		st, err := rt.ContainerStatus(c.Id)
		if err != nil {
			t.Fatal(err)
		}
		st = proto.CloneOf(st)
		st.Labels, st.Annotations = c.Labels, c.Annotations
		st.ImageId = "sha256:feed"
		st.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: "/var/lib/x"}}
		st.Resources = &runtimeapi.ContainerResources{Linux: &runtimeapi.LinuxContainerResources{CpuShares: 2}}
		if i%3 == 1 {
			st.State = runtimeapi.ContainerState_CONTAINER_EXITED
			st.ExitCode, st.Reason, st.Message = int32(i%5-2), "Error", fmt.Sprintf("exit %d <&>", i)
			st.FinishedAt = st.StartedAt + 1e9
		}
		if i%7 == 3 {
			st.Metadata = nil // named by its labels only
		}
		byPod[c.PodSandboxId] = append(byPod[c.PodSandboxId], st)
	}
	var out []*runtimeapi.ContainerEventResponse
	for _, sb := range rt.ListPodSandbox(nil) {
		resp, err := rt.PodSandboxStatus(sb.Id)
		if err != nil {
			t.Fatal(err)
		}
		sbs := proto.CloneOf(resp.GetStatus())
		sbs.Labels, sbs.Annotations = sb.Labels, sb.Annotations
		sbs.Network = &runtimeapi.PodSandboxNetworkStatus{Ip: "10.0.0.1"}
		sbs.Linux = &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{}}}
		sbs.RuntimeHandler = "runc"
		statuses := byPod[sb.Id]
		ids := []string{sb.Id}
		for _, st := range statuses {
			ids = append(ids, st.Id)
		}
		for i, id := range ids {
			for _, typ := range []runtimeapi.ContainerEventType{
				runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT,
				runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
				runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT,
			} {
				ev := &runtimeapi.ContainerEventResponse{ContainerId: id, ContainerEventType: typ, CreatedAt: time.Now().UnixNano(),
					PodSandboxStatus: sbs, ContainersStatuses: statuses}
				if i%4 == 3 {
					ev.PodSandboxStatus = nil // as containerd 1.7 sends a sandbox's deletion
				}
				out = append(out, ev)
			}
		}
	}
	return out
}

// ReadRecording reads a recorded event stream (generator/testdata/cri-events):
// one message a line, in protobuf's JSON form. It fails the test on a line
// that does not decode, naming it.
func ReadRecording(t testing.TB, path string) []*runtimeapi.ContainerEventResponse {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []*runtimeapi.ContainerEventResponse
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		ev := &runtimeapi.ContainerEventResponse{}
		if err := protojson.Unmarshal(sc.Bytes(), ev); err != nil {
			t.Fatalf("%s: decode line %d: %v", path, len(out)+1, err)
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
