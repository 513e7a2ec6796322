package natsembed

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// clusterReadyTimeout bounds the wait for a cluster (or a restarted server)
// to be usable: every server accepting clients and a meta leader that sees
// every running server. An election on loopback takes well under a second;
// a CI machine under -race a few; longer means the routes are wrong.
const clusterReadyTimeout = 30 * time.Second

// clusterPollInterval is how often the readiness of a cluster is polled.
// The server offers no notification of a meta leader election, so the
// helper polls; it is short because elections are fast on loopback.
const clusterPollInterval = 5 * time.Millisecond

// ClusterOptions configures StartCluster.
type ClusterOptions struct {
	// Servers is the number of servers; 3 when 0. JetStream needs a quorum,
	// so a cluster of 3 survives the loss of one server.
	Servers int
	// DataDir holds one store directory per server. Required.
	DataDir string
	// Name is the cluster name; "pleg" when empty.
	Name string
	// Logger, if set, receives the servers' log, tagged with the server
	// name: notices at Info, warnings at Warn, errors at Error. Nil: the
	// servers log nothing.
	Logger *slog.Logger
}

// Cluster is a JetStream cluster of in-process servers on loopback, for
// tests and benchmarks of what happens when servers fail: a server can be
// stopped (to its clients, a crash) and started again with its store and
// ports. Its methods are safe for concurrent use.
type Cluster struct {
	opts ClusterOptions
	// routes lists every server's route URL, fixed at start, so a restarted
	// server finds the others and they find it on the same address.
	routes []*url.URL

	mu sync.Mutex
	// servers holds the current server of each index; a stopped server
	// stays in place (not running) until Restart replaces it. guarded by mu
	servers []*server.Server
	// ports holds each server's client and cluster port, chosen at the
	// first start and kept across restarts. guarded by mu
	ports []clusterPorts
}

type clusterPorts struct{ client, cluster int }

// StartCluster starts opts.Servers servers with JetStream, each routed to
// all others over 127.0.0.1, and waits until they accept clients and a meta
// leader sees all of them, so a stream with as many replicas as servers can
// be created at once. The caller stops them with Shutdown. It returns an
// error naming what failed; servers already started are shut down then.
func StartCluster(opts ClusterOptions) (*Cluster, error) {
	if opts.DataDir == "" {
		return nil, errors.New("start nats cluster: data dir is empty")
	}
	if opts.Servers == 0 {
		opts.Servers = 3
	}
	if opts.Servers < 0 {
		return nil, fmt.Errorf("start nats cluster: servers %d is negative", opts.Servers)
	}
	if opts.Name == "" {
		opts.Name = "pleg"
	}
	// Every route must be known before the first server starts: JetStream
	// sizes its meta group from the configured routes, and a server only
	// ever dials the routes it was given. So the cluster ports are chosen
	// up front, by listening on port 0 and closing; the window in which
	// another process could take a port between that close and the
	// server's listen is tiny on loopback, and a start that loses that
	// race fails with the port named, not silently.
	routePorts, err := freePorts(opts.Servers)
	if err != nil {
		return nil, fmt.Errorf("start nats cluster: %w", err)
	}
	c := &Cluster{
		opts:    opts,
		servers: make([]*server.Server, opts.Servers),
		ports:   make([]clusterPorts, opts.Servers),
	}
	for i, p := range routePorts {
		c.routes = append(c.routes, &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p))})
		// The client port is picked by the server (-1) at the first start
		// and kept afterwards.
		c.ports[i] = clusterPorts{client: -1, cluster: p}
	}
	for i := range opts.Servers {
		if err := c.start(i); err != nil {
			c.Shutdown()
			return nil, fmt.Errorf("start nats cluster: %w", err)
		}
	}
	if err := c.waitReady(-1); err != nil {
		c.Shutdown()
		return nil, fmt.Errorf("start nats cluster: %w", err)
	}
	return c, nil
}

// freePorts returns n distinct loopback ports that were free a moment ago.
// The listeners are all open at once, so the ports differ.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("choose a route port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (c *Cluster) serverName(i int) string {
	return fmt.Sprintf("%s-%d", c.opts.Name, i)
}

// start starts server i with its ports and store, and waits until it
// accepts clients.
func (c *Cluster) start(i int) error {
	c.mu.Lock()
	ports := c.ports[i]
	c.mu.Unlock()
	name := c.serverName(i)
	so := &server.Options{
		// The server name is also its JetStream peer identity: a restarted
		// server must keep it to take its place in the groups again.
		ServerName: name,
		Host:       "127.0.0.1",
		Port:       ports.client,
		JetStream:  true,
		StoreDir:   filepath.Join(c.opts.DataDir, name),
		Cluster: server.ClusterOpts{
			Name: c.opts.Name,
			Host: "127.0.0.1",
			Port: ports.cluster,
		},
		// Every server gets every route, its own included (a server skips
		// itself), so all have the same expected meta group size.
		Routes: c.routes,
		NoSigs: true,
		NoLog:  c.opts.Logger == nil,
	}
	s, err := server.NewServer(so)
	if err != nil {
		return fmt.Errorf("create server %s: %w", name, err)
	}
	if c.opts.Logger != nil {
		s.SetLoggerV2(&serverLogger{log: c.opts.Logger.With("component", "nats-server", "server", name)}, false, false, false)
	}
	s.Start()
	if !s.ReadyForConnections(clusterReadyTimeout) {
		s.Shutdown()
		s.WaitForShutdown()
		return fmt.Errorf("start server %s (client port %d, route port %d): not ready for connections after %s",
			name, ports.client, ports.cluster, clusterReadyTimeout)
	}
	c.mu.Lock()
	c.servers[i] = s
	c.ports[i].client = s.Addr().(*net.TCPAddr).Port
	c.mu.Unlock()
	return nil
}

