package generator

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// batch is one unit of work for the merge: the pods one relist or one stream
// message observed, all at the same time.
type batch struct {
	source Source
	at     time.Time
	pods   []podObservation
	// full says the batch lists every pod of the node: a cached pod missing
	// from it is gone (a full relist).
	full bool
	// subject is the container a stream event reports a transition of
	// (started, stopped, deleted); if the event produces nothing for it, the
	// cache already held that transition.
	subject string

	// Of a full relist: the version of the runtime's listings once they
	// were taken (versioned: the runtime's client has one; see
	// Options.Listings),
	// and whether a status call failed, leaving a change for the next
	// relist to see again (see inspect).
	version   uint64
	versioned bool
	reinspect bool
	// unchanged says the relist listed what the last full relist merged
	// did, with nothing else merged since: it has no pods, and its merge
	// only moves the cache's time (see lastFullMerge). stale is set by the
	// merge if something was merged after all before its turn came: it was
	// not applied, and must be taken again.
	unchanged, stale bool
}

// recycle forgets what b holds, keeping the room of its first pod's
// sightings for the next streamBatch into it. The merge goroutine
// converts every stream message into one batch so: nothing keeps a batch,
// or its sightings, past its merge, which copies what it keeps. A message
// took a new batch and a new slice of sightings, a tenth of what the
// bridge allocated under churn (pleg-bench's throughput rows, allocation
// profile).
func (b *batch) recycle() {
	if len(b.pods) > 0 {
		clear(b.pods[0].containers)
		b.pods[0] = podObservation{containers: b.pods[0].containers[:0]}
	}
	*b = batch{pods: b.pods[:0]}
}

// lastFullMerge is what the merge goroutine knows of the last full relist
// it merged, and what the relister reads to tell that a relist has nothing
// to merge.
//
// Why: a full relist of a node where nothing changed merges nothing, and
// grouping, inspecting and merging its every pod only to learn that was
// half of its CPU once its items came from the memo (a third of the idle
// evented bridge's at 1,000 pods and 5,000 containers; pleg-bench). Merging
// a listing is idempotent (mergeContainer and mergePod change nothing the
// second time they are given the same sightings) and depends on the
// relist's time in one place only: a container missing from the listing is
// declared gone only if nothing saw it after the relist began. So a relist
// whose listings hold what the last merged one's did has nothing to merge
// if, since that one began, nothing else was merged (no stream message,
// targeted relist or backfill: what the cache holds is what that relist
// left) and that relist left nothing to reinspect (a failed status call
// kept a container at its cached state, for the next relist to see the
// change again).
type lastFullMerge struct {
	// valid holds the listings' version of the last full relist merged,
	// plus one, while all of the above holds; 0 otherwise.
	valid atomic.Uint64
}

// unchanged reports whether a full relist whose listings have version has
// nothing to merge. Safe for concurrent use.
func (l *lastFullMerge) unchanged(version uint64) bool {
	return l != nil && l.valid.Load() == version+1
}

// set records the full relist b was just merged (valid: nothing else was
// merged since b began).
func (l *lastFullMerge) set(b *batch, valid bool) {
	if valid && b.versioned && !b.reinspect {
		l.valid.Store(b.version + 1)
	} else {
		l.valid.Store(0)
	}
}

// invalidate records that something other than a full relist was merged.
func (l *lastFullMerge) invalidate() { l.valid.Store(0) }

// relistScope restricts a relist to one pod sandbox (nil: the whole node).
type relistScope struct {
	podUID    string
	sandboxID string
	// containersOnly lists the sandbox's containers but not the sandbox:
	// enough to confirm a container's stop or removal, in one call.
	containersOnly bool
}

// relister turns one ListPodSandbox and one ListContainers into a batch, with
// status calls only for containers whose state changed since the cache last
// saw them. A container created and removed between two relists is never
// seen by it; the event stream narrows that window.
type relister struct {
	rt                Runtime
	metrics           *Metrics
	logger            *slog.Logger
	statusConcurrency int
	// lookup returns the cached record of a container, if any. It is called
	// concurrently with the merge, which is the only writer of the cache.
	lookup func(podUID, containerID string) *containerRecord
	// lookupMeta returns the cached metadata of a pod, if any; like lookup.
	// A sandbox the cache took it from is not read again: a steady relist
	// builds no label maps.
	lookupMeta func(podUID string) *PodMeta
	meta       metaFilter
	// listings versions the runtime's full listings (nil: it does not,
	// and no relist is found unchanged); see Options.Listings.
	listings Listings

	// last is the last full relist merged (nil: a relist is never found
	// unchanged).
	last *lastFullMerge

	mu      sync.Mutex
	skipped map[string]bool // guarded by mu; malformed objects already reported
}

