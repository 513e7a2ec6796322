package generator

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// targetedQueue holds the targeted relists that stream events and
// containerd's events ask for, at most one per sandbox, and hands each out
// once it is due (requests that are due at once go oldest first) and no
// faster than its rate limit.
//
// The CRI stream's requests are due a delay after they were first asked for:
// the rest of a pod's events coalesce with the first (a pod's termination
// stops and removes each of its containers and its sandbox within a few
// milliseconds, and one listing confirms them all). containerd's events
// carry no state, so their requests are due at once, and a second look at a
// container whose listing did not show the change yet is due a little later
// (trigger.go). The rate limit keeps a node-wide storm of terminations from
// turning into a storm of runtime calls. Requests that wait keep coalescing,
// so under a sustained storm each pod is relisted once per turn of the
// queue; the periodic relist remains the backstop.
//
// Request and RequestAfter are safe for concurrent use; Next has one caller
// at a time.
type targetedQueue struct {
	delay   time.Duration
	limit   *rate.Limiter
	pending prometheus.Gauge // the number of sandboxes waiting
	wake    chan struct{}    // capacity 1: a request arrived or came due sooner

	mu       sync.Mutex
	requests map[string]*targetedRequest // guarded by mu; by sandbox ID
	byDue    requestHeap                 // guarded by mu; the values of requests, due first on top
	asked    uint64                      // guarded by mu; requests ever queued, for their order
}

// targetedRequest is a waiting targeted relist of one sandbox: what to list,
// and when it is due.
type targetedRequest struct {
	scope relistScope
	due   time.Time
	seq   uint64 // when it was queued, among all requests: the older goes first at the same due time
	index int    // its place in byDue
}

// requestHeap orders the waiting requests by due time, then age. A heap
// rather than a scan: under a storm of terminations thousands of sandboxes
// wait at the rate limit, and a scan for the first due on every take cost a
// tenth of the bridge's CPU at 10,000 transitions a second (pleg-bench's
// throughput rows, CPU profile).
type requestHeap []*targetedRequest

func (h requestHeap) Len() int { return len(h) }
func (h requestHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h requestHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *requestHeap) Push(x any) {
	r := x.(*targetedRequest)
	r.index = len(*h)
	*h = append(*h, r)
}
func (h *requestHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return r
}

// newTargetedQueue returns an empty queue whose requests wait delay (none if
// negative) unless asked for otherwise, then go out at most perSecond a
// second, in bursts of up to half a second's worth. pending follows the
// number of waiting sandboxes.
func newTargetedQueue(delay time.Duration, perSecond float64, pending prometheus.Gauge) *targetedQueue {
	return &targetedQueue{
		delay:    delay,
		limit:    rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond/2))),
		pending:  pending,
		wake:     make(chan struct{}, 1),
		requests: make(map[string]*targetedRequest),
	}
}

// Request asks for a relist of s's sandbox after the queue's delay. See
// RequestAfter.
func (q *targetedQueue) Request(s relistScope) { q.RequestAfter(s, q.delay) }

// RequestAfter asks for a relist of s's sandbox once delay has passed (at
// once if it is not positive). A request for a sandbox that is already
// waiting joins it, keeping its place and becoming due at the sooner of the
// two times; the joint request lists the sandbox itself if either did (a
// sandbox's own event needs it listed, whatever its containers' events
// asked for), and knows the pod UID if either did. It does not block.
func (q *targetedQueue) RequestAfter(s relistScope, delay time.Duration) {
	due := time.Now().Add(max(delay, 0))
	q.mu.Lock()
	sooner := true
	if r, ok := q.requests[s.sandboxID]; ok {
		r.scope.containersOnly = r.scope.containersOnly && s.containersOnly
		if r.scope.podUID == "" {
			r.scope.podUID = s.podUID
		}
		sooner = due.Before(r.due)
		if sooner {
			r.due = due
			heap.Fix(&q.byDue, r.index)
		}
	} else {
		r := &targetedRequest{scope: s, due: due, seq: q.asked}
		q.asked++
		q.requests[s.sandboxID] = r
		heap.Push(&q.byDue, r)
	}
	q.pending.Set(float64(len(q.requests)))
	q.mu.Unlock()
	if sooner {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// Next removes and returns the request that is due first, once it is due
// and the rate limit allows. It blocks until then, or fails when ctx is done
// (or its deadline would pass first), leaving the request queued.
func (q *targetedQueue) Next(ctx context.Context) (relistScope, error) {
	for {
		due, ok := q.firstDue()
		if !ok {
			select {
			case <-ctx.Done():
				return relistScope{}, ctx.Err()
			case <-q.wake:
			}
			continue
		}
		if d := time.Until(due); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return relistScope{}, ctx.Err()
			case <-q.wake:
				t.Stop()
				continue // a request may have come due sooner
			case <-t.C:
			}
		}
		if err := q.limit.Wait(ctx); err != nil {
			return relistScope{}, fmt.Errorf("wait for the targeted relist rate: %w", err)
		}
		if s, ok := q.take(); ok {
			return s, nil
		}
	}
}

