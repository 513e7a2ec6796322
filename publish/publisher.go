package publish

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// Publisher defaults.
const (
	// DefaultMaxInFlight keeps a LAN or loopback server busy (at ~100µs per
	// ack that is over 2M events/s of headroom) while staying well below
	// nats.go's async pending limit (4000), so PublishMsgAsync never stalls.
	DefaultMaxInFlight = 256
	// DefaultOutboxSize holds minutes of heavy pod churn on a full node
	// (110 pods, a few events each per restart) while NATS is unreachable,
	// at about 1-2 KiB per event: some 30 MiB at worst.
	DefaultOutboxSize = 16384
	// DefaultRetryBackoffMin and DefaultRetryBackoffMax bound the wait
	// before a failed publish is retried: soon enough to hide a leader
	// election, slow enough not to hammer a server that is down.
	DefaultRetryBackoffMin = 100 * time.Millisecond
	DefaultRetryBackoffMax = 10 * time.Second
	// DefaultDrainTimeout bounds the delivery of what is queued at shutdown.
	DefaultDrainTimeout = 10 * time.Second
	// DefaultAckTimeout is how long an ack may take before the publish is
	// treated as failed and retried with the same message id.
	DefaultAckTimeout = 5 * time.Second
)

// ErrClosed is returned (wrapped) by Send once the Publisher no longer accepts
// events: after Run's ctx is done.
var ErrClosed = errors.New("publisher closed")

// Options configures a Publisher. Zero values take the defaults above.
type Options struct {
	// Encoder encodes the events. Required.
	Encoder *Encoder
	// MaxInFlight bounds the published, not yet acked messages, over all
	// pods. Keep it below the JetStream handle's async pending limit.
	MaxInFlight int
	// OutboxSize bounds the accepted, not yet acked events; Send blocks
	// while it is full.
	OutboxSize int
	// RetryBackoffMin and RetryBackoffMax bound the jittered, doubling wait
	// before a failed publish is retried.
	RetryBackoffMin, RetryBackoffMax time.Duration
	// AckTimeout is how long to wait for an ack before retrying.
	AckTimeout time.Duration
	// DrainTimeout bounds delivery of what is queued once Run's ctx is done.
	DrainTimeout time.Duration
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger is tagged with component=publisher; nil logs nothing.
	Logger *slog.Logger
	// OnAck, if set, is called with each event after JetStream acked it,
	// in per-pod Send order, from Run's goroutine. It must not block for
	// long: delivery waits for it.
	OnAck func(ev generator.Event)
}

// Publisher delivers Lifecycle events to JetStream, at least once and in
// order per pod (DESIGN.md §4, §7). Send queues events in a bounded outbox;
// Run publishes them asynchronously.
//
// Per pod, at most one message is in flight: the next event of a pod is
// published only once JetStream acked the previous one, so a failed publish
// that is retried cannot be overtaken. Different pods pipeline, up to
// MaxInFlight messages in all. A failed attempt (an error or no ack within
// AckTimeout) is retried with the same Nats-Msg-Id after a capped,
// jittered, doubling backoff, so JetStream stores the event once even if
// the lost ack's publish did land, as long as the retry comes within the
// stream's duplicate window.
//
// Send and Pending are safe for concurrent use.
type Publisher struct {
	js jetstream.JetStream
	// ajs publishes; its handlers report each outcome on acks, which has
	// room for one outcome per message in flight.
	ajs     jetstream.JetStream
	acks    chan ackResult
	enc     *Encoder
	opts    Options // defaults applied
	log     *slog.Logger
	metrics *metrics

	// slots holds one token per accepted event until it is acked or given
	// up: its length is the outbox fill (queued plus in flight), its
	// capacity OutboxSize.
	slots chan struct{}
	// queue carries accepted events from Send to Run in Send order. Its
	// capacity equals that of slots, and an event takes a slot before it
	// is queued and leaves queue before its slot is freed, so a send on
	// queue never blocks.
	queue chan *outboxEvent

	mu      sync.Mutex
	started bool // guarded by mu
	closed  bool // guarded by mu
	// closedCh is closed when closed is set.
	closedCh chan struct{}
}

