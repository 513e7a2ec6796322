package soak

import (
	"context"
	"fmt"

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