// firstDue returns when the request due first is due.
func (q *targetedQueue) firstDue() (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.byDue) == 0 {
		return time.Time{}, false
	}
	return q.byDue[0].due, true
}

// take removes the request due first.
func (q *targetedQueue) take() (relistScope, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.byDue) == 0 {
		return relistScope{}, false
	}
	return q.popLocked().scope, true
}

// popLocked removes the request due first; there is one. q.mu must be held.
func (q *targetedQueue) popLocked() *targetedRequest {
	r := heap.Pop(&q.byDue).(*targetedRequest)
	delete(q.requests, r.scope.sandboxID)
	q.pending.Set(float64(len(q.requests)))
	return r
}

// takeDueIfAtLeast removes and returns every request that is due at now,
// oldest due first, if there are at least n of them; otherwise it takes
// nothing.
func (q *targetedQueue) takeDueIfAtLeast(now time.Time, n int) []relistScope {
	q.mu.Lock()
	defer q.mu.Unlock()
	due := q.byDue.countDue(0, now)
	if due < n || due == 0 {
		return nil
	}
	taken := make([]relistScope, 0, due)
	for range due {
		taken = append(taken, q.popLocked().scope)
	}
	return taken
}

// countDue counts the requests due at now in the subtree of the heap rooted
// at i: it visits only those and their children, as a request's children are
// due no sooner than it.
func (h requestHeap) countDue(i int, now time.Time) int {
	if i >= len(h) || h[i].due.After(now) {
		return 0
	}
	return 1 + h.countDue(2*i+1, now) + h.countDue(2*i+2, now)
}

// sleep waits d (nothing if d is not positive) or until ctx is done, and then
// returns ctx.Err().
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// runTargeted takes the targeted relists from the queue until ctx is done
// and has each merged. A failed listing is left to the next full relist.
func (g *Generator) runTargeted(ctx context.Context) error {
	for {
		s, err := g.targeted.Next(ctx)
		if err != nil {
			return nil // ctx done
		}
		if g.stream.followsContainerd() {
			// Driven by containerd's events, a burst over many pods (a
			// node draining, a deployment rolling) would be one targeted
			// relist per pod at the rate limit, seconds behind. One full
			// relist is two calls and shows them all: the expectations
			// are confirmed after it (triggerSet.confirmAll).
			if more := g.targeted.takeDueIfAtLeast(time.Now(), coalesceAbove-1); more != nil {
				g.metrics.relists.WithLabelValues("coalesced", "ok").Add(float64(len(more) + 1))
				g.requestRelist()
				continue
			}
		}
		b, err := g.relister.relist(ctx, &s)
		if err != nil {
			g.metrics.relists.WithLabelValues("targeted", "error").Inc()
			g.logger.Debug("targeted relist failed; the next full relist covers it", "pod_uid", s.podUID, "err", err)
			g.triggers.confirm(s, nil)
			continue
		}
		if err := g.merge.submit(ctx, b); err != nil {
			return nil // ctx done, or the merge failed and Run returns its error
		}
		g.metrics.relists.WithLabelValues("targeted", "ok").Inc()
		g.triggers.confirm(s, b)
	}
}
