package crisim

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// testTimeout bounds every wait on the real server, so a bug fails the test
// instead of hanging it.
const testTimeout = 10 * time.Second

type testServer struct {
	srv    *Server
	client runtimeapi.RuntimeServiceClient
	socket string
	stop   func() // stops Serve and checks it returned nil and removed the socket
}

// serve serves rt on a unix socket in t.TempDir() and connects a client.
// Serve is stopped at cleanup unless the test called stop.
func serve(t *testing.T, rt *Runtime, opts ServerOptions) *testServer {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	lis, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(rt, opts)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ctx, lis) }()

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	ts := &testServer{srv: srv, client: runtimeapi.NewRuntimeServiceClient(conn), socket: sock}
	ts.stop = func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Serve returned %v, want nil", err)
			}
		case <-time.After(testTimeout):
			t.Fatal("Serve did not return after its context ended")
		}
		if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("socket file still there after Serve returned (stat: %v)", err)
		}
	}
	t.Cleanup(func() {
		conn.Close()
		ts.stop()
	})
	return ts
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// openEvents opens GetContainerEvents and waits until the server has
// subscribed, so no event emitted afterwards is missed.
func openEvents(t *testing.T, ctx context.Context, c runtimeapi.RuntimeServiceClient) grpc.ServerStreamingClient[runtimeapi.ContainerEventResponse] {
	t.Helper()
	stream, err := c.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatalf("wait for the event stream: %v", err)
	}
	return stream
}

func TestServerServesTheModel(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	sb, _ := rt.RunPodSandbox(PodConfig{Name: "web-0", Labels: map[string]string{"app": "web"}})
	id, _ := rt.CreateContainer(sb, ContainerConfig{Name: "app"})
	if err := rt.StartContainer(id); err != nil {
		t.Fatal(err)
	}
	ts := serve(t, rt, ServerOptions{})
	ctx := testContext(t)

	v, err := ts.client.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil || v.RuntimeName != "containerd" || v.RuntimeApiVersion != "v1" {
		t.Errorf("Version = %v, %v", v, err)
	}
	st, err := ts.client.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil || len(st.GetStatus().GetConditions()) != 2 || !st.Status.Conditions[0].Status {
		t.Errorf("Status = %v, %v; want two true conditions", st, err)
	}

	sandboxes, err := ts.client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "web"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(rt.ListPodSandbox(nil), sandboxes.Items, protocmp.Transform()); diff != "" {
		t.Errorf("ListPodSandbox (-model +grpc):\n%s", diff)
	}
	ctrs, err := ts.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb},
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(rt.ListContainers(nil), ctrs.Containers, protocmp.Transform()); diff != "" {
		t.Errorf("ListContainers (-model +grpc):\n%s", diff)
	}
	cs, err := ts.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := rt.ContainerStatus(id)
	if diff := cmp.Diff(want, cs.Status, protocmp.Transform()); diff != "" {
		t.Errorf("ContainerStatus (-model +grpc):\n%s", diff)
	}
	ps, err := ts.client.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb})
	if err != nil {
		t.Fatal(err)
	}
	if ps.Status.GetState() != runtimeapi.PodSandboxState_SANDBOX_READY || len(ps.ContainersStatuses) != 1 || ps.Timestamp == 0 {
		t.Errorf("PodSandboxStatus = %v, want a ready sandbox with 1 container status and a timestamp", ps)
	}

	_, err = ts.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("ContainerStatus(unknown) error = %v, want NotFound", err)
	}
	_, err = ts.client.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("PodSandboxStatus(unknown) error = %v, want NotFound", err)
	}
}

func TestServerStreamsEventsUntilDropped(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	ts := serve(t, rt, ServerOptions{})
	ctx := testContext(t)
	stream := openEvents(t, ctx, ts.client)

	sb, err := rt.RunPodSandbox(PodConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []runtimeapi.ContainerEventType{
		runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT,
		runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT,
	} {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.ContainerId != sb || ev.ContainerEventType != want || ev.PodSandboxStatus.GetId() != sb || ev.CreatedAt == 0 {
			t.Errorf("got %v, want %s for sandbox %s", ev, want, sb)
		}
	}

	if n := ts.srv.DropStreams(); n != 1 {
		t.Errorf("DropStreams() = %d, want 1", n)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("Recv after DropStreams: %v, want Unavailable", err)
	}

	// The client can reconnect at once.
	stream = openEvents(t, ctx, ts.client)
	if err := rt.StopPodSandbox(sb); err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err != nil || ev.ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
		t.Errorf("after reconnecting got %v, %v; want the STOPPED event", ev, err)
	}
}

