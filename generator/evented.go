package generator

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
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
	// replayQuiet ends a connection's replay once no message came for this
	// long: containerd 2.x sends what it kept for a new subscriber at once,
	// back to back, so a gap this long means the backlog is through.
	replayQuiet = 300 * time.Millisecond
	// replayMax bounds a replay however it goes on: relists wait for its end
	// (see replayGate), and /healthz counts only on relists.
	replayMax = 10 * time.Second
	// replayHold bounds how long a relist taken while the stream is down
	// waits for the next connection and its replay. A working connection
	// that breaks is retried at once, and the first relist that finds a
	// restarted runtime answering reconnects at once (runtimeBack), so the
	// wait is usually milliseconds; past this, relisting goes on as if no
	// replay were coming (a stream failing over and over, backing off).
	replayHold = 3 * time.Second
	// reconnectAtOnceAfter is how long a connection must have lasted for its
	// end to be retried without a backoff: a stream that breaks after
	// working (a dropped connection) is back before anything is missed,
	// while one that ends as soon as it opens backs off.
	reconnectAtOnceAfter = time.Second
	// subscribeSettle is when a subscription to containerd's event service
	// is relisted again, once it is surely in place (see watchTasks).
	subscribeSettle = time.Second
)

// replayGate tells the merge when to hold relists back for the stream.
// containerd 2.x keeps the events emitted while nobody listens and sends
// them to the next subscriber first; they are older than anything a relist
// taken meanwhile lists. A relist merged before them would find a container
// exited or gone whose start only the replay reports, and the forward-only
// merge would then refuse that start as stale: for a sandbox, which has no
// started_at to fill its start in from, or a container removed before its
// status could be read, the ContainerStarted would be lost. So from the
// moment the supervisor sets out to connect (at start, and whenever a
// connection ends) until the new connection's replay is over, the gate is
// open and the merge holds relist batches back, merging the stream
// meanwhile (merger.mergeStreamFirst). During a reconnect backoff of
// replayHold or more it is shut: no replay is that close.
//
// A replay is over at the first message the runtime stamped at or after the
// connection opened (the backlog comes first, oldest first, so everything
// kept has arrived), when no message came for replayQuiet, or after
// replayMax.
//
// The gate also tells since when the current connection is open, if one
// is: while one is, its replay ends by itself (the merge need not bound its
// wait), and a full relist judges the stream by what it missed since
// (streamSupervisor.judge). New makes the gate and hands it to both sides:
// the supervisor opens, shuts and connects it, the merge waits on it. Its
// methods are safe for concurrent use.
type replayGate struct {
	mu   sync.Mutex
	done chan struct{} // guarded by mu; closed while the gate is shut
	// connectedAt is when the current connection opened, in unix ns; 0
	// while none is open.
	connectedAt atomic.Int64
}

func newReplayGate() *replayGate {
	done := make(chan struct{})
	close(done)
	return &replayGate{done: done}
}

// shut returns a channel that is closed once the gate is shut: no replay
// is pending or in progress.
func (r *replayGate) shut() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// open opens the gate, if it is not open already.
func (r *replayGate) open() {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.done:
		r.done = make(chan struct{})
	default:
	}
}

// close shuts the gate, if it is not shut already.
func (r *replayGate) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.done:
	default:
		close(r.done)
	}
}

// connect records that a connection opened at at; disconnect, that it
// ended.
func (r *replayGate) connect(at time.Time) { r.connectedAt.Store(at.UnixNano()) }
func (r *replayGate) disconnect()          { r.connectedAt.Store(0) }

// connectedSince returns when the current connection opened, and false
// while none is open.
func (r *replayGate) connectedSince() (time.Time, bool) {
	at := r.connectedAt.Load()
	if at == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, at), true
}

