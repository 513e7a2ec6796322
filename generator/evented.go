package generator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	// streamBufferSize is how many stream messages wait for the merge. The
	// reader never blocks the runtime (containerd 2.x stalls its event loop
	// on a slow subscriber); this absorbs a node-wide burst, and beyond it
	// messages are dropped, counted, and a full relist resyncs.
	streamBufferSize = 4096
	// missedGrace is how long the stream has to report a transition before a
	// relist that finds it counts it as missed by the stream.
	missedGrace = 2 * time.Second
)

// streamState is what the stream supervisor shares with the rest of the
// generator.
type streamState struct {
	mu          sync.Mutex
	cancelWatch context.CancelFunc // guarded by mu; ends the current connection
	// requireEvents is set after a silent stream was demoted: it returns to
	// evented mode only once a connection has delivered events.
	requireEvents bool // guarded by mu

}

// runStream is the evented source's supervisor: it decides (in auto mode)
// whether to subscribe at all, then keeps a GetContainerEvents stream open,
// falls back to generic relisting after repeated failures, and returns to
// evented mode once a connection has been healthy for StreamHealthyAfter.
func (g *Generator) runStream(ctx context.Context, mode Mode) error {
	if mode == ModeAuto {
		ok, why, err := g.detect(ctx)
		if err != nil {
			return nil // ctx done
		}
		if !ok {
			g.logger.Info("auto mode: relisting only, no event stream", "reason", why)
			g.setMode(ModeGeneric, why)
			return nil
		}
		g.logger.Info("runtime supports the event stream", "reason", why)
	}
	g.setMode(ModeEvented, "event stream opening")
	failures := 0
	delay := g.opts.StreamBackoffMin
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			g.metrics.streamReconnects.Inc()
		}
		up, events, err := g.watchOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if up >= g.opts.StreamHealthyAfter && events > 0 {
			failures, delay = 0, g.opts.StreamBackoffMin
		} else {
			failures++
		}
		g.logger.Warn("event stream ended", "err", err, "connected_for", up.Round(time.Millisecond),
			"events", events, "consecutive_failures", failures)
		if status.Code(err) == codes.Unimplemented {
			g.setMode(ModeGeneric, "runtime does not implement GetContainerEvents")
			return nil
		}
		if failures >= g.opts.StreamFailureLimit && g.Mode() == ModeEvented {
			g.setMode(ModeGeneric, fmt.Sprintf("event stream failed %d times in a row: %v", failures, err))
		}
		// Whatever happened while the stream was down is found by a relist.
		g.requestRelist()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(jitter(delay)):
			delay = min(delay*2, g.opts.StreamBackoffMax)
		case <-g.runtimeBack:
			delay = g.opts.StreamBackoffMin // the runtime answers again: reconnect now
		}
	}
}

// detect asks the runtime its version until it answers or ctx is done.
func (g *Generator) detect(ctx context.Context) (bool, string, error) {
	delay := g.opts.StreamBackoffMin
	for {
		v, err := g.rt.Version(ctx)
		if err == nil {
			ok, why := streamSupport(v)
			return ok, why, nil
		}
		if status.Code(err) == codes.Unimplemented {
			return false, "runtime does not implement Version, so whether its event stream is safe to share is unknown", nil
		}
		g.logger.Warn("cannot read runtime version to choose a mode, relisting meanwhile", "err", err)
		select {
		case <-ctx.Done():
			return false, "", ctx.Err()
		case <-time.After(jitter(delay)):
		}
		delay = min(delay*2, g.opts.StreamBackoffMax)
	}
}

