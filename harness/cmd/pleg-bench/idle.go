package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
)

// daemonSetMemLimit is the GOMEMLIMIT the DaemonSet gives the bridge
// (deploy/kubernetes/daemonset.yaml): 90% of its 192 MiB memory limit.
const daemonSetMemLimit = "GOMEMLIMIT=172MiB"

// idleConfig is what measureNodes measures.
type idleConfig struct {
	sizes  []nodeSize    // idle CPU and peak RSS
	window time.Duration // one repetition
	reps   int
	settle time.Duration // before the first window
	// rssSizes are measured for peak RSS only, over one window of rssWindow.
	rssSizes  []nodeSize
	rssWindow time.Duration
	// memoryOnly runs the bridges without a data directory (see nodeRun).
	memoryOnly bool
	// bridgeEnv is added to the bridges' environment (GOGC=50, ...).
	bridgeEnv []string
	// cgroupLimit, if positive, runs the bridges of the peak RSS sizes each
	// in a memory cgroup with this hard limit (the DaemonSet's), where the
	// machine lets this process make one.
	cgroupLimit int64
}

// daemonSetMemoryLimit is the DaemonSet's memory limit, 192 MiB
// (deploy/kubernetes/daemonset.yaml).
const daemonSetMemoryLimit = 192 << 20