// supervisorOptions are what New gives the stream supervisor: the stream's
// settings (Options' Stream* fields, defaults applied) and its only links
// to the rest of the generator. They are set once, before Run, and only
// read after.
type supervisorOptions struct {
	rt Runtime
	// tasks is containerd's event service, nil where there is none.
	tasks TaskEventSource
	// taskExits says whether containerd's task exits report deaths at
	// once (not Options.ExitsFromCRI), for the log line that says which
	// path exits take.
	taskExits bool
	// failureLimit, backoffMin, backoffMax and healthyAfter are
	// Options.StreamFailureLimit and its neighbours.
	failureLimit                         int
	backoffMin, backoffMax, healthyAfter time.Duration
	// mode is the generator's active mode, which the supervisor drives.
	mode *activeMode
	// replay is shared with the merge (see replayGate).
	replay *replayGate
	// relist asks for a full relist soon.
	relist func()
	// messages carries CRI stream messages to the merge goroutine, which
	// takes them in arrival order between relists; triggers carries
	// containerd's events to the trigger goroutine.
	messages chan<- *runtimeapi.ContainerEventResponse
	triggers chan<- TaskEvent
	// exits carries the task exits and OOM kills followed beside a CRI
	// stream (watchExits) to the trigger goroutine, which reports the
	// deaths of containers the cache holds running from them and nothing
	// else: the stream reports the rest, and a relist they asked for
	// could come before the stream's replay (see replayGate).
	exits chan<- TaskEvent
	// runtimeBack receives when a relist succeeded after failing: the
	// runtime answers again, so waiting out the reconnect backoff would
	// only delay evented mode.
	runtimeBack <-chan struct{}
	logger      *slog.Logger
	metrics     *Metrics
}

// streamSupervisor is the evented source. It decides (in auto and
// containerd-events mode) where to subscribe, if at all, then keeps a
// GetContainerEvents stream, or a subscription to containerd's event service,
// open and hands each message on (a CRI message to the merge, a containerd
// event to the trigger) without ever blocking the runtime. It falls back
// to generic relisting after repeated connection failures, or when a relist
// shows a connected stream silent, and returns to evented mode once a
// connection has been healthy for StreamHealthyAfter (after a silent stream,
// and has delivered again).
//
// It owns the connection state; the generator owns the mode, which the
// supervisor drives (activeMode). Run is called once; judge, runtimeAnswers
// and followsContainerd are safe for concurrent use with it.
type streamSupervisor struct {
	supervisorOptions

	// source is where events come from (an eventSource), set once by Run
	// before it connects; atomic, as runtimeAnswers reads it from the
	// relist loop and followsContainerd from the targeted relist goroutine.
	source atomic.Int32
	// sm are the metrics of the source in use, set once by Run before it
	// connects.
	sm sourceMetrics
	// containerd is set once detect found the runtime to be containerd.
	containerd atomic.Bool
	// backingOff is set while the supervisor waits out a backoff of
	// replayHold or more, with the replay gate shut.
	backingOff atomic.Bool
	// eventsSinceRelist counts the messages received since the last full
	// relist was judged: none at all makes a stream that missed transitions
	// silent rather than lossy.
	eventsSinceRelist atomic.Int64

	mu          sync.Mutex
	cancelWatch context.CancelFunc // guarded by mu; ends the current connection
	// requireEvents is set after a silent stream was demoted: it returns to
	// evented mode only once a connection has delivered events.
	requireEvents bool // guarded by mu
}

