package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/harness/proc"
	"github.com/pleg-bridge/pleg-bridge/harness/soak"
)

// quietAfterFault is the least time each fault's window leaves after the
// fleet drained, before the next fault.
const quietAfterFault = 2 * time.Second

// streamCurrentTimeout bounds the wait, after servers return, for the
// stream to have a leader and every replica current again.
const streamCurrentTimeout = 2 * time.Minute

// Run runs a fleet as opts say and returns its report. It blocks for
// opts.Duration, then until the stream holds every transition
// (opts.SettleTimeout at most) and is read back. It returns an error, and
// no report, only if the run itself could not go on: a server or bridge
// process would not start or exited on its own, the churn failed, ctx
// ended. Loss, duplication and reordering are in the report
// (Report.Failed). Everything it started is stopped when it returns; the
// run directory stays.
func Run(ctx context.Context, opts Options) (Report, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Report{}, err
	}
	if opts.Seed == 0 {
		opts.Seed = uint64(time.Now().UnixNano())
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return Report{}, fmt.Errorf("create run directory: %w", err)
	}
	logger := opts.Logger.With("component", "fleet")
	f := &fleet{opts: opts, logger: logger, prog: soak.NewProgress(opts.Stdout, logger, "fleet")}
	defer f.close()
	return f.run(ctx)
}

// fleet is one run; its fields are set up by run and used from its
// goroutine, except where the types say otherwise.
type fleet struct {
	opts   Options
	logger *slog.Logger

	servers *servers
	nodes   *nodes
	groups  []*bridgeGroup
	mon     *monitor
	nc      *nats.Conn
	js      jetstream.JetStream

	// runner runs the churn, the schedule and the accounting.
	runner *soak.Runner

	// The monitor runs in group until close.
	group       errgroup.Group
	stopMonitor context.CancelFunc

	populated time.Time // when the nodes' first pods were there
	startup   time.Duration
	windows   []soak.Window // the run's, once it is over
	faults    []FaultRecord
	prog      *soak.Progress // the progress lines and the problems
	dropped   float64        // events given up by bridge processes that ended

	// The baseline of publish→ack: the raw publisher's process, each
	// bridge process's ack histogram as last read, and each closed
	// window's acks, in the order of windows.
	raw     *proc.Process
	ackPrev map[*bridgeGroup]ackHist
	acks    []ackWindow
}

