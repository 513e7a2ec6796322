package fleet

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/soak"
)

// Faults a fleet run can inject, in the order a schedule runs them.
const (
	// FaultServerRestart restarts the three servers one after the other
	// (SIGTERM, start again), each once the stream's replicas are all
	// current again: a rolling upgrade of the cluster.
	FaultServerRestart = "server-restart"
	// FaultLeaderKill kills (SIGKILL) the server that leads the stream,
	// under the churn's full load, and starts it again after FaultLength;
	// it reports the election time by the servers' own advisory and each
	// node's stall.
	FaultLeaderKill = "leader-kill"
	// FaultClusterDown stops every server (SIGTERM) for Outage while every
	// node churns, then starts them together: every bridge's outbox and
	// spool fill, then drain at once.
	FaultClusterDown = "cluster-down"
	// FaultBridgeKill kills KillFraction of the bridge processes (at least
	// one) with SIGKILL at once and starts them again after FaultLength:
	// a DaemonSet rollout of those nodes, without the drain a SIGTERM gives.
	FaultBridgeKill = "bridge-kill"
	// FaultAllBridgeKill does the same to every bridge process.
	FaultAllBridgeKill = "all-bridge-kill"
	// FaultRollingDeploy replaces RolloutFraction of the fleet's pods
	// within RolloutSpan, on top of the churn, as a rolling deployment
	// does: for each, a new pod with a new UID starts, then the old one
	// ends by the kubelet's usual path (containers stopped, removed,
	// sandbox stopped, removed). The pods replaced are the nodes' oldest,
	// those they ran before the churn.
	FaultRollingDeploy = "rolling-deploy"
	// FaultNodeDrain drains DrainNodes nodes of their pods within
	// DrainSpan, as kubectl drain does: each standing pod of those nodes
	// ends by the kubelet's usual path, and as many new pods start on
	// the other nodes, in turn. The drained nodes' own churn goes on (it
	// stands for their DaemonSet pods).
	FaultNodeDrain = "node-drain"
	// FaultPowerLoss pauses every server (SIGSTOP) at once, copies their
	// stores, resumes them, and Rollback later kills them (SIGKILL) and
	// starts them with those copies: what they acknowledged in between is
	// lost, as in a power loss with nothing flushed (soak.FaultPowerLoss).
	FaultPowerLoss = soak.FaultPowerLoss
	// FaultOSCrash does the same to the stream's leader alone, while
	// another server is paused (SIGSTOP) from before its crash until
	// FaultLength after its return.
	FaultOSCrash = soak.FaultOSCrash
	// FaultCorruptReplica kills a server that does not lead the stream,
	// truncates or flips a byte of its newest block, starts it again, and
	// restarts the leader so that another may lead.
	FaultCorruptReplica = soak.FaultCorruptReplica
)

// AllFaults lists every fault in schedule order.
var AllFaults = []string{FaultRollingDeploy, FaultNodeDrain, FaultServerRestart, FaultLeaderKill, FaultClusterDown, FaultBridgeKill, FaultAllBridgeKill,
	FaultPowerLoss, FaultOSCrash, FaultCorruptReplica}

