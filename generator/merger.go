package generator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/pleg-bridge/pleg-bridge/statecache"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// merger is the merge goroutine (run) and everything only it touches: it
// is the one writer of the pod-status cache, and the one sender to the
// sink. It takes in, in the order they arrive, relists (submit), stream
// messages, the deaths reported from containerd's task exits, and what
// Restore was given; it merges each into the cache (mergePod) and sends
// the Lifecycle events that produces, or holds them while the sink is full
// (backfill.go).
//
// Its fields: what New gives it (mergerOptions: the cache, its inputs and
// the parts it calls); its own inputs; the time of the last relist merged,
// which any goroutine reads; and the state of the merge goroutine, used by
// that goroutine only (or by Generator.Relist, when Run is not running).
type merger struct {
	mergerOptions

	// Its inputs from the rest of the generator.
	batches  chan mergeRequest // relists to merge, from submit
	restored restoredEvents    // what Restore was given (restore.go)

	// lastRelist is the start of the last good full relist merged, in
	// unix ns (relisted), for Generator.Healthy and Synced.
	lastRelist atomic.Int64

	// The merge goroutine's own.
	lastGC      time.Time
	lastOther   time.Time // when it last merged anything but a full relist
	held        heldState // see backfill.go
	streamBatch batch     // see batch.recycle
	// started is set by the first Run or Relist, which takes in what
	// Restore was given before it (start); they are never called
	// concurrently.
	started bool
}

// mergerOptions is what New gives the merger: what it shares with the
// generator's other parts, and those parts.
type mergerOptions struct {
	sink  Sink
	cache *statecache.Cache[*podRecord] // written by the merger only
	meta  metaFilter
	// lastFull is the last full relist merged: written by the merger, read
	// by the relister (see lastFullMerge).
	lastFull *lastFullMerge
	// replay is shared with the stream supervisor: the merger holds a
	// relist back while it is open (mergeStreamFirst).
	replay *replayGate
	// streamBuf carries stream messages from the connection's reader, and
	// exits the deaths the trigger goroutine reports from containerd's
	// task exits (exits.go).
	streamBuf <-chan *runtimeapi.ContainerEventResponse
	exits     <-chan *batch

	// relister takes the relists that run while a batch waits for the
	// stream's replay (mergeStreamFirst), every relistPeriod.
	relister     *relister
	relistPeriod time.Duration
	targeted     *targetedQueue    // asked to confirm a stopped or deleted container
	stream       *streamSupervisor // judged by each full relist
	tombstoneTTL time.Duration
	// requestRelist asks the relist loop for a full relist.
	requestRelist func()

	logger  *slog.Logger
	metrics *Metrics
}

type mergeRequest struct {
	b    *batch
	done chan error
}

func newMerger(opts mergerOptions) *merger {
	return &merger{
		mergerOptions: opts,
		batches:       make(chan mergeRequest),
		restored:      newRestoredEvents(),
	}
}

