package generator

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pleg-bridge/pleg-bridge/statecache"
	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerd's events as a trigger.
//
// containerd's event service names a container or sandbox and what happened
// to its task, nothing more: no pod, no CRI state. Each event therefore
// asks for a targeted relist of the sandbox it concerns, through the same
// queue as the CRI stream's requests, and what is published comes from CRI
// listings and statuses (so an event's detectedBy is "relist"), but for the
// exit of a container the cache holds running, which carries all a Died
// needs beyond the cache and is reported at once (exits.go); its targeted
// relists then check it against CRI.
//
// containerd publishes a task's events before its CRI plugin has updated the
// container's CRI status (the plugin handles the same events, after they
// are published), so a listing taken at once may not show the change yet.
// Each event is therefore kept as an expectation (the container at least
// running, exited, or gone) until a targeted relist of its sandbox shows it,
// and looked at again after 25 ms, then 50 ms, and so on, up to
// triggerLooks times; past that, the periodic relist finds it.
//
// An event that names an ID the cache does not hold (a new pod, a new
// container) needs the runtime to say which sandbox it is in. Asking for
// each such ID in turn, one or two calls each, made the trigger goroutine
// slower than the events as soon as the runtime was: at 100 new pods a
// second and 10 ms a call it fell seconds behind, asked about containers
// that were gone by then, and lost three of four short-lived containers
// whole (the 1.7 soak under CPU saturation, and
// TestContainerdEventsKeepUpWithASlowRuntime). So the trigger goroutine
// takes every event that is waiting before it asks, and asks for the
// unknown IDs together: a few are looked up one by one, coalesceAbove or
// more (or any, while others already wait for one) wait for one full
// relist, which lists them all in two calls however many they are. The
// slower the runtime, the more IDs each listing answers, so the trigger
// keeps up. An ID that a lookup or a full relist does not show, or that a
// failed call could not show, is asked about again after 25 ms, then
// 50 ms, and so on, up to triggerLooks times, with whatever else is
// unknown by then.

const (
	// triggerLooks bounds the targeted relists one expectation asks for,
	// the first included: 25 ms doubling to 3.2 s, about 6.4 s in all.
	triggerLooks = 8
	// triggerRelookFirst is the wait before the second look.
	triggerRelookFirst = 25 * time.Millisecond
	// coalesceAbove is how many sandboxes due for a targeted relist at once,
	// or how many IDs the cache does not know taken at once, make one full
	// relist instead, in containerd-events mode.
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
	triggerListed      = "listed"      // its ID, not cached, waits for a full relist with others
	triggerUnresolved  = "unresolved"  // CRI never listed its ID: left to the periodic relist
	triggerDied        = "died"        // a task exit of a container held running: its Died merged at once (exits.go)
	triggerOOM         = "oom"         // an OOM kill, kept for the container's exit (exits.go)
)

// expectation is what one container or sandbox should show, after one of
// containerd's events, once CRI has caught up.
type expectation struct {
	want  cstate
	scope relistScope
	looks int // targeted relists asked for so far
}

// triggerOptions are what New gives the trigger set: its only links to the
// rest of the generator. They are set once and only read after.
type triggerOptions struct {
	// cache is read (never written) to find where an event's ID is and
	// whether a relist showed what the event reported.
	cache *statecache.Cache[*podRecord]
	// rt is asked where an ID the cache does not hold is (resolve).
	rt Runtime
	// targeted takes the targeted relists the events ask for.
	targeted *targetedQueue
	// relist asks for a full relist soon.
	relist func()
	// exits takes the batches of the task exits reported at once to the
	// merge goroutine (exits.go); nil leaves exits to CRI.
	exits   chan<- *batch
	logger  *slog.Logger
	results *prometheus.CounterVec
}

// triggerSet holds the expectations and turns containerd's events into
// targeted relists. Its methods are safe for concurrent use (the trigger
// goroutine adds, the relist loop and the targeted relist goroutine
// confirm).
type triggerSet struct {
	triggerOptions

	// fullRelists counts the full relists the relist loop began
	// (fullRelistBegins), so that an ID taken can be told from a full
	// relist begun after it (awaitListing) from one that may have listed
	// before.
	fullRelists atomic.Uint64

	// retries carries the events whose ID CRI did not list yet back to
	// the trigger goroutine, each after its wait.
	retries chan unresolved

	mu      sync.Mutex
	pending map[string]*expectation // guarded by mu; by container or sandbox ID
	// listing holds the IDs the cache did not hold that wait for a full
	// relist begun after they were taken, by ID (see resolveAll).
	listing map[string]*awaited // guarded by mu

	// oom holds the containers a /tasks/oom named, until their exit, with
	// when it came; the trigger goroutine's own (exits.go).
	oom map[string]time.Time
}

