package crisim

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// defaultEventBuffer is the default per-subscriber buffer. Tearing down a
// pod is a handful of events and subscribers read concurrently, so 4096
// absorbs any burst a test or the demo makes while still catching a
// subscriber that stopped reading.
const defaultEventBuffer = 4096

// maxReplayEvents bounds the events kept for replay while nobody listens, so
// churn without a subscriber cannot grow memory without limit. The oldest
// are dropped first.
const maxReplayEvents = 100_000

// ErrSlowSubscriber ends a subscription whose buffer was full when an event
// arrived. The subscriber has missed that event and must resubscribe (and
// relist).
var ErrSlowSubscriber = errors.New("crisim: subscriber too slow, event buffer full")

// stream is what a listener on either of a Runtime's event streams holds:
// the channel its events arrive on, and why it ended.
type stream[T any] struct {
	events chan T
	stop   func() bool // stops the context.AfterFunc that ends the subscription

	mu     sync.Mutex
	err    error // guarded by mu
	closed bool  // guarded by mu
}

// Events returns the channel the subscription's events arrive on. The
// Runtime closes it when the subscription ends.
func (s *stream[T]) Events() <-chan T { return s.events }

// Err returns why the subscription ended, or nil while it is active.
func (s *stream[T]) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// end closes the subscription with err, once: it reports whether it was
// still open.
func (s *stream[T]) end(err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.closed = true
	s.err = err
	close(s.events)
	s.stop()
	return true
}

// endLocked ends s (one of subs) with err and returns subs without it.
// r.mu must be held.
func endLocked[S interface{ end(error) bool }](r *Runtime, subs []S, s S, err error) []S {
	if !s.end(err) {
		return subs
	}
	if errors.Is(err, ErrSlowSubscriber) {
		r.stats.SlowSubscribers++
	}
	return slices.DeleteFunc(subs, func(x S) bool { return any(x) == any(s) })
}

// Subscription is one listener on a Runtime's CRI event stream.
type Subscription struct {
	stream[*runtimeapi.ContainerEventResponse]
	// shared is true for a subscriber that only reads what it receives
	// (the Server's streams only marshal it): it gets the one message the
	// Runtime built for the event, the same as every other such
	// subscriber, which aliases the Runtime's stored statuses. Others get
	// a deep copy of their own.
	shared bool
}

type replayEvent struct {
	at time.Time
	ev *runtimeapi.ContainerEventResponse
}

// Subscribe starts a subscription to the events emitted from now on; with
// Options.ReplayWhileDisconnected, it first receives the events kept while
// nobody listened. The subscription ends, and its Events channel is closed,
// when ctx is done (Err returns context.Cause(ctx)) or when an event finds
// its buffer full (Err returns ErrSlowSubscriber).
//
// A slow subscriber is disconnected rather than waited for: containerd 2.x
// blocks its event loop on a slow client, which in a test would only hide
// the fault as a hang. Disconnecting never blocks the model and makes the
// loss visible, and the right reaction (resubscribe and relist) is the same
// as for a runtime restart.
//
// Every event the subscription receives is its own copy: the subscriber
// may change it. Subscribe starts no goroutine; it is safe for concurrent
// use.
func (r *Runtime) Subscribe(ctx context.Context) *Subscription {
	return r.subscribe(ctx, false)
}

// subscribeShared is Subscribe for a subscriber that never changes the
// events it receives, nor anything they point to: they are shared with the
// other such subscribers and with the Runtime's state.
func (r *Runtime) subscribeShared(ctx context.Context) *Subscription {
	return r.subscribe(ctx, true)
}

func (r *Runtime) subscribe(ctx context.Context, shared bool) *Subscription {
	r.mu.Lock()
	defer r.mu.Unlock()
	backlog := r.takeBacklogLocked(time.Now())
	s := &Subscription{
		stream: stream[*runtimeapi.ContainerEventResponse]{events: make(chan *runtimeapi.ContainerEventResponse, r.opts.EventBuffer+len(backlog))},
		shared: shared,
	}
	for _, e := range backlog {
		s.events <- s.own(e.ev)
	}
	r.subs = append(r.subs, s)
	// If ctx is already done, the callback runs at once in its own goroutine
	// and waits for mu.
	s.stop = context.AfterFunc(ctx, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.endSubscriptionLocked(s, context.Cause(ctx))
	})
	return s
}

func (r *Runtime) endSubscriptionLocked(s *Subscription, err error) {
	r.subs = endLocked(r, r.subs, s, err)
}

// own returns ev as s receives it: ev itself for a shared subscriber, else
// a deep copy.
func (s *Subscription) own(ev *runtimeapi.ContainerEventResponse) *runtimeapi.ContainerEventResponse {
	if s.shared {
		return ev
	}
	return proto.CloneOf(ev)
}

// emitLocked hands ev to the subscribers: to each of them, or with
// SharedEventChannel to the next one in turn, and publishes containerd's
// envelopes that go with it to the task subscribers. It never blocks.
//
// ev is built once and never changed afterwards: the shared subscribers
// (the Server's streams) all get ev itself, and the others a deep copy
// each (see Subscription.own). It may alias the Runtime's stored statuses
// (see eventLocked), which are never changed in place either.
func (r *Runtime) emitLocked(ev *runtimeapi.ContainerEventResponse) {
	r.stats.Events++
	r.publishTasksLocked(ev)
	if r.opts.SharedEventChannel {
		for len(r.subs) > 0 {
			r.nextShared %= len(r.subs)
			s := r.subs[r.nextShared]
			r.nextShared++
			if r.sendLocked(s, ev) {
				return
			}
		}
	} else {
		delivered := false
		// sendLocked may remove s from r.subs: walk a copy, kept between
		// events so that emitting allocates nothing.
		r.emitting = append(r.emitting[:0], r.subs...)
		for _, s := range r.emitting {
			if r.sendLocked(s, ev) {
				delivered = true
			}
		}
		clear(r.emitting) // hold no ended subscription
		if delivered {
			return
		}
	}
	if r.opts.ReplayWhileDisconnected <= 0 {
		r.stats.Undelivered++
		return
	}
	if len(r.backlog) >= maxReplayEvents {
		r.backlog = r.backlog[1:]
		r.stats.Undelivered++
	}
	r.backlog = append(r.backlog, replayEvent{at: time.Now(), ev: ev})
}

// sendLocked delivers ev, as s receives it, to s without blocking, or ends
// s as too slow.
func (r *Runtime) sendLocked(s *Subscription, ev *runtimeapi.ContainerEventResponse) bool {
	select {
	case s.events <- s.own(ev):
		return true
	default:
		r.endSubscriptionLocked(s, ErrSlowSubscriber)
		return false
	}
}

// takeBacklogLocked returns and forgets the events kept for replay that are
// not older than the replay window.
func (r *Runtime) takeBacklogLocked(now time.Time) []replayEvent {
	backlog := r.backlog
	r.backlog = nil
	cutoff := now.Add(-r.opts.ReplayWhileDisconnected)
	for len(backlog) > 0 && backlog[0].at.Before(cutoff) {
		backlog = backlog[1:]
		r.stats.Undelivered++
	}
	return backlog
}
