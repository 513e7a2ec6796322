// Command pleg-bench measures pleg-bridge as the DaemonSet runs it (package
// bridge, a data directory, GOMEMLIMIT) against the simulated runtime
// serving CRI over a unix socket from a process of its own, on nodes whose
// pods and containers carry the kubelet's labels and annotations, and
// prints one table: each figure as the median and range over repetitions,
// beside its baseline measured in the same run, and their ratio. Rows: idle
// CPU of the bridge in generic and evented mode, each in a process of its
// own, beside a bare ListPodSandbox + ListContainers + diff loop and a Go
// process that does nothing, all running at the same time; peak RSS of
// those bridges by node size, first relist included; the cost of one full
// relist beside the bare List round trip; detection latency (a transition
// in the runtime to the JetStream ack of its event) in evented and generic
// mode beside raw JetStream publish→ack, at 1,000 transitions/s.
//
//	go run ./harness/cmd/pleg-bench                              # everything, about 5 minutes
//	go run ./harness/cmd/pleg-bench --modes= --relist=false      # idle CPU and peak RSS only
//	go run ./harness/cmd/pleg-bench --idle=false --modes=        # the relist rows only
//	go run ./harness/cmd/pleg-bench --sizes=110/330 --reps=3     # other sizes, more repetitions
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/latencybench"
)

func main() {
	// The detection latency harness re-executes this executable as the
	// simulated runtime's process; that process must not get further.
	latencybench.MaybeRunRuntimeProcess()
	maybeRunChild()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pleg-bench:", err)
		os.Exit(1)
	}
}

