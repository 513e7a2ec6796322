package generator

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/pleg-bridge/pleg-bridge/statecache"
	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerd's events as a trigger.
//
// containerd's event service names a container or sandbox and what happened
// to its task, nothing more: no pod, no CRI state. Each event therefore only
// asks for a targeted relist of the sandbox it concerns, through the same
// queue as the CRI stream's requests, and what is published still comes
// from CRI listings and statuses (so an event's detectedBy is "relist").
//
// containerd publishes a task's events before its CRI plugin has updated the
// container's CRI status (the plugin handles the same events, after they
// are published), so a listing taken at once may not show the change yet.
// Each event is therefore kept as an expectation (the container at least
// running, exited, or gone) until a targeted relist of its sandbox shows it,
// and looked at again after 25 ms, then 50 ms, and so on, up to
// triggerLooks times; past that, the periodic relist finds it.

const (
	// triggerLooks bounds the targeted relists one expectation asks for,
	// the first included: 25 ms doubling to 3.2 s, about 6.4 s in all.
	triggerLooks = 8
	// triggerRelookFirst is the wait before the second look.
	triggerRelookFirst = 25 * time.Millisecond
	// coalesceAbove is how many sandboxes due for a targeted relist at once
	// make one full relist instead, in containerd-events mode.
	coalesceAbove = 8
)

// Results of a containerd event, counted in
// pleg_bridge_containerd_triggers_total.
const (
	triggerRequested   = "requested"   // a targeted relist was asked for
	triggerKnown       = "known"       // the cache already held what it reports
	triggerExec        = "exec"        // an exec's exit or delete: nothing to report
	triggerConfirmed   = "confirmed"   // a targeted relist showed it
	triggerRelooked    = "relooked"    // a targeted relist did not show it yet: asked again
	triggerUnconfirmed = "unconfirmed" // no look showed it: left to the periodic relist
	triggerUnresolved  = "unresolved"  // CRI never listed its ID: left to the periodic relist
)

// expectation is what one container or sandbox should show, after one of
// containerd's events, once CRI has caught up.
type expectation struct {
	want  cstate
	scope relistScope
	looks int // targeted relists asked for so far
}

// triggerSet holds the expectations and turns containerd's events into
// targeted relists. It belongs to a Generator; its methods are safe for
// concurrent use (the trigger goroutine adds, the targeted relist goroutine
// confirms).
type triggerSet struct {
	g       *Generator
	results *prometheus.CounterVec

	// retries carries the events whose ID CRI did not list yet back to
	// the trigger goroutine, each after its wait.
	retries chan unresolved

	mu      sync.Mutex
	pending map[string]*expectation // guarded by mu; by container or sandbox ID
}

// unresolved is an event to resolve again: tries attempts so far.
type unresolved struct {
	ev    TaskEvent
	tries int
}

func newTriggerSet(g *Generator, results *prometheus.CounterVec) *triggerSet {
	return &triggerSet{g: g, results: results, pending: make(map[string]*expectation), retries: make(chan unresolved, 1024)}
}

// wantOf is the state a topic's event means its container has reached.
func wantOf(topic string) (cstate, bool) {
	switch topic {
	case TopicTaskStart:
		return stateRunning, true
	case TopicTaskExit, TopicTaskDelete:
		return stateExited, true
	case TopicContainerDelete:
		return stateGone, true
	}
	return 0, false
}

// runTriggers takes containerd's events from the subscription's buffer until
// ctx is done. Resolving a container the cache does not know asks CRI, so
// it runs here, off the subscription's reader, which never blocks.
func (g *Generator) runTriggers(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-g.taskBuf:
			g.triggers.handle(ctx, ev, 0)
		case r := <-g.triggers.retries:
			g.triggers.handle(ctx, r.ev, r.tries)
		}
	}
}

// handle turns one event into an expectation and a targeted relist. tries
// counts earlier attempts to resolve an ID that CRI did not list yet.
func (t *triggerSet) handle(ctx context.Context, ev TaskEvent, tries int) {
	g := t.g
	if ev.ExecID != "" {
		t.results.WithLabelValues(triggerExec).Inc()
		return
	}
	want, ok := wantOf(ev.Topic)
	if !ok {
		return // DecodeEnvelope lets no other topic through
	}
	scope, state, found := g.locate(ev.ID)
	switch {
	case found && state >= want:
		t.results.WithLabelValues(triggerKnown).Inc()
		return
	case !found && want == stateGone:
		// Never seen: nothing was reported, so there is nothing to remove.
		t.results.WithLabelValues(triggerKnown).Inc()
		return
	case !found:
		var err error
		scope, found, err = g.resolve(ctx, ev.ID)
		if err != nil && ctx.Err() != nil {
			return
		}
		if !found {
			// CRI does not list it yet (containerd's event came first), or
			// the runtime did not answer: look again shortly, bounded.
			if tries+1 >= triggerLooks {
				t.results.WithLabelValues(triggerUnresolved).Inc()
				g.logger.Debug("containerd event names an ID that CRI does not list; the periodic relist covers it",
					"topic", ev.Topic, "id", ev.ID, "err", err)
				return
			}
			retry := unresolved{ev: ev, tries: tries + 1}
			time.AfterFunc(relookDelay(tries+1), func() {
				select {
				case t.retries <- retry:
				default: // a storm of them: the periodic relist covers it
					t.results.WithLabelValues(triggerUnresolved).Inc()
				}
			})
			return
		}
	}
	t.mu.Lock()
	e, ok := t.pending[ev.ID]
	if !ok {
		e = &expectation{want: want, scope: scope}
		t.pending[ev.ID] = e
	} else {
		e.want = max(e.want, want)
		e.looks = 0 // news of it: the looks start over
	}
	e.looks++
	t.mu.Unlock()
	t.results.WithLabelValues(triggerRequested).Inc()
	if g.logger.Enabled(ctx, slog.LevelDebug) {
		g.logger.Debug("containerd event", "topic", ev.Topic, "id", ev.ID, "sandbox_id", scope.sandboxID,
			"published", ev.At.UTC(), "age", time.Since(ev.At))
	}
	g.targeted.RequestAfter(scope, 0)
}