var _ generator.Sink = (*Publisher)(nil)

// outboxEvent is an accepted event and its encoded message.
type outboxEvent struct {
	ev  generator.Event
	msg *nats.Msg
}

// New returns a Publisher that publishes with js. Run must be called for
// anything to be delivered. It returns an error for a missing encoder,
// negative sizes or durations, or metrics that cannot be registered.
func New(js jetstream.JetStream, opts Options) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("create publisher: jetstream handle is nil")
	}
	if opts.Encoder == nil {
		return nil, errors.New("create publisher: encoder is nil")
	}
	if err := applyDefaults(&opts); err != nil {
		return nil, fmt.Errorf("create publisher: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Publisher{
		js:       js,
		acks:     make(chan ackResult, opts.MaxInFlight),
		enc:      opts.Encoder,
		opts:     opts,
		log:      log.With("component", "publisher"),
		slots:    make(chan struct{}, opts.OutboxSize),
		queue:    make(chan *outboxEvent, opts.OutboxSize),
		closedCh: make(chan struct{}),
	}
	m, err := newMetrics(opts.Registerer, p.Pending)
	if err != nil {
		return nil, fmt.Errorf("create publisher: %w", err)
	}
	p.metrics = m
	// A JetStream context of our own reports every outcome through the
	// handlers, on the connection's goroutine: no goroutine per message in
	// flight, and one handoff fewer between the ack and the next publish.
	// nats.go calls exactly one handler per publish (an ack, an error, or
	// ErrAsyncPublishTimeout after AckTimeout).
	ajs, err := jetstream.New(js.Conn(),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, ack *jetstream.PubAck) {
			p.report(ackResult{msg: m, ack: ack, done: time.Now()})
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			p.report(ackResult{msg: m, err: err, done: time.Now()})
		}),
		jetstream.WithPublishAsyncTimeout(opts.AckTimeout),
		jetstream.WithPublishAsyncMaxPending(opts.MaxInFlight),
	)
	if err != nil {
		return nil, fmt.Errorf("create publisher: %w", err)
	}
	p.ajs = ajs
	return p, nil
}

// report hands the outcome of one publish to Run. It runs on the NATS
// connection's goroutine and must not block: acks has room for every
// message in flight, and each has exactly one outcome.
func (p *Publisher) report(r ackResult) {
	select {
	case p.acks <- r:
	default:
		p.log.Error("publish outcome lost: more outcomes than messages in flight", "err", r.err)
	}
}

