package soak

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Faults a soak can inject, in the order a schedule runs them.
const (
	// FaultNATSRestart restarts NATS at once: the server, or every server
	// of the cluster.
	FaultNATSRestart = "nats-restart"
	// FaultNATSOutage stops NATS for twice the stream's duplicate window:
	// longer than the bridge's outbox holds and longer than JetStream's
	// memory of the message ids it stored.
	FaultNATSOutage = "nats-outage"
	// FaultLeaderKill kills the server that leads the stream (cluster only)
	// and restarts it after FaultLength.
	FaultLeaderKill = "leader-kill"
	// FaultMetaLeaderChange kills the JetStream meta leader (cluster only)
	// and restarts it after FaultLength.
	FaultMetaLeaderChange = "meta-leader-change"
	// FaultBridgeKill kills the bridge with SIGKILL and starts it again
	// after FaultLength, while the churn goes on.
	FaultBridgeKill = "bridge-kill"
	// FaultOutageBridgeKill stops NATS as FaultNATSOutage does, kills the
	// bridge with SIGKILL halfway through while events wait for NATS, and
	// starts it again after FaultLength, before NATS returns: what waited
	// in memory must outlive the process.
	FaultOutageBridgeKill = "outage-bridge-kill"
	// FaultRuntimeRestart stops serving CRI for FaultLength and serves the
	// same model again, as containerd keeps its containers across a restart;
	// the churn pauses meanwhile.
	FaultRuntimeRestart = "runtime-restart"
	// FaultStreamDrop ends the bridge's CRI event stream every 250 ms for
	// FaultLength.
	FaultStreamDrop = "stream-drop"
	// FaultStreamRefused ends the bridge's CRI event stream and makes the
	// runtime refuse every new one (codes.Unavailable) while the rest of
	// CRI answers, for FaultLength or, with Prometheus, until
	// PlegBridgeEventStreamDisconnected fires. containerd 2.4 only.
	FaultStreamRefused = "stream-refused"
	// FaultBridgeGone stops the bridge (SIGTERM) and takes its scrape
	// target away, as when its pod is deleted, until PlegBridgeAbsent
	// fires; then both come back. With Prometheus only.
	FaultBridgeGone = "bridge-gone"
	// FaultPowerLoss copies every server's store, and Rollback later stops
	// every server and starts it again with that copy: what the servers
	// acknowledged in between is lost, as in a power loss with nothing
	// flushed for that long (machine.go).
	FaultPowerLoss = "power-loss"
	// FaultOSCrash does the same to the stream leader alone, while another
	// server is down around its return. Cluster only.
	FaultOSCrash = "os-crash"
	// FaultCorruptReplica truncates, or flips a byte of, the newest block of
	// the stream on a stopped server that does not lead, starts it again,
	// and (in a cluster) stops the leader for FaultLength so that another
	// may lead.
	FaultCorruptReplica = "corrupt-replica"
)

// AllFaults lists every fault in schedule order.
var AllFaults = []string{
	FaultNATSRestart, FaultNATSOutage, FaultLeaderKill, FaultMetaLeaderChange,
	FaultBridgeKill, FaultBridgeGone, FaultOutageBridgeKill, FaultRuntimeRestart,
	FaultStreamDrop, FaultStreamRefused, FaultPowerLoss, FaultOSCrash, FaultCorruptReplica,
}

// machineFault is whether fault makes the servers lose what they
// acknowledged (machine.go).
func machineFault(fault string) bool {
	return fault == FaultPowerLoss || fault == FaultOSCrash || fault == FaultCorruptReplica
}

// AlertingFaults are the faults a soak with Prometheus runs by default:
// those that fire an alert (alerts.go).
var AlertingFaults = []string{
	FaultNATSOutage, FaultBridgeKill, FaultBridgeGone, FaultRuntimeRestart, FaultStreamRefused,
}

func clusterOnly(fault string) bool {
	return fault == FaultLeaderKill || fault == FaultMetaLeaderChange || fault == FaultOSCrash
}

// defaultFault is whether "all" faults include fault without Prometheus:
// the faults added for alerts are not, so that a soak without Prometheus
// runs as it did before them.
func defaultFault(fault string) bool {
	return fault != FaultBridgeGone && fault != FaultStreamRefused && !machineFault(fault)
}

