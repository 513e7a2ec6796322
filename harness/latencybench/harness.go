package latencybench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/trace"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Mode is what one run measures.
type Mode string

// Modes.
const (
	// ModeRaw publishes CloudEvent messages straight to JetStream with
	// PublishMsgAsync: the floor any bridge mode sits on.
	ModeRaw Mode = "raw"
	// ModeEvented runs the bridge in evented mode.
	ModeEvented Mode = "evented"
	// ModeGeneric runs the bridge in generic mode (relisting only).
	ModeGeneric Mode = "generic"
	// ModeContainerd runs the bridge in containerd-events mode against the
	// containerd 1.7 preset: containerd's own events trigger targeted
	// relists.
	ModeContainerd Mode = "containerd"
)

// subscribes says whether the bridge follows an event stream in mode.
func (m Mode) subscribes() bool { return m == ModeEvented || m == ModeContainerd }

// ParseModes reads a comma-separated list of modes ("raw,evented,containerd,generic").
// An empty string is an empty list.
func ParseModes(s string) ([]Mode, error) {
	var modes []Mode
	for f := range strings.SplitSeq(s, ",") {
		switch m := Mode(strings.TrimSpace(f)); m {
		case ModeRaw, ModeEvented, ModeContainerd, ModeGeneric:
			modes = append(modes, m)
		case "":
		default:
			return nil, fmt.Errorf("unknown mode %q (want raw, evented, containerd or generic)", f)
		}
	}
	return modes, nil
}

// RuntimeTopology is where the simulated runtime runs in the bridge modes.
type RuntimeTopology string

// Runtime topologies.
const (
	// RuntimeProcess runs the simulated runtime and its driver in a child
	// process, as containerd runs beside the bridge on a node, so that their
	// CPU use, allocations and garbage collection are not charged to the
	// bridge's process. The default.
	RuntimeProcess RuntimeTopology = "process"
	// RuntimeInProcess runs them in the harness's own process, beside the
	// bridge and the NATS server.
	RuntimeInProcess RuntimeTopology = "inprocess"
)

// ParseRuntime reads a runtime topology: "process" or "inprocess".
func ParseRuntime(s string) (RuntimeTopology, error) {
	switch t := RuntimeTopology(s); t {
	case RuntimeProcess, RuntimeInProcess:
		return t, nil
	}
	return "", fmt.Errorf("unknown runtime topology %q (want process or inprocess)", s)
}

// Defaults for Config.
const (
	DefaultRate             = 1000
	DefaultDuration         = 10 * time.Second
	DefaultWarmup           = time.Second
	DefaultContainersPerPod = 4
)

// Names the harness publishes under: the bridge's default subject prefix
// (and stream), and a node of its own.
const (
	nodeName      = "bench-node"
	subjectPrefix = schemas.DefaultSubjectPrefix
	podNamespace  = "bench"
)

// Config configures a Harness. Zero values take the defaults.
type Config struct {
	// Rate is the transitions (one Lifecycle event each) per second the
	// driver makes; default 1000.
	Rate float64
	// Duration is how long latencies are measured, after Warmup; default
	// 10s. Warmup transitions are made at the same rate and must be acked
	// too, but are not counted.
	Duration time.Duration
	// Warmup precedes the measurement; default 1s. Negative means none.
	Warmup time.Duration
	// RelistPeriod is the relist period of generic mode; default
	// generator.DefaultRelistPeriod (1s, the production default).
	RelistPeriod time.Duration
	// Dwell is how long each container stays running, then exited, before
	// the driver moves it on. A container must outlive a relist period to be
	// seen by generic mode at all, so the default is 2.5 relist periods. The
	// runtime holds Rate×Dwell container slots, ContainersPerPod a pod.
	Dwell time.Duration
	// ContainersPerPod is the number of container slots of each pod; default
	// 4. Each stream event carries the statuses of all its pod's containers.
	ContainersPerPod int
	// DrainTimeout bounds the wait for the last acks after the driver stops;
	// default 5s plus three relist periods.
	DrainTimeout time.Duration
	// Dir holds the JetStream store and the runtimes' sockets; empty means a
	// temporary directory that Close removes. Keep it short: a unix socket
	// path is limited to about 100 bytes.
	Dir string
	// Runtime is where the simulated runtime and its driver run in the
	// bridge modes; default RuntimeProcess. A Harness in that topology
	// re-executes its own executable, which must call
	// MaybeRunRuntimeProcess first thing in main (and tests in TestMain).
	Runtime RuntimeTopology
	// Stages times the stages of each bridge event (see Result.Stages): the
	// generator's Runtime and Sink are then wrapped to stamp each stream
	// event's arrival and each event's encoding, and the publisher is
	// handed one event per Send call, all of which costs each event a few
	// mutex-guarded map updates.
	Stages bool
	// TraceDir, if not empty, is where each mode's measured transitions
	// (warmup included) are recorded with runtime/trace, as
	// latency-<mode>-<unix ns>.trace: go tool trace -pprof=sched shows
	// where the process's goroutines waited to run. Tracing costs each
	// event some time of its own; compare traced runs with each other.
	TraceDir string
	// Logger receives the bridge's logs; nil discards them.
	Logger *slog.Logger
}