func (f *fleet) run(ctx context.Context) (Report, error) {
	o := f.opts
	var err error
	if f.servers, err = newServers(serversCount, filepath.Join(o.Dir, "nats"), o.ChildCommand, o.SyncInterval); err != nil {
		return Report{}, err
	}
	f.prog.Printf("starting %d NATS servers (processes), stores and logs in %s", serversCount, filepath.Join(o.Dir, "nats"))
	if err := f.servers.startAll(ctx); err != nil {
		return Report{}, err
	}
	if f.nc, f.js, err = soak.ConnectNATS(f.servers.urls); err != nil {
		return Report{}, err
	}
	// The harness sets the stream up before the herd, as an operator
	// would; each bridge then finds it (PLEG_STREAM_MANAGE=true) and
	// creates the state bucket if it is missing.
	sctx, cancel := context.WithTimeout(ctx, streamCurrentTimeout)
	err = bridge.EnsureStream(sctx, f.js, bridge.Options{Stream: bridge.StreamOptions{
		Name: streamName, Replicas: replicas, MaxAge: streamMaxAge, DuplicateWindow: duplicateWindow,
	}, Logger: f.logger})
	cancel()
	if err != nil {
		return Report{}, fmt.Errorf("set up stream %s: %w", streamName, err)
	}

	f.prog.Printf("populating %d simulated nodes with %d pods of %d containers each", o.Nodes, o.Pods, o.ContainersPerPod)
	f.populated = time.Now()
	if f.nodes, err = startNodes(ctx, filepath.Join(o.Dir, "rt"), nodeOptions{
		count: o.Nodes, pods: o.Pods, containersPerPod: o.ContainersPerPod, lifetime: o.Lifetime, seed: o.Seed,
	}); err != nil {
		return Report{}, err
	}
	if f.groups, err = newBridgeGroups(o, f.nodes, f.servers.urls, filepath.Join(o.Dir, "bridges")); err != nil {
		return Report{}, err
	}
	f.mon = newMonitor(f.servers, f.groups, o.Nodes)
	monCtx, stopMonitor := context.WithCancel(ctx)
	f.stopMonitor = stopMonitor
	f.group.Go(func() error { return f.mon.Run(monCtx) })
	// Built before anything waits: the waits end early on what it watches.
	f.runner = &soak.Runner{
		Duration:        o.Duration,
		Faults:          o.Faults,
		QuietAfterFault: quietAfterFault,
		JS:              f.js,
		Stream:          streamName,
		SettleTimeout:   o.SettleTimeout,
		Progress:        f.prog,
		Baseline:        fmt.Sprintf("baseline: churn at %.0f transitions/s over %d nodes", o.Rate, o.Nodes),
		Before:          []soak.Window{{Name: "start-up", From: f.populated}},
		Churn:           func(ctx context.Context) error { return f.nodes.Churn(ctx, o.Rate) },
		Count:           f.nodes.count,
		Transitions:     f.nodes.transitions,
		Crash: func() (<-chan struct{}, func() error) {
			return f.mon.failed, func() error { return f.mon.failure }
		},
		Inject:       f.injectAndDrain,
		WindowClosed: f.closeAcks,
		ChurnStopped: f.stopRaw,
		Stop: func(ctx context.Context, _ time.Time, held int) {
			f.prog.Printf("the stream holds %d messages; stopping the bridges", held)
			f.scrapeDropped(ctx, f.groups)
			var eg errgroup.Group
			for _, g := range f.groups {
				eg.Go(func() error { return g.proc.Stop(proc.CloseStdin) })
			}
			if err := eg.Wait(); err != nil {
				f.prog.Problem("%v", err)
			}
		},
	}

	f.prog.Printf("starting %d bridges in %d processes", o.Nodes, len(f.groups))
	began := time.Now()
	if err := startGroups(ctx, f.groups); err != nil {
		return Report{}, err
	}
	f.startup = time.Since(began)
	f.prog.Printf("every bridge ready (first relist merged) %v after the start", roundDelay(f.startup))

	rawRate := max(o.Rate/float64(len(f.groups)), 1)
	if err := f.startRaw(ctx, rawRate); err != nil {
		return Report{}, err
	}
	f.prog.Printf("raw publisher (the baseline of publish→ack) publishing %.1f copies of stored events a second to %s", rawRate, rawStream)

	out, err := f.runner.Run(ctx)
	if err != nil {
		return Report{}, err
	}
	f.windows = out.Windows
	made, stored := out.Made, out.Stored
	state := checkState(ctx, f.js, f.nodes)
	for _, d := range state.Diffs {
		f.prog.Problem("state bucket: %s", d)
	}
	f.prog.Printf("the state bucket holds %d keys for the runtimes' %d containers, %d differences", state.Keys, state.Want, len(state.Diffs))
	f.measureStalls(stored)
	rep := Report{
		Options:     o,
		Accounting:  out.Accounting,
		Start:       out.Start,
		End:         out.End,
		Startup:     f.startup,
		Settle:      out.Settle,
		Faults:      f.faults,
		Made:        len(made),
		Stored:      len(stored) + len(out.Undecodable),
		Undecodable: out.Undecodable,
		Dropped:     f.dropped,
		State:       state,
		Problems:    f.prog.Problems(),
	}
	rep.Figures = f.windowFigures(made, stored)
	rep.Stream, rep.Bucket = f.streamFigures(ctx)
	rep.Servers, rep.Bridges, rep.Harness = f.mon.usages()
	for i, d := range f.servers.dirs {
		rep.Servers[i].Disk = dirSize(d)
	}
	return rep, nil
}

// injectAndDrain makes one fault happen from at and repairs it, then
// waits until every node drained the events pending (DrainTimeout at
// most), records it, and says what happened.
func (f *fleet) injectAndDrain(ctx context.Context, fault string, at time.Time) (string, error) {
	rec, err := f.inject(ctx, fault)
	if err != nil {
		return "", err
	}
	rec.Name, rec.At = fault, at
	drain, ok, err := f.mon.waitDrained(ctx, rec.Repaired, f.opts.DrainTimeout)
	if err != nil {
		return "", err
	}
	rec.Drain, rec.Drained = drain, ok
	drained := fmt.Sprintf("every node drained %v after the repair", roundDelay(drain))
	if !ok {
		f.prog.Problem("%s: some node still had events pending %v after the repair", fault, f.opts.DrainTimeout)
		drained = fmt.Sprintf("NOT drained %v after the repair", roundDelay(drain))
	}
	f.faults = append(f.faults, rec)
	return rec.Note + "; " + drained, nil
}

