package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/harness/proc"
)

// ChildEnv is the environment variable that carries a child's spec (JSON)
// to the command that runs RunChild: Options.ChildCommand.
const ChildEnv = "PLEG_FLEET_CHILD"

// Roles of a child process.
const (
	roleServer  = "server"  // one nats-server of the cluster
	roleBridges = "bridges" // a group of bridges, one per simulated node
	roleRaw     = "raw"     // the raw publisher, the baseline of publish→ack
)

// requestDropped asks a bridges child for its dropped events too, and
// requestAcks for its publish→ack histogram: each costs a gather of every
// bridge's registry. Any other line asks for the pending events only.
const (
	requestDropped = "dropped"
	requestAcks    = "acks"
)

// Bounds of a child's start.
const (
	// serverReadyTimeout bounds the wait for a server to accept clients and
	// be a current member of the JetStream meta group; its peers start at
	// the same time, or are running.
	serverReadyTimeout = time.Minute
	// readyPoll is how often a child looks whether it is ready. Neither
	// nats-server nor the bridge offers a notification of it.
	readyPoll = 20 * time.Millisecond
)

// childSpec says what a child process is.
type childSpec struct {
	Role    string
	Server  *serverSpec  `json:",omitempty"`
	Bridges *bridgesSpec `json:",omitempty"`
	Raw     *rawSpec     `json:",omitempty"`
}

// newProcess describes the child process spec says, run by command (the
// harness's own program, Options.ChildCommand) with spec in ChildEnv, its
// stderr appended to logPath; it does not start it. The child speaks the
// protocol of RunChild, which proc.Process's StartReady and Request speak.
func newProcess(name string, command []string, spec childSpec, logPath string) (*proc.Process, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode the spec of %s: %w", name, err)
	}
	env := append(os.Environ(), ChildEnv+"="+string(b))
	return proc.New(name, command, proc.Options{Env: env, LogPath: logPath, Lines: true}), nil
}

// serverSpec is one nats-server of the cluster. Its name, ports and store
// stay the same across restarts: the name is its JetStream peer identity,
// and its peers dial its route port.
type serverSpec struct {
	Name        string
	Cluster     string
	ClientPort  int
	ClusterPort int
	Routes      []string // every server's route URL, its own included
	StoreDir    string
	// SyncInterval is JetStream's sync_interval (Options.SyncInterval).
	SyncInterval string
}

// bridgesSpec is a group of bridges run by one process.
type bridgesSpec struct {
	URLs            string // the servers' client URLs, comma-separated
	Stream          string
	Replicas        int
	MaxAge          time.Duration
	DuplicateWindow time.Duration
	StateBucket     string
	LogLevel        slog.Level
	Nodes           []nodeSpec
	// NoRepair turns the bridges' repair off (Options.NoRepair).
	NoRepair bool
}

// nodeSpec is one simulated node's bridge.
type nodeSpec struct {
	Name    string
	Socket  string // its runtime's CRI socket, served by the harness
	DataDir string
}

// childStats is a bridges child's answer to a request.
type childStats struct {
	// Pending is, per node in spec order, the events not acked yet, in
	// memory and in the spool; -1 for a bridge not built yet.
	Pending []int
	// Synced counts the bridges whose first relist is merged.
	Synced int
	// Dropped sums pleg_bridge_events_dropped_total over the bridges; only
	// when asked with requestDropped.
	Dropped float64
	// Acks merges the bridges' publish→ack histograms since the process
	// started; only when asked with requestAcks.
	Acks ackHist
}

// RunChild runs this process as the child spec (the value of ChildEnv)
// describes, until stdin ends or ctx is done, and returns nil after a
// clean stop. It writes "ready" on stdout once the child is in its steady
// state, then answers each line of stdin with one line of JSON. It is
// what Options.ChildCommand must run; nothing else should call it.
func RunChild(ctx context.Context, spec string, stdin io.Reader, stdout, stderr io.Writer) error {
	var s childSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		return fmt.Errorf("read %s: %w", ChildEnv, err)
	}
	// The reader ends at the end of stdin, which the parent closes at the
	// latest when it exits; a child that returns before exits with it.
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	switch {
	case s.Role == roleServer && s.Server != nil:
		return runServer(ctx, *s.Server, lines, stdout)
	case s.Role == roleBridges && s.Bridges != nil:
		return runBridges(ctx, *s.Bridges, lines, stdout, stderr)
	case s.Role == roleRaw && s.Raw != nil:
		return runRaw(ctx, *s.Raw, lines, stdout)
	}
	return fmt.Errorf("read %s: unknown role %q or no spec for it", ChildEnv, s.Role)
}

