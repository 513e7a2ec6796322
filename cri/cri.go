package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// DefaultEndpoints are the sockets probed, in order, when no endpoint is
// configured: containerd's, then CRI-O's (crictl's order, without dockershim).
var DefaultEndpoints = []string{
	"unix:///run/containerd/containerd.sock",
	"unix:///run/crio/crio.sock",
	"unix:///var/run/crio/crio.sock",
}

const (
	// DefaultMaxRecvMsgSize lets one ListContainers response of a node with
	// tens of thousands of containers through; gRPC's 4 MiB default breaks at
	// about 4,250 containers.
	DefaultMaxRecvMsgSize = 64 << 20
	// DefaultTimeout bounds every unary CRI call. A full listing of a very
	// large node takes well under a second; a runtime that does not answer
	// within this is treated as down for that relist.
	DefaultTimeout = 30 * time.Second
	// criBaseBackoff and criMaxBackoff bound the reconnect backoff after
	// the runtime restarts, so that the bridge is back within a second of
	// the runtime: with containerd 1.7, which keeps no event for an absent
	// subscriber, a container that lives and goes before the bridge is back
	// cannot be reported. A unix socket's connect costs next to nothing.
	criBaseBackoff = 100 * time.Millisecond
	criMaxBackoff  = time.Second
	// criStreamWindow and criConnWindow are the connection's fixed HTTP/2
	// flow-control windows. Fixing them turns gRPC's bandwidth estimator
	// off: left on, it answers nearly every data frame that comes after a
	// quiet moment with a window update and a PING, which the runtime must
	// answer, so that each event of a node's stream costs both processes
	// an extra write, read and wake-up (found in a runtime trace of
	// pleg-bench's latency rows; a quarter of the runtime's CPU at 1,000
	// events a second). Over a unix
	// socket these windows are far more than a listing needs to flow at
	// full speed; they also bound what the runtime may send ahead of what
	// the bridge has read.
	criStreamWindow = 4 << 20
	criConnWindow   = 8 << 20
)

// ErrNoEndpoint is returned by DiscoverEndpoint when none of the default
// sockets exists.
var ErrNoEndpoint = errors.New("no CRI socket found")

// ParseEndpoint turns a CRI endpoint in crictl's form (unix:///path) or a bare
// socket path into the socket path. Other schemes are refused with an error
// naming the endpoint.
func ParseEndpoint(endpoint string) (string, error) {
	if endpoint == "" {
		return "", errors.New("empty CRI endpoint")
	}
	if !strings.Contains(endpoint, "://") {
		endpoint = strings.TrimPrefix(endpoint, "unix:")
		return filepath.Clean(endpoint), nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("parse CRI endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "unix" {
		return "", fmt.Errorf("CRI endpoint %q: scheme %q is not supported, use unix:///path/to.sock", endpoint, u.Scheme)
	}
	p := u.Path
	if u.Host != "" { // unix://relative/path
		p = u.Host + u.Path
	}
	if p == "" {
		return "", fmt.Errorf("CRI endpoint %q has no socket path", endpoint)
	}
	return filepath.Clean(p), nil
}

// DiscoverEndpoint returns the first of DefaultEndpoints whose socket
// exists, or ErrNoEndpoint.
func DiscoverEndpoint() (string, error) {
	for _, ep := range DefaultEndpoints {
		p, err := ParseEndpoint(ep)
		if err != nil {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return ep, nil
		}
	}
	return "", fmt.Errorf("%w (tried %s)", ErrNoEndpoint, strings.Join(DefaultEndpoints, ", "))
}

// Options configures the CRI client.
type Options struct {
	// MaxRecvMsgSize is the largest response accepted; zero means
	// DefaultMaxRecvMsgSize.
	MaxRecvMsgSize int
	// Timeout bounds each unary call; zero means DefaultTimeout.
	Timeout time.Duration
	// PodAnnotations are the only sandbox annotations ListPodSandbox
	// returns: set it to the generator's Options.PodAnnotations.
	PodAnnotations []string
}

// Client is the Runtime backed by a CRI runtime.v1 RuntimeService over a
// unix socket. It is the only code that touches the generated gRPC client, and
// it only calls read methods; the connection's interceptors refuse any other
// with codes.PermissionDenied before it is sent (readonly.go). The connection
// is established lazily and re-established with capped backoff after the
// runtime restarts; calls made while the runtime is down fail with
// codes.Unavailable. Safe for concurrent use.
//
// ListPodSandbox and ListContainers return only what the generator reads
// (see listCodec): containers without annotations and with only the
// kubelet's identity labels, sandboxes with their labels and the
// annotations in Options.PodAnnotations. The items of one listing share
// strings and label maps, and an item that did not change since the last
// full listing is that listing's (listMemo): they are read-only.
type Client struct {
	conn    *grpc.ClientConn
	client  runtimeapi.RuntimeServiceClient
	timeout time.Duration
	codec   listCodec
	lists   grpc.CallOption // decodes a filtered listing with listCodec
	// fullLists decodes a full listing (no filter), which may replace the
	// memos that both read (see listMemo).
	fullLists grpc.CallOption
	frames    *framePool // the connection's receive buffers
	memos     *listMemos
}

var _ generator.Runtime = (*Client)(nil)

// NewClient prepares a client for endpoint (see ParseEndpoint). It does not
// connect; the first call does. Close releases it.
func NewClient(endpoint string, opts Options) (*Client, error) {
	path, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if opts.MaxRecvMsgSize <= 0 {
		opts.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	pool := &framePool{}
	bo := backoff.DefaultConfig
	bo.BaseDelay, bo.MaxDelay = criBaseBackoff, criMaxBackoff
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxRecvMsgSize)),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}),
		grpc.WithChainUnaryInterceptor(readOnlyUnary),
		grpc.WithChainStreamInterceptor(readOnlyStream),
		grpc.WithStaticStreamWindowSize(criStreamWindow),
		grpc.WithStaticConnWindowSize(criConnWindow),
		// A bounded pool: see framePool.
		experimental.WithBufferPool(pool),
	)
	if err != nil {
		return nil, fmt.Errorf("create CRI client for %q: %w", endpoint, err)
	}
	codec, memos := newListCodec(opts.PodAnnotations), &listMemos{}
	return &Client{conn: conn, client: runtimeapi.NewRuntimeServiceClient(conn), timeout: opts.Timeout, frames: pool, memos: memos, codec: codec,
		lists:     grpc.ForceCodecV2(codec.withMemos(memos, false)),
		fullLists: grpc.ForceCodecV2(codec.withMemos(memos, true)),
	}, nil
}