// inject makes one fault happen and repairs it, and says what happened and
// when it was repaired.
func (f *fleet) inject(ctx context.Context, fault string) (FaultRecord, error) {
	switch fault {
	case FaultServerRestart:
		var notes []string
		for i, p := range f.servers.procs {
			down, err := f.servers.restart(ctx, i)
			if err != nil {
				return FaultRecord{}, err
			}
			current, err := f.waitStreamCurrent(ctx)
			if err != nil {
				return FaultRecord{}, err
			}
			notes = append(notes, fmt.Sprintf("%s down %v, stream current %v later", p.Name(), roundDelay(down), roundDelay(current)))
		}
		return FaultRecord{Note: "rolling restart (SIGTERM): " + strings.Join(notes, ", "), Repaired: time.Now()}, nil

	case FaultLeaderKill:
		return f.killLeader(ctx)

	case FaultClusterDown:
		down := time.Now()
		if err := f.servers.stopAll(); err != nil {
			return FaultRecord{}, err
		}
		if err := f.runner.Until(ctx, down.Add(f.opts.Outage)); err != nil {
			return FaultRecord{}, err
		}
		repaired, current, err := f.startServers(ctx, f.servers.startAll)
		if err != nil {
			return FaultRecord{}, err
		}
		return FaultRecord{
			Note: fmt.Sprintf("every server stopped (SIGTERM) for %v, started together; stream current %v after",
				roundDelay(repaired.Sub(down)), roundDelay(current)),
			Repaired: repaired,
		}, nil

	case FaultBridgeKill, FaultAllBridgeKill:
		k := len(f.groups)
		if fault == FaultBridgeKill {
			k = f.opts.killed()
		}
		// The last k processes: a rollout goes through the nodes in some
		// order, and which ones does not matter to the bridges.
		victims := f.groups[len(f.groups)-k:]
		nodes := 0
		for _, g := range victims {
			nodes += len(g.nodes)
		}
		f.scrapeDropped(ctx, victims)
		var eg errgroup.Group
		for _, g := range victims {
			eg.Go(func() error { g.proc.Kill(); return nil })
		}
		_ = eg.Wait()
		if err := f.runner.Wait(ctx, f.opts.FaultLength); err != nil {
			return FaultRecord{}, err
		}
		started := time.Now()
		if err := startGroups(ctx, victims); err != nil {
			return FaultRecord{}, err
		}
		return FaultRecord{
			Note: fmt.Sprintf("%d of %d bridge processes (%d nodes) killed (SIGKILL), started again after %v, ready %v after their start",
				k, len(f.groups), nodes, f.opts.FaultLength, roundDelay(time.Since(started))),
			Repaired: started,
		}, nil

	case FaultRollingDeploy:
		return f.rollout(ctx)

	case FaultNodeDrain:
		return f.drain(ctx)

	case FaultPowerLoss, FaultOSCrash, FaultCorruptReplica:
		return f.machineFault(ctx, fault)
	}
	return FaultRecord{}, fmt.Errorf("unknown fault %q", fault)
}

// rollout has the churn replace RolloutFraction of the fleet's pods over
// RolloutSpan and waits until it has; the rollout is repaired when its
// last runtime call is made.
func (f *fleet) rollout(ctx context.Context) (FaultRecord, error) {
	r := &rollout{fraction: f.opts.RolloutFraction, span: f.opts.RolloutSpan, done: make(chan struct{})}
	began := time.Now()
	f.nodes.rollouts <- r // a place for one, and a run has one rollout
	if err := f.runner.Watch().For(ctx, r.done); err != nil {
		return FaultRecord{}, err
	}
	return FaultRecord{
		Note: fmt.Sprintf("rolling deployment: %d of the fleet's %d pods replaced (new pod started, old one stopped and removed by the kubelet's usual path) in %v, on top of the churn: %d runtime calls, %d transitions",
			r.pods, r.of, roundDelay(r.finished.Sub(began)), r.calls, r.made),
		Repaired: r.finished,
		Replaced: r.pods,
		Pods:     r.of,
		Rolled:   r.made,
	}, nil
}