func TestServerFailNext(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	ts := serve(t, rt, ServerOptions{})
	ctx := testContext(t)

	ts.srv.FailNext("ListContainers", codes.Unavailable)
	ts.srv.FailNext("ListContainers", codes.Internal)
	ts.srv.FailNext("GetContainerEvents", codes.Unimplemented)
	for _, want := range []codes.Code{codes.Unavailable, codes.Internal, codes.OK} {
		_, err := ts.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if status.Code(err) != want {
			t.Errorf("ListContainers error = %v, want code %s", err, want)
		}
	}
	if _, err := ts.client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err != nil {
		t.Errorf("ListPodSandbox failed too: %v", err)
	}
	stream, err := ts.client.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Unimplemented {
		t.Errorf("GetContainerEvents error = %v, want Unimplemented", err)
	}
}

func TestServerLatency(t *testing.T) {
	t.Parallel()
	ts := serve(t, NewRuntime(Options{}), ServerOptions{})

	ts.srv.SetLatency("Version", time.Hour)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := ts.client.Version(ctx, &runtimeapi.VersionRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Version with an hour of latency: %v, want DeadlineExceeded", err)
	}
	ts.srv.SetLatency("Version", 0)
	if _, err := ts.client.Version(testContext(t), &runtimeapi.VersionRequest{}); err != nil {
		t.Errorf("Version without latency: %v", err)
	}
}

func TestServerCountsCallsAndReportsMutations(t *testing.T) {
	t.Parallel()
	ts := serve(t, NewRuntime(Options{}), ServerOptions{})
	ctx := testContext(t)

	for range 2 {
		if _, err := ts.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(ts.srv.MutatingCalls()) != 0 {
		t.Errorf("MutatingCalls() = %v after reads only", ts.srv.MutatingCalls())
	}
	_, err := ts.client.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: "x"})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("RemoveContainer error = %v, want Unimplemented", err)
	}

	wantCalls := map[string]int{
		"/runtime.v1.RuntimeService/ListContainers":  2,
		"/runtime.v1.RuntimeService/RemoveContainer": 1,
	}
	if diff := cmp.Diff(wantCalls, ts.srv.Calls()); diff != "" {
		t.Errorf("Calls() (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"/runtime.v1.RuntimeService/RemoveContainer"}, ts.srv.MutatingCalls()); diff != "" {
		t.Errorf("MutatingCalls() (-want +got):\n%s", diff)
	}
}

func TestServerSendsLargeListings(t *testing.T) {
	t.Parallel()
	rt := NewRuntime(Options{})
	if err := rt.Populate(3000, 10); err != nil {
		t.Fatal(err)
	}
	ts := serve(t, rt, ServerOptions{})
	// Encoding 15 MiB twice takes seconds under the race detector.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// With gRPC's default 4 MiB receive limit the client refuses the answer,
	// which shows the listing really is that large.
	_, err := ts.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("ListContainers with the default receive limit: %v, want ResourceExhausted", err)
	}
	resp, err := ts.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{}, grpc.MaxCallRecvMsgSize(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.Containers); n != 30000 {
		t.Errorf("listed %d containers, want 30000", n)
	}
}

func TestServeEndsStreamsAndRemovesSocketOnShutdown(t *testing.T) {
	t.Parallel()
	ts := serve(t, NewRuntime(Options{}), ServerOptions{})
	stream := openEvents(t, testContext(t), ts.client)

	ts.stop() // checks that Serve returns nil and the socket is gone
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("Recv after shutdown: %v, want Unavailable", err)
	}
}

func TestListenReplacesStaleSocketOnly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sock := filepath.Join(dir, "stale.sock")
	old, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	old.(*net.UnixListener).SetUnlinkOnClose(false)
	old.Close() // leaves the socket file behind, as a crashed runtime does

	lis, err := Listen(sock)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	lis.Close()

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file); err == nil {
		t.Error("Listen over a regular file succeeded, want an error")
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me" {
		t.Errorf("regular file changed: %q, %v", b, err)
	}
}
