package fleet

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/harness/proc"
)

// clusterName names the NATS cluster; its servers are <clusterName>-<i>.
const clusterName = "fleet"

// servers is the NATS cluster: three nats-server processes on loopback,
// each a child of the harness, so that their memory and CPU are their own.
// Ports and stores are chosen once and kept across restarts. Its methods
// are called from the schedule's goroutine, but for procs, which is fixed.
type servers struct {
	procs []*proc.Process
	urls  []string // client URLs, in index order
	dirs  []string // store directories, in index order
}

// newServers chooses the ports of n servers and describes them; none runs
// yet. dir holds their stores and logs.
func newServers(n int, dir string, command []string, syncInterval string) (*servers, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create the servers' directory: %w", err)
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var routes []string
	for i := range n {
		routes = append(routes, "nats-route://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[n+i])))
	}
	s := &servers{}
	for i := range n {
		name := fmt.Sprintf("%s-%d", clusterName, i)
		spec := &serverSpec{
			Name: name, Cluster: clusterName, ClientPort: ports[i], ClusterPort: ports[n+i],
			Routes: routes, StoreDir: filepath.Join(dir, name), SyncInterval: syncInterval,
		}
		p, err := newProcess(name, command, childSpec{Role: roleServer, Server: spec}, filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		s.procs = append(s.procs, p)
		s.urls = append(s.urls, "nats://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i])))
		s.dirs = append(s.dirs, spec.StoreDir)
	}
	return s, nil
}

// freePorts returns n distinct loopback ports that were free a moment ago.
// The listeners are all open at once, so the ports differ; a server that
// loses one to another process in the moment between fails with the port
// named.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("choose a port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startAll starts every server at once, none can be ready before a quorum
// is, and waits until each is a current member of the meta group.
func (s *servers) startAll(ctx context.Context) error {
	var eg errgroup.Group
	for _, p := range s.procs {
		eg.Go(func() error { return p.StartReady(ctx, serverReadyTimeout) })
	}
	return eg.Wait()
}

// stopAll stops every server with SIGTERM, as an operator stops the
// cluster: each flushes its store and closes its connections.
func (s *servers) stopAll() error {
	var eg errgroup.Group
	for _, p := range s.procs {
		eg.Go(func() error { return p.Stop(proc.Term) })
	}
	return eg.Wait()
}

// restart stops server i with SIGTERM and starts it again; it returns how
// long it was down, until it was a current member of the meta group again.
func (s *servers) restart(ctx context.Context, i int) (time.Duration, error) {
	down := time.Now()
	if err := s.procs[i].Stop(proc.Term); err != nil {
		return 0, err
	}
	if err := s.procs[i].StartReady(ctx, serverReadyTimeout); err != nil {
		return 0, err
	}
	return time.Since(down), nil
}

// shutdown kills every server that still runs.
func (s *servers) shutdown() {
	for _, p := range s.procs {
		p.Kill()
	}
}