// drain has the churn drain DrainNodes nodes of their pods over DrainSpan
// and waits until it has; the drain is repaired when its last runtime
// call is made.
func (f *fleet) drain(ctx context.Context) (FaultRecord, error) {
	r := &rollout{drainNodes: f.opts.DrainNodes, span: f.opts.DrainSpan, done: make(chan struct{})}
	began := time.Now()
	f.nodes.rollouts <- r // a place for one; a run has one rollout and one drain, one after the other
	if err := f.runner.Watch().For(ctx, r.done); err != nil {
		return FaultRecord{}, err
	}
	took := r.finished.Sub(began)
	perNode := r.evictCalls / max(r.drainNodes, 1)
	return FaultRecord{
		Note: fmt.Sprintf("node drain: %d node(s) drained of %d pods (each ended by the kubelet's usual path; as many new pods started on the other nodes) in %v, on top of the churn: %d runtime calls, %d transitions; %d transitions per drained node (%.0f an hour at that pace)",
			r.drainNodes, r.pods, roundDelay(took), r.calls, r.made, perNode, float64(perNode)/took.Hours()),
		Repaired: r.finished,
		Replaced: r.pods,
		Pods:     r.of,
		Rolled:   r.made,
	}, nil
}

// startServers starts servers with start, then waits until the stream
// has a leader and every replica is current; it returns when start
// returned and how long the stream took to be current after that.
func (f *fleet) startServers(ctx context.Context, start func(context.Context) error) (time.Time, time.Duration, error) {
	if err := start(ctx); err != nil {
		return time.Time{}, 0, err
	}
	started := time.Now()
	current, err := f.waitStreamCurrent(ctx)
	return started, current, err
}

// waitStreamCurrent waits until the stream has a leader and every replica
// is current, and returns how long that took. The server offers no
// notification of it, so it asks every sampleEvery.
func (f *fleet) waitStreamCurrent(ctx context.Context) (time.Duration, error) {
	began := time.Now()
	deadline := began.Add(streamCurrentTimeout)
	last := "no answer yet"
	for {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := f.js.Stream(ictx, streamName)
		cancel()
		switch {
		case err != nil:
			last = err.Error()
		case s.CachedInfo().Cluster == nil || s.CachedInfo().Cluster.Leader == "":
			last = "no leader"
		default:
			cl := s.CachedInfo().Cluster
			current := len(cl.Replicas) == replicas-1
			for _, r := range cl.Replicas {
				current = current && r.Current
			}
			if current {
				return time.Since(began), nil
			}
			last = fmt.Sprintf("leader %s, replicas %d of %d current", cl.Leader, countCurrent(cl.Replicas), replicas-1)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("wait for stream %s to be current: after %v: %s", streamName, streamCurrentTimeout, last)
		}
		if err := f.runner.Wait(ctx, sampleEvery); err != nil {
			return 0, err
		}
	}
}

func countCurrent(rs []*jetstream.PeerInfo) int {
	n := 0
	for _, r := range rs {
		if r.Current {
			n++
		}
	}
	return n
}

// scrapeDropped adds the dropped events of groups' bridges to the total,
// before their processes end.
func (f *fleet) scrapeDropped(ctx context.Context, groups []*bridgeGroup) {
	n, err := dropped(ctx, groups)
	if err != nil {
		f.logger.Warn("ask the bridges for their dropped events; the report's count misses some", "err", err)
	}
	f.dropped += n
}

// close stops whatever run started: the monitor, the
// bridges (they use the runtimes and NATS), the runtimes, the servers.
func (f *fleet) close() {
	if f.stopMonitor != nil {
		f.stopMonitor()
	}
	_ = f.group.Wait() // their errors were returned by run
	for _, g := range f.groups {
		g.proc.Kill()
	}
	if f.raw != nil {
		f.raw.Kill()
	}
	if f.nodes != nil {
		if err := f.nodes.stop(); err != nil {
			f.logger.Warn("stop the simulated runtimes", "err", err)
		}
	}
	if f.nc != nil {
		f.nc.Close()
	}
	if f.servers != nil {
		f.servers.shutdown()
	}
}

// roundDelay rounds a measured time for people.
func roundDelay(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// dirSize returns the bytes of the files under dir, 0 if it cannot be
// read.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