// runServer runs one nats-server with JetStream, routed to its peers.
func runServer(ctx context.Context, spec serverSpec, lines <-chan string, stdout io.Writer) error {
	var routes []*url.URL
	for _, r := range spec.Routes {
		u, err := url.Parse(r)
		if err != nil {
			return fmt.Errorf("server %s: route %q: %w", spec.Name, r, err)
		}
		routes = append(routes, u)
	}
	syncEvery, syncAlways, err := syncInterval(spec.SyncInterval)
	if err != nil {
		return fmt.Errorf("server %s: sync interval: %w", spec.Name, err)
	}
	s, err := server.NewServer(&server.Options{
		SyncInterval: syncEvery,
		SyncAlways:   syncAlways,
		ServerName:   spec.Name,
		Host:         "127.0.0.1",
		Port:         spec.ClientPort,
		JetStream:    true,
		StoreDir:     spec.StoreDir,
		Cluster:      server.ClusterOpts{Name: spec.Cluster, Host: "127.0.0.1", Port: spec.ClusterPort},
		Routes:       routes,
		NoSigs:       true,
		NoLog:        true,
	})
	if err != nil {
		return fmt.Errorf("create server %s: %w", spec.Name, err)
	}
	s.Start()
	defer func() {
		s.Shutdown()
		s.WaitForShutdown()
	}()
	if !s.ReadyForConnections(serverReadyTimeout) {
		return fmt.Errorf("server %s (client port %d, route port %d): not ready for connections after %v",
			spec.Name, spec.ClientPort, spec.ClusterPort, serverReadyTimeout)
	}
	deadline := time.Now().Add(serverReadyTimeout)
	ticker := time.NewTicker(readyPoll)
	defer ticker.Stop()
	for !s.JetStreamIsCurrent() {
		if time.Now().After(deadline) {
			return fmt.Errorf("server %s: not a current member of the JetStream meta group after %v", spec.Name, serverReadyTimeout)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
	if _, err := fmt.Fprintln(stdout, "ready"); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-lines:
			if !ok {
				return nil
			}
			if _, err := fmt.Fprintln(stdout, "{}"); err != nil {
				return err
			}
		}
	}
}

// runBridges runs one bridge per node of spec, each with its own NATS
// connection, data directory and registry, as package bridge runs it on a
// node. The garbage collector's target is left to the process: the bridges
// share it.
func runBridges(ctx context.Context, spec bridgesSpec, lines <-chan string, stdout, stderr io.Writer) error {
	logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: spec.LogLevel}))
	bridges := make([]*bridge.Bridge, len(spec.Nodes))
	regs := make([]*prometheus.Registry, len(spec.Nodes))
	for i, n := range spec.Nodes {
		regs[i] = prometheus.NewRegistry()
		b, err := bridge.New(nodeBridgeOptions(spec, n, regs[i], logger.With("node", n.Name)))
		if err != nil {
			return fmt.Errorf("bridge of %s: %w", n.Name, err)
		}
		bridges[i] = b
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	eg, gctx := errgroup.WithContext(runCtx)
	for i, b := range bridges {
		eg.Go(func() error {
			if err := b.Run(gctx); err != nil {
				return fmt.Errorf("bridge of %s: %w", spec.Nodes[i].Name, err)
			}
			return nil
		})
	}
	done := make(chan error, 1)
	go func() { done <- eg.Wait() }() // joined by every return below
	stopped := func() error { stop(); return <-done }

	ticker := time.NewTicker(readyPoll)
	for synced := 0; synced < len(bridges); {
		select {
		case <-ctx.Done():
			ticker.Stop()
			return stopped()
		case err := <-done:
			ticker.Stop()
			return errors.Join(errors.New("the bridges ended before they were ready"), err)
		case <-ticker.C:
		}
		synced = stats(bridges, regs, "").Synced
	}
	ticker.Stop()
	if _, err := fmt.Fprintln(stdout, "ready"); err != nil {
		return errors.Join(err, stopped())
	}
	enc := json.NewEncoder(stdout)
	for {
		select {
		case <-ctx.Done():
			return stopped()
		case err := <-done:
			if err == nil {
				err = errors.New("the bridges ended on their own")
			}
			return err
		case line, ok := <-lines:
			if !ok {
				return stopped()
			}
			if err := enc.Encode(stats(bridges, regs, line)); err != nil {
				return errors.Join(err, stopped())
			}
		}
	}
}

// nodeBridgeOptions are the options of node n's bridge in a group run as
// spec says: evented, its own data directory and spool, the stream and
// the state bucket managed, the garbage collector's target left to the
// process. The many-clusters test builds its bridges from it too.
func nodeBridgeOptions(spec bridgesSpec, n nodeSpec, reg *prometheus.Registry, logger *slog.Logger) bridge.Options {
	return bridge.Options{
		Node:        n.Name,
		CRIEndpoint: "unix://" + n.Socket,
		Mode:        generator.ModeEvented,
		NATS:        bridge.NATSOptions{URL: spec.URLs},
		Stream: bridge.StreamOptions{
			Name: spec.Stream, Replicas: spec.Replicas, MaxAge: spec.MaxAge,
			DuplicateWindow: spec.DuplicateWindow, Manage: true,
		},
		StateBucket:   spec.StateBucket,
		DataDir:       n.DataDir,
		SpoolMaxBytes: bridge.DefaultSpoolMaxBytes,
		RepairWindow:  map[bool]time.Duration{true: -1}[spec.NoRepair],
		Registry:      reg,
		Logger:        logger,
	}
}

// stats reads the bridges' status, and their dropped events or their ack
// histogram if req asks for it.
func stats(bridges []*bridge.Bridge, regs []*prometheus.Registry, req string) childStats {
	st := childStats{Pending: make([]int, len(bridges))}
	for i, b := range bridges {
		s := b.Status()
		st.Pending[i] = -1
		if s.Built {
			st.Pending[i] = s.Pending
		}
		if s.Synced {
			st.Synced++
		}
		if req == requestDropped {
			st.Dropped += counterSum(regs[i], droppedMetric)
		}
	}
	if req == requestAcks {
		st.Acks = ackHistOf(regs)
	}
	return st
}

// droppedMetric counts the events a bridge gave up on.
const droppedMetric = "pleg_bridge_events_dropped_total"

// counterSum returns the sum of a counter's samples in reg, 0 if it has
// none or cannot be gathered.
func counterSum(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