// unresolved is an event whose ID the cache does not hold: tries attempts
// to resolve it so far.
type unresolved struct {
	ev    TaskEvent
	tries int
}

// awaited is an ID waiting for a full relist: its furthest event, and the
// number of full relists begun before it was taken (triggerSet.fullRelists),
// which cannot have listed it.
type awaited struct {
	unresolved
	after uint64
}

func newTriggerSet(opts triggerOptions) *triggerSet {
	return &triggerSet{triggerOptions: opts, pending: make(map[string]*expectation),
		listing: make(map[string]*awaited), retries: make(chan unresolved, 1024)}
}

// fullRelistBegins is called by the relist loop as it begins a full relist;
// it returns the relist's number, for relistFailed and confirmAll.
func (t *triggerSet) fullRelistBegins() uint64 { return t.fullRelists.Add(1) }

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

// run takes containerd's events from the subscription's buffer, events,
// and the task exits followed beside a CRI stream from exits (takeExit),
// until ctx is done, and returns nil. Resolving IDs the cache does not know asks CRI, so it runs
// here, off the subscription's reader, which never blocks: first every
// event already waiting is taken, then the unknown IDs among them are
// resolved together (resolveAll).
func (t *triggerSet) run(ctx context.Context, events, exits <-chan TaskEvent) error {
	var unknown []unresolved
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-exits:
			t.takeExit(ctx, ev)
			continue
		case ev := <-events:
			unknown = t.take(ctx, ev, 0, unknown)
		case r := <-t.retries:
			unknown = t.take(ctx, r.ev, r.tries, unknown)
		}
		// What is buffered now, not what keeps coming: a storm must not
		// keep the lookups out.
		for range len(events) {
			unknown = t.take(ctx, <-events, 0, unknown)
		}
		for range len(t.retries) {
			r := <-t.retries
			unknown = t.take(ctx, r.ev, r.tries, unknown)
		}
		t.resolveAll(ctx, unknown)
		clear(unknown)
		unknown = unknown[:0]
	}
}

// take turns one event into an expectation and a targeted relist, if the
// cache holds its ID, and returns unknown with the event appended if it does
// not. tries counts earlier attempts to resolve the ID.
func (t *triggerSet) take(ctx context.Context, ev TaskEvent, tries int, unknown []unresolved) []unresolved {
	if ev.ExecID != "" {
		t.results.WithLabelValues(triggerExec).Inc()
		return unknown
	}
	if ev.Topic == TopicTaskOOM {
		t.results.WithLabelValues(triggerOOM).Inc()
		t.sawOOM(ev)
		return unknown
	}
	want, ok := wantOf(ev.Topic)
	if !ok {
		return unknown // taskevent.Decode lets no other topic through
	}
	scope, state, found := locate(t.cache, ev.ID)
	switch {
	case found && state >= want:
		t.results.WithLabelValues(triggerKnown).Inc()
	case found:
		if ev.Topic == TopicTaskExit && state == stateRunning {
			// Reported at once; the expectation has CRI check it.
			t.died(ctx, ev, scope)
		}
		t.expect(ctx, ev, want, scope)
	case want == stateGone:
		// Never seen: nothing was reported, so there is nothing to remove.
		t.results.WithLabelValues(triggerKnown).Inc()
	default:
		unknown = append(unknown, unresolved{ev: ev, tries: tries})
	}
	return unknown
}