// relist takes one snapshot. Its timestamp is taken before the list calls, so
// anything the merge learnt after that time wins over it. A full relist that
// lists what the last merged one did, with nothing merged since, comes back
// unchanged, without pods (see lastFullMerge).
func (r *relister) relist(ctx context.Context, scope *relistScope) (*batch, error) {
	return r.take(ctx, scope, true)
}

// take is relist; mayBeUnchanged false always builds the pods.
func (r *relister) take(ctx context.Context, scope *relistScope, mayBeUnchanged bool) (*batch, error) {
	at := time.Now()
	var sbFilter *runtimeapi.PodSandboxFilter
	var cFilter *runtimeapi.ContainerFilter
	if scope != nil {
		sbFilter = &runtimeapi.PodSandboxFilter{Id: scope.sandboxID}
		cFilter = &runtimeapi.ContainerFilter{PodSandboxId: scope.sandboxID}
	}
	seenBad := make(map[string]bool)
	var sandboxes []sandboxView
	if scope == nil || !scope.containersOnly {
		listed, err := r.rt.ListPodSandbox(ctx, sbFilter)
		if err != nil {
			return nil, err
		}
		// The listed sandboxes are left before the containers are listed:
		// the containers' listing is the relist's memory peak.
		sandboxes = r.viewSandboxes(listed, at, seenBad)
	}
	containers, err := r.rt.ListContainers(ctx, cFilter)
	if err != nil {
		return nil, err
	}
	b := &batch{source: SourceRelist, at: at, full: scope == nil}
	if b.full && r.listings != nil {
		b.version, b.versioned = r.listings.ListingVersion()
		if b.versioned && mayBeUnchanged && r.last.unchanged(b.version) {
			b.unchanged = true
			return b, nil
		}
	}
	pods := r.group(sandboxes, containers, at, scope, seenBad)
	if scope != nil && scope.podUID != "" && pods[scope.podUID] == nil {
		// The sandbox is gone with all its containers: an empty, complete
		// view of it lets the merge declare them gone. (A sandbox whose pod
		// is not known yet, named by one of containerd's events, has
		// nothing to declare gone.)
		pods[scope.podUID] = &podObservation{pod: Pod{UID: scope.podUID}, complete: true,
			scope: map[string]bool{scope.sandboxID: true}, containersOnly: scope.containersOnly}
	}
	if b.reinspect, err = r.inspect(ctx, pods, at); err != nil {
		return nil, err
	}
	b.pods = make([]podObservation, 0, len(pods))
	for _, p := range pods {
		b.pods = append(b.pods, *p)
	}
	return b, nil
}

// sandboxView is what a relist keeps of a listed sandbox while it lists
// the containers: its pod, with its metadata, and its sighting.
type sandboxView struct {
	pod Pod
	s   sighting
}

// viewSandboxes reads the listed sandboxes. Sandbox metadata is the
// authority for a pod's identity; a sandbox with no pod UID is skipped,
// reported once and counted (seenBad collects what a relist skipped).
func (r *relister) viewSandboxes(sandboxes []*runtimeapi.PodSandbox, at time.Time, seenBad map[string]bool) []sandboxView {
	views := make([]sandboxView, 0, len(sandboxes))
	for _, sb := range sandboxes {
		if sb == nil || sb.GetId() == "" {
			r.reportSkipped(seenBad, "sandbox", "", "sandbox without ID")
			continue
		}
		pod := sandboxPod(sb)
		if pod.UID == "" {
			r.reportSkipped(seenBad, "sandbox", sb.GetId(), "sandbox without pod UID in metadata or labels")
			continue
		}
		pod.Meta = r.meta.sandboxMeta(r.lookupMeta, pod.UID, sb, at)
		views = append(views, sandboxView{pod: pod, s: sandboxSighting(sb, at)})
	}
	return views
}