// run is the merge goroutine: it applies relist batches, stream messages
// and exits in the order they arrive, until ctx is done (nil) or the sink
// fails for a reason other than being full.
func (m *merger) run(ctx context.Context) error {
	for {
		var err error
		select {
		case <-ctx.Done():
			return nil
		case req := <-m.batches:
			var taken []*batch
			if taken, err = m.mergeStreamFirst(ctx); err == nil {
				err = m.apply(ctx, req.b)
			}
			req.done <- err // buffered: the submitter may have gone
			for _, b := range taken {
				if err != nil {
					break
				}
				if err = m.apply(ctx, b); err == nil {
					m.relisted(b.at)
				}
			}
		case ev := <-m.streamBuf:
			err = m.applyStreamEvent(ctx, ev)
		case b := <-m.exits:
			err = m.apply(ctx, b)
		case <-m.held.due: // armed only while the sink left events unsent
			err = m.backfill(ctx)
		case <-m.restored.due:
			m.mergeRestored()
		}
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
}

// submit hands a batch to the merge goroutine and waits until it is applied.
func (m *merger) submit(ctx context.Context, b *batch) error {
	req := mergeRequest{b: b, done: make(chan error, 1)}
	select {
	case m.batches <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// relisted records that the full relist taken at at was merged: by the
// merge goroutine, or by the relist loop or Relist once their relist is.
// Safe for concurrent use.
func (m *merger) relisted(at time.Time) {
	m.metrics.relists.WithLabelValues("full", "ok").Inc()
	m.metrics.lastRelist.Set(float64(at.UnixNano()) / 1e9)
	m.lastRelist.Store(at.UnixNano())
}

// mergeStreamFirst runs in the merge goroutine before a batch is applied:
// while the replay gate is open, it waits, merging the stream meanwhile
// (while no connection is open, at most replayHold), then merges every
// stream message already received. A stream message is never newer than the
// relist for being merged first: the merge refuses what would move a
// container backwards, and a relist declares gone only what nothing saw
// after it began. The other way round, a relist merged before an older
// message can make that message stale and lose the transition it reports
// (see replayGate).
//
// The node is not left unlisted while a batch waits: every RelistPeriod it
// takes a full relist itself and returns them, oldest first, to be merged
// after the batch. The relist loop is blocked meanwhile, and a replay that
// does not come (a runtime refusing every new stream, whose reconnects back
// off in steps shorter than replayHold, so that the gate stays open for
// seconds) would otherwise space the relists replayHold apart: a sandbox
// that started and ended between two of them would be listed only ended,
// and a sandbox first seen ended has no start to report.
func (m *merger) mergeStreamFirst(ctx context.Context) ([]*batch, error) {
	shut := m.replay.shut()
	select {
	case <-shut:
		return nil, m.mergeBuffered(ctx)
	default:
	}
	hold := time.NewTimer(replayHold)
	defer hold.Stop()
	relist := time.NewTicker(m.relistPeriod)
	defer relist.Stop()
	var taken []*batch
	for waiting := true; waiting; {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-shut:
			waiting = false
		case <-hold.C:
			// While connected, the replay ends by itself within replayMax.
			_, waiting = m.replay.connectedSince()
		case <-relist.C:
			b, err := m.relister.take(ctx, nil, false)
			if err != nil {
				m.metrics.relists.WithLabelValues("full", "error").Inc()
				m.logger.Debug("relist while another waits for the stream's replay failed", "err", err)
				continue
			}
			taken = append(taken, b)
		case ev := <-m.streamBuf:
			if err := m.applyStreamEvent(ctx, ev); err != nil {
				return nil, err
			}
		}
	}
	return taken, m.mergeBuffered(ctx)
}

// mergeBuffered merges the stream messages buffered now, not what keeps
// coming: a storm must not keep a relist out.
func (m *merger) mergeBuffered(ctx context.Context) error {
	for range len(m.streamBuf) {
		if err := m.applyStreamEvent(ctx, <-m.streamBuf); err != nil {
			return err
		}
	}
	return nil
}

// applyStreamEvent merges one stream message, in the merge goroutine, and
// asks for a targeted relist of a stopped or deleted container's pod.
func (m *merger) applyStreamEvent(ctx context.Context, ev *runtimeapi.ContainerEventResponse) error {
	b, scope, err := streamBatch(&m.streamBatch, ev, time.Now(), m.meta, m.lookupMeta)
	defer m.streamBatch.recycle()
	if err != nil {
		m.metrics.streamEvents.WithLabelValues("invalid").Inc()
		m.logger.Warn("skipping malformed container event, relisting instead", "err", err)
		m.requestRelist()
		return nil
	}
	m.metrics.streamEvents.WithLabelValues("accepted").Inc()
	if m.logger.Enabled(ctx, slog.LevelDebug) {
		m.logger.Debug("stream message", "event_type", ev.GetContainerEventType().String(), "container_id", ev.GetContainerId(),
			"created_at", time.Unix(0, ev.GetCreatedAt()).UTC())
	}
	if err := m.apply(ctx, b); err != nil {
		return err
	}
	if scope != nil {
		m.targeted.Request(*scope)
	}
	return nil
}

// apply merges one batch into the cache and sends the events it produced.
// Only the merge goroutine (or Relist, when Run is not running) calls it.
func (m *merger) apply(ctx context.Context, b *batch) error {
	if b.unchanged {
		m.applyUnchanged(ctx, b)
		return nil
	}
	if b.full {
		// Until it is merged, the last full relist no longer tells what
		// the cache holds.
		m.lastFull.invalidate()
	} else {
		m.mergingOther()
	}
	var events []Event
	var touched map[string]bool
	if b.full {
		touched = make(map[string]bool, len(b.pods))
	}
	for i := range b.pods {
		p := &b.pods[i]
		if p.pod.UID == "" {
			if p.pod.UID = m.podOf(p.containers); p.pod.UID == "" {
				m.metrics.streamEvents.WithLabelValues("invalid").Inc()
				m.logger.Warn("skipping container event without pod sandbox status for an unknown container",
					"container_id", p.containers[0].info.ID)
				continue
			}
		}
		if touched != nil {
			touched[p.pod.UID] = true
		}
		events = m.mergeOne(p.pod.UID, *p, b, events)
	}
	if b.full {
		// Pods missing from a full listing: everything in them is gone,
		// unless the stream saw it after the relist began.
		var missing []string
		m.cache.Range(func(uid string, _ statecache.Entry[*podRecord]) bool {
			if !touched[uid] {
				missing = append(missing, uid)
			}
			return true
		})
		for _, uid := range missing {
			e, _ := m.cache.Get(uid)
			events = m.mergeOne(uid, podObservation{pod: e.Status.pod, complete: true}, b, events)
		}
		m.cache.UpdateTime(b.at)
		m.collectGarbage(b.at)
	}
	if b.source == SourceRelist && b.full {
		m.stream.judge(b.at, events)
	}
	if b.subject != "" && !slices.ContainsFunc(events, func(e Event) bool { return e.Container.ID == b.subject }) {
		m.metrics.suppressed.WithLabelValues(string(b.source)).Inc()
	}
	debug := m.logger.Enabled(ctx, slog.LevelDebug)
	if debug && b.source == SourceRelist {
		m.logger.Debug("relist merged", "at", b.at, "full", b.full, "pods", len(b.pods), "events", len(events))
	}
	for _, ev := range events {
		m.metrics.events.WithLabelValues(string(ev.Type), string(ev.DetectedBy)).Inc()
		if debug {
			m.logger.Debug("lifecycle event", "event_type", ev.Type, "container_id", ev.Container.ID,
				"pod_uid", ev.Pod.UID, "sandbox", ev.Container.Sandbox, "source", ev.DetectedBy, "full_relist", b.full)
		}
	}
	if len(events) > 0 {
		if err := m.send(ctx, events); err != nil {
			return err
		}
	}
	if b.full {
		m.lastFull.set(b, !m.lastOther.After(b.at))
	}
	return nil
}

// mergingOther records, in the merge goroutine, that something other than
// a full relist is about to change the cache: the last full relist merged
// no longer tells what it holds (see lastFullMerge).
func (m *merger) mergingOther() {
	m.lastFull.invalidate()
	m.lastOther = time.Now()
}

// applyUnchanged merges a full relist that listed what the last one merged
// did, with nothing else merged since (see lastFullMerge): only the cache's
// time moves, as the merge of its pods would have moved nothing else. One
// that something else was merged before (a stream message the relist was
// held for) is marked stale, and not applied.
func (m *merger) applyUnchanged(ctx context.Context, b *batch) {
	if !m.lastFull.unchanged(b.version) {
		b.stale = true
		return
	}
	m.cache.UpdateTime(b.at)
	m.collectGarbage(b.at)
	m.stream.judge(b.at, nil)
	m.metrics.relistsUnchanged.Inc()
	if m.logger.Enabled(ctx, slog.LevelDebug) {
		m.logger.Debug("relist merged", "at", b.at, "full", b.full, "unchanged", true)
	}
}

// podOf finds the cached pod that holds the first of the sightings'
// containers (locate scans the cache): it serves only stream events that
// name no pod, which containerd 1.7 sends once per sandbox removal.
func (m *merger) podOf(seen []sighting) string {
	if len(seen) == 0 {
		return ""
	}
	scope, _, _ := locate(m.cache, seen[0].info.ID)
	return scope.podUID
}

func (m *merger) mergeOne(uid string, obs podObservation, b *batch, events []Event) []Event {
	e, ok := m.cache.Get(uid)
	var old *podRecord
	if ok {
		old = e.Status
	}
	rec, evs := mergePod(old, obs, b.source, b.at)
	if rec != old && old != nil {
		for i := range obs.containers {
			s := &obs.containers[i]
			if orec := old.containers[s.info.ID]; verifies(orec, s) {
				m.checkExit(old.pod, orec, s)
			}
		}
	}
	if rec != old {
		modified := b.at
		if e.Modified.After(modified) {
			modified = e.Modified
		}
		m.cache.Set(uid, rec, modified)
	}
	return append(events, evs...)
}

// send hands events to the sink, or holds them while earlier events wait for
// a backfill. It returns an error only if the sink failed for a reason other
// than being full.
func (m *merger) send(ctx context.Context, events []Event) error {
	if m.held.count > 0 {
		m.hold(events)
		return nil
	}
	n, err := m.sendSome(ctx, events)
	if err != nil {
		return err
	}
	m.hold(events[n:])
	return nil
}

// sendSome sends events and returns how many the sink recorded: all of them,
// or the prefix a *SinkFullError names.
func (m *merger) sendSome(ctx context.Context, events []Event) (int, error) {
	err := m.sink.Send(ctx, events)
	var full *SinkFullError
	switch {
	case err == nil:
		return len(events), nil
	case errors.As(err, &full):
		return min(max(full.Recorded, 0), len(events)), nil
	}
	return 0, fmt.Errorf("send %d events: %w", len(events), err)
}

// collectGarbage drops tombstones older than the TTL, and pods left with
// nothing. It runs at most every tenth of the TTL.
func (m *merger) collectGarbage(now time.Time) {
	if now.Sub(m.lastGC) < m.tombstoneTTL/10 {
		return
	}
	m.lastGC = now
	cutoff := now.Add(-m.tombstoneTTL)
	var stale []string
	m.cache.Range(func(uid string, e statecache.Entry[*podRecord]) bool {
		for _, rec := range e.Status.containers {
			if rec.state == stateGone && rec.goneAt.Before(cutoff) {
				stale = append(stale, uid)
				break
			}
		}
		if len(e.Status.containers) == 0 {
			stale = append(stale, uid)
		}
		return true
	})
	for _, uid := range stale {
		e, ok := m.cache.Get(uid)
		if !ok {
			continue
		}
		keep := make(map[string]*containerRecord, len(e.Status.containers))
		for id, rec := range e.Status.containers {
			if rec.state != stateGone || !rec.goneAt.Before(cutoff) {
				keep[id] = rec
			} else if rec.unsent != 0 {
				m.unreported(uid, rec)
			}
		}
		if len(keep) == 0 {
			m.cache.Delete(uid)
			continue
		}
		m.cache.Set(uid, &podRecord{pod: e.Status.pod, containers: keep}, e.Modified)
	}
}

// lookupMeta returns the cached labels and annotations of a pod, if any.
func (m *merger) lookupMeta(podUID string) *PodMeta { return lookupMeta(m.cache, podUID) }

// lookupMeta returns cache's labels and annotations of a pod, if any.
func lookupMeta(cache *statecache.Cache[*podRecord], podUID string) *PodMeta {
	e, ok := cache.Get(podUID)
	if !ok || e.Status == nil {
		return nil
	}
	return e.Status.pod.Meta
}

// lookup returns cache's record of a container, if any.
func lookup(cache *statecache.Cache[*podRecord], podUID, containerID string) *containerRecord {
	e, ok := cache.Get(podUID)
	if !ok || e.Status == nil {
		return nil
	}
	return e.Status.containers[containerID]
}
