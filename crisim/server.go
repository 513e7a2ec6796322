package crisim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultMaxMsgSize is the default send and receive limit of a Server: a
// ListContainers answer for 30,000 containers is around 15 MiB, well over
// gRPC's 4 MiB default.
const DefaultMaxMsgSize = 64 << 20

// shutdownGrace is how long Serve waits for calls in flight (an injected
// latency, a stream blocked on a client that does not read) before it closes
// the connections.
const shutdownGrace = 5 * time.Second

// Reasons a Server ends an event stream; the client sees codes.Unavailable.
var (
	errStreamsDropped = errors.New("crisim: event streams dropped")
	errServerStopping = errors.New("crisim: server shutting down")
)

// ServerOptions configures a Server.
type ServerOptions struct {
	// MaxSendMsgSize and MaxRecvMsgSize are the gRPC message size limits;
	// 0 means DefaultMaxMsgSize.
	MaxSendMsgSize int
	MaxRecvMsgSize int
}

// Server serves a Runtime as a CRI RuntimeService (runtime.v1) over gRPC.
// It implements the read methods the bridge uses (Version, Status,
// ListPodSandbox, PodSandboxStatus, ListContainers, ContainerStatus,
// GetContainerEvents); every other method answers codes.Unimplemented. It
// counts every call and can inject faults: an error on the next call of a
// method, latency, and dropped event streams.
//
// GetContainerEvents streams the Runtime's events (see Runtime.Subscribe)
// until the client goes away; DropStreams, the end of Serve and a
// subscriber too slow for its buffer end it with codes.Unavailable. The
// server sends the response headers once it has subscribed, so a client that
// waits for them (ClientStream.Header) misses no event emitted afterwards.
//
// The fault injection methods and Calls are safe for concurrent use, also
// while Serve runs. One Server may Serve several listeners, one after the
// other (a runtime restart) or at once; faults and counts are shared.
type Server struct {
	rt   *Runtime
	opts ServerOptions

	mu       sync.Mutex
	calls    map[string]int           // by full method name; guarded by mu
	mutating []string                 // full method names, in call order; guarded by mu
	failNext map[string][]codes.Code  // by short method name; guarded by mu
	latency  map[string]time.Duration // by short method name; guarded by mu
	streams  map[*openStream]struct{} // open GetContainerEvents calls; guarded by mu
}

// serving is one Serve call.
type serving struct {
	stopping bool // guarded by Server.mu
}

type openStream struct {
	srv    *serving
	cancel context.CancelCauseFunc
}

// NewServer returns a Server for rt. It does not listen yet: see Listen and
// Serve.
func NewServer(rt *Runtime, opts ServerOptions) *Server {
	if opts.MaxSendMsgSize <= 0 {
		opts.MaxSendMsgSize = DefaultMaxMsgSize
	}
	if opts.MaxRecvMsgSize <= 0 {
		opts.MaxRecvMsgSize = DefaultMaxMsgSize
	}
	return &Server{
		rt:       rt,
		opts:     opts,
		calls:    make(map[string]int),
		failNext: make(map[string][]codes.Code),
		latency:  make(map[string]time.Duration),
		streams:  make(map[*openStream]struct{}),
	}
}

// Listen listens on the unix socket at socketPath, first removing a stale
// socket file left there. Clients can connect as soon as it returns, before
// Serve runs: the kernel queues them. Closing the listener (Serve does)
// removes the socket file. It refuses to remove anything but a socket.
func Listen(socketPath string) (net.Listener, error) {
	fi, err := os.Lstat(socketPath)
	switch {
	case err == nil && fi.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("listen on %s: file exists and is not a socket", socketPath)
	case err == nil:
		if err := os.Remove(socketPath); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	lis, err := net.Listen("unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	return lis, nil
}

// Serve serves CRI on lis until ctx is done, then ends the open event
// streams with codes.Unavailable (as a runtime that stops does), waits up to
// 5 seconds for the calls in flight, and closes lis, which removes its
// socket file. It returns nil after a shutdown through ctx, or the error
// that made accepting connections fail.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	srv := &serving{}
	gs := grpc.NewServer(
		grpc.MaxSendMsgSize(s.opts.MaxSendMsgSize),
		grpc.MaxRecvMsgSize(s.opts.MaxRecvMsgSize),
		grpc.ChainUnaryInterceptor(s.interceptUnary),
		grpc.ChainStreamInterceptor(s.interceptStream),
	)
	runtimeapi.RegisterRuntimeServiceServer(gs, &service{srv: s, serving: srv})
	if strings.Contains(strings.ToLower(s.rt.Version().GetRuntimeName()), "containerd") {
		// containerd serves its own API, its event service among it, on the
		// CRI socket.
		eventsapi.RegisterEventsServer(gs, &eventsService{srv: s, serving: srv})
	}

	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	var serveErr error
	select {
	case serveErr = <-errc:
	case <-ctx.Done():
	}
	s.endStreams(srv, errServerStopping)
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	grace := time.NewTimer(shutdownGrace)
	defer grace.Stop()
	select {
	case <-stopped:
	case <-grace.C:
		gs.Stop()
		<-stopped
	}
	if serveErr == nil {
		serveErr = <-errc
	}
	if serveErr != nil {
		return fmt.Errorf("serve CRI: %w", serveErr)
	}
	return nil
}

// FailNext makes the next call of method (a short name such as
// "ListContainers" or "GetContainerEvents") fail with code. Calls queue up:
// FailNext twice fails the next two calls.
func (s *Server) FailNext(method string, code codes.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext[method] = append(s.failNext[method], code)
}

// SetLatency delays every call of method (a short name) by d before it is
// served, or until the caller's deadline; 0 removes the delay.
func (s *Server) SetLatency(method string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d <= 0 {
		delete(s.latency, method)
		return
	}
	s.latency[method] = d
}

// DropStreams ends every open GetContainerEvents stream and containerd
// event subscription with
// codes.Unavailable and returns how many it ended. Clients may reconnect at
// once.
func (s *Server) DropStreams() int {
	return s.endStreams(nil, errStreamsDropped)
}

// Calls returns how often each method was called, by full method name
// ("/runtime.v1.RuntimeService/ListContainers"), failed and unimplemented
// calls included.
func (s *Server) Calls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.calls)
}

