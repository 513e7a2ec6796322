package soak

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// What the soak configures the bridge with, besides Options.
const (
	nodeName   = "soak-node"
	streamName = "PLEG"
	// droppedMetric counts the events the bridge gave up on.
	droppedMetric = "pleg_bridge_events_dropped_total"
	// mismatchMetric counts the exits the bridge reported from
	// containerd's task exits that CRI contradicted.
	mismatchMetric = "pleg_bridge_task_event_mismatches_total"
	// streamDropEvery is the interval between stream drops: the bridge
	// reconnects and relists in between, and the next drop may hit it
	// halfway.
	streamDropEvery = 250 * time.Millisecond
)

// Run runs a soak as Options say and returns its report. It blocks for
// opts.Duration, then until the bridge caught up (opts.SettleTimeout at
// most) and the stream is read back. It returns an error, and no report,
// only if the soak itself could not run: the bridge would not start or
// exited on its own, the churn failed, ctx ended. Loss, duplication and
// reordering are in the report (Report.Failed). Everything it started is
// stopped when it returns; the run directory stays.
func Run(ctx context.Context, opts Options) (Report, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Report{}, err
	}
	if opts.Seed == 0 {
		opts.Seed = uint64(time.Now().UnixNano())
	}
	for _, d := range []string{opts.Dir, filepath.Join(opts.Dir, "bridge")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return Report{}, fmt.Errorf("create run directory: %w", err)
		}
	}
	logger := opts.Logger.With("component", "soak")
	s := &soak{opts: opts, logger: logger, prog: NewProgress(opts.Stdout, logger, "soak")}
	defer s.close()
	return s.run(ctx)
}

// soak is one run; its fields are set up by run and used from its
// goroutine, except where the types say otherwise.
type soak struct {
	opts   Options
	logger *slog.Logger

	nats   *natsSetup
	nc     *nats.Conn
	js     jetstream.JetStream
	rt     *simRuntime
	bridge *bridgeProcess
	health *healthMonitor
	driver *driver
	// With Options.Prometheus: Prometheus and Alertmanager, and the
	// webhook Alertmanager notifies.
	prom   *promStack
	alerts *alertReceiver

	// runner runs the churn, the schedule and the accounting.
	runner *Runner

	// The health monitor runs in group until close.
	group      errgroup.Group
	stopHealth context.CancelFunc
	stopAlerts context.CancelFunc

	// blind are the times no bridge process could observe the runtime,
	// from a kill until the next process is up, with a runtime that keeps
	// no event for an absent subscriber (Options.Containerd17).
	blind   []Window
	faults  []FaultRecord
	prog    *Progress // the progress lines and the problems
	dropped float64   // the events given up by bridge processes that ended
	// mismatches are the task-event mismatches of bridge processes that
	// ended (see Report.TaskMismatches).
	mismatches float64
}

