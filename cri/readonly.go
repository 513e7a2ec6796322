package cri

import (
	"context"

	eventsapi "github.com/containerd/containerd/api/services/events/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// readMethods are the CRI methods the bridge may call: Version, Status, the
// listings (List*, and the streamed forms of the two the relist uses), the
// status reads (*Status), GetContainerEvents and containerd's
// Events/Subscribe. None of them changes the
// runtime. Anything else (create, start, stop, remove, exec, update, pull,
// checkpoint) is refused before it reaches the socket, so a future caller
// of the connection cannot make the bridge act on the node by mistake. A read
// method the generator comes to need is added here, with a test.
var readMethods = map[string]bool{
	runtimeapi.RuntimeService_Version_FullMethodName:               true,
	runtimeapi.RuntimeService_Status_FullMethodName:                true,
	runtimeapi.RuntimeService_ListPodSandbox_FullMethodName:        true,
	runtimeapi.RuntimeService_ListContainers_FullMethodName:        true,
	runtimeapi.RuntimeService_StreamPodSandboxes_FullMethodName:    true,
	runtimeapi.RuntimeService_StreamContainers_FullMethodName:      true,
	runtimeapi.RuntimeService_ListContainerStats_FullMethodName:    true,
	runtimeapi.RuntimeService_ListPodSandboxStats_FullMethodName:   true,
	runtimeapi.RuntimeService_ListPodSandboxMetrics_FullMethodName: true,
	runtimeapi.RuntimeService_ListMetricDescriptors_FullMethodName: true,
	runtimeapi.RuntimeService_PodSandboxStatus_FullMethodName:      true,
	runtimeapi.RuntimeService_ContainerStatus_FullMethodName:       true,
	runtimeapi.RuntimeService_GetContainerEvents_FullMethodName:    true,
	// containerd's own event service, on the same socket: Subscribe only
	// (Publish and Forward would inject events into containerd).
	containerdSubscribe: true,
}

// containerdSubscribe is the full method name of containerd's
// Events/Subscribe (its generated code has no constant for it).
var containerdSubscribe = "/" + eventsapi.Events_ServiceDesc.ServiceName + "/" + eventsapi.Events_ServiceDesc.Streams[0].StreamName

// checkReadOnly returns nil for a read method and otherwise a
// codes.PermissionDenied error naming the method.
func checkReadOnly(method string) error {
	if readMethods[method] {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "call %s: refused, pleg-bridge is read-only towards the container runtime", method)
}

// readOnlyUnary is the client interceptor that refuses a unary call to
// anything but a read method, without sending it.
func readOnlyUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := checkReadOnly(method); err != nil {
		return err
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// readOnlyStream is readOnlyUnary for streaming calls: the stream is never
// opened.
func readOnlyStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err := checkReadOnly(method); err != nil {
		return nil, err
	}
	return streamer(ctx, desc, cc, method, opts...)
}