// withNATS runs f with the client URL of a JetStream server of its own, in
// this process.
func withNATS(f func(url string) error) error {
	dir, err := os.MkdirTemp("", "pleg-bench-nats-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ns, err := natsembed.Start(natsembed.Options{DataDir: dir, Port: -1})
	if err != nil {
		return err
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	return f(ns.ClientURL())
}

// measureNodes measures, for each node size, the bridge in generic and in
// evented mode at rest (nothing changes in the runtime), each in a process
// of its own as the DaemonSet runs it, beside a bare relist loop and a Go
// process that does nothing, all four on the same simulated runtime (a
// process of its own) at the same time, so that they share the machine's
// load; the idle sizes are measured at the same time too, the peak RSS
// sizes one after the other. CPU is read over windows of cfg.window; peak RSS at the end.
func measureNodes(ctx context.Context, cfg idleConfig, natsURL string, progress io.Writer) ([]measurement, error) {
	// The idle sizes at the same time: at rest they hardly load the
	// machine, and the run takes a minute less per size.
	bySize := make([][]measurement, len(cfg.sizes))
	g, gctx := errgroup.WithContext(ctx)
	for i, size := range cfg.sizes {
		g.Go(func() error {
			r, err := measureNode(gctx, size, natsURL, cfg, cfg.settle, cfg.window, cfg.reps, true, progress)
			bySize[i] = r
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	rows := slices.Concat(bySize...)
	for _, size := range cfg.rssSizes {
		r, err := measureNode(ctx, size, natsURL, cfg, cfg.settle, cfg.rssWindow, 1, false, progress)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

func measureNode(ctx context.Context, size nodeSize, natsURL string, cfg idleConfig, settle, window time.Duration, reps int, cpu bool, progress io.Writer) (_ []measurement, err error) {
	dir, err := os.MkdirTemp("", "pleg-bench-node-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	node, err := startNode(ctx, dir, natsURL, size, cfg.memoryOnly)
	if err == nil {
		node.bridgeEnv = cfg.bridgeEnv
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := node.close(); err == nil && cerr != nil {
			err = fmt.Errorf("runtime %s: %w", size, cerr)
		}
	}()
	// The peak RSS sizes' bridges run under the DaemonSet's memory limit,
	// applied by the kernel, where this process may make memory cgroups.
	var cgroups [2]*memCgroup // generic, evented
	if !cpu && cfg.cgroupLimit > 0 {
		for i, mode := range []generator.Mode{generator.ModeGeneric, generator.ModeEvented} {
			cg, err := newMemCgroup(fmt.Sprintf("pleg-bench-%d-%s", os.Getpid(), mode), cfg.cgroupLimit)
			if err != nil {
				fmt.Fprintf(progress, "node %s: the %s bridge runs without a memory limit: %v\n", size, mode, err)
				continue
			}
			cgroups[i] = cg
			defer cg.remove() // after the bridge is stopped (deferred below)
		}
	}
	// The bridges first, so that the others' start does not stand in the
	// way of their first relist.
	var generic, evented, bare, empty *child
	defer func() {
		if serr := stopAll(generic, evented, bare, empty); err == nil {
			err = serr
		}
	}()
	var limitRows []measurement
	startBridge := func(i int, mode generator.Mode) (*child, error) {
		c, err := node.bridgeIn(ctx, cgroups[i], mode, daemonSetMemLimit)
		if cg := cgroups[i]; cg != nil {
			row := limitRow(cg, mode, size, cfg.cgroupLimit, err == nil)
			limitRows = append(limitRows, row)
			if err != nil {
				kills, _ := cg.oomKills()
				err = fmt.Errorf("%w (in a memory cgroup limited to %d MiB: %d OOM kills, %s MiB at most)", err, cfg.cgroupLimit>>20, kills, row.unit.format(row.values[0]))
			}
		}
		return c, err
	}
	if generic, err = startBridge(0, generator.ModeGeneric); err != nil {
		return limitRows, err
	}
	if evented, err = startBridge(1, generator.ModeEvented); err != nil {
		return limitRows, err
	}
	if bare, err = node.bare(ctx); err != nil {
		return nil, err
	}
	if empty, err = startChild(ctx, "bare Go process", childSpec{Role: roleEmpty}); err != nil {
		return nil, err
	}
	all := []*child{generic, evented, bare, empty}
	if err := sleep(ctx, settle); err != nil {
		return nil, err
	}
	cpuOf := make([][]float64, len(all)) // cpu-s per minute, by child and repetition
	prev, err := statsOf(ctx, all)
	if err != nil {
		return nil, err
	}
	for rep := range reps {
		if err := sleep(ctx, window); err != nil {
			return nil, err
		}
		cur, err := statsOf(ctx, all)
		if err != nil {
			return nil, err
		}
		for i := range all {
			cpuOf[i] = append(cpuOf[i], (cur[i].CPU-prev[i].CPU).Seconds()*float64(time.Minute)/float64(window))
		}
		prev = cur
		if cpu {
			// Each window apart: the first after the start-up holds the
			// evented bridge's relist that fills its listing memo.
			fmt.Fprintf(progress, "node %s, window %d: generic %.3f cpu-s/min (bare loop %.3f), evented %.4f %% of a core (bare Go process %.4f %%)\n",
				size, rep+1, cpuOf[0][rep], cpuOf[2][rep], cpuOf[1][rep]/60*100, cpuOf[3][rep]/60*100)
		}
	}
	if prev[2].Events > 0 {
		return nil, fmt.Errorf("node %s changed while at rest: the bare loop saw %d changes", size, prev[2].Events)
	}
	fmt.Fprintf(progress, "node %s measured in %v\n", size, time.Since(start).Round(100*time.Millisecond))

	var rows []measurement
	if cpu {
		evTarget := 0.1
		if size.containers <= 330 {
			evTarget = 0.05
		}
		share := func(vs []float64) []float64 { // cpu-s/min to % of a core
			out := make([]float64, len(vs))
			for i, v := range vs {
				out[i] = v / 60 * 100
			}
			return out
		}
		rows = append(rows,
			measurement{name: "idle cpu, generic, " + size.String(), unit: cpuPerMinute, values: cpuOf[0],
				baseName: "bare loop", base: cpuOf[2], target: "≤1.0×", met: medianRatioAtMost(1.0)},
			measurement{name: "idle cpu, evented, " + size.String(), unit: coreShare, values: share(cpuOf[1]),
				baseName: "bare Go process", base: share(cpuOf[3]),
				target: fmt.Sprintf("≤%g%% of a core", evTarget), met: medianAtMost(evTarget)},
		)
	}
	rss := func(st childStats) []float64 { return []float64{float64(st.MaxRSS) / (1 << 20)} }
	rssRow := func(mode string, st childStats) measurement {
		m := measurement{name: fmt.Sprintf("peak RSS, %s, %s", mode, size), unit: mebibytes, values: rss(st),
			baseName: "bare loop", base: rss(prev[2])}
		switch {
		case size.containers >= 30_000:
			m.target, m.met = "≤192 MiB", maxAtMost(192)
		case size.containers >= 20_000:
			m.target, m.met = "≤160 MiB", maxAtMost(160)
		case size.containers >= 5_000:
			m.target, m.met = "≤64 MiB", maxAtMost(64)
		}
		return m
	}
	rows = append(rows, rssRow("generic", prev[0]), rssRow("evented", prev[1]))
	return append(rows, limitRows...), nil
}

// limitRow reports a bridge's first relist under a memory cgroup's limit:
// the most the kernel charged to it (its anonymous memory and the page
// cache of its files), and whether it got through (became ready, and was
// not killed for want of memory).
func limitRow(cg *memCgroup, mode generator.Mode, size nodeSize, limit int64, ready bool) measurement {
	peak, err := cg.peak()
	kills, kerr := cg.oomKills()
	ok := ready && err == nil && kerr == nil && kills == 0
	return measurement{
		name: fmt.Sprintf("first relist in a %d MiB memory cgroup, %s, %s", limit>>20, mode, size), unit: mebibytes,
		values: []float64{float64(peak) / (1 << 20)},
		target: "no OOM kill", met: func(measurement) bool { return ok },
	}
}

func statsOf(ctx context.Context, cs []*child) ([]childStats, error) {
	out := make([]childStats, len(cs))
	for i, c := range cs {
		var err error
		if out[i], err = c.stats(ctx); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// sleep waits for d or until ctx is done: the benchmark's measuring
// windows.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