// Options configures a soak. The zero value of a field means its default.
// Errors about them name the pleg-bridge soak command's flags, which carry
// the same names.
type Options struct {
	// Duration is how long the churn runs, faults included. Default 5m.
	Duration time.Duration
	// Rate is the churn's target in transitions per second. Default 200.
	Rate float64
	// Cluster runs a three-server NATS cluster with a stream of three
	// replicas instead of one server.
	Cluster bool
	// Containerd17 simulates containerd 1.7 instead of 2.4, and runs the
	// bridge in auto mode, which follows containerd's own events there.
	// containerd 1.7 keeps no event for a subscriber that is away, so the
	// transitions of a container whose whole life falls in a time the
	// bridge process was dead are unobservable: they are counted as such,
	// not as missing.
	Containerd17 bool
	// Faults are injected in the order of AllFaults, each in its own window
	// with quiet time after it. Nil means every fault the NATS setup allows.
	Faults []string
	// Dir is the run directory: the runtime's socket, the NATS store, the
	// bridge's data directory and its log (bridge.log). Required; created
	// if missing. Unix sockets limit its path to about 90 bytes.
	Dir string
	// BridgeBinary is the pleg-bridge executable, run as "BridgeBinary run".
	// Required.
	BridgeBinary string
	// BridgeEnv is added to the bridge's environment after the soak's own
	// PLEG_* settings, so it may override them. The bridge gets no other
	// environment.
	BridgeEnv []string

	// ContainersPerPod is the number of containers of each pod. Default 2.
	ContainersPerPod int
	// Lifetime is how long containers run, give or take 50%. Default 3s.
	Lifetime time.Duration
	// Seed makes the churn's pods, lifetimes and exits repeatable; 0 picks
	// one from the clock (the report shows it).
	Seed uint64
	// DuplicateWindow is the stream's duplicate window; a NATS outage lasts
	// twice as long. Default 5s.
	DuplicateWindow time.Duration
	// OutboxSize and MaxInFlight are the bridge's PLEG_OUTBOX_SIZE and
	// PLEG_PUBLISH_MAX_IN_FLIGHT, small so that an outage overflows the
	// outbox. Defaults 64 and 16.
	OutboxSize  int
	MaxInFlight int
	// FaultLength is how long a killed or stopped part stays down (the
	// bridge, the runtime, a cluster server) and how long stream drops go
	// on. Default 3s.
	FaultLength time.Duration
	// SettleTimeout bounds the wait, after the churn stopped, for the
	// stream to hold every transition. Default 1m.
	SettleTimeout time.Duration
	// Rollback is how far back the machine faults roll a server's store:
	// what it acknowledged in the last Rollback is lost. Default 30s.
	Rollback time.Duration
	// NoRepair runs the bridge without its repair of what the servers
	// lost (PLEG_REPAIR_WINDOW=0), to show the loss the repair prevents.
	NoRepair bool

	// Prometheus runs a real Prometheus server and Alertmanager beside the
	// bridge (PrometheusBinary, AlertmanagerBinary): Prometheus scrapes the
	// bridge and evaluates RulesFile rendered AlertTimeScale times faster,
	// and the soak checks that each fault fires the alerts it should, that
	// they resolve, that nothing else fires, and that every query of
	// DashboardFile returns data. Faults then last until their alerts fire,
	// and nil Faults means AlertingFaults.
	Prometheus         bool
	PrometheusBinary   string
	AlertmanagerBinary string
	// RulesFile and DashboardFile are deploy/prometheus/rules.yml and
	// deploy/grafana/pleg-bridge.json; required with Prometheus.
	RulesFile     string
	DashboardFile string

	// Logger gets the soak's own diagnostics; nil discards them.
	Logger *slog.Logger
	// Stdout gets one line of progress per phase; nil discards it.
	Stdout io.Writer

	// Set by withDefaults with Prometheus: the rules rendered for the
	// soak, and the dashboard's queries.
	rules         []rule
	renderedRules []byte
	dashboard     []dashboardQuery
}

// Defaults of Options.
const (
	DefaultDuration         = 5 * time.Minute
	DefaultRate             = 200
	DefaultContainersPerPod = 2
	DefaultLifetime         = 3 * time.Second
	DefaultDuplicateWindow  = 5 * time.Second
	DefaultOutboxSize       = 64
	DefaultMaxInFlight      = 16
	DefaultFaultLength      = 3 * time.Second
	DefaultRollback         = 30 * time.Second
	DefaultSettleTimeout    = time.Minute
)

// clusterRestart is about how long the servers of a cluster take to be
// ready after all of them restarted.
const clusterRestart = 5 * time.Second

// quietAfterFault is the least time each fault's window leaves after the
// fault is repaired, for the bridge to catch up before the next one.
const quietAfterFault = time.Second

// maxDirLen keeps the runtime's socket path (Dir + "/cri.sock") within the
// 108 bytes of a unix socket address, with room to spare.
const maxDirLen = 90