// Run supervises the stream until ctx is done, or until it settles on
// relisting only (auto mode on a runtime without a safe stream, or a runtime
// that does not implement GetContainerEvents). It returns nil; connection
// failures are logged, counted and retried with capped, jittered backoff.
func (s *streamSupervisor) Run(ctx context.Context, mode Mode) error {
	// From the start: the first relist must wait for what the runtime kept
	// while the bridge was away.
	s.replay.open()
	defer s.replay.close()
	s.source.Store(int32(sourceCRI))
	// Beside a CRI stream, containerd's task exits report deaths sooner
	// than the stream does (exits.go); evented mode, which asks the
	// runtime nothing, has watchExits ask.
	exitsBeside := mode == ModeEvented && s.tasks != nil && s.taskExits
	if mode == ModeAuto || mode == ModeContainerdEvents {
		src, why, err := s.detect(ctx, mode)
		if err != nil {
			return nil // ctx done
		}
		exitsBeside = src == sourceCRI && s.tasks != nil && s.taskExits && s.containerd.Load()
		if src == sourceContainerd && s.tasks == nil {
			src, why = sourceNone, why+"; but no connection to containerd's event service was given"
		}
		if src == sourceNone {
			s.logger.Info(string(mode)+" mode: relisting only, no event stream", "reason", why, "exits", exitsFromCRI)
			s.mode.set(ModeGeneric, why)
			return nil
		}
		s.source.Store(int32(src))
		s.logger.Info("following the runtime's events", "source", src.String(), "reason", why, "exits", s.exitsPath(src))
	}
	if exitsBeside {
		var wg sync.WaitGroup
		ectx, cancel := context.WithCancel(ctx)
		wg.Go(func() { s.watchExits(ectx, mode == ModeEvented) })
		defer func() {
			cancel()
			wg.Wait()
		}()
	}
	s.sm = s.metrics.sourceMetrics(s.eventSource())
	s.metrics.eventSource.WithLabelValues(s.eventSource().String()).Set(1)
	s.mode.set(ModeEvented, "event stream opening")
	failures := 0
	delay := s.backoffMin
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			s.sm.reconnects.Inc()
		}
		up, events, err := s.watchOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		// Whatever the runtime keeps for the next connection must be merged
		// before any relist taken from now on.
		s.openReplay()
		if up >= s.healthyAfter && events > 0 {
			failures, delay = 0, s.backoffMin
		} else {
			failures++
		}
		s.logger.Warn("event stream ended", "err", err, "connected_for", up.Round(time.Millisecond),
			"events", events, "consecutive_failures", failures)
		if status.Code(err) == codes.Unimplemented {
			why := "runtime does not implement GetContainerEvents"
			if s.eventSource() == sourceContainerd {
				why = "the socket does not serve containerd's event service"
			}
			s.mode.set(ModeGeneric, why)
			return nil
		}
		if failures >= s.failureLimit && s.mode.get() == ModeEvented {
			s.mode.set(ModeGeneric, fmt.Sprintf("event stream failed %d times in a row: %v", failures, err))
		}
		if up >= reconnectAtOnceAfter {
			continue // a working connection broke: the next one's relist covers the gap
		}
		wait := jitter(delay)
		if wait >= replayHold {
			// No connection for a while: relists are not held for a
			// replay that far away, or a stream that keeps failing (CRI-O
			// without pod events) would slow relisting to one each
			// replayHold. runtimeAnswers opens the gate again for a
			// reconnect brought forward.
			s.replay.close()
			s.backingOff.Store(true)
		}
		// Whatever happened while the stream was down is found by a relist.
		s.relist()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
			delay = min(delay*2, s.backoffMax)
		case <-s.runtimeBack:
			delay = s.backoffMin // the runtime answers again: reconnect now
		}
		s.backingOff.Store(false)
		s.openReplay()
	}
}

// How exits are detected, as the start-up's log line says it.
const (
	exitsFromCRI  = "cri"                  // CRI's listings, statuses or event stream
	exitsFromTask = "containerd-task-exit" // containerd's /tasks/exit, checked against CRI after
)

// exitsPath says how exits are detected with events from src.
func (s *streamSupervisor) exitsPath(src eventSource) string {
	if s.tasks != nil && s.taskExits && (src == sourceContainerd || (src == sourceCRI && s.containerd.Load())) {
		return exitsFromTask
	}
	return exitsFromCRI
}

// eventSource is where events come from.
func (s *streamSupervisor) eventSource() eventSource { return eventSource(s.source.Load()) }

// followsContainerd reports whether containerd's events are the source:
// then a burst of targeted relists is better taken as one full relist (see
// Generator.runTargeted).
func (s *streamSupervisor) followsContainerd() bool { return s.eventSource() == sourceContainerd }

// openReplay opens the replay gate for the next connection, if its source
// replays anything: containerd's event service keeps nothing for a new
// subscriber, and holding relists for it would only space them out while
// the subscription is down (the relists are all there is then).
func (s *streamSupervisor) openReplay() {
	if s.eventSource() == sourceCRI {
		s.replay.open()
	}
}