func (c *Config) applyDefaults() error {
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	switch {
	case c.Warmup == 0:
		c.Warmup = DefaultWarmup
	case c.Warmup < 0:
		c.Warmup = 0
	}
	if c.RelistPeriod == 0 {
		c.RelistPeriod = generator.DefaultRelistPeriod
	}
	if c.Dwell == 0 {
		c.Dwell = c.RelistPeriod * 5 / 2
	}
	if c.ContainersPerPod == 0 {
		c.ContainersPerPod = DefaultContainersPerPod
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 5*time.Second + 3*c.RelistPeriod
	}
	if c.Runtime == "" {
		c.Runtime = RuntimeProcess
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	var errs []error
	if _, err := ParseRuntime(string(c.Runtime)); err != nil {
		errs = append(errs, err)
	}
	if c.Rate < 0 || c.Rate > 100_000 {
		errs = append(errs, fmt.Errorf("rate %v: want more than 0 and at most 100000 per second", c.Rate))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"duration", c.Duration}, {"relist period", c.RelistPeriod}, {"dwell", c.Dwell}, {"drain timeout", c.DrainTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v: must be positive", d.name, d.v))
		}
	}
	if c.ContainersPerPod < 0 {
		errs = append(errs, fmt.Errorf("containers per pod %d: must be positive", c.ContainersPerPod))
	}
	return errors.Join(errs...)
}

// Result is what one mode's run measured.
type Result struct {
	Mode Mode
	// Expected is the number of transitions (raw: messages) the driver made
	// while measuring; Acked how many of them were acked, matched by
	// container ID and event type.
	Expected, Acked int
	// Duplicates counts acks of a transition that was acked already.
	Duplicates int
	// ByRelist counts the acked events a relist detected rather than the
	// event stream.
	ByRelist int
	// Rate is the rate the driver achieved while measuring, per second.
	Rate float64
	// Runtime is where the simulated runtime ran; empty in raw mode.
	Runtime RuntimeTopology
	// CPU is the CPU use while measuring, in cores, of the harness's
	// process: the bridge and the NATS server, and in the in-process
	// topology the simulated runtime too. 0 where unknown.
	CPU float64
	// RuntimeCPU is the simulated runtime's process's CPU use while
	// measuring, in cores, in the process topology; 0 otherwise or where
	// unknown.
	RuntimeCPU float64
	// Latency summarises the acked transitions' latencies.
	Latency Summary
	// Stages splits the latency of the bridge modes' events into the stages
	// the harness sees from outside (StageStream, StageDetect, StageEncode,
	// StageAck), when Config.Stages asks for it. The stages' percentiles do
	// not add up to the total's.
	Stages []Stage
}

// Stage is the latency of one stage of a bridge event.
type Stage struct {
	Name    string
	Latency Summary
}

// Lost returns the number of transitions that were never acked.
func (r Result) Lost() int { return r.Expected - r.Acked }

