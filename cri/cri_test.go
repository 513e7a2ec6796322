package cri_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestParseEndpoint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want, err string
	}{
		{name: "crictl form", in: "unix:///run/containerd/containerd.sock", want: "/run/containerd/containerd.sock"},
		{name: "a bare path", in: "/var/run/crio/crio.sock", want: "/var/run/crio/crio.sock"},
		{name: "unix: without slashes", in: "unix:/run/x.sock", want: "/run/x.sock"},
		{name: "tcp is refused and named", in: "tcp://10.0.0.1:1234", err: `CRI endpoint "tcp://10.0.0.1:1234": scheme "tcp" is not supported`},
		{name: "empty is refused", in: "", err: "empty CRI endpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := cri.ParseEndpoint(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseEndpoint(%q) error = %v, want %q", tt.in, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseEndpoint(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func newClient(t *testing.T, endpoint string, opts cri.Options) *cri.Client {
	t.Helper()
	c, err := cri.NewClient(endpoint, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCRIClientReadsTheRuntime(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Options{})
	sb := must(model.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
	c := must(model.CreateContainer(sb, crisim.ContainerConfig{Name: "app"}))
	must(0, model.StartContainer(c))
	srv, ep := crisimtest.Serve(t, model)
	cli := newClient(t, ep, cri.Options{})
	ctx := t.Context()

	v, err := cli.Version(ctx)
	if err != nil || v.GetRuntimeName() != "containerd" {
		t.Fatalf("Version = %v, %v", v, err)
	}
	sbs, err := cli.ListPodSandbox(ctx, nil)
	if err != nil || len(sbs) != 1 || sbs[0].GetId() != sb {
		t.Fatalf("ListPodSandbox = %v, %v", sbs, err)
	}
	cs, err := cli.ListContainers(ctx, &runtimeapi.ContainerFilter{PodSandboxId: sb})
	if err != nil || len(cs) != 1 || cs[0].GetId() != c {
		t.Fatalf("ListContainers = %v, %v", cs, err)
	}
	st, err := cli.ContainerStatus(ctx, c)
	if err != nil || st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("ContainerStatus = %v, %v", st, err)
	}
	if _, err := cli.ContainerStatus(ctx, "nope"); status.Code(err) != codes.NotFound {
		t.Fatalf("ContainerStatus of an unknown id: %v, want NotFound", err)
	}
	if m := srv.MutatingCalls(); len(m) != 0 {
		t.Errorf("the client made mutating calls: %v", m)
	}
}

func TestCRIClientListsThirtyThousandContainers(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Options{})
	if err := model.Populate(3000, 10); err != nil {
		t.Fatal(err)
	}
	_, ep := crisimtest.Serve(t, model)
	cs, err := newClient(t, ep, cri.Options{}).ListContainers(t.Context(), nil)
	if err != nil || len(cs) != 30000 {
		t.Fatalf("ListContainers = %d containers, %v; want 30000", len(cs), err)
	}
	// gRPC's default limit would have refused it: the raise is what works.
	_, err = newClient(t, ep, cri.Options{MaxRecvMsgSize: 4 << 20}).ListContainers(t.Context(), nil)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("with a 4 MiB limit: %v, want ResourceExhausted", err)
	}
}

func TestCRIClientWatchEventsEndsWithTheRuntimesStatus(t *testing.T) {
	t.Parallel()
	// Events made while nobody listens are replayed to the first subscriber,
	// as containerd 2.x does, so the stream needs no readiness signal.
	model := crisim.NewRuntime(crisim.Options{ReplayWhileDisconnected: time.Minute})
	sb := must(model.RunPodSandbox(crisim.PodConfig{}))
	srv, ep := crisimtest.Serve(t, model)
	cli := newClient(t, ep, cri.Options{})
	got := make(chan *runtimeapi.ContainerEventResponse, 16)
	done := make(chan error, 1)
	go func() {
		done <- cli.WatchEvents(t.Context(), func(ev *runtimeapi.ContainerEventResponse) { got <- ev })
	}()
	var ev *runtimeapi.ContainerEventResponse
	select {
	case ev = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	if ev.GetContainerId() != sb {
		t.Errorf("first event is for %s, want the sandbox %s", ev.GetContainerId(), sb)
	}
	if ev.GetPodSandboxStatus() == nil || ev.GetCreatedAt() <= 0 {
		t.Errorf("event without sandbox status or time: %v", ev)
	}
	if n := srv.DropStreams(); n != 1 {
		t.Fatalf("DropStreams ended %d streams", n)
	}
	select {
	case err := <-done:
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("WatchEvents = %v, want Unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchEvents did not return after the stream was dropped")
	}
}

func TestInstrumentedRuntimePassesErrorsAndCountsThem(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Options{})
	srv, ep := crisimtest.Serve(t, model)
	reg := prometheus.NewRegistry()
	m, err := generator.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	rt := generator.InstrumentRuntime(newClient(t, ep, cri.Options{}), m)
	srv.FailNext("ListContainers", codes.Unavailable)
	if _, err := rt.ListContainers(t.Context(), nil); status.Code(err) != codes.Unavailable {
		t.Fatalf("first ListContainers = %v, want the injected Unavailable", err)
	}
	if _, err := rt.ListContainers(t.Context(), nil); err != nil {
		t.Fatalf("second ListContainers = %v", err)
	}
	srv.FailNext("ContainerStatus", codes.Internal)
	if _, err := rt.ContainerStatus(t.Context(), "x"); status.Code(err) != codes.Internal {
		t.Fatalf("ContainerStatus = %v, want the injected Internal", err)
	}
	const want = `
# HELP pleg_bridge_cri_requests_total CRI requests by operation and result (gRPC code).
# TYPE pleg_bridge_cri_requests_total counter
pleg_bridge_cri_requests_total{operation="ContainerStatus",result="Internal"} 1
pleg_bridge_cri_requests_total{operation="ListContainers",result="OK"} 1
pleg_bridge_cri_requests_total{operation="ListContainers",result="Unavailable"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pleg_bridge_cri_requests_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "pleg_bridge_cri_request_duration_seconds"); n != 2 {
		t.Errorf("duration series = %d, want one per operation", n)
	}
}

// TestCRIClientStreamCostsTheRuntimeNoPings follows the runtime's stream one
// event at a time, each after the last was received, as a node's stream
// mostly comes, and reads what the client sent back over the connection:
// gRPC's bandwidth estimator, left on, answers a data frame after a quiet
// moment with a window update and a PING the runtime must answer.
func TestCRIClientStreamCostsTheRuntimeNoPings(t *testing.T) {
	t.Parallel()
	// The sandbox's event is replayed to the stream's subscriber: its
	// arrival says the stream is open.
	model := crisim.NewRuntime(crisim.Options{ReplayWhileDisconnected: time.Minute})
	sb := must(model.RunPodSandbox(crisim.PodConfig{UID: "uid-1"}))
	lis, err := crisim.Listen(filepath.Join(t.TempDir(), "cri.sock"))
	if err != nil {
		t.Fatal(err)
	}
	frames := &frameCounter{}
	serveCtx, stopServing := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- crisim.NewServer(model, crisim.ServerOptions{}).Serve(serveCtx, countingListener{Listener: lis, frames: frames})
	}()
	t.Cleanup(func() {
		stopServing()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	cli := newClient(t, "unix://"+lis.Addr().String(), cri.Options{})
	got := make(chan *runtimeapi.ContainerEventResponse, 1)
	go func() {
		_ = cli.WatchEvents(t.Context(), func(ev *runtimeapi.ContainerEventResponse) { got <- ev })
	}()
	receive := func(what string) {
		t.Helper()
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not received within 10s", what)
		}
	}
	receive("the sandbox's event")
	// A container created and removed: two events, each of the same size.
	const n = 200
	for i := range n / 2 {
		id := must(model.CreateContainer(sb, crisim.ContainerConfig{Name: fmt.Sprintf("c%d", i)}))
		receive(fmt.Sprintf("the creation of container %d", i))
		must(0, model.RemoveContainer(id))
		receive(fmt.Sprintf("the removal of container %d", i))
	}
	pings, updates := frames.pings.Load(), frames.windowUpdates.Load()
	t.Logf("%d events: the client sent %d PING and %d WINDOW_UPDATE frames", n, pings, updates)
	if pings != 0 || updates > n/20 {
		t.Errorf("%d events cost the runtime %d PINGs and %d window updates, want none and at most %d", n, pings, updates, n/20)
	}
}

// countingListener counts the HTTP/2 frames its connections read: what
// the client sends the server.
type countingListener struct {
	net.Listener
	frames *frameCounter
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, frames: l.frames, parse: frameParser{skip: len(http2Preface)}}, nil
}

type countingConn struct {
	net.Conn
	frames *frameCounter
	parse  frameParser // only the server's reader reads
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.parse.feed(b[:n], c.frames)
	return n, err
}

// frameCounter counts PING frames (not their ACKs) and WINDOW_UPDATE
// frames, over every connection.
type frameCounter struct {
	pings, windowUpdates atomic.Int64
}

// http2Preface opens every HTTP/2 connection from a client (RFC 9113,
// section 3.4).
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// frameParser follows one connection's HTTP/2 frames from the client, made
// with the preface to skip: frames of a 9-byte header (24-bit length,
// type, flags, stream) and a payload of that length (RFC 9113, section
// 4.1).
type frameParser struct {
	skip   int    // bytes of the preface or a payload still to pass over
	header []byte // of the next frame, as far as read
}

func (p *frameParser) feed(b []byte, count *frameCounter) {
	for len(b) > 0 {
		if p.skip > 0 {
			k := min(p.skip, len(b))
			p.skip -= k
			b = b[k:]
			continue
		}
		k := min(9-len(p.header), len(b))
		p.header = append(p.header, b[:k]...)
		b = b[k:]
		if len(p.header) < 9 {
			return
		}
		switch p.header[3] {
		case 0x6:
			if p.header[4]&0x1 == 0 { // not the ACK of the server's PING
				count.pings.Add(1)
			}
		case 0x8:
			count.windowUpdates.Add(1)
		}
		p.skip = int(p.header[0])<<16 | int(p.header[1])<<8 | int(p.header[2])
		p.header = p.header[:0]
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