// confirm checks, after a targeted relist of s's sandbox was merged (b) or
// failed (b nil), the expectations on that sandbox: those the cache now
// shows are done, the others are looked at again a little later, up to
// triggerLooks times.
func (t *triggerSet) confirm(s relistScope, b *batch) {
	t.check(func(e *expectation) bool { return e.scope.sandboxID == s.sandboxID }, b != nil)
}

// confirmAll checks every expectation after a full relist was merged, as
// confirm does for one sandbox: a burst coalesced into this relist left the
// queue, so nothing else would look at what it did not show before the
// safety-net relist.
func (t *triggerSet) confirmAll() {
	t.check(func(*expectation) bool { return true }, true)
}

// check settles the expectations that match: met (if listed says the cache
// has just been relisted), out of looks, or asked for again.
func (t *triggerSet) check(match func(*expectation) bool, listed bool) {
	type look struct {
		scope relistScope
		after time.Duration
	}
	var again []look
	t.mu.Lock()
	for id, e := range t.pending {
		if !match(e) {
			continue
		}
		if listed && t.reached(id, e) {
			delete(t.pending, id)
			t.results.WithLabelValues(triggerConfirmed).Inc()
			continue
		}
		if e.looks >= triggerLooks {
			delete(t.pending, id)
			t.results.WithLabelValues(triggerUnconfirmed).Inc()
			t.g.logger.Debug("no relist showed what containerd reported; the periodic relist covers it",
				"id", id, "want", e.want.String(), "looks", e.looks)
			continue
		}
		e.looks++
		t.results.WithLabelValues(triggerRelooked).Inc()
		again = append(again, look{e.scope, relookDelay(e.looks - 1)})
	}
	t.mu.Unlock()
	for _, l := range again {
		t.g.targeted.RequestAfter(l.scope, l.after)
	}
}

// reached says whether the cache shows e met, learning its pod's UID from
// the cache if the event came before the pod was known. t.mu must be held.
func (t *triggerSet) reached(id string, e *expectation) bool {
	if e.scope.podUID == "" {
		if sc, _, ok := t.g.locate(e.scope.sandboxID); ok {
			e.scope.podUID = sc.podUID
		}
	}
	return t.g.reached(e.scope.podUID, id, e.want)
}

// relookDelay is the wait before look n+1 (n ≥ 1): 25 ms doubling.
func relookDelay(n int) time.Duration {
	return triggerRelookFirst << min(n-1, 10)
}

// locate finds id among the cached containers and sandboxes: the scope
// of a targeted relist that shows it, and its state.
func (g *Generator) locate(id string) (relistScope, cstate, bool) {
	var scope relistScope
	var state cstate
	var found bool
	g.cache.Range(func(podUID string, e statecache.Entry[*podRecord]) bool {
		if e.Status == nil {
			return true
		}
		rec, ok := e.Status.containers[id]
		if !ok {
			return true
		}
		found, state = true, rec.state
		// A container's change is confirmed by its sandbox's containers
		// alone; a sandbox's needs the sandbox listed.
		scope = relistScope{podUID: podUID, sandboxID: rec.sandboxID, containersOnly: !rec.info.Sandbox}
		return false
	})
	return scope, state, found
}

// resolve asks CRI which sandbox id is, or belongs to: containerd's events
// name containers the cache has not seen yet (a new pod, a new container).
func (g *Generator) resolve(ctx context.Context, id string) (relistScope, bool, error) {
	cs, err := g.rt.ListContainers(ctx, &runtimeapi.ContainerFilter{Id: id})
	if err != nil {
		return relistScope{}, false, err
	}
	for _, c := range cs {
		if c.GetId() != id || c.GetPodSandboxId() == "" {
			continue
		}
		sb := c.GetPodSandboxId()
		if s, _, ok := g.locate(sb); ok {
			return relistScope{podUID: s.podUID, sandboxID: sb, containersOnly: true}, true, nil
		}
		return relistScope{sandboxID: sb}, true, nil
	}
	sbs, err := g.rt.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{Id: id})
	if err != nil {
		return relistScope{}, false, err
	}
	for _, sb := range sbs {
		if sb.GetId() == id {
			return relistScope{podUID: sb.GetMetadata().GetUid(), sandboxID: id}, true, nil
		}
	}
	return relistScope{}, false, nil
}

// reached says whether the cache shows container id of pod podUID at least
// in state want. A container the cache does not hold after a relist of its
// sandbox has not been listed yet, if it is expected to run, and is gone
// (removed before the listing) if it is expected to have exited.
func (g *Generator) reached(podUID, id string, want cstate) bool {
	rec := g.lookup(podUID, id)
	if rec == nil {
		return want >= stateExited
	}
	return rec.state >= want
}