// Harness runs measurements against one embedded NATS server with JetStream.
// Its methods must not be called concurrently: runs would disturb each
// other's latencies.
type Harness struct {
	cfg     Config
	dir     string
	tempDir bool
	ns      *server.Server
	enc     *publish.Encoder
}

// Start starts the embedded NATS server (loopback, a random port, the store
// under cfg.Dir) and creates the bridge's stream with the production
// settings. Close stops it.
func Start(ctx context.Context, cfg Config) (*Harness, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, fmt.Errorf("configure latency harness: %w", err)
	}
	h := &Harness{cfg: cfg, dir: cfg.Dir}
	if h.dir == "" {
		dir, err := os.MkdirTemp("", "pleg-bench-")
		if err != nil {
			return nil, err
		}
		h.dir, h.tempDir = dir, true
	}
	ns, err := natsembed.Start(natsembed.Options{DataDir: filepath.Join(h.dir, "nats"), Port: -1})
	if err != nil {
		h.Close()
		return nil, err
	}
	h.ns = ns
	if err := h.setUp(ctx); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

func (h *Harness) setUp(ctx context.Context) error {
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: nodeName, SubjectPrefix: subjectPrefix})
	if err != nil {
		return err
	}
	h.enc = enc
	nc, js, err := h.connect("setup")
	if err != nil {
		return err
	}
	defer nc.Close()
	return bridge.EnsureStream(ctx, js, h.bridgeOptions())
}

// bridgeOptions are the options the harness's bridges share: the production
// defaults (a spool as large as the command's default) on the harness's
// NATS server and stream. runBridge adds the runtime, the mode, a data
// directory and its hooks.
func (h *Harness) bridgeOptions() bridge.Options {
	return bridge.Options{
		Node:          nodeName,
		SubjectPrefix: subjectPrefix,
		RelistPeriod:  h.cfg.RelistPeriod,
		NATS:          bridge.NATSOptions{URL: h.ns.ClientURL()},
		Stream:        bridge.StreamOptions{Manage: true},
		SpoolMaxBytes: bridge.DefaultSpoolMaxBytes,
		Logger:        h.cfg.Logger,
	}
}

// connect opens a connection for raw mode and the stream setup, with a
// JetStream handle that has room for twice the publisher's messages in
// flight, so that raw publishing never waits on nats.go's pending limit.
func (h *Harness) connect(name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(h.ns.ClientURL(), nats.Name("pleg-bench "+name))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the embedded NATS server: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*publish.DefaultMaxInFlight))
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("create JetStream context: %w", err)
	}
	return nc, js, nil
}

// Config returns the configuration in use, defaults applied.
func (h *Harness) Config() Config { return h.cfg }

// Run measures one mode: it blocks for about Warmup+Duration, plus the setup
// and, in generic mode, a relist period or two. Every component it starts
// is stopped before it returns. It returns an error if a component fails or
// ctx ends; events that were not acked are reported in the Result, not as
// an error.
func (h *Harness) Run(ctx context.Context, mode Mode) (Result, error) {
	switch mode {
	case ModeRaw:
		return h.runRaw(ctx)
	case ModeEvented, ModeContainerd, ModeGeneric:
		return h.runBridge(ctx, mode)
	}
	return Result{}, fmt.Errorf("unknown mode %q", mode)
}

// Close stops the NATS server and removes the temporary directory, if
// Start made it.
func (h *Harness) Close() {
	if h.ns != nil {
		h.ns.Shutdown()
		h.ns.WaitForShutdown()
	}
	if h.tempDir {
		os.RemoveAll(h.dir)
	}
}

// startTrace records the process with runtime/trace into Config.TraceDir,
// if set, until stop is called.
func (h *Harness) startTrace(mode Mode) (stop func(), err error) {
	if h.cfg.TraceDir == "" {
		return func() {}, nil
	}
	f, err := os.Create(filepath.Join(h.cfg.TraceDir, fmt.Sprintf("latency-%s-%d.trace", mode, time.Now().UnixNano())))
	if err != nil {
		return nil, fmt.Errorf("trace %s mode: %w", mode, err)
	}
	if err := trace.Start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("trace %s mode: %w", mode, err)
	}
	return func() {
		trace.Stop()
		f.Close()
	}, nil
}
