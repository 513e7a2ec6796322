package soak

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/natsembed"
)

// natsAccount is the account streams live in on servers without accounts
// configured.
const natsAccount = "$G"

// natsSetup is the soak's NATS: one embedded server or a cluster of three.
// Its methods are called from the schedule's goroutine only.
type natsSetup struct {
	logger *slog.Logger

	// One server: restarted on the same port and store, so the bridge
	// reconnects to the URL it was given.
	single     *server.Server
	singleOpts natsembed.Options

	cluster *natsembed.Cluster
	urls    []string // every server's client URL, fixed at start
}

// startNATS starts NATS with JetStream, its store under dir.
func startNATS(dir string, cluster bool, logger *slog.Logger) (*natsSetup, error) {
	n := &natsSetup{logger: logger}
	if cluster {
		c, err := natsembed.StartCluster(natsembed.ClusterOptions{Servers: 3, DataDir: dir, Name: "soak"})
		if err != nil {
			return nil, err
		}
		n.cluster, n.urls = c, c.URLs()
		return n, nil
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	n.singleOpts = natsembed.Options{DataDir: dir, Host: "127.0.0.1", Port: port, ServerName: "soak"}
	if n.single, err = natsembed.Start(n.singleOpts); err != nil {
		return nil, err
	}
	n.urls = []string{n.single.ClientURL()}
	return n, nil
}

// describe says what runs, for the report.
func (n *natsSetup) describe() string {
	if n.cluster != nil {
		return "NATS cluster of 3 servers, stream replicas 3"
	}
	return "one NATS server"
}

// replicas is the stream's replica count for this setup.
func (n *natsSetup) replicas() int {
	if n.cluster != nil {
		return 3
	}
	return 1
}

// stopAll stops every server, as a crash looks to clients.
func (n *natsSetup) stopAll() {
	if n.cluster != nil {
		for i := range n.urls {
			n.cluster.Stop(i)
		}
		return
	}
	n.single.Shutdown()
	n.single.WaitForShutdown()
}

// startAll starts every server again with its store and ports. The servers
// of a cluster start together: none can be ready before a quorum is.
func (n *natsSetup) startAll() error {
	if n.cluster != nil {
		var eg errgroup.Group
		for i := range n.urls {
			eg.Go(func() error { return n.cluster.Restart(i) })
		}
		return eg.Wait()
	}
	s, err := natsembed.Start(n.singleOpts)
	if err != nil {
		return fmt.Errorf("restart nats server: %w", err)
	}
	n.single = s
	return nil
}

// indexes returns the servers' indexes.
func (n *natsSetup) indexes() []int {
	out := make([]int, len(n.urls))
	for i := range out {
		out[i] = i
	}
	return out
}

// storeDir returns server i's store directory.
func (n *natsSetup) storeDir(i int) string {
	if n.cluster != nil {
		return n.cluster.StoreDir(i)
	}
	return n.singleOpts.DataDir
}

// stop stops server i, as a crash looks to clients.
func (n *natsSetup) stop(i int) {
	if n.cluster != nil {
		n.cluster.Stop(i)
		return
	}
	n.single.Shutdown()
	n.single.WaitForShutdown()
}

// stopTogether stops the servers is at the same moment, as a power loss
// does: one stopped before the others would leave them a quorum that
// stores what it lacks.
func (n *natsSetup) stopTogether(is []int) {
	var eg errgroup.Group
	for _, i := range is {
		eg.Go(func() error { n.stop(i); return nil })
	}
	_ = eg.Wait()
}

// start starts the servers is again, on their ports and stores; a
// cluster's together, since one waits for a quorum.
func (n *natsSetup) start(is ...int) error {
	if n.cluster == nil {
		return n.startAll()
	}
	var eg errgroup.Group
	for _, i := range is {
		eg.Go(func() error { return n.cluster.Restart(i) })
	}
	return eg.Wait()
}

// shutdown stops NATS for good.
func (n *natsSetup) shutdown() {
	if n.cluster != nil {
		n.cluster.Shutdown()
		return
	}
	n.single.Shutdown()
	n.single.WaitForShutdown()
}

// freePort returns a loopback TCP port that was free a moment ago. A port
// chosen so is kept for restarts, so clients reconnect to the same URL.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("choose a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