// withDefaults returns opts with defaults filled in and validated.
func (opts Options) withDefaults() (Options, error) {
	opts.Duration = orDefault(opts.Duration, DefaultDuration)
	opts.Rate = orDefault(opts.Rate, DefaultRate)
	opts.ContainersPerPod = orDefault(opts.ContainersPerPod, DefaultContainersPerPod)
	opts.Lifetime = orDefault(opts.Lifetime, DefaultLifetime)
	opts.DuplicateWindow = orDefault(opts.DuplicateWindow, DefaultDuplicateWindow)
	if opts.Prometheus {
		opts.OutboxSize = orDefault(opts.OutboxSize, AlertingOutboxSize)
	}
	opts.OutboxSize = orDefault(opts.OutboxSize, DefaultOutboxSize)
	opts.MaxInFlight = orDefault(opts.MaxInFlight, DefaultMaxInFlight)
	opts.FaultLength = orDefault(opts.FaultLength, DefaultFaultLength)
	opts.SettleTimeout = orDefault(opts.SettleTimeout, DefaultSettleTimeout)
	opts.Rollback = orDefault(opts.Rollback, DefaultRollback)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Stdout == nil {
		opts.Stdout = io.Discard
	}
	if opts.Faults == nil {
		for _, f := range AllFaults {
			if (opts.Cluster || !clusterOnly(f)) && defaultFault(f) {
				opts.Faults = append(opts.Faults, f)
			}
		}
		if opts.Prometheus {
			opts.Faults = slices.Clone(AlertingFaults)
		}
	}

	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if opts.Duration < 0 {
		bad("--duration=%v must be positive", opts.Duration)
	}
	if opts.Rate < 0 || opts.Rate > 10_000 {
		bad("--rate=%v: want 1 to 10000 transitions per second", opts.Rate)
	}
	if opts.ContainersPerPod < 0 || opts.ContainersPerPod > 20 {
		bad("--containers=%d: want 1 to 20", opts.ContainersPerPod)
	}
	if opts.Lifetime < 0 {
		bad("--lifetime=%v must be positive", opts.Lifetime)
	}
	if opts.DuplicateWindow < 100*time.Millisecond {
		bad("--duplicate-window=%v: JetStream needs at least 100ms", opts.DuplicateWindow)
	}
	if opts.MaxInFlight < 1 || opts.OutboxSize < opts.MaxInFlight {
		bad("--outbox=%d, --max-in-flight=%d: want 1 <= max-in-flight <= outbox", opts.OutboxSize, opts.MaxInFlight)
	}
	if opts.Rollback < 0 {
		bad("--rollback=%v must be positive", opts.Rollback)
	}
	if opts.FaultLength < 0 || opts.SettleTimeout < 0 {
		bad("--fault-length=%v, --settle-timeout=%v must be positive", opts.FaultLength, opts.SettleTimeout)
	}
	if opts.Dir == "" {
		bad("--dir is empty")
	} else if len(opts.Dir) > maxDirLen {
		bad("--dir=%q is %d bytes long; the runtime's unix socket needs it within %d", opts.Dir, len(opts.Dir), maxDirLen)
	}
	if opts.BridgeBinary == "" {
		bad("the pleg-bridge binary to run is not set")
	}
	seen := map[string]bool{}
	for _, f := range opts.Faults {
		switch {
		case !slices.Contains(AllFaults, f):
			bad("--faults: unknown fault %q; known: %s", f, strings.Join(AllFaults, ", "))
		case clusterOnly(f) && !opts.Cluster:
			bad("--faults: %s needs a NATS cluster (--cluster)", f)
		case f == FaultBridgeGone && !opts.Prometheus:
			bad("--faults: %s takes a scrape target away: it needs --prometheus", f)
		case machineFault(f) && opts.Prometheus:
			bad("--faults: %s has no alerts of the soak's to check: run it without --prometheus", f)
		case f == FaultStreamRefused && opts.Containerd17:
			bad("--faults: %s refuses CRI's event stream, which the bridge does not use on containerd 1.7 (--containerd-1.7)", f)
		case seen[f]:
			bad("--faults: %s named twice", f)
		}
		seen[f] = true
	}
	if opts.Prometheus {
		if opts.PrometheusBinary == "" || opts.AlertmanagerBinary == "" {
			bad("--prometheus: the prometheus and alertmanager binaries to run are not set")
		}
		if err := opts.loadAlerting(); err != nil {
			bad("--prometheus: %v", err)
		}
	}
	if len(errs) == 0 {
		// Schedule order, whatever order they were named in.
		opts.Faults = slices.Clone(opts.Faults)
		slices.SortStableFunc(opts.Faults, func(a, b string) int {
			return slices.Index(AllFaults, a) - slices.Index(AllFaults, b)
		})
		if need := opts.alertingDuration(); opts.Prometheus && opts.Duration < need {
			bad("--duration=%v is too short for %d faults with --prometheus: each fault lasts until its alerts fire, and the alerts must resolve after it, which takes %v with a baseline and a recovery",
				opts.Duration, len(opts.Faults), need)
		} else if part, need := opts.part(), opts.longestFault(); !opts.Prometheus && part < need {
			fit := "no fault fits: --faults none"
			if f := opts.fittingFaults(); len(f) > 0 {
				fit = "--faults " + strings.Join(f, ",") + " fits (or fewer of them, or --faults none)"
			}
			bad("--duration=%v is too short for %d faults: the run is cut into %d equal windows (a baseline, one per fault, a recovery) and the longest fault needs %v, so at least %v; in %v, %s",
				opts.Duration, len(opts.Faults), len(opts.Faults)+2, need, need*time.Duration(len(opts.Faults)+2), opts.Duration, fit)
		}
	}
	if len(errs) > 0 {
		return opts, &OptionsError{Errs: errs}
	}
	return opts, nil
}