func applyDefaults(o *Options) error {
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"max in flight", &o.MaxInFlight, DefaultMaxInFlight},
		{"outbox size", &o.OutboxSize, DefaultOutboxSize},
	}
	for _, f := range ints {
		if *f.v < 0 {
			return fmt.Errorf("%s %d is negative", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"retry backoff min", &o.RetryBackoffMin, DefaultRetryBackoffMin},
		{"retry backoff max", &o.RetryBackoffMax, DefaultRetryBackoffMax},
		{"ack timeout", &o.AckTimeout, DefaultAckTimeout},
		{"drain timeout", &o.DrainTimeout, DefaultDrainTimeout},
	}
	for _, f := range durations {
		if *f.v < 0 {
			return fmt.Errorf("%s %s is negative", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if o.RetryBackoffMax < o.RetryBackoffMin {
		return fmt.Errorf("retry backoff max %s is below retry backoff min %s", o.RetryBackoffMax, o.RetryBackoffMin)
	}
	return nil
}

// Send encodes events and queues them for delivery, in order. It blocks
// while the outbox is full, until there is room or ctx is done; then it
// returns ctx.Err(), and the events before the one it waited for stay
// queued. An event that cannot be encoded is dropped, counted in
// pleg_bridge_events_dropped_total and logged at Warn; Send goes on with the
// next. Once Run's ctx is done, Send returns an error wrapping ErrClosed.
//
// The events of one Send call are queued contiguously only if no other
// goroutine calls Send at the same time.
func (p *Publisher) Send(ctx context.Context, events []generator.Event) error {
	for i := range events {
		ev := &events[i]
		select {
		case <-p.closedCh:
			return fmt.Errorf("send events: %w", ErrClosed)
		default:
		}
		msg, err := p.enc.Encode(*ev)
		if err != nil {
			p.metrics.dropped.Inc()
			p.log.Warn("drop event: cannot encode it",
				"pod_uid", ev.Pod.UID, "container_id", ev.Container.ID, "event_type", string(ev.Type), "err", err)
			continue
		}
		if err := p.enqueue(ctx, &outboxEvent{ev: *ev, msg: msg}); err != nil {
			return err
		}
	}
	return nil
}

func (p *Publisher) enqueue(ctx context.Context, e *outboxEvent) error {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closedCh:
		return fmt.Errorf("send events: %w", ErrClosed)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.slots
		return fmt.Errorf("send events: %w", ErrClosed)
	}
	// Sending under mu orders this event against closeIntake: it is either
	// queued before Run stops accepting events (and Run delivers or counts
	// it), or refused. The send cannot block (see queue).
	p.queue <- e
	p.mu.Unlock()
	return nil
}

// Pending returns the number of accepted events not yet acked or given up:
// queued plus in flight.
func (p *Publisher) Pending() int {
	return len(p.slots)
}

// closeIntake makes Send refuse events from now on.
func (p *Publisher) closeIntake() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		close(p.closedCh)
	}
}

// Run delivers the queued events until ctx is done, then stops accepting
// events and keeps delivering what is queued for up to DrainTimeout. What is
// still undelivered then is given up: each such event is counted in
// pleg_bridge_events_dropped_total and logged at Warn. Run returns nil after
// that, or an error wrapping nats.ErrConnectionClosed if the NATS
// connection is closed under it (everything queued is given up the same
// way). It starts no goroutine: outcomes arrive through the JetStream
// context's handlers. Run may be called once.
func (p *Publisher) Run(ctx context.Context) error {
	p.mu.Lock()
	started := p.started
	p.started = true
	p.mu.Unlock()
	if started {
		return errors.New("run publisher: already running or ran")
	}
	defer p.closeIntake()
	d := &delivery{
		p:        p,
		pods:     make(map[string]*podQueue),
		inflight: make(map[*nats.Msg]inflight, p.opts.MaxInFlight),
	}
	return d.run(ctx)
}

// delivery is the state of one Run. Only Run's goroutine touches it.
type delivery struct {
	p *Publisher
	// pods holds the queued events of each pod with any. A pod is in
	// exactly one of: ready, in flight, retries.
	pods    map[string]*podQueue
	ready   []*podQueue
	retries retryHeap
	// retryTimer fires at armedAt, the earliest retry, when there is one.
	retryTimer *time.Timer
	armedAt    time.Time
	inFlight   int
	// inflight maps each published message to its pod until its outcome
	// comes back on Publisher.acks.
	inflight map[*nats.Msg]inflight
}

type inflight struct {
	pod  *podQueue
	sent time.Time
}

// podQueue holds the undelivered events of one pod in Send order. events[0]
// is in flight, waiting for a retry, or next in line.
type podQueue struct {
	uid      string
	events   []*outboxEvent
	failures int       // consecutive failed attempts of events[0]
	retryAt  time.Time // when events[0] is retried, while in retries
}

type ackResult struct {
	msg  *nats.Msg
	pod  *podQueue
	ack  *jetstream.PubAck
	err  error
	sent time.Time
	done time.Time
}