// Options configures a fleet run. The zero value of a field means its
// default. Errors about them name the pleg-bridge fleet command's flags,
// which carry the same names.
type Options struct {
	// Nodes is the number of simulated nodes, each a bridge with its own
	// runtime, NATS connection and data directory. Default 50.
	Nodes int
	// Procs is the number of processes the bridges are spread over; a
	// fault kills whole processes. Default 4, at most Nodes.
	Procs int
	// Pods is the number of kubelet-like pods each node runs from the
	// start (crisim.PopulateKubelet), ContainersPerPod containers each.
	// Default 30; negative means none.
	Pods int
	// ContainersPerPod is the containers of each pod, populated or
	// churned. Default 2.
	ContainersPerPod int
	// Rate is the fleet-wide churn in transitions per second, spread over
	// the nodes in turn. Default half a transition per node per second
	// (500/s for 1,000 nodes).
	Rate float64
	// Lifetime is how long a churned pod's containers run, give or take
	// 50%. Default 30s.
	Lifetime time.Duration
	// Duration is how long the churn runs, faults included. Default 2m.
	Duration time.Duration
	// Faults are injected in the order of AllFaults, each in its own
	// window. Nil means FaultServerRestart, FaultClusterDown and
	// FaultBridgeKill.
	Faults []string
	// Outage is how long FaultClusterDown keeps the servers down. Default
	// 60s.
	Outage time.Duration
	// KillFraction is the share of bridge processes FaultBridgeKill kills,
	// rounded up. Default 0.1.
	KillFraction float64
	// RolloutFraction is the share of the fleet's pods, churned ones
	// counted, that FaultRollingDeploy replaces, rounded up. Default 0.1.
	RolloutFraction float64
	// RolloutSpan is the time FaultRollingDeploy spreads its runtime
	// calls over. Default 1m.
	RolloutSpan time.Duration
	// DrainNodes is how many nodes FaultNodeDrain drains. Default 1.
	DrainNodes int
	// DrainSpan is the time FaultNodeDrain spreads its runtime calls
	// over. Default 30s, the kubelet's default termination grace period.
	DrainSpan time.Duration
	// FaultLength is how long killed bridge processes stay down. Default
	// 2s.
	FaultLength time.Duration
	// Rollback is how far back FaultPowerLoss and FaultOSCrash roll a
	// server's store. Default 30s.
	Rollback time.Duration
	// NoRepair runs the bridges without their repair of what the servers
	// lost (bridge.Options.RepairWindow -1), to show the loss it prevents.
	NoRepair bool
	// SyncInterval is the servers' JetStream sync_interval: "always", or a
	// duration; empty keeps nats-server's default (2 minutes).
	SyncInterval string
	// DrainTimeout bounds the wait, after each fault is repaired, for
	// every node to have nothing pending. Default 2m.
	DrainTimeout time.Duration
	// SettleTimeout bounds the wait, after the churn stopped, for the
	// stream to hold every transition. Default 2m.
	SettleTimeout time.Duration
	// Seed makes the churn repeatable; 0 picks one from the clock.
	Seed uint64
	// Dir is the run directory: the runtimes' sockets, the servers'
	// stores, the bridges' data directories and every child's log.
	// Required; created if missing. Unix sockets limit its path to about
	// 90 bytes.
	Dir string
	// ChildCommand is the command line that runs RunChild with the spec
	// in ChildEnv: the pleg-bridge binary's hidden fleet child command,
	// or a test binary. Required.
	ChildCommand []string
	// BridgeLogLevel is the bridges' log level; their logs go to
	// Dir/bridges-<i>.log. The zero value is info.
	BridgeLogLevel slog.Level

	// Logger gets the harness's own diagnostics; nil discards them.
	Logger *slog.Logger
	// Stdout gets one line of progress per phase; nil discards it.
	Stdout io.Writer
}

// Defaults of Options.
const (
	DefaultNodes            = 50
	DefaultProcs            = 4
	DefaultPods             = 30
	DefaultContainersPerPod = 2
	DefaultRatePerNode      = 0.5
	DefaultLifetime         = 30 * time.Second
	DefaultDuration         = 2 * time.Minute
	DefaultOutage           = time.Minute
	DefaultKillFraction     = 0.1
	DefaultRolloutFraction  = 0.1
	DefaultRolloutSpan      = time.Minute
	DefaultDrainNodes       = 1
	DefaultDrainSpan        = 30 * time.Second
	DefaultFaultLength      = 2 * time.Second
	DefaultRollback         = 30 * time.Second
	DefaultDrainTimeout     = 2 * time.Minute
	DefaultSettleTimeout    = 2 * time.Minute
)

// What the fleet's bridges are configured with, as a deployment would.
const (
	streamName   = "PLEG"
	stateBucket  = "PLEG_STATE"
	replicas     = 3
	serversCount = 3
	// streamMaxAge is the default PLEG_STREAM_MAX_AGE: no message ages out
	// during a run, and the stream's figures are those of its first
	// minutes of a week's retention.
	streamMaxAge = 7 * 24 * time.Hour
	// duplicateWindow is the default PLEG_STREAM_DUPLICATE_WINDOW.
	duplicateWindow = 2 * time.Minute
)

// maxDirLen keeps the runtimes' socket paths (Dir/rt/<n>.sock) within
// the 108 bytes of a unix socket address.
const maxDirLen = 90