// waitReady waits until a meta leader sees every running server with
// JetStream, and (when current >= 0) server current is a current member of
// the meta group.
func (c *Cluster) waitReady(current int) error {
	deadline := time.Now().Add(clusterReadyTimeout)
	for {
		leader, seen, running := c.metaView()
		ok := leader >= 0 && seen >= running
		if ok && current >= 0 {
			ok = c.Server(current).JetStreamIsCurrent()
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("wait for jetstream meta group: after %s the meta leader is server %d and sees %d of %d running servers",
				clusterReadyTimeout, leader, seen, running)
		}
		time.Sleep(clusterPollInterval)
	}
}

// metaView returns the meta leader's index (-1 if none), how many servers
// it sees online with JetStream, and how many servers are running.
func (c *Cluster) metaView() (leader, seen, running int) {
	leader = -1
	for i, s := range c.snapshot() {
		if !s.Running() {
			continue
		}
		running++
		if s.JetStreamIsLeader() {
			leader = i
			seen = len(s.JetStreamClusterPeers())
		}
	}
	return leader, seen, running
}

func (c *Cluster) snapshot() []*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*server.Server(nil), c.servers...)
}

// URLs returns the client URLs of the running servers, in index order.
func (c *Cluster) URLs() []string {
	var urls []string
	for _, s := range c.snapshot() {
		if s != nil && s.Running() {
			urls = append(urls, s.ClientURL())
		}
	}
	return urls
}

// Server returns server i: the running one, or the last one stopped.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i]
}

// StreamLeader returns the index of the running server that leads stream
// of account ("$G" without accounts configured), or -1 if none does, as
// during an election.
func (c *Cluster) StreamLeader(account, stream string) int {
	for i, s := range c.snapshot() {
		if s.Running() && s.JetStreamIsStreamLeader(account, stream) {
			return i
		}
	}
	return -1
}

// MetaLeader returns the index of the running server that leads the
// JetStream meta group, or -1 if none does.
func (c *Cluster) MetaLeader() int {
	leader, _, _ := c.metaView()
	return leader
}

// WaitMetaLeader waits until a running server leads the JetStream meta
// group and returns its index. After the meta leader is stopped, the others
// elect a new one within a few seconds; publishing to a stream does not
// wait for that, so a caller that needs the new leader waits here. It
// returns an error after the cluster's ready timeout.
func (c *Cluster) WaitMetaLeader() (int, error) {
	deadline := time.Now().Add(clusterReadyTimeout)
	for {
		if leader := c.MetaLeader(); leader >= 0 {
			return leader, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("wait for a jetstream meta leader: none after %s", clusterReadyTimeout)
		}
		time.Sleep(clusterPollInterval)
	}
}

// StoreDir returns the store directory of server i: what a test that
// rolls a server's store back copies while the server is stopped.
func (c *Cluster) StoreDir(i int) string {
	return filepath.Join(c.opts.DataDir, c.serverName(i))
}

// Stop shuts server i down and waits until it stopped. To its clients and
// its peers that is a crash: connections and routes drop, nothing is
// handed over. Stopping a stopped server does nothing.
func (c *Cluster) Stop(i int) {
	s := c.Server(i)
	s.Shutdown()
	s.WaitForShutdown()
}

// Restart starts server i again, with its store, name and ports, and waits
// until it accepts clients and is a current member of the meta group again.
// Its streams may still be catching up when Restart returns. It returns an
// error if server i is running or does not come back.
func (c *Cluster) Restart(i int) error {
	if c.Server(i).Running() {
		return fmt.Errorf("restart server %s: it is running", c.serverName(i))
	}
	if err := c.start(i); err != nil {
		return fmt.Errorf("restart server: %w", err)
	}
	if err := c.waitReady(i); err != nil {
		return fmt.Errorf("restart server %s: %w", c.serverName(i), err)
	}
	return nil
}

// Shutdown stops every server and waits until they stopped.
func (c *Cluster) Shutdown() {
	for _, s := range c.snapshot() {
		if s != nil {
			s.Shutdown()
		}
	}
	for _, s := range c.snapshot() {
		if s != nil {
			s.WaitForShutdown()
		}
	}
}

// serverLogger passes a server's log to slog. The servers run without
// debug and trace logging (the logger is set so), so only notices, warnings
// and errors arrive, and they are rare: formatting each is cheap enough.
type serverLogger struct{ log *slog.Logger }

func (l *serverLogger) Noticef(format string, v ...any) { l.log.Info(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Tracef(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
