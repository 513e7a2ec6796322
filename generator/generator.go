package generator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/pleg-bridge/pleg-bridge/statecache"
	"golang.org/x/sync/errgroup"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Defaults for Options.
const (
	DefaultRelistPeriod      = time.Second
	DefaultRelistThreshold   = 3 * time.Minute
	DefaultStatusConcurrency = 8
	// DefaultTombstoneTTL keeps removed containers long enough to recognise
	// containerd's replay of stale events (it keeps them up to 5 minutes).
	DefaultTombstoneTTL = 10 * time.Minute
	// DefaultEventedRelistPeriod is the safety-net relist in evented mode.
	// BenchmarkRelist measures a steady relist (nothing changed) of a
	// 30,000-container node at ~120 ms of CPU in the bridge, ~300 ms with
	// the runtime's side of the gRPC calls; of a 1,000-container node at
	// ~10 ms. Every 30 s that is 0.4% of a core (1% with the runtime) on the
	// largest node, against 12-30% when relisting every second, while it
	// bounds how long a lost stream event can go unnoticed to 30 s; the
	// kubelet's 300 s would let such a loss linger.
	DefaultEventedRelistPeriod = 30 * time.Second
	DefaultStreamFailureLimit  = 3
	DefaultStreamBackoffMin    = 500 * time.Millisecond
	DefaultStreamBackoffMax    = 30 * time.Second
	DefaultStreamHealthyAfter  = 30 * time.Second
	// DefaultTargetedRelistDelay is how long the targeted relist after a
	// STOPPED or DELETED event waits for more of the same pod's events to
	// coalesce with. A pod's termination stops and removes each of its
	// containers and its sandbox within a few milliseconds; one listing
	// confirms them all. Waiting also keeps the confirming call off the CPU
	// while the event that asked for it is still being published.
	DefaultTargetedRelistDelay = 100 * time.Millisecond
	// DefaultTargetedRelistRate bounds the targeted relists a second. A
	// drained node's 110 pods are confirmed within about 1.5 s (a burst of
	// half a second's worth runs at once), while a sustained storm of
	// terminations costs at most 100 small listings a second. Each costs
	// about 150 µs of CPU in the bridge and as much in the runtime (the
	// latency benchmark, 667 a second: 0.1 core on each side).
	DefaultTargetedRelistRate = 100
)

// Options configure a Generator. Zero values take the defaults.
type Options struct {
	// Mode selects the sources; the zero value means DefaultMode.
	Mode            Mode
	RelistPeriod    time.Duration
	RelistThreshold time.Duration
	// EventedRelistPeriod is the relist period while the event stream is
	// healthy. In evented mode the health threshold is the larger of
	// RelistThreshold and three evented periods.
	EventedRelistPeriod time.Duration
	// StreamFailureLimit is how many short-lived stream connections in a row
	// make the generator fall back to relisting at RelistPeriod.
	StreamFailureLimit int
	// StreamBackoffMin and StreamBackoffMax bound the jittered exponential
	// backoff between stream connection attempts.
	StreamBackoffMin, StreamBackoffMax time.Duration
	// StreamHealthyAfter is how long a connection must last to count as
	// healthy: to reset the failure count and to return to evented mode.
	StreamHealthyAfter time.Duration
	// TargetedRelistDelay is how long a targeted relist waits to coalesce
	// with later requests for the same pod; negative means no wait.
	TargetedRelistDelay time.Duration
	// TargetedRelistRate is the most targeted relists a second, with bursts
	// of half that.
	TargetedRelistRate float64
	// StatusConcurrency bounds the ContainerStatus calls in flight during
	// one relist.
	StatusConcurrency int
	TombstoneTTL      time.Duration
	// PodAnnotations are the keys of the pod annotations that events carry
	// (Event.Pod.Meta); no other annotation is read or kept. Empty: none.
	PodAnnotations []string
	// TaskEvents is containerd's event service, for the containerd-events
	// mode and auto mode on containerd 1.x (the CRI client serves it on
	// the CRI socket). Nil: none; those modes then relist only.
	TaskEvents TaskEventSource
	// ExitsFromCRI leaves containers' exits to CRI, as the other
	// transitions are: a task exit from containerd's event service then
	// only asks for a targeted relist. By default, the exit of a container
	// the cache holds running is reported from the task exit itself, at
	// once, and checked against CRI after (exits.go).
	ExitsFromCRI bool
	// Listings are the listings of the client the Runtime lists through
	// (the CRI client), given apart from the Runtime so that a decorator
	// around it cannot hide them. With them, a full relist that lists
	// what the last one merged did merges nothing (see lastFullMerge),
	// once EndStartup let the client reuse its listings. Nil: every relist
	// is merged whole.
	Listings Listings
	Logger   *slog.Logger
	Metrics  *Metrics
}