// resolveAll finds out where the IDs of unknown are, which the cache did not
// hold when their events were taken, and asks for their targeted relists.
// Fewer than coalesceAbove IDs are looked up one by one (resolve), unless
// IDs already wait for a full relist; then, or for more, they all wait for
// one full relist, which confirmAll judges them by. An ID that a lookup does
// not find is resolved again a little later (retry); so is one whose lookup
// fails, with those not looked up yet: the runtime is not answering.
func (t *triggerSet) resolveAll(ctx context.Context, unknown []unresolved) {
	if len(unknown) == 0 {
		return
	}
	// One per ID, with its furthest state: the events of a container
	// that started and stopped while its start waited are looked up once.
	ids := make([]unresolved, 0, len(unknown))
	at := make(map[string]int, len(unknown))
	for _, u := range unknown {
		i, ok := at[u.ev.ID]
		if !ok {
			at[u.ev.ID] = len(ids)
			ids = append(ids, u)
			continue
		}
		ids[i] = furthest(ids[i], u)
	}
	t.mu.Lock()
	waiting := len(t.listing) > 0
	t.mu.Unlock()
	if waiting || len(ids) >= coalesceAbove {
		t.awaitListing(ids)
		return
	}
	for i, u := range ids {
		want, _ := wantOf(u.ev.Topic)
		// A targeted relist asked for by another event (its sandbox's)
		// may have listed it meanwhile.
		scope, state, cached := locate(t.cache, u.ev.ID)
		if cached && state >= want {
			t.results.WithLabelValues(triggerKnown).Inc()
			continue
		}
		if !cached {
			var found bool
			var err error
			scope, found, err = resolve(ctx, t.rt, t.cache, u.ev.ID)
			switch {
			case err != nil && ctx.Err() != nil:
				return
			case err != nil:
				t.logger.Debug("looking up the ID of a containerd event failed; looking again shortly",
					"topic", u.ev.Topic, "id", u.ev.ID, "err", err)
				for _, u := range ids[i:] {
					t.retry(u, "the runtime did not answer")
				}
				return
			case !found:
				t.retry(u, "CRI does not list it")
				continue
			}
		}
		t.expect(ctx, u.ev, want, scope)
	}
}

// furthest is the one of two events of an ID that reports the further
// state, with the more tries of the two.
func furthest(a, b unresolved) unresolved {
	wa, _ := wantOf(a.ev.Topic)
	wb, _ := wantOf(b.ev.Topic)
	out := a
	if wb > wa {
		out.ev = b.ev
	}
	out.tries = max(a.tries, b.tries)
	return out
}

// awaitListing leaves ids to a full relist begun from now on, and asks for
// one.
func (t *triggerSet) awaitListing(ids []unresolved) {
	after := t.fullRelists.Load()
	t.mu.Lock()
	for _, u := range ids {
		if a, ok := t.listing[u.ev.ID]; ok {
			a.unresolved = furthest(a.unresolved, u)
			continue
		}
		t.listing[u.ev.ID] = &awaited{unresolved: u, after: after}
	}
	t.mu.Unlock()
	t.results.WithLabelValues(triggerListed).Add(float64(len(ids)))
	t.relist()
}

// retry resolves u's ID again after a wait, up to triggerLooks times in
// all; past that, it is left to the periodic relist. why says why it is
// not resolved yet.
func (t *triggerSet) retry(u unresolved, why string) {
	if u.tries+1 >= triggerLooks {
		t.results.WithLabelValues(triggerUnresolved).Inc()
		t.logger.Debug("containerd event names an ID that CRI does not list; the periodic relist covers it",
			"topic", u.ev.Topic, "id", u.ev.ID, "tries", u.tries+1, "reason", why)
		return
	}
	again := unresolved{ev: u.ev, tries: u.tries + 1}
	time.AfterFunc(relookDelay(again.tries), func() {
		select {
		case t.retries <- again:
		default: // a storm of them: the periodic relist covers it
			t.results.WithLabelValues(triggerUnresolved).Inc()
		}
	})
}

// expect records what the cache should come to show of ev's ID, found in
// scope's sandbox, and asks for a targeted relist of it at once.
func (t *triggerSet) expect(ctx context.Context, ev TaskEvent, want cstate, scope relistScope) {
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
	if t.logger.Enabled(ctx, slog.LevelDebug) {
		t.logger.Debug("containerd event", "topic", ev.Topic, "id", ev.ID, "sandbox_id", scope.sandboxID,
			"published", ev.At.UTC(), "age", time.Since(ev.At))
	}
	t.targeted.RequestAfter(scope, 0)
}

// relistFailed resolves again, a little later, the IDs that waited for
// full relist number seq, which failed (retry): waiting for the next one
// could take a safety-net period.
func (t *triggerSet) relistFailed(seq uint64) {
	var due []unresolved
	t.mu.Lock()
	for id, a := range t.listing {
		if a.after < seq {
			delete(t.listing, id)
			due = append(due, a.unresolved)
		}
	}
	t.mu.Unlock()
	for _, u := range due {
		t.retry(u, "the full relist failed")
	}
}

// confirm checks, after a targeted relist of s's sandbox was merged (b) or
// failed (b nil), the expectations on that sandbox: those the cache now
// shows are done, the others are looked at again a little later, up to
// triggerLooks times.
func (t *triggerSet) confirm(s relistScope, b *batch) {
	t.check(func(e *expectation) bool { return e.scope.sandboxID == s.sandboxID }, b != nil)
}