// runtimeAnswers is called when a relist's listing succeeded after failed
// ones, before it is merged: the runtime is back, the supervisor reconnects
// at once (runtimeBack), and that relist must wait for the reconnect's
// replay even if the gate was shut for a long backoff.
func (s *streamSupervisor) runtimeAnswers() {
	if s.backingOff.Load() {
		s.openReplay()
	}
}

// detect asks the runtime its version until it answers or ctx is done, and
// chooses the event source for mode from it.
func (s *streamSupervisor) detect(ctx context.Context, mode Mode) (eventSource, string, error) {
	delay := s.backoffMin
	for {
		v, err := s.rt.Version(ctx)
		if err == nil {
			s.containerd.Store(isContainerd(v))
			src, why := chooseSource(mode, v)
			return src, why, nil
		}
		if status.Code(err) == codes.Unimplemented {
			return sourceNone, "runtime does not implement Version, so which event source is safe to use is unknown", nil
		}
		// At Debug: the relists meanwhile fail too, and say so at Warn once.
		s.logger.Debug("cannot read runtime version to choose a mode, relisting meanwhile", "err", err)
		if err := sleep(ctx, jitter(delay)); err != nil {
			return sourceNone, "", err
		}
		delay = min(delay*2, s.backoffMax)
	}
}

// beforeSubscribing strips the exit details from ev, a task exit, if the
// process ended before the subscription that delivers it was opened at
// subscribed: containerd's shim forwards the exits it could not deliver
// while containerd was down once it is back, and the CRI plugin, which
// recovered the container meanwhile, may report that exit otherwise (exit
// code 255, reason Unknown, when it found the task gone). Such an exit is
// left to CRI (exits.go reports only exits with their details).
func beforeSubscribing(ev TaskEvent, subscribed time.Time) TaskEvent {
	if ev.Topic == TopicTaskExit && ev.ExitedAt.Before(subscribed) {
		ev.ExitStatus, ev.ExitedAt = 0, time.Time{}
	}
	return ev
}

// watchExits follows containerd's task exits and OOM kills beside the CRI
// event stream until ctx is done, handing them to the trigger goroutine,
// which reports the death of a container the cache holds running at once
// (exits.go); everything else is the stream's, so the subscription's other
// events are dropped, and so is an exit the buffer has no room for (the
// stream reports it). ask says whether the runtime's Version must
// first show containerd (evented mode did not ask it). A socket without
// containerd's event service, or one that refuses it, ends it: exits then
// come from CRI alone, as the log says.
func (s *streamSupervisor) watchExits(ctx context.Context, ask bool) {
	if ask {
		v, err := s.rt.Version(ctx)
		for delay := s.backoffMin; err != nil && ctx.Err() == nil; delay = min(delay*2, s.backoffMax) {
			if sleep(ctx, jitter(delay)) != nil {
				return
			}
			v, err = s.rt.Version(ctx)
		}
		if err != nil {
			return // ctx done
		}
		if !isContainerd(v) {
			s.logger.Info("exits come from CRI: the runtime is not containerd", "runtime", v.GetRuntimeName(), "exits", exitsFromCRI)
			return
		}
		s.containerd.Store(true)
		s.logger.Info("containerd's task exits report deaths beside the CRI event stream", "exits", exitsFromTask)
	}
	delay := s.backoffMin
	// Not through the instrumentation: pleg_bridge_containerd_events_connected
	// and the Subscribe requests speak of containerd's events as the source
	// followed (the alert on a stream that stays down reads them), and
	// beside a CRI stream they are not.
	tasks := s.tasks
	if in, ok := tasks.(*instrumentedTasks); ok {
		tasks = in.src
	}
	for {
		start := time.Now()
		err := tasks.WatchTaskEvents(ctx, func(ev TaskEvent, err error) {
			if err != nil || (ev.Topic != TopicTaskExit && ev.Topic != TopicTaskOOM) {
				return
			}
			if ev = beforeSubscribing(ev, start); ev.Topic == TopicTaskExit && ev.ExitedAt.IsZero() {
				return // the stream reports it
			}
			select {
			case s.exits <- ev:
			default:
			}
		})
		if ctx.Err() != nil {
			return
		}
		if c := status.Code(err); c == codes.Unimplemented || c == codes.PermissionDenied {
			s.containerd.Store(false)
			s.logger.Info("containerd's event service is out of reach: exits come from CRI", "err", err, "exits", exitsFromCRI)
			return
		}
		s.logger.Debug("containerd task exit subscription ended, resubscribing", "err", err)
		if time.Since(start) >= reconnectAtOnceAfter {
			delay = s.backoffMin
			continue
		}
		if sleep(ctx, jitter(delay)) != nil {
			return
		}
		delay = min(delay*2, s.backoffMax)
	}
}

