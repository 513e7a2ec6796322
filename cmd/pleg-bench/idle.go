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
}

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
	// The bridges first, so that the others' start does not stand in the
	// way of their first relist.
	var generic, evented, bare, empty *child
	defer func() {
		if serr := stopAll(generic, evented, bare, empty); err == nil {
			err = serr
		}
	}()
	if generic, err = node.bridge(ctx, generator.ModeGeneric, daemonSetMemLimit); err != nil {
		return nil, err
	}
	if evented, err = node.bridge(ctx, generator.ModeEvented, daemonSetMemLimit); err != nil {
		return nil, err
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
	prev, err := statsOf(all)
	if err != nil {
		return nil, err
	}
	for range reps {
		if err := sleep(ctx, window); err != nil {
			return nil, err
		}
		cur, err := statsOf(all)
		if err != nil {
			return nil, err
		}
		for i := range all {
			cpuOf[i] = append(cpuOf[i], (cur[i].CPU-prev[i].CPU).Seconds()*float64(time.Minute)/float64(window))
		}
		prev = cur
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
	return rows, nil
}

func statsOf(cs []*child) ([]childStats, error) {
	out := make([]childStats, len(cs))
	for i, c := range cs {
		var err error
		if out[i], err = c.stats(); err != nil {
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