// Generator is the PLEG: it relists the runtime, merges what it sees into
// the pod-status cache in one goroutine, and sends the Lifecycle events the
// changes produce to the sink, per relist in order.
//
// A container created and removed between two relists is never seen by the
// relist alone; the event stream narrows that window.
//
// It runs the relist loop and wires its parts together: the merger (the
// merge goroutine, which owns the cache, the held events, restore and
// backfill: merger.go), the relister, and, in the modes that follow
// events, the stream supervisor, the trigger and the targeted relists
// (Run). Hence its fields: what New sets and all read; the parts, each safe
// for concurrent use (its own goroutine, lock or atomics); what passes
// between the goroutines; and the relist loop's own state.
type Generator struct {
	// Set by New, then only read.
	opts    Options // defaults applied
	logger  *slog.Logger
	metrics *Metrics

	// The parts.
	merge    *merger
	relister *relister
	targeted *targetedQueue
	triggers *triggerSet
	stream   *streamSupervisor
	mode     *activeMode

	// Between the goroutines.
	relistNow chan struct{} // capacity 1: asks the relist loop for a relist now
	// runtimeBack (capacity 1) tells the stream supervisor that a relist
	// succeeded after failing: the runtime is back, so waiting out the
	// stream's reconnect backoff would only delay evented mode.
	runtimeBack chan struct{}
	// taskBuf carries containerd's events from the subscription's reader
	// to the trigger goroutine.
	taskBuf chan TaskEvent
	// exitBuf carries the task exits and OOM kills followed beside a CRI
	// stream to the trigger goroutine (streamSupervisor.watchExits).
	exitBuf chan TaskEvent

	// The relist loop's own.
	relistStart time.Time
}

// withDefaults returns o with the defaults in place of its zero values.
func (o Options) withDefaults() Options {
	if o.RelistPeriod <= 0 {
		o.RelistPeriod = DefaultRelistPeriod
	}
	if o.RelistThreshold <= 0 {
		o.RelistThreshold = DefaultRelistThreshold
	}
	if o.StatusConcurrency <= 0 {
		o.StatusConcurrency = DefaultStatusConcurrency
	}
	if o.TombstoneTTL <= 0 {
		o.TombstoneTTL = DefaultTombstoneTTL
	}
	if o.Mode == "" {
		o.Mode = DefaultMode
	}
	if o.EventedRelistPeriod <= 0 {
		o.EventedRelistPeriod = DefaultEventedRelistPeriod
	}
	if o.StreamFailureLimit <= 0 {
		o.StreamFailureLimit = DefaultStreamFailureLimit
	}
	if o.StreamBackoffMin <= 0 {
		o.StreamBackoffMin = DefaultStreamBackoffMin
	}
	if o.StreamBackoffMax < o.StreamBackoffMin {
		o.StreamBackoffMax = max(DefaultStreamBackoffMax, o.StreamBackoffMin)
	}
	if o.StreamHealthyAfter <= 0 {
		o.StreamHealthyAfter = DefaultStreamHealthyAfter
	}
	if o.TargetedRelistRate <= 0 {
		o.TargetedRelistRate = DefaultTargetedRelistRate
	}
	if o.TargetedRelistDelay == 0 {
		o.TargetedRelistDelay = DefaultTargetedRelistDelay
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = newMetrics()
	}
	return o
}

