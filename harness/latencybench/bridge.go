package latencybench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// readyTimeout bounds the wait for a bridge to be in its steady state before
// the driver starts: first relist merged and acked, stream subscribed.
const readyTimeout = 30 * time.Second

// readyPoll is how often the harness looks whether the bridge is ready; the
// bridge offers no signal to wait on, and this is outside the measurement.
const readyPoll = 10 * time.Millisecond

// runBridge measures one bridge mode on a new simulated node: the runtime on
// a unix socket, in a process of its own or in this one (Config.Runtime),
// and the bridge as package bridge runs it in production, durable state in
// a data directory of its own included, with the production defaults except
// for the mode and the generic relist period. The harness observes it
// through the bridge's hooks: the acks, and with Config.Stages the runtime's
// stream and the hand-over to the publisher.
func (h *Harness) runBridge(ctx context.Context, mode Mode) (Result, error) {
	cfg := h.cfg
	tr := newTracker(int(cfg.Rate * (cfg.Warmup + cfg.Duration).Seconds()))
	slots := max(3, int(math.Ceil(cfg.Rate*cfg.Dwell.Seconds())))
	sock := filepath.Join(h.dir, string(mode)+".sock")
	dataDir, err := os.MkdirTemp(h.dir, string(mode)+"-data-")
	if err != nil {
		return Result{}, fmt.Errorf("measure %s mode: %w", mode, err)
	}

	opts := h.bridgeOptions()
	opts.CRIEndpoint = "unix://" + sock
	opts.DataDir = dataDir
	preset := crisim.Containerd24Options
	switch mode {
	case ModeGeneric:
		opts.Mode = generator.ModeGeneric
	case ModeContainerd:
		opts.Mode = generator.ModeContainerdEvents
		preset = crisim.Containerd17Options
	default:
		opts.Mode = generator.ModeEvented
	}
	opts.Hooks.OnAck = tr.onAck
	if cfg.Stages {
		timeStages(&opts.Hooks, tr)
	}
	b, err := bridge.New(opts)
	if err != nil {
		return Result{}, fmt.Errorf("measure %s mode: %w", mode, err)
	}

	// The runtime starts last: from then on only the goroutines below stop
	// it. Either topology gives the same three things.
	var (
		serve      func(ctx context.Context) error          // serves CRI until ctx is done
		drive      func(ctx context.Context) (paced, error) // makes the transitions, tracked; returns after the last
		subscribed func() bool                              // the stream has a subscriber; nil where not visible
	)
	switch cfg.Runtime {
	case RuntimeInProcess:
		model := crisim.NewRuntime(preset())
		pool, err := newPool(model, slots, cfg.ContainersPerPod, tr.track)
		if err != nil {
			return Result{}, err
		}
		lis, err := crisim.Listen(sock)
		if err != nil {
			return Result{}, err
		}
		sim := crisim.NewServer(model, crisim.ServerOptions{})
		serve = func(ctx context.Context) error { return sim.Serve(ctx, lis) }
		drive = func(ctx context.Context) (paced, error) {
			return pace(ctx, cfg.Rate, cfg.Warmup, cfg.Duration, pool.transition)
		}
		subscribed = func() bool { st := model.Stats(); return st.Subscribers+st.TaskSubscribers > 0 }
	default: // RuntimeProcess; the process waits for the subscription itself
		env, err := runtimeProcessEnv(runtimeSpec{
			Socket: sock, Rate: cfg.Rate, Warmup: cfg.Warmup, Duration: cfg.Duration,
			Slots: slots, ContainersPerPod: cfg.ContainersPerPod, WaitSubscriber: mode.subscribes(),
			Containerd17: mode == ModeContainerd,
		})
		if err != nil {
			return Result{}, fmt.Errorf("measure %s mode: %w", mode, err)
		}
		proc, err := startRuntimeProcess(ctx, env, cfg.Logger)
		if err != nil {
			return Result{}, fmt.Errorf("measure %s mode: %w", mode, err)
		}
		serve = func(ctx context.Context) error { return proc.run(ctx, tr) }
		// Pacing runs late only when the runtime's process is starved.
		timeout := readyTimeout + 2*(cfg.Warmup+cfg.Duration)
		drive = func(ctx context.Context) (paced, error) { return proc.drive(ctx, timeout) }
	}

	// The bridge stops in its own shutdown order; the runtime goes away
	// after it, as a node's runtime outlives the bridge that reads it.
	eg, egctx := errgroup.WithContext(ctx)
	simCtx, stopSim := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSim()
	runCtx, stopBridge := context.WithCancel(egctx)
	defer stopBridge()
	eg.Go(func() error { return serve(simCtx) })
	eg.Go(func() error {
		defer stopSim()
		if err := b.Run(runCtx); err != nil {
			return fmt.Errorf("bridge: %w", err)
		}
		return nil
	})
	var res Result
	eg.Go(func() error {
		defer stopBridge()
		if err := waitReady(egctx, mode, b, subscribed); err != nil {
			return err
		}
		stopTrace, err := h.startTrace(mode)
		if err != nil {
			return err
		}
		p, err := drive(egctx)
		stopTrace()
		if err != nil {
			return err
		}
		tr.finish()
		drain := time.NewTimer(cfg.DrainTimeout)
		defer drain.Stop()
		select {
		case <-tr.allAcked:
		case <-drain.C: // what is missing is reported as lost
		case <-egctx.Done():
			return egctx.Err()
		}
		res = tr.result(mode, p)
		res.Runtime = cfg.Runtime
		return nil
	})
	if err := eg.Wait(); err != nil {
		return Result{}, fmt.Errorf("measure %s mode: %w", mode, err)
	}
	return res, nil
}

// waitReady returns once the bridge is in its steady state: the first relist
// merged, everything it produced acked, and in evented mode the stream
// subscribed (as far as subscribed, if not nil, can tell), so that the
// driver's first transitions are not queued behind the setup's.
func waitReady(ctx context.Context, mode Mode, b *bridge.Bridge, subscribed func() bool) error {
	return pollUntil(ctx, func() bool {
		st := b.Status()
		ready := st.Built && st.Synced && st.Pending == 0
		if mode.subscribes() {
			ready = ready && st.Mode == generator.ModeEvented && (subscribed == nil || subscribed())
		}
		return ready
	}, "the bridge did not become ready (first relist acked, stream subscribed) within "+readyTimeout.String())
}

// pollUntil returns once cond holds, looking every readyPoll; ctx.Err() if
// ctx is done first, and an error saying timeout after readyTimeout.
func pollUntil(ctx context.Context, cond func() bool, timeout string) error {
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return errors.New(timeout)
		case <-t.C:
		}
	}
	return nil
}