// withDefaults returns opts with defaults filled in and validated.
func (opts Options) withDefaults() (Options, error) {
	opts.Nodes = orDefault(opts.Nodes, DefaultNodes)
	opts.Procs = min(orDefault(opts.Procs, DefaultProcs), opts.Nodes)
	opts.Pods = max(orDefault(opts.Pods, DefaultPods), 0)
	opts.ContainersPerPod = orDefault(opts.ContainersPerPod, DefaultContainersPerPod)
	opts.Rate = orDefault(opts.Rate, DefaultRatePerNode*float64(opts.Nodes))
	opts.Lifetime = orDefault(opts.Lifetime, DefaultLifetime)
	opts.Duration = orDefault(opts.Duration, DefaultDuration)
	opts.Outage = orDefault(opts.Outage, DefaultOutage)
	opts.KillFraction = orDefault(opts.KillFraction, DefaultKillFraction)
	opts.RolloutFraction = orDefault(opts.RolloutFraction, DefaultRolloutFraction)
	opts.RolloutSpan = orDefault(opts.RolloutSpan, DefaultRolloutSpan)
	opts.DrainNodes = orDefault(opts.DrainNodes, DefaultDrainNodes)
	opts.DrainSpan = orDefault(opts.DrainSpan, DefaultDrainSpan)
	opts.FaultLength = orDefault(opts.FaultLength, DefaultFaultLength)
	opts.Rollback = orDefault(opts.Rollback, DefaultRollback)
	opts.DrainTimeout = orDefault(opts.DrainTimeout, DefaultDrainTimeout)
	opts.SettleTimeout = orDefault(opts.SettleTimeout, DefaultSettleTimeout)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Stdout == nil {
		opts.Stdout = io.Discard
	}
	if opts.Faults == nil {
		opts.Faults = []string{FaultServerRestart, FaultClusterDown, FaultBridgeKill}
	}

	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if opts.Nodes < 1 || opts.Nodes > 10_000 {
		bad("--nodes=%d: want 1 to 10000", opts.Nodes)
	}
	if opts.Procs < 1 {
		bad("--procs=%d: want at least 1", opts.Procs)
	}
	if opts.ContainersPerPod < 1 || opts.ContainersPerPod > 20 {
		bad("--containers=%d: want 1 to 20", opts.ContainersPerPod)
	}
	if opts.Rate < 0 {
		bad("--rate=%v must not be negative", opts.Rate)
	}
	if opts.KillFraction <= 0 || opts.KillFraction > 1 {
		bad("--kill-fraction=%v: want more than 0, at most 1", opts.KillFraction)
	}
	if opts.RolloutFraction <= 0 || opts.RolloutFraction > 1 {
		bad("--rollout-fraction=%v: want more than 0, at most 1", opts.RolloutFraction)
	}
	if opts.DrainNodes < 1 || opts.DrainNodes > opts.Nodes {
		bad("--drain-nodes=%d: want 1 to --nodes (%d)", opts.DrainNodes, opts.Nodes)
	}
	for name, d := range map[string]time.Duration{"--duration": opts.Duration, "--lifetime": opts.Lifetime, "--outage": opts.Outage, "--rollout-span": opts.RolloutSpan, "--drain-span": opts.DrainSpan,
		"--fault-length": opts.FaultLength, "--drain-timeout": opts.DrainTimeout, "--settle-timeout": opts.SettleTimeout, "--rollback": opts.Rollback} {
		if d < 0 {
			bad("%s=%v must be positive", name, d)
		}
	}
	if opts.Dir == "" {
		bad("--dir is empty")
	} else if len(opts.Dir) > maxDirLen {
		bad("--dir=%q is %d bytes long; the runtimes' unix sockets need it within %d", opts.Dir, len(opts.Dir), maxDirLen)
	}
	if _, _, err := syncInterval(opts.SyncInterval); err != nil {
		bad("--sync-interval=%q: %v", opts.SyncInterval, err)
	}
	if len(opts.ChildCommand) == 0 {
		bad("the command that runs a fleet child is not set")
	}
	seen := map[string]bool{}
	for _, f := range opts.Faults {
		switch {
		case !slices.Contains(AllFaults, f):
			bad("--faults: unknown fault %q; known: %s", f, strings.Join(AllFaults, ", "))
		case seen[f]:
			bad("--faults: %s named twice", f)
		}
		seen[f] = true
	}
	opts.Faults = slices.Clone(opts.Faults)
	slices.SortStableFunc(opts.Faults, func(a, b string) int {
		return slices.Index(AllFaults, a) - slices.Index(AllFaults, b)
	})
	return opts, errors.Join(errs...)
}

// killed is how many bridge processes FaultBridgeKill kills.
func (opts Options) killed() int {
	n := int(float64(opts.Procs)*opts.KillFraction + 0.999)
	return min(max(n, 1), opts.Procs)
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// syncInterval reads a sync_interval setting: "always", a duration, or
// empty for nats-server's default.
func syncInterval(v string) (time.Duration, bool, error) {
	switch v {
	case "":
		return 0, false, nil
	case "always":
		return 0, true, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, false, fmt.Errorf("want always or a positive duration (like 10s)")
	}
	return d, false, nil
}