// confirmAll checks every expectation after full relist number seq (see
// triggerSet.fullRelists) was merged, as confirm does for one sandbox: a
// burst coalesced into this relist left the queue, so nothing else would
// look at what it did not show before the safety-net relist. The IDs that
// waited for a full relist begun after they were taken (awaitListing) are
// judged first: one the cache holds now becomes an expectation, checked
// with the others; one it does not is resolved again later (retry).
func (t *triggerSet) confirmAll(seq uint64) {
	var due []*awaited
	t.mu.Lock()
	for id, a := range t.listing {
		if a.after < seq { // a relist begun before may have listed before the event came
			delete(t.listing, id)
			due = append(due, a)
		}
	}
	t.mu.Unlock()
	if len(due) > 0 {
		// Looked up in the cache without the lock: locate reads every pod.
		type listed struct {
			want  cstate
			scope relistScope
		}
		found := make(map[string]listed, len(due))
		for _, a := range due {
			if scope, _, ok := locate(t.cache, a.ev.ID); ok {
				want, _ := wantOf(a.ev.Topic)
				found[a.ev.ID] = listed{want, scope}
			} else {
				t.retry(a.unresolved, "a full relist did not list it")
			}
		}
		t.mu.Lock()
		for id, l := range found {
			if e, ok := t.pending[id]; ok {
				e.want = max(e.want, l.want)
			} else {
				// The full relist was its first look.
				t.pending[id] = &expectation{want: l.want, scope: l.scope, looks: 1}
			}
		}
		t.mu.Unlock()
	}
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
			t.logger.Debug("no relist showed what containerd reported; the periodic relist covers it",
				"id", id, "want", e.want.String(), "looks", e.looks)
			continue
		}
		e.looks++
		t.results.WithLabelValues(triggerRelooked).Inc()
		again = append(again, look{e.scope, relookDelay(e.looks - 1)})
	}
	t.mu.Unlock()
	for _, l := range again {
		t.targeted.RequestAfter(l.scope, l.after)
	}
}

// reached says whether the cache shows e met, learning its pod's UID from
// the cache if the event came before the pod was known. t.mu must be held.
func (t *triggerSet) reached(id string, e *expectation) bool {
	if e.scope.podUID == "" {
		if sc, _, ok := locate(t.cache, e.scope.sandboxID); ok {
			e.scope.podUID = sc.podUID
		}
	}
	return reached(t.cache, e.scope.podUID, id, e.want)
}

// relookDelay is the wait before look n+1 (n ≥ 1): 25 ms doubling.
func relookDelay(n int) time.Duration {
	return triggerRelookFirst << min(n-1, 10)
}

// locate finds id among the containers and sandboxes cache holds: the
// scope of a targeted relist that shows it, and its state.
func locate(cache *statecache.Cache[*podRecord], id string) (relistScope, cstate, bool) {
	// Find, not Range: a containerd event must not copy the whole cache.
	podUID, e, found := cache.Find(func(_ string, e statecache.Entry[*podRecord]) bool {
		if e.Status == nil {
			return false
		}
		_, ok := e.Status.containers[id]
		return ok
	})
	if !found {
		return relistScope{}, 0, false
	}
	rec := e.Status.containers[id]
	// A container's change is confirmed by its sandbox's containers alone;
	// a sandbox's needs the sandbox listed.
	return relistScope{podUID: podUID, sandboxID: rec.sandboxID, containersOnly: !rec.info.Sandbox}, rec.state, true
}

// resolve asks rt which sandbox id is, or belongs to: containerd's events
// name containers the cache has not seen yet (a new pod, a new container).
func resolve(ctx context.Context, rt Runtime, cache *statecache.Cache[*podRecord], id string) (relistScope, bool, error) {
	cs, err := rt.ListContainers(ctx, &runtimeapi.ContainerFilter{Id: id})
	if err != nil {
		return relistScope{}, false, err
	}
	for _, c := range cs {
		if c.GetId() != id || c.GetPodSandboxId() == "" {
			continue
		}
		sb := c.GetPodSandboxId()
		if s, _, ok := locate(cache, sb); ok {
			return relistScope{podUID: s.podUID, sandboxID: sb, containersOnly: true}, true, nil
		}
		return relistScope{sandboxID: sb}, true, nil
	}
	sbs, err := rt.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{Id: id})
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
func reached(cache *statecache.Cache[*podRecord], podUID, id string, want cstate) bool {
	rec := lookup(cache, podUID, id)
	if rec == nil {
		return want >= stateExited
	}
	// An exit reported from containerd's task event is reached once CRI
	// showed it too (exits.go).
	return rec.state > want || (rec.state == want && !rec.unverified)
}
