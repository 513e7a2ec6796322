package latencybench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
)

// readyTimeout bounds the wait for a bridge to be in its steady state before
// the driver starts: first relist merged and acked, stream subscribed.
const readyTimeout = 30 * time.Second

// readyPoll is how often the harness looks whether the bridge is ready; the
// generator offers no signal to wait on, and this is outside the measurement.
const readyPoll = 10 * time.Millisecond

// runBridge measures one bridge mode on a new simulated node: the runtime on
// a unix socket, in a process of its own or in this one (Config.Runtime),
// the CRI client, and a generator and publisher wired as cmd/pleg-bridge
// wires them, with the production defaults except for the mode and the
// generic relist period.
func (h *Harness) runBridge(ctx context.Context, mode Mode) (Result, error) {
	cfg := h.cfg
	tr := newTracker(int(cfg.Rate * (cfg.Warmup + cfg.Duration).Seconds()))
	slots := max(3, int(math.Ceil(cfg.Rate*cfg.Dwell.Seconds())))
	sock := filepath.Join(h.dir, string(mode)+".sock")

	cri, err := generator.NewCRIClient("unix://"+sock, generator.CRIOptions{})
	if err != nil {
		return Result{}, err
	}
	defer cri.Close()
	nc, js, err := h.connect(string(mode))
	if err != nil {
		return Result{}, err
	}
	defer nc.Close()

	reg := prometheus.NewRegistry()
	pub, err := publish.New(js, publish.Options{
		Encoder:      h.enc,
		MaxInFlight:  publish.DefaultMaxInFlight,
		OutboxSize:   publish.DefaultOutboxSize,
		DrainTimeout: publish.DefaultDrainTimeout,
		Registerer:   reg,
		Logger:       cfg.Logger,
		OnAck:        tr.onAck,
	})
	if err != nil {
		return Result{}, err
	}
	metrics := generator.NewMetrics(reg)
	gmode := generator.ModeEvented
	if mode == ModeGeneric {
		gmode = generator.ModeGeneric
	}
	var rt generator.Runtime = generator.InstrumentRuntime(cri, metrics)
	var sink generator.Sink = pub
	if cfg.Stages {
		rt, sink = timedRuntime{Runtime: rt, tr: tr}, timedSink{pub: pub, tr: tr}
	}
	gen := generator.New(rt, sink, generator.Options{
		Mode:         gmode,
		RelistPeriod: cfg.RelistPeriod,
		Logger:       cfg.Logger,
		Metrics:      metrics,
	})

	// The runtime starts last: from then on only the goroutines below stop
	// it. Either topology gives the same three things.
	var (
		serve      func(ctx context.Context) error          // serves CRI until ctx is done
		drive      func(ctx context.Context) (paced, error) // makes the transitions, tracked; returns after the last
		subscribed func() bool                              // the stream has a subscriber; nil where not visible
	)
	switch cfg.Runtime {
	case RuntimeInProcess:
		model := crisim.NewRuntime(crisim.Containerd24Options())
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
		subscribed = func() bool { return model.Stats().Subscribers > 0 }
	default: // RuntimeProcess; the process waits for the subscription itself
		env, err := runtimeProcessEnv(runtimeSpec{
			Socket: sock, Rate: cfg.Rate, Warmup: cfg.Warmup, Duration: cfg.Duration,
			Slots: slots, ContainersPerPod: cfg.ContainersPerPod, WaitSubscriber: mode == ModeEvented,
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

	// Shutdown order as in the bridge: the generator stops first, then the
	// publisher delivers what is pending, then the runtime goes away.
	eg, egctx := errgroup.WithContext(ctx)
	simCtx, stopSim := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSim()
	pubCtx, stopPub := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPub()
	genCtx, stopGen := context.WithCancel(egctx)
	defer stopGen()
	eg.Go(func() error { return serve(simCtx) })
	eg.Go(func() error {
		defer stopSim()
		if err := pub.Run(pubCtx); err != nil {
			return fmt.Errorf("publisher: %w", err)
		}
		return nil
	})
	eg.Go(func() error {
		defer stopPub()
		if err := gen.Run(genCtx); err != nil {
			return fmt.Errorf("generator: %w", err)
		}
		return nil
	})
	var res Result
	eg.Go(func() error {
		defer stopGen()
		if err := waitReady(egctx, mode, gen, pub, subscribed); err != nil {
			return err
		}
		p, err := drive(egctx)
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
func waitReady(ctx context.Context, mode Mode, gen *generator.Generator, pub *publish.Publisher, subscribed func() bool) error {
	return pollUntil(ctx, func() bool {
		ready := gen.Synced() && pub.Pending() == 0
		if mode == ModeEvented {
			ready = ready && gen.Mode() == generator.ModeEvented && (subscribed == nil || subscribed())
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