func (d *delivery) run(ctx context.Context) error {
	d.retryTimer = time.NewTimer(time.Hour)
	d.retryTimer.Stop()
	defer d.retryTimer.Stop()

	done := ctx.Done()
	var drainDeadline <-chan time.Time
	for {
		if err := d.dispatch(); err != nil {
			d.p.closeIntake()
			d.giveUp("nats connection closed")
			return err
		}
		if drainDeadline != nil && len(d.pods) == 0 && len(d.p.queue) == 0 {
			return nil
		}
		select {
		case e := <-d.p.queue:
			d.add(e)
		case r := <-d.p.acks:
			d.handle(r)
		case now := <-d.retryC():
			d.armedAt = time.Time{}
			d.retryDue(now)
		case <-done:
			done = nil
			// From here on the queue only shrinks: Send refuses events.
			d.p.closeIntake()
			t := time.NewTimer(d.p.opts.DrainTimeout)
			defer t.Stop()
			drainDeadline = t.C
		case <-drainDeadline:
			d.giveUp("drain timeout ended")
			return nil
		}
	}
}

// add appends e to its pod's queue; a pod with nothing queued becomes ready.
func (d *delivery) add(e *outboxEvent) {
	uid := e.ev.Pod.UID
	pq, ok := d.pods[uid]
	if !ok {
		pq = &podQueue{uid: uid}
		d.pods[uid] = pq
		d.ready = append(d.ready, pq)
	}
	pq.events = append(pq.events, e)
}

// dispatch publishes the head event of ready pods while there is room in
// flight. It returns an error only when the connection is closed for good.
func (d *delivery) dispatch() error {
	for d.inFlight < d.p.opts.MaxInFlight && len(d.ready) > 0 {
		pq := d.ready[0]
		d.ready[0] = nil
		d.ready = d.ready[1:]
		if err := d.publish(pq); err != nil {
			return err
		}
	}
	return nil
}

func (d *delivery) publish(pq *podQueue) error {
	e := pq.events[0]
	sent := time.Now()
	_, err := d.p.ajs.PublishMsgAsync(e.msg)
	if err != nil {
		if conn := d.p.js.Conn(); conn != nil && conn.IsClosed() {
			return fmt.Errorf("publish event: %w (%w)", nats.ErrConnectionClosed, err)
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			// Retrying cannot help; holding it would stall the pod forever.
			d.drop(e, "message exceeds the server's max payload", err)
			d.advance(pq) // frees its slot
			return nil
		}
		d.failed(pq, err)
		return nil
	}
	d.inFlight++
	d.p.metrics.inFlight.Inc()
	d.inflight[e.msg] = inflight{pod: pq, sent: sent}
	return nil
}

func (d *delivery) handle(r ackResult) {
	f, ok := d.inflight[r.msg]
	if !ok {
		return // given up already
	}
	delete(d.inflight, r.msg)
	r.pod, r.sent = f.pod, f.sent
	d.inFlight--
	d.p.metrics.inFlight.Dec()
	pq := r.pod
	if r.err != nil {
		d.failed(pq, r.err)
		return
	}
	if r.ack.Duplicate {
		d.p.metrics.duplicate.Inc()
	} else {
		d.p.metrics.acked.Inc()
	}
	d.p.metrics.ackDuration.Observe(r.done.Sub(r.sent).Seconds())
	pq.failures = 0
	ev := pq.events[0].ev
	d.advance(pq)
	if d.p.opts.OnAck != nil {
		d.p.opts.OnAck(ev)
	}
}

// advance removes the head event of pq, which is delivered or given up, and
// frees its outbox slot. The pod goes to the back of the ready line if it
// has more events.
func (d *delivery) advance(pq *podQueue) {
	pq.events[0] = nil
	pq.events = pq.events[1:]
	<-d.p.slots
	if len(pq.events) == 0 {
		delete(d.pods, pq.uid)
		return
	}
	d.ready = append(d.ready, pq)
}

