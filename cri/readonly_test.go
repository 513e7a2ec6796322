package cri_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestCRIClientRefusesMutatingCallsBeforeTheSocket(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Options{})
	sb := must(model.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
	c := must(model.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
	must(0, model.StartContainer(c))
	srv, ep := crisimtest.Serve(t, model)
	cli := newClient(t, ep, cri.Options{})
	conn := cri.ConnOf(cli)

	_, err := runtimeapi.NewRuntimeServiceClient(conn).StopContainer(t.Context(), &runtimeapi.StopContainerRequest{ContainerId: c})
	if status.Code(err) != codes.PermissionDenied ||
		!strings.Contains(err.Error(), "/runtime.v1.RuntimeService/StopContainer") || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("StopContainer = %v, want PermissionDenied naming the method and saying read-only", err)
	}
	if st, err := cli.ContainerStatus(t.Context(), c); err != nil || st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("after the refused stop, ContainerStatus = %v, %v; want still running", st, err)
	}

	// Every method of the service, unary and streaming: what the runtime
	// counts as mutating never reaches it, and what the generator reads does.
	desc := runtimeapi.RuntimeService_ServiceDesc
	call := func(name string, stream bool) error {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		method := "/" + desc.ServiceName + "/" + name
		if stream {
			s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
			if err != nil {
				return err
			}
			if err := s.SendMsg(&emptypb.Empty{}); err != nil {
				return err
			}
			return s.CloseSend()
		}
		// An empty request decodes as any request type; the reply is
		// discarded.
		return conn.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
	}
	var names []string
	streams := map[string]bool{}
	for _, m := range desc.Methods {
		names = append(names, m.MethodName)
	}
	for _, s := range desc.Streams {
		names = append(names, s.StreamName)
		streams[s.StreamName] = true
	}
	for _, name := range names {
		err := call(name, streams[name])
		refused := status.Code(err) == codes.PermissionDenied && strings.Contains(err.Error(), "read-only")
		if !crisim.IsReadOnly(name) && !refused {
			t.Errorf("%s (mutating) = %v, want refused", name, err)
		}
	}
	for _, name := range []string{"Version", "Status", "ListPodSandbox", "ListContainers", "PodSandboxStatus", "ContainerStatus", "GetContainerEvents"} {
		if err := call(name, streams[name]); status.Code(err) == codes.PermissionDenied {
			t.Errorf("%s (a read) = %v, want admitted", name, err)
		}
	}
	// containerd's event service, on the same socket: Subscribe is a read,
	// Publish and Forward would inject events into containerd.
	for _, m := range []string{"Publish", "Forward"} {
		err := conn.Invoke(t.Context(), "/containerd.services.events.v1.Events/"+m, &emptypb.Empty{}, &emptypb.Empty{})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("Events/%s = %v, want refused", m, err)
		}
	}
	if m := srv.MutatingCalls(); len(m) != 0 {
		t.Errorf("mutating calls reached the runtime: %v", m)
	}
	if n := srv.Calls()[runtimeapi.RuntimeService_ListContainers_FullMethodName]; n == 0 {
		t.Error("the admitted ListContainers never reached the runtime")
	}
}
