package latencybench

import (
	"sync"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// transition names one expected event: a container and an event type.
type transition struct {
	containerID string
	typ         generator.LifecycleEventType
}

// expectation is a transition the driver made, when, and when it passed the
// stages of the bridge that the harness can see from outside.
type expectation struct {
	at       time.Time // right before the runtime call
	measured bool      // false during the warmup
	received time.Time // its stream event reached the generator (zero: never)
	handed   time.Time // the generator handed its event to the publisher
	queued   time.Time // the publisher encoded and queued it
}

// Stages of a bridge event, in order, as Result.Stages names them.
const (
	// StageStream is the runtime call to the stream event's arrival in the
	// generator: the runtime, gRPC and the CRI client (evented only).
	StageStream = "runtime→stream"
	// StageDetect is the arrival (generic: the runtime call) to the event
	// handed to the publisher: the stream buffer, the conversion and the
	// merge, or the wait for a relist and the relist, and the encoding of
	// the events handed over before it in the same batch.
	StageDetect = "detect+merge"
	// StageEncode is the publisher's Send of the event: encoding it and
	// queueing it in the outbox.
	StageEncode = "encode+queue"
	// StageAck is the event queued to OnAck: the publisher's dispatch,
	// JetStream's store and ack, and the publisher's handling of the ack.
	StageAck = "queue→ack"
)

// tracker matches acks to the transitions the driver made and keeps the
// latencies of the measured ones, in all and by stage. Safe for concurrent
// use: the driver calls expect, the bridge's goroutines stamp the stages,
// the publisher's goroutine (or the raw waiters) settle them.
type tracker struct {
	mu          sync.Mutex
	pending     map[transition]*expectation // guarded by mu
	acked       map[transition]bool         // guarded by mu; every transition acked so far
	latencies   []time.Duration             // guarded by mu; of measured transitions
	stages      map[string][]time.Duration  // guarded by mu; of measured transitions
	expected    int                         // guarded by mu; measured transitions made
	outstanding int                         // guarded by mu; measured transitions not acked yet
	duplicates  int                         // guarded by mu
	byRelist    int                         // guarded by mu
	finished    bool                        // guarded by mu; the driver made its last transition
	allAcked    chan struct{}               // closed once finished and nothing is outstanding
}

func newTracker(capacity int) *tracker {
	return &tracker{
		pending:   make(map[transition]*expectation, capacity/4),
		acked:     make(map[transition]bool, capacity),
		latencies: make([]time.Duration, 0, capacity),
		stages:    make(map[string][]time.Duration),
		allAcked:  make(chan struct{}),
	}
}

// expect records a transition the caller is about to make, timed last thing
// before the caller makes it.
func (t *tracker) expect(tr transition, measured bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.startLocked(measured)
	t.pending[tr] = &e
}

// start counts a raw publish the caller is about to make, which it settles
// itself, and returns its expectation, timed last thing.
func (t *tracker) start(measured bool) expectation {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.startLocked(measured)
}

func (t *tracker) startLocked(measured bool) expectation {
	if measured {
		t.expected++
		t.outstanding++
	}
	return expectation{at: time.Now(), measured: measured}
}

// forget drops a transition whose runtime call failed.
func (t *tracker) forget(tr transition) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.pending[tr]; ok {
		delete(t.pending, tr)
		if e.measured {
			t.expected--
			t.outstanding--
		}
	}
}

// stamp records when a pending transition reached a stage: set picks the
// stage's field. Transitions the driver did not make are ignored.
func (t *tracker) stamp(tr transition, now time.Time, set func(*expectation, time.Time)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.pending[tr]; ok {
		set(e, now)
	}
}

func setReceived(e *expectation, now time.Time) {
	if e.received.IsZero() {
		e.received = now
	}
}
func setHanded(e *expectation, now time.Time) { e.handed = now }
func setQueued(e *expectation, now time.Time) { e.queued = now }

// onAck is the publisher's OnAck: it settles the transition ev reports. It
// runs on the publisher's goroutine, so it does little.
func (t *tracker) onAck(ev generator.Event) {
	now := time.Now()
	tr := transition{ev.Container.ID, ev.Type}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.pending[tr]
	if !ok {
		if t.acked[tr] {
			t.duplicates++
		}
		return // the pool's setup, a sandbox
	}
	delete(t.pending, tr)
	t.acked[tr] = true
	if !e.measured {
		return
	}
	if ev.DetectedBy == generator.SourceRelist {
		t.byRelist++
	}
	detectFrom := e.at
	if !e.received.IsZero() && ev.DetectedBy == generator.SourceEvented {
		t.stages[StageStream] = append(t.stages[StageStream], e.received.Sub(e.at))
		detectFrom = e.received
	}
	if !e.handed.IsZero() {
		if e.queued.IsZero() {
			// Acked before the Send that queued it returned: the publisher
			// runs concurrently with Send.
			e.queued = now
		}
		t.stages[StageDetect] = append(t.stages[StageDetect], e.handed.Sub(detectFrom))
		t.stages[StageEncode] = append(t.stages[StageEncode], e.queued.Sub(e.handed))
		t.stages[StageAck] = append(t.stages[StageAck], now.Sub(e.queued))
	}
	t.settleLocked(*e, now)
}

// settle records the ack of a raw publish made at e.
func (t *tracker) settle(e expectation, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.settleLocked(e, now)
}

func (t *tracker) settleLocked(e expectation, now time.Time) {
	if !e.measured {
		return
	}
	t.latencies = append(t.latencies, now.Sub(e.at))
	t.outstanding--
	t.closeIfDoneLocked()
}

// finish says the driver made its last transition.
func (t *tracker) finish() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.finished = true
	t.closeIfDoneLocked()
}

func (t *tracker) closeIfDoneLocked() {
	if t.finished && t.outstanding == 0 {
		select {
		case <-t.allAcked:
		default:
			close(t.allAcked)
		}
	}
}

// result summarises what was tracked so far.
func (t *tracker) result(mode Mode, p paced) Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := Result{
		Mode:       mode,
		Expected:   t.expected,
		Acked:      len(t.latencies),
		Duplicates: t.duplicates,
		ByRelist:   t.byRelist,
		Rate:       p.rate,
		CPU:        p.cpu,
		Latency:    summarize(t.latencies),
	}
	for _, name := range []string{StageStream, StageDetect, StageEncode, StageAck} {
		if l := t.stages[name]; len(l) > 0 {
			r.Stages = append(r.Stages, Stage{Name: name, Latency: summarize(l)})
		}
	}
	return r
}