// errLost is returned when a mode did not get every event acked: the
// latencies printed are then not the whole story.
var errLost = errors.New("events were lost")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("pleg-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rate := fs.Float64("rate", latencybench.DefaultRate, "container transitions (Lifecycle events) per second of the latency rows")
	duration := fs.Duration("duration", 5*time.Second, "how long each latency mode is measured, after the warmup")
	warmup := fs.Duration("warmup", latencybench.DefaultWarmup, "transitions made at the same rate before measuring (0: none)")
	modesFlag := fs.String("modes", "raw,evented,containerd,generic", "modes to measure, comma-separated: raw, evented, containerd (containerd-events against the containerd 1.7 preset), generic (empty: none)")
	runtimeFlag := fs.String("runtime", string(latencybench.RuntimeProcess),
		"where the simulated runtime and its driver run: process (a child process, as containerd runs beside the bridge) or inprocess (the bridge's process)")
	stages := fs.Bool("stages", false, "also time the stages of each bridge event (stream, merge, encode, ack) and print them")
	throughput := fs.Bool("throughput", true, "measure the evented bridge's throughput and CPU per transition beside the raw stream decode + async publish")
	throughputRate := fs.Float64("throughput-rate", 10_400, "transitions per second asked of the runtime in the throughput rows; a 5 s churn makes some 3% fewer (its last pods make only their starts), so 10,400 asks for at least 10,000")
	throughputFor := fs.Duration("throughput-duration", 5*time.Second, "how long the runtime churns for the throughput rows")
	relist := fs.Bool("relist", true, "measure the cost of one full relist (steady and first) beside the bare List round trip")
	relistSizesFlag := fs.String("relist-sizes", "110/330,1000/5000,5000/20000", "node sizes (pods/containers) of the relist rows")
	idle := fs.Bool("idle", true, "measure idle CPU and peak RSS of the bridge in its own process, generic and evented, beside a bare relist loop")
	sizesFlag := fs.String("sizes", "110/330,1000/5000", "node sizes (pods/containers) for idle CPU and peak RSS")
	rssSizesFlag := fs.String("rss-sizes", "5000/20000,7500/30000", "node sizes measured for peak RSS only (first relist included)")
	window := fs.Duration("window", 30*time.Second, "idle CPU window; at least the evented safety-net relist period, so that each window holds one")
	settle := fs.Duration("settle", 3*time.Second, "how long the processes run once ready before the first idle window")
	memoryOnly := fs.Bool("memory-only", false, "run the measured bridges without a data directory (no checkpoint, no spool written through), to see what the durable state costs")
	cgroupLimit := fs.Bool("cgroup-limit", true, "run the peak RSS sizes' bridges each in a memory cgroup limited to the DaemonSet's 192 MiB, where this process may make one, and report whether the first relist gets through")
	bridgeEnv := fs.String("bridge-env", "", "environment variables added to the measured bridges' (after the DaemonSet's GOMEMLIMIT), space-separated, e.g. GOGC=50")
	reps := fs.Int("reps", 2, "repetitions of each idle window, relist benchmark, throughput run and latency mode")
	logLevel := fs.String("log-level", "warn", "log level of the bridge under test: debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: pleg-bench [flags]\n\n"+
			"Measures pleg-bridge as the DaemonSet runs it, each bridge in a process of its own, against the\n"+
			"simulated runtime (kubelet-like labels and annotations) serving CRI from a process of its own,\n"+
			"and prints one table, each figure beside a baseline measured in the same run: idle CPU and peak\n"+
			"RSS (beside a bare relist loop and an idle Go process), the cost of a relist (beside the bare\n"+
			"List round trip), throughput and CPU per transition (beside a raw stream decode + async\n"+
			"publish), and detection latency per mode (beside raw JetStream publish→ack). See BENCHMARKS.md.\n\n"+
			"Flags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	modes, err := latencybench.ParseModes(*modesFlag)
	if err != nil {
		return fmt.Errorf("--modes=%q: %w", *modesFlag, err)
	}
	runtimeTopology, err := latencybench.ParseRuntime(*runtimeFlag)
	if err != nil {
		return fmt.Errorf("--runtime=%q: %w", *runtimeFlag, err)
	}
	if *rate <= 0 {
		return fmt.Errorf("--rate=%v: must be positive", *rate)
	}
	if *duration <= 0 {
		return fmt.Errorf("--duration=%v: must be positive", *duration)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level=%q: want debug, info, warn or error", *logLevel)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if *warmup == 0 {
		*warmup = -1 // Config's zero means the default
	}

	sizes, err := parseSizes(*sizesFlag)
	if err != nil {
		return fmt.Errorf("--sizes=%q: %w", *sizesFlag, err)
	}
	rssSizes, err := parseSizes(*rssSizesFlag)
	if err != nil {
		return fmt.Errorf("--rss-sizes=%q: %w", *rssSizesFlag, err)
	}
	relistSizes, err := parseSizes(*relistSizesFlag)
	if err != nil {
		return fmt.Errorf("--relist-sizes=%q: %w", *relistSizesFlag, err)
	}
	if *reps < 1 {
		return fmt.Errorf("--reps=%d: must be at least 1", *reps)
	}
	if *window <= 0 {
		return fmt.Errorf("--window=%v: must be positive", *window)
	}

	var limit int64 // the peak RSS sizes' memory cgroup limit
	if *cgroupLimit {
		limit = daemonSetMemoryLimit
	}
	cpu0, cpuOK := readCPUTimes()
	var rows []measurement
	if *idle || *throughput {
		err := withNATS(func(url string) error {
			if *idle {
				r, err := measureNodes(ctx, idleConfig{
					sizes: sizes, window: *window, reps: *reps, settle: *settle, rssSizes: rssSizes, rssWindow: 10 * time.Second, memoryOnly: *memoryOnly, bridgeEnv: strings.Fields(*bridgeEnv),
					cgroupLimit: limit,
				}, url, stderr)
				if err != nil {
					return err
				}
				rows = append(rows, r...)
			}
			if *throughput {
				r, err := measureThroughput(ctx, throughputConfig{
					rate: *throughputRate, duration: *throughputFor, reps: *reps, memoryOnly: *memoryOnly, bridgeEnv: strings.Fields(*bridgeEnv),
				}, url, stderr)
				if err != nil {
					return err
				}
				rows = append(rows, r...)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if *relist {
		r, err := measureRelist(ctx, relistSizes, *reps, stderr)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
	}
	var lost bool
	if len(modes) > 0 {
		var all []latencybench.Result
		for range *reps {
			results, err := measureLatency(ctx, latencybench.Config{
				Rate: *rate, Duration: *duration, Warmup: *warmup, Runtime: runtimeTopology, Stages: *stages, Logger: logger,
				TraceDir: os.Getenv(profileEnv),
			}, modes, stdout, stderr)
			if err != nil {
				return err
			}
			for _, r := range results {
				lost = lost || r.Lost() > 0
			}
			all = append(all, results...)
			fmt.Fprintln(stdout)
		}
		rows = append(rows, latencyRows(all)...)
	}
	if len(rows) > 0 {
		fmt.Fprintf(stdout, "summary: %d repetitions; idle windows of %v; ratios are per repetition, against the baseline measured beside it\n", *reps, *window)
		if cpu1, ok := readCPUTimes(); ok && cpuOK {
			if note := stealNote(cpu0, cpu1); note != "" {
				fmt.Fprintln(stdout, note)
			}
		}
		fmt.Fprintln(stdout)
		if err := writeMeasurements(stdout, rows); err != nil {
			return err
		}
	}
	if lost {
		return errLost
	}
	return nil
}

// measureLatency runs the modes one after the other on one NATS server and
// prints their table to w, and its progress to progress.
func measureLatency(ctx context.Context, cfg latencybench.Config, modes []latencybench.Mode, w, progress io.Writer) ([]latencybench.Result, error) {
	h, err := latencybench.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	cfg = h.Config()
	topology := "the simulated runtime runs in a child process (--runtime process); the bridge process's cpu includes the NATS server"
	if cfg.Runtime == latencybench.RuntimeInProcess {
		topology = "the simulated runtime runs in the bridge's process (--runtime inprocess); process cpu includes it and the NATS server"
	}
	fmt.Fprintf(w, "detection latency: %.0f transitions/s for %v per mode after a %v warmup; pods of %d container slots, each container %v running, %v exited;\n"+
		"runtime transition (raw: PublishMsgAsync) to JetStream ack; generic mode relists every %v;\n%s\n\n",
		cfg.Rate, cfg.Duration, cfg.Warmup, cfg.ContainersPerPod, cfg.Dwell, cfg.Dwell, cfg.RelistPeriod, topology)
	var results []latencybench.Result
	for _, m := range modes {
		start := time.Now()
		r, err := h.Run(ctx, m)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(progress, "%s measured in %v\n", m, time.Since(start).Round(100*time.Millisecond))
		results = append(results, r)
	}
	return results, latencybench.WriteTable(w, results)
}