// Validate returns the *OptionsError Run would refuse opts with, or nil. It
// starts and creates nothing.
func (opts Options) Validate() error {
	_, err := opts.withDefaults()
	return err
}

// OptionsError is Run's error when it refuses its Options: it started and
// created nothing, so a run directory made for it holds nothing to keep.
// Errs name the flags at fault, one each.
type OptionsError struct {
	Errs []error
}

func (e *OptionsError) Error() string { return errors.Join(e.Errs...).Error() }

// Unwrap returns Errs.
func (e *OptionsError) Unwrap() []error { return e.Errs }

// fittingFaults returns the most faults among opts.Faults that fit in
// opts.Duration, in schedule order: the cheapest first, as many as leave
// each window long enough for the longest of them. It returns none if not
// even one fits.
func (opts Options) fittingFaults() []string {
	byBudget := slices.Clone(opts.Faults)
	slices.SortStableFunc(byBudget, func(a, b string) int {
		return cmp.Compare(opts.faultBudget(a), opts.faultBudget(b))
	})
	k := 0
	for n := 1; n <= len(byBudget); n++ {
		// byBudget[n-1] is the longest of the n cheapest.
		if opts.Duration/time.Duration(n+2) >= opts.faultBudget(byBudget[n-1]) {
			k = n
		}
	}
	fit := byBudget[:k]
	slices.SortStableFunc(fit, func(a, b string) int {
		return slices.Index(AllFaults, a) - slices.Index(AllFaults, b)
	})
	return fit
}

// part is the planned length of each window of the schedule: the
// baseline, each fault with the quiet time after it, and the recovery.
func (opts Options) part() time.Duration {
	return opts.Duration / time.Duration(len(opts.Faults)+2)
}

// faultBudget is the time a fault's window needs: the fault, its repair
// (a restarted bridge or NATS takes a second or so) and the quiet after it.
func (opts Options) faultBudget(fault string) time.Duration {
	var d time.Duration
	switch fault {
	case FaultNATSRestart, FaultNATSOutage, FaultOutageBridgeKill:
		d = time.Second
		if fault != FaultNATSRestart {
			d += opts.outage()
		}
		if fault == FaultOutageBridgeKill {
			d += opts.FaultLength + time.Second
		}
		if opts.Cluster {
			// Restarted servers wait for a quorum before any is ready.
			d += clusterRestart
		}
	case FaultLeaderKill, FaultMetaLeaderChange, FaultBridgeKill:
		d = opts.FaultLength + 2*time.Second
	case FaultRuntimeRestart, FaultStreamDrop, FaultStreamRefused:
		d = opts.FaultLength
	case FaultBridgeGone:
		d = opts.FaultLength + 2*time.Second
	case FaultPowerLoss, FaultOSCrash:
		// The copy's restart, the rollback, the restart with the copy.
		d = opts.Rollback + 2*time.Second
		if fault == FaultOSCrash {
			d += opts.FaultLength
		}
		if opts.Cluster {
			d += 2 * clusterRestart
		}
	case FaultCorruptReplica:
		d = 2 * time.Second
		if opts.Cluster {
			d += 2*opts.FaultLength + 2*clusterRestart
		}
	}
	if opts.Prometheus {
		d = max(d, opts.alertBudget(fault))
	}
	return d + quietAfterFault
}

func (opts Options) longestFault() time.Duration {
	var d time.Duration
	for _, f := range opts.Faults {
		d = max(d, opts.faultBudget(f))
	}
	return d
}

// outage is how long a NATS outage lasts: twice the duplicate window, so
// that a retry after it can no longer rely on JetStream's deduplication.
func (opts Options) outage() time.Duration {
	return 2 * opts.DuplicateWindow
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
