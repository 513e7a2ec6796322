package generator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// targetedQueue holds the targeted relists that STOPPED and DELETED stream
// events ask for, at most one per sandbox, and hands them out oldest first,
// each once its delay has passed since it was first asked for and no faster
// than its rate limit.
//
// The delay lets the rest of a pod's events coalesce with the first: a pod's
// termination stops and removes each of its containers and its sandbox within
// a few milliseconds, and one listing confirms them all. The rate limit keeps
// a node-wide storm of terminations from turning into a storm of runtime
// calls. Requests that wait keep coalescing, so under a sustained storm each
// pod is relisted once per turn of the queue; they confirm what the stream
// reported, and the periodic relist remains the backstop.
//
// Request is safe for concurrent use; Next has one caller at a time.
type targetedQueue struct {
	delay   time.Duration
	limit   *rate.Limiter
	pending prometheus.Gauge // the number of sandboxes waiting
	wake    chan struct{}    // capacity 1: a request arrived

	mu       sync.Mutex
	requests map[string]*targetedRequest // guarded by mu; by sandbox ID
	order    []string                    // guarded by mu; the keys of requests, oldest first
}

// targetedRequest is a waiting targeted relist of one sandbox: what to list,
// and when it was first asked for.
type targetedRequest struct {
	scope relistScope
	since time.Time
}

// newTargetedQueue returns an empty queue whose requests wait delay (none if
// negative), then go out at most perSecond a second, in bursts of up to half
// a second's worth. pending follows the number of waiting sandboxes.
func newTargetedQueue(delay time.Duration, perSecond float64, pending prometheus.Gauge) *targetedQueue {
	return &targetedQueue{
		delay:    delay,
		limit:    rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond/2))),
		pending:  pending,
		wake:     make(chan struct{}, 1),
		requests: make(map[string]*targetedRequest),
	}
}

// Request asks for a relist of s's sandbox. A request for a sandbox that is
// already waiting joins it, keeping its place and its delay; the joint
// request lists the sandbox itself if either did (a sandbox's own event
// needs it listed, whatever its containers' events asked for). It does not
// block.
func (q *targetedQueue) Request(s relistScope) {
	q.mu.Lock()
	if r, ok := q.requests[s.sandboxID]; ok {
		r.scope.containersOnly = r.scope.containersOnly && s.containersOnly
	} else {
		q.requests[s.sandboxID] = &targetedRequest{scope: s, since: time.Now()}
		q.order = append(q.order, s.sandboxID)
	}
	q.pending.Set(float64(len(q.requests)))
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Next removes and returns the oldest request once its delay has passed and
// the rate limit allows. It blocks until then, or fails when ctx is done (or
// its deadline would pass first), leaving the request queued.
func (q *targetedQueue) Next(ctx context.Context) (relistScope, error) {
	for {
		since, ok := q.oldest()
		if !ok {
			select {
			case <-ctx.Done():
				return relistScope{}, ctx.Err()
			case <-q.wake:
			}
			continue
		}
		if err := sleep(ctx, time.Until(since.Add(q.delay))); err != nil {
			return relistScope{}, err
		}
		if err := q.limit.Wait(ctx); err != nil {
			return relistScope{}, fmt.Errorf("wait for the targeted relist rate: %w", err)
		}
		// The oldest request is still the one waited for: only Next takes
		// requests, and new ones queue behind it.
		if s, ok := q.take(); ok {
			return s, nil
		}
	}
}

// oldest returns when the oldest request was first asked for.
func (q *targetedQueue) oldest() (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.order) == 0 {
		return time.Time{}, false
	}
	return q.requests[q.order[0]].since, true
}

// take removes the oldest request.
func (q *targetedQueue) take() (relistScope, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.order) == 0 {
		return relistScope{}, false
	}
	id := q.order[0]
	q.order = q.order[1:]
	r := q.requests[id]
	delete(q.requests, id)
	q.pending.Set(float64(len(q.requests)))
	return r.scope, true
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
		b, err := g.relister.relist(ctx, &s)
		if err != nil {
			g.metrics.relists.WithLabelValues("targeted", "error").Inc()
			g.logger.Debug("targeted relist failed; the next full relist covers it", "pod_uid", s.podUID, "err", err)
			continue
		}
		if err := g.submit(ctx, b); err != nil {
			return nil // ctx done, or the merge failed and Run returns its error
		}
		g.metrics.relists.WithLabelValues("targeted", "ok").Inc()
	}
}