// MutatingCalls returns the full method names of the calls, in order, that
// were not read-only (see IsReadOnly), whether they succeeded or not. The
// bridge must never make one.
func (s *Server) MutatingCalls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.mutating)
}

// IsReadOnly reports whether the RuntimeService method (a short name such as
// "ListContainers") only reads: Version, Status, the List, Stream and Status
// methods, the stats and metrics methods, RuntimeConfig and
// GetContainerEvents, and containerd's Events/Subscribe. Everything else changes the node or runs something in
// a container.
func IsReadOnly(method string) bool {
	switch method {
	case "Version", "Status", "RuntimeConfig", "GetContainerEvents", "Subscribe",
		"ListPodSandbox", "ListContainers", "StreamPodSandboxes", "StreamContainers",
		"PodSandboxStatus", "ContainerStatus",
		"ContainerStats", "ListContainerStats", "StreamContainerStats",
		"PodSandboxStats", "ListPodSandboxStats", "StreamPodSandboxStats",
		"ListMetricDescriptors", "ListPodSandboxMetrics", "StreamPodSandboxMetrics":
		return true
	}
	return false
}

// endStreams cancels the open event streams of srv (nil: of every Serve)
// with cause. For a Serve that is stopping, later streams end at once.
func (s *Server) endStreams(srv *serving, cause error) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if srv != nil {
		srv.stopping = true
	}
	n := 0
	for st := range s.streams {
		if srv == nil || st.srv == srv {
			st.cancel(cause)
			delete(s.streams, st)
			n++
		}
	}
	return n
}

// addStream registers an open event stream; it returns false if its Serve
// is stopping.
func (s *Server) addStream(st *openStream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.srv.stopping {
		return false
	}
	s.streams[st] = struct{}{}
	return true
}

func (s *Server) removeStream(st *openStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.streams, st)
}

func (s *Server) interceptUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := s.beforeCall(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (s *Server) interceptStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := s.beforeCall(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// beforeCall counts the call, then applies its latency and injected failure.
func (s *Server) beforeCall(ctx context.Context, fullMethod string) error {
	method := path.Base(fullMethod)
	s.mu.Lock()
	s.calls[fullMethod]++
	if !IsReadOnly(method) {
		s.mutating = append(s.mutating, fullMethod)
	}
	delay := s.latency[method]
	fail, failing := codes.OK, false
	if q := s.failNext[method]; len(q) > 0 {
		fail, failing = q[0], true
		s.failNext[method] = q[1:]
	}
	s.mu.Unlock()

	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	if failing {
		return status.Errorf(fail, "crisim: injected failure of %s", method)
	}
	return nil
}

// service is the gRPC face of a Runtime for one Serve call.
type service struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	srv     *Server
	serving *serving
}

func (svc *service) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return svc.srv.rt.Version(), nil
}

func (svc *service) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return svc.srv.rt.Status(), nil
}

func (svc *service) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: svc.srv.rt.ListPodSandbox(req.GetFilter())}, nil
}

func (svc *service) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	return svc.srv.rt.PodSandboxStatus(req.GetPodSandboxId())
}

func (svc *service) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: svc.srv.rt.ListContainers(req.GetFilter())}, nil
}

func (svc *service) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	st, err := svc.srv.rt.ContainerStatus(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ContainerStatusResponse{Status: st}, nil
}

// GetContainerEvents: see the Server type.
func (svc *service) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	st := &openStream{srv: svc.serving, cancel: cancel}
	if !svc.srv.addStream(st) {
		return status.Error(codes.Unavailable, errServerStopping.Error())
	}
	defer svc.srv.removeStream(st)

	sub := svc.srv.rt.subscribeShared(ctx) // the stream only marshals the events
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	for ev := range sub.Events() {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	return streamEnd(stream.Context(), sub.Err())
}

// streamEnd is how an event stream whose subscription ended with err ends:
// codes.Unavailable when the server dropped it, stopped or found the
// subscriber too slow, as a runtime does; else the client's cancellation.
func streamEnd(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, errStreamsDropped), errors.Is(err, errServerStopping), errors.Is(err, ErrSlowSubscriber):
		return status.Error(codes.Unavailable, err.Error())
	default:
		return status.FromContextError(ctx.Err()).Err()
	}
}