// failed counts and logs a failed attempt and schedules the retry of the
// pod's head event. The first failure of an event logs at Warn, the
// following ones at Debug, so an outage does not flood the log.
func (d *delivery) failed(pq *podQueue, err error) {
	d.p.metrics.failed.Inc()
	pq.failures++
	delay := retryDelay(d.p.opts.RetryBackoffMin, d.p.opts.RetryBackoffMax, pq.failures)
	ev := pq.events[0].ev
	attrs := []any{"pod_uid", ev.Pod.UID, "container_id", ev.Container.ID, "event_type", string(ev.Type),
		"attempt", pq.failures, "retry_in", delay, "err", err}
	if pq.failures == 1 {
		d.p.log.Warn("publish event failed, will retry", attrs...)
	} else {
		d.p.log.Debug("publish event failed, will retry", attrs...)
	}
	pq.retryAt = time.Now().Add(delay)
	heap.Push(&d.retries, pq)
}

// retryDelay doubles min for each failure after the first, caps it at max,
// and picks uniformly from its upper half, which spreads the retries of
// pods that failed together.
func retryDelay(minDelay, maxDelay time.Duration, failures int) time.Duration {
	d := minDelay
	for i := 1; i < failures && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	return d/2 + rand.N(d/2+1)
}

// retryC arms the retry timer for the earliest retry and returns its
// channel, or nil when nothing waits for a retry.
func (d *delivery) retryC() <-chan time.Time {
	if len(d.retries) == 0 {
		return nil
	}
	if at := d.retries[0].retryAt; !at.Equal(d.armedAt) {
		d.retryTimer.Reset(time.Until(at))
		d.armedAt = at
	}
	return d.retryTimer.C
}

// retryDue moves the pods whose retry time has come to the ready line.
func (d *delivery) retryDue(now time.Time) {
	for len(d.retries) > 0 && !d.retries[0].retryAt.After(now) {
		d.ready = append(d.ready, heap.Pop(&d.retries).(*podQueue))
	}
}

// giveUp takes in the outcomes that arrived and what Send still left, stops
// waiting for acks, and drops every undelivered event.
func (d *delivery) giveUp(reason string) {
	for {
		select {
		case r := <-d.p.acks:
			if r.err == nil {
				d.handle(r)
				continue
			}
			// Failed, and no time is left to retry it.
			if _, ok := d.inflight[r.msg]; ok {
				delete(d.inflight, r.msg)
				d.inFlight--
				d.p.metrics.inFlight.Dec()
				d.p.metrics.failed.Inc()
			}
			continue
		default:
		}
		break
	}
	for {
		select {
		case e := <-d.p.queue:
			d.add(e)
			continue
		default:
		}
		break
	}
	// Whatever is still in flight is given up below with its pod's queue;
	// it may yet be stored, but nobody waits for the ack any more.
	d.p.metrics.inFlight.Sub(float64(d.inFlight))
	d.inFlight = 0
	clear(d.inflight)
	for _, pq := range d.pods {
		for _, e := range pq.events {
			d.drop(e, reason, nil)
			<-d.p.slots
		}
	}
	clear(d.pods)
	d.ready = nil
	d.retries = nil
}

// drop counts and logs an event that is given up. The caller removes it
// from its pod's queue and frees its outbox slot.
func (d *delivery) drop(e *outboxEvent, reason string, err error) {
	d.p.metrics.dropped.Inc()
	attrs := []any{"reason", reason,
		"pod_uid", e.ev.Pod.UID, "container_id", e.ev.Container.ID, "event_type", string(e.ev.Type)}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	d.p.log.Warn("drop event", attrs...)
}

// retryHeap orders pods waiting for a retry by retry time.
type retryHeap []*podQueue

func (h retryHeap) Len() int           { return len(h) }
func (h retryHeap) Less(i, j int) bool { return h[i].retryAt.Before(h[j].retryAt) }
func (h retryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *retryHeap) Push(x any)        { *h = append(*h, x.(*podQueue)) }
func (h *retryHeap) Pop() any {
	old := *h
	n := len(old)
	x := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	return x
}