func (s *soak) run(ctx context.Context) (Report, error) {
	o := s.opts
	var err error
	if s.nats, err = startNATS(filepath.Join(o.Dir, "nats"), o.Cluster, s.logger); err != nil {
		return Report{}, err
	}
	if s.nc, s.js, err = connectNATS(s.nats.urls); err != nil {
		return Report{}, err
	}
	s.rt = newSimRuntime(filepath.Join(o.Dir, "cri.sock"), o.Containerd17)
	if err := s.rt.serve(ctx); err != nil {
		return Report{}, err
	}
	port, err := freePort()
	if err != nil {
		return Report{}, err
	}
	listen := "127.0.0.1:" + strconv.Itoa(port)
	s.bridge = newBridgeProcess(o.BridgeBinary, s.bridgeEnv(listen), filepath.Join(o.Dir, "bridge.log"), listen)
	s.prog.Printf("starting: %s, simulated %s on %s, bridge %s (log %s)", s.nats.describe(), s.runtimeName(), s.rt.socket, o.BridgeBinary, s.bridge.logPath())
	if err := s.bridge.start(ctx); err != nil {
		return Report{}, err
	}
	if o.Prometheus {
		if err := s.startAlerting(ctx, listen); err != nil {
			return Report{}, err
		}
	}

	s.health = &healthMonitor{bridge: s.bridge}
	s.driver = newDriver(s.rt.model, driverOptions{Rate: o.Rate, ContainersPerPod: o.ContainersPerPod, Lifetime: o.Lifetime, Seed: o.Seed})
	healthCtx, stopHealth := context.WithCancel(ctx)
	s.stopHealth = stopHealth
	s.health.setUp(true)
	s.group.Go(func() error { return s.health.Run(healthCtx) })

	var alerts []AlertResult
	var panels []PanelResult
	s.runner = &Runner{
		Duration:        o.Duration,
		Faults:          o.Faults,
		QuietAfterFault: quietAfterFault,
		JS:              s.js,
		Stream:          streamName,
		SettleTimeout:   o.SettleTimeout,
		Progress:        s.prog,
		Baseline:        fmt.Sprintf("baseline: churn at %.0f transitions/s", o.Rate),
		Churn:           s.driver.Run,
		Count:           s.driver.count,
		Transitions:     s.driver.transitions,
		Crash: func() (<-chan struct{}, func() error) {
			return s.bridge.crashed(), s.bridge.exitError
		},
		Inject: func(ctx context.Context, fault string, at time.Time) (string, error) {
			note, err := s.inject(ctx, fault)
			if err != nil {
				return "", err
			}
			s.faults = append(s.faults, FaultRecord{Name: fault, At: at, Note: note})
			return note, nil
		},
		Stop: func(ctx context.Context, end time.Time, held int) {
			if o.Prometheus {
				// Before the bridge stops, which would fire PlegBridgeDown.
				alerts, panels = s.checkAlerting(ctx, end)
			}
			s.prog.Printf("the stream holds %d messages; stopping the bridge (SIGTERM)", held)
			s.scrapeDropped(ctx)
			s.health.setUp(false)
			if err := s.bridge.stop(); err != nil {
				s.prog.Problem("%v", err)
			}
		},
		Excused: func() ([]HealthFailure, []Window) { return s.health.failures(), s.blind },
	}
	out, err := s.runner.Run(ctx)
	if err != nil {
		return Report{}, err
	}
	// The stopped bridge wrote its state bucket last; it must hold what
	// the runtime holds, whatever the faults did to its writes.
	containers, diffs := checkState(ctx, s.js, s.rt.model)
	for _, d := range diffs {
		s.prog.Problem("state bucket: %s", d)
	}
	s.prog.Printf("the state bucket holds the runtime's %d containers with %d differences", containers, len(diffs))
	rep := Report{
		Accounting:     out.Accounting,
		Options:        o,
		Setup:          s.nats.describe(),
		Start:          out.Start,
		Faults:         s.faults,
		Stored:         len(out.Stored) + len(out.Undecodable),
		Undecodable:    out.Undecodable,
		BridgeDropped:  s.dropped,
		TaskMismatches: s.mismatches,
		Problems:       s.prog.Problems(),
		Alerts:         alerts,
		Panels:         panels,
	}
	return rep, nil
}

// bridgeEnv is the bridge's whole environment: PLEG_* settings pointing it
// at the soak's runtime and NATS, with an outbox small enough for an outage
// to overflow it and a duplicate window short enough for an outage to
// outlast it, then Options.BridgeEnv.
func (s *soak) bridgeEnv(listen string) []string {
	o := s.opts
	env := []string{
		"PLEG_NODE_NAME=" + nodeName,
		"PLEG_CRI_ENDPOINT=" + s.rt.endpoint(),
		"PLEG_NATS_URL=" + strings.Join(s.nats.urls, ","),
		"PLEG_DATA_DIR=" + filepath.Join(o.Dir, "bridge"),
		"PLEG_MODE=" + map[bool]string{false: "evented", true: "auto"}[o.Containerd17],
		"PLEG_LISTEN_ADDRESS=" + listen,
		"PLEG_STREAM=" + streamName,
		"PLEG_STREAM_REPLICAS=" + strconv.Itoa(s.nats.replicas()),
		"PLEG_STREAM_DUPLICATE_WINDOW=" + o.DuplicateWindow.String(),
		"PLEG_OUTBOX_SIZE=" + strconv.Itoa(o.OutboxSize),
		"PLEG_PUBLISH_MAX_IN_FLIGHT=" + strconv.Itoa(o.MaxInFlight),
		"PLEG_LOG_FORMAT=json",
		"PLEG_LOG_LEVEL=info",
	}
	if o.Prometheus {
		env = append(env,
			// The rules' 180 s relist threshold is 6 s in the soak, so
			// the safety-net relist of evented mode, every 30 s in
			// production, comes every second: 30 s scaled the same way.
			"PLEG_EVENTED_RELIST_PERIOD="+(generatorEventedRelistPeriod/AlertTimeScale).String(),
			// Small enough for a NATS outage to fill it.
			"PLEG_SPOOL_MAX_BYTES="+strconv.Itoa(soakSpoolBytes))
	}
	if o.NoRepair {
		env = append(env, "PLEG_REPAIR_WINDOW=0")
	}
	return append(env, o.BridgeEnv...)
}