// watchOnce holds one stream connection open until it ends, feeding the
// merge's stream buffer without ever blocking. It returns how long the
// connection lasted and how many messages it delivered.
func (s *streamSupervisor) watchOnce(ctx context.Context) (time.Duration, int, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.cancelWatch = cancel
	requireEvents := s.requireEvents
	s.mu.Unlock()

	start := time.Now()
	s.replay.connect(start)
	s.sm.connected.Set(1)
	defer func() {
		s.replay.disconnect()
		s.sm.connected.Set(0)
	}()
	if s.eventSource() == sourceContainerd {
		events, err := s.watchTasks(wctx, requireEvents)
		return time.Since(start), events, err
	}
	// The gate is open (Run opened it), so this relist is merged after
	// whatever the runtime replays.
	s.relist()

	var events int
	gotEvent := make(chan struct{}, 1)
	replayed := make(chan struct{}, 1)
	var wg sync.WaitGroup
	// The goroutines below end with wctx: end it, then wait for them.
	defer func() {
		cancel()
		wg.Wait()
	}()
	wg.Go(func() { s.promoteWhenHealthy(wctx, requireEvents, gotEvent) })
	wg.Go(func() { endReplayWhenQuiet(wctx, s.replay, replayed) })
	err := s.rt.WatchEvents(wctx, func(ev *runtimeapi.ContainerEventResponse) {
		events++
		s.eventsSinceRelist.Add(1)
		select {
		case gotEvent <- struct{}{}:
		default:
		}
		select {
		case s.messages <- ev:
		default:
			s.sm.events.WithLabelValues("dropped").Inc()
			s.logger.Warn("event stream buffer full, dropping an event and resyncing by relist",
				"container_id", ev.GetContainerId(), "event_type", ev.GetContainerEventType().String())
			s.relist()
		}
		// Only once the message is in the merge's buffer: the merge drains
		// the buffer before it applies a relist the replay held back.
		if at := ev.GetCreatedAt(); at >= start.UnixNano() {
			s.replay.close() // a live message: the backlog is through
		} else {
			select {
			case replayed <- struct{}{}:
			default:
			}
		}
	})
	return time.Since(start), events, err
}

// watchTasks holds one subscription to containerd's event service open
// until it ends, handing each event to the trigger goroutine without ever
// blocking. It returns how many events the subscription delivered.
//
// containerd keeps nothing for a new subscriber, so there is no replay to
// wait for: the gate is shut at once. What happened while no subscription
// was open is found by the relist at connect, and once more by a relist
// after subscribeSettle, since containerd gives no sign of when the
// subscription is in place: a change between the first relist's listing and
// that moment would otherwise wait for the safety-net relist.
func (s *streamSupervisor) watchTasks(ctx context.Context, requireEvents bool) (int, error) {
	s.replay.close()
	s.relist()
	var events int
	gotEvent := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { s.promoteWhenHealthy(ctx, requireEvents, gotEvent) })
	wg.Go(func() {
		if sleep(ctx, subscribeSettle) == nil {
			s.relist()
		}
	})
	subscribed := time.Now()
	err := s.tasks.WatchTaskEvents(ctx, func(ev TaskEvent, err error) {
		if err != nil {
			s.sm.events.WithLabelValues("invalid").Inc()
			s.logger.Warn("skipping a containerd event that does not decode, relisting instead", "err", err)
			s.relist()
			return
		}
		ev = beforeSubscribing(ev, subscribed)
		events++
		s.eventsSinceRelist.Add(1)
		select {
		case gotEvent <- struct{}{}:
		default:
		}
		select {
		case s.triggers <- ev:
			s.sm.events.WithLabelValues("accepted").Inc()
		default:
			s.sm.events.WithLabelValues("dropped").Inc()
			s.logger.Warn("containerd event buffer full, dropping an event and resyncing by relist",
				"id", ev.ID, "topic", ev.Topic)
			s.relist()
		}
	})
	return events, err
}