// group builds one complete observation per pod UID from the listings. A
// container whose sandbox is missing takes its identity from its labels; a
// container with no pod UID at all is skipped, reported once and counted.
// seenBad holds what viewSandboxes skipped.
func (r *relister) group(sandboxes []sandboxView, containers []*runtimeapi.Container, at time.Time, scope *relistScope, seenBad map[string]bool) map[string]*podObservation {
	pods := make(map[string]*podObservation, len(sandboxes))
	bySandbox := make(map[string]Pod, len(sandboxes))
	// Room for a pod's sandbox and its share of the containers, so that a
	// pod's sightings are not copied as they grow: growing them was a
	// third of what a steady relist of 1,000/5,000 allocated besides the
	// listings (BenchmarkRelist).
	perPod := 2
	if len(sandboxes) > 0 {
		perPod += len(containers) / len(sandboxes)
	}
	obsFor := func(p Pod) *podObservation {
		o := pods[p.UID]
		if o == nil {
			o = &podObservation{pod: p, complete: true, containers: make([]sighting, 0, perPod)}
			if scope != nil {
				o.scope = map[string]bool{scope.sandboxID: true}
				o.containersOnly = scope.containersOnly
			}
			pods[p.UID] = o
		} else {
			o.pod = mergePodIdentity(o.pod, p)
		}
		return o
	}
	for _, v := range sandboxes {
		bySandbox[v.s.info.ID] = v.pod
		o := obsFor(v.pod)
		o.containers = append(o.containers, v.s)
	}
	if scope != nil && scope.containersOnly {
		// The sandbox was not listed: its pod is the one the event named.
		bySandbox[scope.sandboxID] = Pod{UID: scope.podUID}
	}
	for _, c := range containers {
		if c == nil || c.GetId() == "" {
			r.reportSkipped(seenBad, "container", "", "container without ID")
			continue
		}
		pod, ok := bySandbox[c.GetPodSandboxId()]
		if !ok {
			pod = podFromLabels(c.GetLabels())
		}
		if pod.UID == "" {
			r.reportSkipped(seenBad, "container", c.GetId(), "container without pod UID: its sandbox is unknown and it has no pod labels")
			continue
		}
		o := obsFor(pod)
		o.containers = append(o.containers, containerSighting(c, c.GetPodSandboxId(), at))
	}
	r.mu.Lock()
	if scope == nil {
		r.skipped = seenBad // forget objects that are gone, so a new one is reported
	}
	r.mu.Unlock()
	return pods
}

// reportSkipped logs a malformed object at Warn and counts it, once for as
// long as the object keeps being listed.
func (r *relister) reportSkipped(seen map[string]bool, kind, id, why string) {
	key := kind + "/" + id
	seen[key] = true
	r.mu.Lock()
	known := r.skipped[key]
	if r.skipped == nil {
		r.skipped = map[string]bool{}
	}
	r.skipped[key] = true
	r.mu.Unlock()
	if known {
		return
	}
	r.metrics.skipped.WithLabelValues(kind).Inc()
	r.logger.Warn("skipping malformed runtime object", "kind", kind, "id", id, "reason", why)
}

// inspect reads the status of every container whose state moved forward since
// the cache saw it (or that the cache does not know), for exit code, reason
// and timestamps. A failed status call leaves the container at its cached
// state, so the next relist sees the change again and retries (the kubelet's
// podsToReinspect); a container removed in between keeps what the listing
// said. It reports whether a status call failed so.
//
// A container listed running whose status call failed keeps that its
// listing at at showed it started (sighting.listedRunningAt): if it is gone
// before a status call succeeds, its start is still reported. One listed
// exited keeps nothing: containerd lists a container whose start failed as
// exited too, without started_at, so exited alone does not say it ran.
func (r *relister) inspect(ctx context.Context, pods map[string]*podObservation, at time.Time) (reinspect bool, err error) {
	type job struct {
		pod string
		s   *sighting
	}
	var jobs []job
	for uid, p := range pods {
		for i := range p.containers {
			s := &p.containers[i]
			if s.info.Sandbox || s.state < stateRunning {
				continue
			}
			// An exit reported from containerd's task event is read again
			// once CRI lists it, to check it (exits.go).
			if rec := r.lookup(uid, s.info.ID); rec != nil && rec.state >= s.state && !(rec.unverified && s.state == stateExited) {
				continue
			}
			jobs = append(jobs, job{uid, s})
		}
	}
	if len(jobs) == 0 {
		return false, nil
	}
	var failed atomic.Bool
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.statusConcurrency)
	for _, j := range jobs {
		g.Go(func() error {
			st, err := r.rt.ContainerStatus(gctx, j.s.info.ID)
			switch {
			case err == nil:
				applyStatus(j.s, st, at)
			case status.Code(err) == codes.NotFound:
				// Removed after the listing: the listing still stands.
			case gctx.Err() != nil:
				return gctx.Err()
			default:
				r.logger.Debug("container status failed, will reinspect", "pod_uid", j.pod, "container_id", j.s.info.ID, "err", err)
				cached := stateCreated
				if rec := r.lookup(j.pod, j.s.info.ID); rec != nil {
					cached = rec.state
				}
				if j.s.state == stateRunning {
					j.s.listedRunningAt = at
				}
				j.s.state = cached
				failed.Store(true)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return false, fmt.Errorf("inspect containers: %w", err)
	}
	return failed.Load(), nil
}