// watchOnce holds one stream connection open until it ends, feeding the
// merge's stream buffer without ever blocking. It returns how long the
// connection lasted and how many messages it delivered.
func (g *Generator) watchOnce(ctx context.Context) (time.Duration, int, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g.stream.mu.Lock()
	g.stream.cancelWatch = cancel
	requireEvents := g.stream.requireEvents
	g.stream.mu.Unlock()

	start := time.Now()
	g.streamConnectedAt.Store(start.UnixNano())
	g.metrics.streamConnected.Set(1)
	defer func() {
		g.streamConnectedAt.Store(0)
		g.metrics.streamConnected.Set(0)
	}()
	g.requestRelist() // the relist after every connect

	var events int
	gotEvent := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { g.promoteWhenHealthy(wctx, requireEvents, gotEvent) })
	err := g.rt.WatchEvents(wctx, func(ev *runtimeapi.ContainerEventResponse) {
		events++
		g.streamEventsSinceRelist.Add(1)
		select {
		case gotEvent <- struct{}{}:
		default:
		}
		select {
		case g.streamBuf <- ev:
		default:
			g.metrics.streamEvents.WithLabelValues("dropped").Inc()
			g.logger.Warn("event stream buffer full, dropping an event and resyncing by relist",
				"container_id", ev.GetContainerId(), "event_type", ev.GetContainerEventType().String())
			g.requestRelist()
		}
	})
	return time.Since(start), events, err
}

// promoteWhenHealthy returns the generator to evented mode once the current
// connection has lasted StreamHealthyAfter (and, after a silent stream, has
// delivered an event).
func (g *Generator) promoteWhenHealthy(ctx context.Context, requireEvents bool, gotEvent <-chan struct{}) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(g.opts.StreamHealthyAfter):
	}
	if requireEvents {
		select {
		case <-ctx.Done():
			return
		case <-gotEvent:
		}
	}
	if g.Mode() != ModeEvented {
		g.stream.mu.Lock()
		g.stream.requireEvents = false
		g.stream.mu.Unlock()
		g.setMode(ModeEvented, fmt.Sprintf("event stream healthy for %v", g.opts.StreamHealthyAfter))
	}
}

// applyStreamEvent merges one stream message, in the merge goroutine, and
// asks for a targeted relist of a stopped or deleted container's pod.
func (g *Generator) applyStreamEvent(ctx context.Context, ev *runtimeapi.ContainerEventResponse) error {
	b, scope, err := streamBatch(ev, time.Now())
	if err != nil {
		g.metrics.streamEvents.WithLabelValues("invalid").Inc()
		g.logger.Warn("skipping malformed container event, relisting instead", "err", err)
		g.requestRelist()
		return nil
	}
	g.metrics.streamEvents.WithLabelValues("accepted").Inc()
	if err := g.apply(ctx, b); err != nil {
		return err
	}
	if scope != nil {
		g.targeted.Request(*scope)
	}
	return nil
}

// checkMissed counts the transitions a relist found that the stream, while
// connected, should have reported first, and demotes a silent stream.
func (g *Generator) checkMissed(b *batch, events []Event) {
	if !b.full {
		return // targeted relists follow stream events; they judge nothing
	}
	connected := g.streamConnectedAt.Load()
	silent := g.streamEventsSinceRelist.Swap(0) == 0
	if connected == 0 || g.Mode() != ModeEvented {
		return
	}
	since := time.Unix(0, connected).Add(missedGrace)
	until := b.at.Add(-missedGrace)
	missed := 0
	for _, ev := range events {
		if ev.DetectedBy == SourceRelist && ev.Type != ContainerRemoved && ev.Time.After(since) && ev.Time.Before(until) {
			missed++
		}
	}
	if missed == 0 {
		return
	}
	g.metrics.missedByStream.Add(float64(missed))
	if !silent {
		g.logger.Warn("relist found transitions the event stream did not report", "missed", missed)
		return
	}
	g.stream.mu.Lock()
	g.stream.requireEvents = true
	cancel := g.stream.cancelWatch
	g.stream.mu.Unlock()
	g.setMode(ModeGeneric, fmt.Sprintf("event stream is silent: a relist found %d transitions it did not report", missed))
	if cancel != nil {
		cancel() // reconnect; it returns to evented mode only once it delivers
	}
}

// jitter spreads d by ±20% so that many nodes do not reconnect in step.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