// endReplayWhenQuiet shuts the gate when no replayed message came for
// replayQuiet, or after replayMax. When ctx (the connection) ends first, it
// leaves the gate as it is: the supervisor keeps it open for the next
// connection.
func endReplayWhenQuiet(ctx context.Context, gate *replayGate, replayed <-chan struct{}) {
	quiet := time.NewTimer(replayQuiet)
	defer quiet.Stop()
	limit := time.NewTimer(replayMax)
	defer limit.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-gate.shut():
			return // a live message came
		case <-quiet.C:
			gate.close()
			return
		case <-limit.C:
			gate.close()
			return
		case <-replayed:
			quiet.Reset(replayQuiet)
		}
	}
}

// promoteWhenHealthy returns the generator to evented mode once the current
// connection has lasted StreamHealthyAfter (and, after a silent stream, has
// delivered an event).
func (s *streamSupervisor) promoteWhenHealthy(ctx context.Context, requireEvents bool, gotEvent <-chan struct{}) {
	if sleep(ctx, s.healthyAfter) != nil {
		return
	}
	if requireEvents {
		select {
		case <-ctx.Done():
			return
		case <-gotEvent:
		}
	}
	if s.mode.get() != ModeEvented {
		s.mu.Lock()
		s.requireEvents = false
		s.mu.Unlock()
		s.mode.set(ModeEvented, fmt.Sprintf("event stream healthy for %v", s.healthyAfter))
	}
}

// judge judges the stream by the outcome of a full relist that began at
// at: it counts the transitions among the relist's events that the stream,
// while connected, should have reported first, and demotes a stream that
// delivered nothing at all since the previous full relist. The merge
// goroutine calls it for each full relist it merges.
func (s *streamSupervisor) judge(at time.Time, events []Event) {
	connected, open := s.replay.connectedSince()
	silent := s.eventsSinceRelist.Swap(0) == 0
	if !open || s.mode.get() != ModeEvented {
		return
	}
	missed := missedTransitions(events, connected, at)
	if missed == 0 {
		return
	}
	s.metrics.missedByStream.Add(float64(missed))
	if !silent {
		s.logger.Warn("relist found transitions the event stream did not report", "missed", missed)
		return
	}
	s.mu.Lock()
	s.requireEvents = true
	cancel := s.cancelWatch
	s.mu.Unlock()
	s.mode.set(ModeGeneric, fmt.Sprintf("event stream is silent: a relist found %d transitions it did not report", missed))
	if cancel != nil {
		cancel() // reconnect; it returns to evented mode only once it delivers
	}
}

// missedTransitions counts the transitions among the events of a full
// relist that began at relistAt that a stream connected since connected
// should have reported first: those the relist detected, removals aside,
// that happened more than missedGrace after the connection opened and more
// than missedGrace before the relist began. It is pure: the supervisor
// judges by its count (judge).
func missedTransitions(events []Event, connected, relistAt time.Time) int {
	since := connected.Add(missedGrace)
	until := relistAt.Add(-missedGrace)
	missed := 0
	for _, ev := range events {
		if ev.DetectedBy == SourceRelist && ev.Type != ContainerRemoved && ev.Time.After(since) && ev.Time.Before(until) {
			missed++
		}
	}
	return missed
}

// jitter spreads d by ±20% so that many nodes do not reconnect in step.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