// New builds a Generator reading rt and sending to sink. It starts nothing.
//
// It makes first what the merger shares with the other parts (the cache
// they read, the last full relist, the replay gate and the channels that
// feed the merge), then the parts, then the merger that calls on them.
func New(rt Runtime, sink Sink, opts Options) *Generator {
	opts = opts.withDefaults()
	g := &Generator{
		opts:        opts,
		logger:      opts.Logger.With("component", "generator"),
		metrics:     opts.Metrics,
		relistNow:   make(chan struct{}, 1),
		runtimeBack: make(chan struct{}, 1),
		taskBuf:     make(chan TaskEvent, streamBufferSize),
		exitBuf:     make(chan TaskEvent, streamBufferSize),
	}
	cache := statecache.New[*podRecord]()
	meta := metaFilter{annotations: slices.Clone(opts.PodAnnotations)}
	lastFull := new(lastFullMerge)
	replay := newReplayGate()
	streamBuf := make(chan *runtimeapi.ContainerEventResponse, streamBufferSize)
	exits := make(chan *batch, streamBufferSize)
	// One func for every part that asks the relist loop for a relist.
	requestRelist := g.requestRelist

	g.targeted = newTargetedQueue(opts.TargetedRelistDelay, opts.TargetedRelistRate, opts.Metrics.targetedPending)
	topts := triggerOptions{
		cache: cache, rt: rt, targeted: g.targeted, relist: requestRelist,
		logger: g.logger, results: opts.Metrics.triggers,
	}
	if !opts.ExitsFromCRI {
		topts.exits = exits
	}
	g.triggers = newTriggerSet(topts)
	// requestRelist: a new mode re-times the relist loop for its period.
	g.mode = newActiveMode(g.metrics.mode, g.logger, requestRelist)
	g.relister = &relister{
		rt:                rt,
		metrics:           opts.Metrics,
		logger:            opts.Logger.With("component", "relister"),
		statusConcurrency: opts.StatusConcurrency,
		lookup: func(podUID, containerID string) *containerRecord {
			return lookup(cache, podUID, containerID)
		},
		lookupMeta: func(podUID string) *PodMeta { return lookupMeta(cache, podUID) },
		meta:       meta,
		listings:   opts.Listings,
		last:       lastFull,
	}
	g.stream = &streamSupervisor{supervisorOptions: supervisorOptions{
		rt:           rt,
		tasks:        opts.TaskEvents,
		taskExits:    !opts.ExitsFromCRI,
		failureLimit: opts.StreamFailureLimit,
		backoffMin:   opts.StreamBackoffMin,
		backoffMax:   opts.StreamBackoffMax,
		healthyAfter: opts.StreamHealthyAfter,
		mode:         g.mode,
		replay:       replay,
		relist:       requestRelist,
		messages:     streamBuf,
		triggers:     g.taskBuf,
		exits:        g.exitBuf,
		runtimeBack:  g.runtimeBack,
		logger:       g.logger,
		metrics:      g.metrics,
	}}
	g.merge = newMerger(mergerOptions{
		sink:          sink,
		cache:         cache,
		meta:          meta,
		lastFull:      lastFull,
		replay:        replay,
		streamBuf:     streamBuf,
		exits:         exits,
		relister:      g.relister,
		relistPeriod:  opts.RelistPeriod,
		targeted:      g.targeted,
		stream:        g.stream,
		tombstoneTTL:  opts.TombstoneTTL,
		requestRelist: requestRelist,
		logger:        g.logger,
		metrics:       g.metrics,
	})
	return g
}

// Run relists and, in evented and auto mode, follows the event stream, and
// merges both until ctx is done; it then returns nil after stopping every
// goroutine it started. Runtime failures are retried (relists at the next
// period, the stream with capped backoff) and reported through Healthy and
// the metrics. A full sink blocks nothing: the events it could not record are
// kept in the state and sent later (backfill.go). An error is returned only if
// the sink fails for a reason other than ctx or being full.
func (g *Generator) Run(ctx context.Context) error {
	g.merge.start()
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return g.merge.run(ctx) })
	eg.Go(func() error { return g.relistLoop(ctx, g.relistPeriod) })
	switch g.opts.Mode {
	case ModeGeneric:
		g.mode.set(ModeGeneric, "configured")
	default:
		eg.Go(func() error { return g.stream.Run(ctx, g.opts.Mode) })
		eg.Go(func() error { return g.runTargeted(ctx) })
		eg.Go(func() error { return g.triggers.run(ctx, g.taskBuf, g.exitBuf) })
	}
	err := eg.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (g *Generator) relistPeriod() time.Duration {
	if g.Mode() == ModeEvented {
		return g.opts.EventedRelistPeriod
	}
	return g.opts.RelistPeriod
}

// Mode returns the active mode: ModeEvented while the stream is trusted,
// else ModeGeneric. Safe for concurrent use.
func (g *Generator) Mode() Mode { return g.mode.get() }

// requestRelist asks for a full relist as soon as the relist loop is free.
func (g *Generator) requestRelist() {
	select {
	case g.relistNow <- struct{}{}:
	default:
	}
}

// RequestRelist asks Run for a full relist as soon as its relist loop is
// free, rather than at the end of its period; the period starts again
// from that relist. It does not block, and requests made before that
// relist starts are one.
func (g *Generator) RequestRelist() { g.requestRelist() }

// EndStartup tells the generator that its owner's start-up, its memory
// peak, is over: its first relist is merged and that relist's events are
// delivered. From then on the runtime's client reuses its listings
// (Options.Listings' ReuseListings), which makes a steady relist cheap but
// costs memory that lives on, so it must not happen earlier; and a full
// relist is asked for at once (RequestRelist) to fill what the client
// keeps, so that the one full decode of the node after the first relist is
// part of the start-up too rather than of the first safety-net relist. Call
// it once. It does not block and is safe for concurrent use; without
// Options.Listings it only asks for the relist.
func (g *Generator) EndStartup() {
	if g.opts.Listings != nil {
		g.opts.Listings.ReuseListings()
	}
	g.requestRelist()
}

