package soak

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// simRuntime serves the simulated runtime on a unix socket and can stop and
// serve it again, as containerd restarts: the model, its containers and the
// events kept for the next subscriber survive, the connections and event
// streams do not. Its methods are called from one goroutine at a time.
type simRuntime struct {
	model  *crisim.Runtime
	srv    *crisim.Server
	socket string

	stopServe context.CancelFunc // nil while not serving
	served    chan error         // Serve's result
}

func newSimRuntime(socket string, containerd17 bool) *simRuntime {
	opts := crisim.Containerd24Options()
	if containerd17 {
		opts = crisim.Containerd17Options()
	}
	model := crisim.NewRuntime(opts)
	return &simRuntime{model: model, srv: crisim.NewServer(model, crisim.ServerOptions{}), socket: socket}
}

// endpoint is the runtime's address in crictl's form, for PLEG_CRI_ENDPOINT.
func (r *simRuntime) endpoint() string { return "unix://" + r.socket }

// serve starts serving; clients can connect when it returns. The server
// runs until stop, also after ctx is done (the caller stops it last).
func (r *simRuntime) serve(ctx context.Context) error {
	lis, err := crisim.Listen(r.socket)
	if err != nil {
		return fmt.Errorf("serve the simulated runtime: %w", err)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.stopServe, r.served = cancel, make(chan error, 1)
	go func() { r.served <- r.srv.Serve(sctx, lis) }() // joined by stop
	return nil
}

// stop stops serving: open event streams end with codes.Unavailable, the
// socket goes away. It returns Serve's error.
func (r *simRuntime) stop() error {
	if r.stopServe == nil {
		return nil
	}
	r.stopServe()
	r.stopServe = nil
	return <-r.served
}

// refusedMethod is the CRI event stream, as crisim's fault injection names
// it, and its full gRPC name, as Calls counts it.
const (
	refusedMethod     = "GetContainerEvents"
	refusedFullMethod = "/runtime.v1.RuntimeService/GetContainerEvents"
)

// refuser makes the runtime refuse every new CRI event stream with
// codes.Unavailable, while its other calls answer, by keeping one
// injected failure queued ahead of the calls made. Its methods are called
// from one goroutine.
type refuser struct {
	rt     *simRuntime
	base   int // calls made before the refusals began
	queued int // failures queued since
}

// refuseStreams ends the open event streams and refuses new ones until
// the returned refuser's end.
func (r *simRuntime) refuseStreams() (*refuser, int) {
	f := &refuser{rt: r, base: r.srv.Calls()[refusedFullMethod]}
	f.topUp()
	return f, r.srv.DropStreams()
}

// topUp queues a failure for each call made since the last topUp, so that
// the next call fails too. Called often enough (every few milliseconds; the
// bridge reconnects at most twice a second while refused), no call is
// served in between.
func (f *refuser) topUp() int {
	made := f.rt.srv.Calls()[refusedFullMethod] - f.base
	for f.queued < made+1 {
		f.rt.srv.FailNext(refusedMethod, codes.Unavailable)
		f.queued++
	}
	return made
}

// end stops refusing: it takes the failures still queued with calls of its
// own, so that the bridge's next attempt is served. It returns how many
// calls the bridge made while refused.
func (f *refuser) end(ctx context.Context) (int, error) {
	made := f.topUp()
	conn, err := grpc.NewClient("unix://"+f.rt.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return made, fmt.Errorf("connect to the simulated runtime: %w", err)
	}
	defer conn.Close()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	for range f.queued - made {
		// A failure the bridge took meanwhile leaves this call a real
		// stream, which the timeout ends.
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := client.GetContainerEvents(cctx, &runtimeapi.GetEventsRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		cancel()
		if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
			return made, fmt.Errorf("take a queued refusal of the event stream: %w", err)
		}
	}
	return made, nil
}
