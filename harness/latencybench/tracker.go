package latencybench

import (
	"errors"
	"fmt"
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
// stages of the bridge that the harness can see from outside. Until the
// driver's word on it arrives (early), it holds only the stamps and acks
// that came first.
type expectation struct {
	at       time.Time // right before the runtime call
	measured bool      // false during the warmup
	received time.Time // its stream event reached the generator (zero: never)
	handed   time.Time // the generator handed its event to the publisher
	queued   time.Time // the publisher encoded and queued it

	// Acks that came before the driver's word: the runtime's process
	// reports a transition over a pipe, after making it, so the bridge can
	// be faster than the report.
	acks    int              // how many
	ackedAt time.Time        // the first one's
	ackedBy generator.Source // the first one's DetectedBy
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
// latencies of the measured ones, in all and by stage. The driver's word on
// a transition, the stage stamps and the acks may come in any order: in the
// in-process topology the driver expects a transition before making it, but
// the runtime's process records it after making it, and its record travels
// through a pipe the bridge can outrun. Stamps and acks of transitions the
// driver has not reported (yet) are kept as early expectations. Those of the
// pool's setup and of sandboxes, which the driver never reports, are never
// counted; they stay until the tracker, which lives for one run, is dropped.
// Safe for concurrent use: the driver (or the reader of the runtime's
// process's records) reports transitions, the bridge's goroutines stamp the
// stages, the publisher's goroutine (or the raw waiters) settle them.
type tracker struct {
	mu          sync.Mutex
	pending     map[transition]*expectation // guarded by mu; reported by the driver, not acked yet
	early       map[transition]*expectation // guarded by mu; stamped or acked, not reported yet
	acked       map[transition]bool         // guarded by mu; every reported transition acked so far
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
		early:     make(map[transition]*expectation),
		acked:     make(map[transition]bool, capacity),
		latencies: make([]time.Duration, 0, capacity),
		stages:    make(map[string][]time.Duration),
		allAcked:  make(chan struct{}),
	}
}

// errReportedTwice is returned by record for a transition reported before:
// the runtime's process makes each transition once.
var errReportedTwice = errors.New("transition reported twice")

// track is the driver's trackFunc in the harness's process: it expects tr,
// makes it with call, and forgets it if call fails.
func (t *tracker) track(tr transition, measured bool, call func() error) error {
	t.expect(tr, measured)
	if err := call(); err != nil {
		t.forget(tr)
		return err
	}
	return nil
}

// expect records a transition the caller is about to make, timed last thing
// before the caller makes it.
func (t *tracker) expect(tr transition, measured bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.reportLocked(tr, measured)
	e.at = time.Now()
	t.pending[tr] = e
}

// record records a transition the runtime's process made at at (its wall
// clock: both processes read the same one), and settles it at once if its
// ack came first. It returns errReportedTwice for a transition it knows
// already.
func (t *tracker) record(tr transition, at time.Time, measured bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.pending[tr]; ok || t.acked[tr] {
		return fmt.Errorf("%s of container %s: %w", tr.typ, tr.containerID, errReportedTwice)
	}
	e := t.reportLocked(tr, measured)
	e.at = at
	if e.acks == 0 {
		t.pending[tr] = e
		return nil
	}
	t.acked[tr] = true
	t.duplicates += e.acks - 1
	t.settleAckLocked(e, e.ackedAt, e.ackedBy)
	return nil
}

// reportLocked takes what came early for tr, if anything, and counts tr.
func (t *tracker) reportLocked(tr transition, measured bool) *expectation {
	e, ok := t.early[tr]
	if ok {
		delete(t.early, tr)
	} else {
		e = &expectation{}
	}
	e.measured = measured
	if measured {
		t.expected++
		t.outstanding++
	}
	return e
}

// start counts a raw publish the caller is about to make, which it settles
// itself, and returns its expectation, timed last thing.
func (t *tracker) start(measured bool) expectation {
	t.mu.Lock()
	defer t.mu.Unlock()
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

// stamp records when a transition reached a stage: set picks the stage's
// field. Stamps after the transition's ack are ignored, as the ack settled
// its stages.
func (t *tracker) stamp(tr transition, now time.Time, set func(*expectation, time.Time)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.pending[tr]; ok {
		set(e, now)
		return
	}
	if t.acked[tr] {
		return
	}
	e, ok := t.early[tr]
	if !ok {
		e = &expectation{}
		t.early[tr] = e
	}
	if e.acks == 0 {
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
	t.ack(transition{ev.Container.ID, ev.Type}, ev.DetectedBy, time.Now())
}

// ack settles tr, acked at now after detection by source; an ack that comes
// before tr is reported is kept until it is.
func (t *tracker) ack(tr transition, source generator.Source, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.pending[tr]; ok {
		delete(t.pending, tr)
		t.acked[tr] = true
		t.settleAckLocked(e, now, source)
		return
	}
	if t.acked[tr] {
		t.duplicates++
		return
	}
	// The pool's setup, a sandbox, or a transition not reported yet.
	e, ok := t.early[tr]
	if !ok {
		e = &expectation{}
		t.early[tr] = e
	}
	e.acks++
	if e.acks == 1 {
		e.ackedAt, e.ackedBy = now, source
	}
}

// settleAckLocked records the ack, at now, of the reported transition e.
func (t *tracker) settleAckLocked(e *expectation, now time.Time, source generator.Source) {
	if !e.measured {
		return
	}
	if source == generator.SourceRelist {
		t.byRelist++
	}
	detectFrom := e.at
	if !e.received.IsZero() && source == generator.SourceEvented {
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
		RuntimeCPU: p.runtimeCPU,
		Latency:    summarize(t.latencies),
	}
	for _, name := range []string{StageStream, StageDetect, StageEncode, StageAck} {
		if l := t.stages[name]; len(l) > 0 {
			r.Stages = append(r.Stages, Stage{Name: name, Latency: summarize(l)})
		}
	}
	return r
}