// ReuseListings makes the listings from now on reuse what the last full
// listing decoded (listMemo) and the buffers it was read into (framePool):
// a steady relist then decodes and allocates little. Both cost memory that
// lives on (about 1 KB a container, and up to 8 MiB of buffers), which the
// bridge should not carry through its first relist, its memory peak: it
// calls this once that relist's events are acked.
func (c *Client) ReuseListings() {
	c.memos.arm()
	c.frames.grow()
}

// ListedItems returns how many items (containers and sandboxes) the
// listings decoded, and how many they took unchanged from the last full
// listing (see ReuseListings), since the client was made.
func (c *Client) ListedItems() (decoded, reused uint64) {
	return c.memos.counts.decoded.Load(), c.memos.counts.reused.Load()
}

// ListingVersion implements Listings (see listMemos.version).
func (c *Client) ListingVersion() (uint64, bool) { return c.memos.version() }

var _ generator.Listings = (*Client)(nil)

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Version implements Runtime.
func (c *Client) Version(ctx context.Context) (*runtimeapi.VersionResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return nil, fmt.Errorf("get runtime version: %w", err)
	}
	return resp, nil
}

// ListPodSandbox implements Runtime.
func (c *Client) ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: filter}, c.listing(filter == nil))
	if err != nil {
		return nil, fmt.Errorf("list pod sandboxes: %w", err)
	}
	return resp.GetItems(), nil
}

// listing returns the codec option of a listing, full or filtered.
func (c *Client) listing(full bool) grpc.CallOption {
	if full {
		return c.fullLists
	}
	return c.lists
}

// ListContainers implements Runtime.
func (c *Client) ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: filter}, c.listing(filter == nil))
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	return resp.GetContainers(), nil
}

// ContainerStatus implements Runtime.
func (c *Client) ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil, fmt.Errorf("get status of container %s: %w", id, err)
	}
	if resp.GetStatus() == nil {
		return nil, fmt.Errorf("get status of container %s: runtime returned no status", id)
	}
	return resp.GetStatus(), nil
}

// WatchEvents implements Runtime. A stream the runtime ends cleanly is
// reported as io.ErrUnexpectedEOF wrapped: for the caller it means "reconnect
// and relist", like codes.Unavailable.
func (c *Client) WatchEvents(ctx context.Context, fn func(*runtimeapi.ContainerEventResponse)) error {
	stream, err := c.client.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{}, grpc.ForceCodecV2(c.codec.forStream()))
	if err != nil {
		return fmt.Errorf("open container event stream: %w", err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("receive container event: stream closed by runtime: %w", io.ErrUnexpectedEOF)
			}
			return fmt.Errorf("receive container event: %w", err)
		}
		fn(ev)
	}
}