// inject makes one fault happen and undoes it, and says what happened.
func (s *soak) inject(ctx context.Context, fault string) (string, error) {
	o := s.opts
	switch fault {
	case FaultNATSRestart, FaultNATSOutage:
		down := time.Now()
		s.nats.stopAll()
		var readiness, fired string
		if fault == FaultNATSOutage {
			end := down.Add(o.outage())
			readiness = s.readyzDuring(ctx, down, end)
			var err error
			if fired, err = s.holdAlerts(ctx, fault, down, end, nil); err != nil {
				return "", err
			}
		}
		if err := s.nats.startAll(); err != nil {
			return "", err
		}
		note := fmt.Sprintf("NATS down for %v%s%s", roundDelay(time.Since(down)), readiness, fired)
		note += s.bridgeRecovery(ctx)
		return note + s.awaitResolved(ctx, fault), nil

	case FaultLeaderKill, FaultMetaLeaderChange:
		c := s.nats.cluster
		i, what := c.StreamLeader(natsAccount, streamName), "stream leader"
		if fault == FaultMetaLeaderChange {
			i, what = c.MetaLeader(), "meta leader"
		}
		if i < 0 {
			return "no " + what + " to kill at this moment: skipped", nil
		}
		name := c.Server(i).Name()
		c.Stop(i)
		if err := s.runner.Wait(ctx, o.FaultLength); err != nil {
			return "", err
		}
		newLeader := c.StreamLeader(natsAccount, streamName)
		if fault == FaultMetaLeaderChange {
			newLeader = c.MetaLeader()
		}
		if err := c.Restart(i); err != nil {
			return "", err
		}
		note := fmt.Sprintf("%s %s killed, restarted after %v; %s meanwhile: %s", what, name, o.FaultLength, what, s.serverName(newLeader))
		return note + s.bridgeRecovery(ctx), nil

	case FaultOutageBridgeKill:
		down := time.Now()
		s.nats.stopAll()
		if err := s.runner.Wait(ctx, o.outage()/2); err != nil {
			return "", err
		}
		s.scrapeDropped(ctx)
		s.health.setUp(false)
		killed := time.Now()
		s.bridge.kill()
		if err := s.runner.Wait(ctx, o.FaultLength); err != nil {
			return "", err
		}
		if err := s.bridge.startUntil(ctx, "/healthz"); err != nil {
			return "", err
		}
		s.blindSince(killed)
		s.health.setUp(true)
		if err := s.runner.Until(ctx, down.Add(o.outage()+o.FaultLength)); err != nil {
			return "", err
		}
		if err := s.nats.startAll(); err != nil {
			return "", err
		}
		note := fmt.Sprintf("NATS down for %v; bridge killed (SIGKILL) %v into it, started again %v later, before NATS returned",
			roundDelay(time.Since(down)), roundDelay(o.outage()/2), o.FaultLength)
		return note + s.bridgeRecovery(ctx), nil

	case FaultBridgeKill, FaultBridgeGone:
		s.scrapeDropped(ctx)
		s.health.setUp(false)
		killed := time.Now()
		how := "killed (SIGKILL)"
		if fault == FaultBridgeKill {
			s.bridge.kill()
		} else {
			how = "stopped (SIGTERM), its scrape target removed,"
			if err := s.bridge.stop(); err != nil {
				s.prog.Problem("%s: %v", fault, err)
			}
			if err := s.prom.setTarget(false); err != nil {
				return "", err
			}
		}
		fired, err := s.holdAlerts(ctx, fault, killed, killed.Add(o.FaultLength), nil)
		if err != nil {
			return "", err
		}
		if fault == FaultBridgeGone {
			if err := s.prom.setTarget(true); err != nil {
				return "", err
			}
		}
		down := time.Since(killed)
		started := time.Now()
		if err := s.bridge.start(ctx); err != nil {
			return "", err
		}
		s.blindSince(killed)
		s.health.setUp(true)
		note := fmt.Sprintf("bridge %s started again after %v%s, ready %v after its start",
			how, roundDelay(down), fired, roundDelay(time.Since(started)))
		return note + s.awaitResolved(ctx, fault), nil

	case FaultRuntimeRestart:
		s.driver.pause()
		stopped := time.Now()
		if err := s.rt.stop(); err != nil {
			return "", err
		}
		fired, err := s.holdAlerts(ctx, fault, stopped, stopped.Add(o.FaultLength), nil)
		if err != nil {
			return "", err
		}
		if err := s.rt.serve(ctx); err != nil {
			return "", err
		}
		s.driver.resume()
		note := fmt.Sprintf("runtime stopped serving for %v (churn paused)%s, serving the same containers again", roundDelay(time.Since(stopped)), fired)
		return note + s.awaitResolved(ctx, fault), nil

	case FaultStreamRefused:
		began := time.Now()
		ref, streams := s.rt.refuseStreams()
		fired, err := s.holdAlerts(ctx, fault, began, began.Add(o.FaultLength), func() { ref.topUp() })
		if err != nil {
			return "", err
		}
		calls, err := ref.end(ctx)
		if err != nil {
			return "", err
		}
		note := fmt.Sprintf("ended %d CRI event streams and refused the bridge's %d new ones for %v%s", streams, calls, roundDelay(time.Since(began)), fired)
		return note + s.awaitResolved(ctx, fault), nil

	case FaultStreamDrop:
		end := time.Now().Add(o.FaultLength)
		drops, streams := 0, 0
		for time.Now().Before(end) {
			streams += s.rt.srv.DropStreams()
			drops++
			if err := s.runner.Until(ctx, time.Now().Add(streamDropEvery)); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("dropped the CRI event streams %d times in %v (%d streams ended)", drops, o.FaultLength, streams), nil

	case FaultPowerLoss, FaultOSCrash, FaultCorruptReplica:
		return s.injectMachineFault(ctx, fault)
	}
	return "", fmt.Errorf("unknown fault %q", fault)
}

// blindSince records, with a runtime that keeps no event for an absent
// subscriber, that no bridge observed it from just before killed until
// now: the new process has made its first relist (it is healthy or ready).
// What happened in the last unseenBeforeKill before a SIGKILL may not have
// been made durable yet, and nothing replays it.
func (s *soak) blindSince(killed time.Time) {
	if s.opts.Containerd17 {
		s.blind = append(s.blind, Window{Name: "bridge dead", From: killed.Add(-unseenBeforeKill), To: time.Now()})
	}
}

// generatorEventedRelistPeriod is the bridge's default
// PLEG_EVENTED_RELIST_PERIOD (generator.DefaultEventedRelistPeriod; the
// soak does not import generator).
const generatorEventedRelistPeriod = 30 * time.Second

// unseenBeforeKill is how long before a SIGKILL a transition may not be on
// disk yet: the durable store writes the spool every 100 ms, and a
// containerd event takes a few milliseconds to become a listed, merged
// event. On containerd 2.x the CRI stream's replay brings such transitions
// back; on 1.7 nothing does.
const unseenBeforeKill = 150 * time.Millisecond

// runtimeName names the simulated runtime.
func (s *soak) runtimeName() string {
	if s.opts.Containerd17 {
		return "containerd 1.7"
	}
	return "containerd 2.4"
}

func (s *soak) serverName(i int) string {
	if i < 0 {
		return "none"
	}
	return s.nats.cluster.Server(i).Name()
}

// bridgeRecovery waits for the bridge to be ready again after a NATS fault
// and says how long that took. A bridge not ready within readyTimeout is a
// problem, and the soak goes on to see what it lost.
func (s *soak) bridgeRecovery(ctx context.Context) string {
	back := time.Now()
	if err := s.bridge.waitReady(ctx, readyTimeout); err != nil {
		s.prog.Problem("after NATS came back: %v", err)
		return "; bridge NOT ready again"
	}
	return fmt.Sprintf("; bridge ready again %v after NATS", roundDelay(time.Since(back)))
}

// readyzDuring checks, while NATS is down from down until end, that the
// bridge tells its readiness probe so: /readyz must answer 503 with the
// reason before end. A bridge that stays ready through an outage is a
// problem, since a Service would keep sending it readers it cannot serve.
func (s *soak) readyzDuring(ctx context.Context, down, end time.Time) string {
	body, err := s.bridge.waitNotReady(ctx, end)
	if err != nil {
		if ctx.Err() == nil {
			s.prog.Problem("/readyz during the NATS outage: %v", err)
		}
		return "; /readyz NOT 503 during it"
	}
	return fmt.Sprintf("; /readyz 503 after %v (%q)", roundDelay(time.Since(down)), body)
}

// scrapeDropped adds the running bridge's count of events given up to the
// total, before that process ends.
func (s *soak) scrapeDropped(ctx context.Context) {
	n, err := s.bridge.counter(ctx, droppedMetric)
	if err != nil {
		s.logger.Warn("scrape the bridge's dropped events; the report's count misses them", "err", err)
		return
	}
	s.dropped += n
	if n, err = s.bridge.counter(ctx, mismatchMetric); err != nil {
		s.logger.Warn("scrape the bridge's task-event mismatches; the report's count misses them", "err", err)
		return
	}
	s.mismatches += n
}

// close stops whatever run started, the bridge first: it uses both the
// runtime and NATS.
func (s *soak) close() {
	for _, stop := range []context.CancelFunc{s.stopHealth, s.stopAlerts} {
		if stop != nil {
			stop()
		}
	}
	_ = s.group.Wait() // their errors were returned by run
	if s.bridge != nil {
		s.bridge.kill()
	}
	if s.prom != nil {
		s.prom.stop()
	}
	if s.rt != nil {
		if err := s.rt.stop(); err != nil {
			s.logger.Warn("stop the simulated runtime", "err", err)
		}
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.nats != nil {
		s.nats.shutdown()
	}
}