// Relist takes one full relist and merges it synchronously, sending its
// events to the sink (or holding them, while the sink is full, for a backfill
// that only Run does). It must not be called while Run is running.
func (g *Generator) Relist(ctx context.Context) error {
	g.merge.start()
	b, err := g.relistFull(ctx, func() {}, g.merge.apply)
	if err != nil {
		return fmt.Errorf("relist: %w", err)
	}
	g.merge.relisted(b.at)
	return nil
}

func (g *Generator) relistLoop(ctx context.Context, period func() time.Duration) error {
	t := time.NewTimer(0)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-g.relistNow:
			t.Stop()
		}
		err := g.relistOnce(ctx, func() {
			if failing {
				// The runtime answers again: reconnect now, so that this
				// relist, held for the stream's replay, is not held long.
				g.stream.runtimeAnswers()
				select {
				case g.runtimeBack <- struct{}{}:
				default:
				}
			}
		})
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !failing:
			failing = true
			g.logger.Warn("relist failed, retrying every period", "err", err)
		case err != nil:
			g.logger.Debug("relist failed", "err", err)
		case failing:
			failing = false
			g.logger.Info("relist recovered")
		}
		t.Reset(period())
	}
}

// relistOnce takes one full relist and has it merged, calling listed once
// the runtime answered, before the merge.
func (g *Generator) relistOnce(ctx context.Context, listed func()) error {
	start := time.Now()
	seq := g.triggers.fullRelistBegins()
	b, err := g.relistFull(ctx, listed, g.merge.submit)
	if err != nil {
		if ctx.Err() == nil {
			g.triggers.relistFailed(seq)
		}
		return err
	}
	g.triggers.confirmAll(seq)
	g.metrics.relistDuration.Observe(time.Since(start).Seconds())
	if !g.relistStart.IsZero() {
		g.metrics.relistInterval.Observe(start.Sub(g.relistStart).Seconds())
	} else {
		g.logFirstRelist(b, time.Since(start))
	}
	g.relistStart = start
	g.merge.relisted(b.at)
	return nil
}

// relistFull takes one full relist, calls listed once the runtime
// answered, and has merge merge it. A relist that came back unchanged but
// found stale by the merge (something else was merged before its turn) is
// taken again, whole.
func (g *Generator) relistFull(ctx context.Context, listed func(), merge func(context.Context, *batch) error) (*batch, error) {
	for first := true; ; first = false {
		b, err := g.relister.take(ctx, nil, first)
		if err != nil {
			g.metrics.relists.WithLabelValues("full", "error").Inc()
			return nil, err
		}
		if first {
			listed()
		}
		// A retaken relist is never unchanged, so never stale.
		if err := merge(ctx, b); err != nil || !b.stale {
			return b, err
		}
	}
}

// logFirstRelist says at Info, once, what the first full relist found: a
// new user sees at once whether the bridge reads the runtime they meant.
func (g *Generator) logFirstRelist(b *batch, took time.Duration) {
	var containers, running, sandboxes int
	for _, p := range b.pods {
		for _, c := range p.containers {
			switch {
			case c.info.Sandbox:
				sandboxes++
			case c.state == stateRunning:
				running++
				containers++
			default:
				containers++
			}
		}
	}
	g.logger.Info("first relist done", "pods", len(b.pods), "sandboxes", sandboxes, "containers", containers,
		"running", running, "mode", g.Mode(), "configured_mode", g.opts.Mode, "took", took)
}

// Healthy reports whether the generator relisted recently enough, in the
// kubelet's words; now is the time to judge by. Safe for concurrent use.
func (g *Generator) Healthy(now time.Time) error {
	last := g.merge.lastRelist.Load()
	if last == 0 {
		return errors.New("pleg has yet to be successful")
	}
	elapsed := now.Sub(time.Unix(0, last))
	threshold := g.opts.RelistThreshold
	if g.Mode() == ModeEvented {
		threshold = max(threshold, 3*g.opts.EventedRelistPeriod)
	}
	if elapsed > threshold {
		return fmt.Errorf("pleg was last seen active %v ago; threshold is %v", elapsed, threshold)
	}
	return nil
}

// Synced reports whether a first relist has been merged. Safe for concurrent
// use.
func (g *Generator) Synced() bool { return g.merge.lastRelist.Load() != 0 }
