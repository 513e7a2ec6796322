package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// Publisher defaults.
const (
	// DefaultMaxInFlight keeps a LAN or loopback server busy (at ~100µs per
	// ack that is over 2M events/s of headroom) while staying well below
	// nats.go's async pending limit (4000), so PublishMsgAsync never stalls.
	DefaultMaxInFlight = 256
	// DefaultOutboxSize holds minutes of heavy pod churn on a full node
	// (110 pods, a few events each per restart) in memory while NATS is
	// unreachable, at about 1-2 KiB per event: some 30 MiB at worst. What
	// does not fit goes to the spool.
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
	// OutboxSize bounds the events held in memory, queued or in flight.
	// When it is full, Send spools events (Spool), or refuses them.
	OutboxSize int
	// Spool holds, on disk, the events that do not fit the outbox, until
	// there is room; nil: memory only. It survives a restart: a Publisher
	// over the same spool delivers what an earlier one left, before
	// anything newer.
	Spool *datadir.Spool
	// WriteThrough (with a Spool) also writes each event Send keeps in
	// memory to the spool, as an entry taken already (datadir's
	// AppendTaken), marked Done once delivered. A process that is killed
	// then loses at most the last flush of them (100 ms), not every event
	// waiting in memory for NATS: the next one delivers the copies left,
	// checked against the stream as any earlier entry. It costs an
	// encoding and a share of a batched disk write for each event not
	// acked by the spool's next write (100 ms).
	WriteThrough bool
	// Stream is the name of the stream the events land in, asked before a
	// retry that could be stored twice (see DuplicateWindow); empty: the
	// stream that takes the event's subject, looked up once.
	Stream string
	// DuplicateWindow is the stream's duplicate window; 0 means
	// DefaultDuplicateWindow. A retry of a publish that may have been
	// stored more than half of it ago is checked against the stream before
	// it is sent. It must not exceed the stream's window.
	DuplicateWindow time.Duration
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
	// OnAck, if set, is called with each event after JetStream acked it
	// (or it was found stored), in per-pod Send order, from Run's
	// goroutine. It must not block for long: delivery waits for it. seq is
	// not the event's own sequence but a watermark: every message this
	// node stored at or below it was acked and reported to OnAck, by this
	// run or by an earlier one that recorded it (readback.go). Record the
	// highest seq with the acks, written together: the next run's
	// Restart.From is that plus one.
	OnAck func(ev generator.Event, seq uint64)
	// Restart is what this run takes over from an earlier one on the
	// node; the zero value is a first start.
	Restart Restart
	// Repair checks that the stream still holds what it acked, and
	// publishes again what the servers lost; the zero value checks
	// nothing.
	Repair Repair
}

// Repair configures the repair of what the NATS servers lost after acking
// it (repair.go): the acked events kept on disk, and what Run does while
// and after it checks the stream for them. Run checks when it starts,
// after every reconnect, every election of the stream's leader and every
// ack whose sequence went backwards. The zero value checks nothing.
type Repair struct {
	// Retained, if set, keeps every acked event for its window
	// (datadir.Retained), and Run checks that the stream still holds
	// them: what the servers lost is published again, with its id, before
	// anything newer of its pod. nil: no repair.
	Retained *datadir.Retained
	// QuickHold is how long a check holds publishing even while
	// publishing works; 0 means DefaultRepairQuickHold. Past it, a check
	// still on its way holds publishing only while publishing fails.
	QuickHold time.Duration
	// OnRepaired, if set, is called from Run's goroutine after a check
	// put lost events back: the state bucket checks its keys too. It must
	// not block.
	OnRepaired func(lost int)
}

// Restart is the state a Publisher takes over from an earlier run on the
// node, and what it hands on once it has read the stream: before it
// publishes anything, Run reads back what the earlier run stored after its
// checkpoint (readback.go), and, if the stream is not the checkpoint's,
// carries the checkpoint's history into it (history.go). The zero value is
// a first start: nothing is read back and no stream's history is checked.
// The bridge fills it from its durable store (datadir.Checkpoint) and the
// generator.
type Restart struct {
	// From is the first stream sequence whose messages an earlier run may
	// have stored without its acks being recorded: the sequence the
	// checkpoint holds (the highest OnAck reported with the acks it
	// wrote), plus one. 0 means there is none to read back (no checkpoint,
	// or one without a sequence). Before it publishes anything, Run reads
	// back the ids of this node's messages from there and does not publish
	// those events again (readback.go).
	From uint64
	// Since, with From 0, starts the same read at the messages stored
	// since this time: when the checkpoint has written no sequence yet,
	// since its store was created (less a margin for the clocks of node
	// and server). Zero, with From 0: no read.
	Since time.Time
	// Checkpoint, if set, is the durable checkpoint OnAck records the acks
	// in. Before it publishes anything, Run tells whether the stream is
	// the one the checkpoint belongs to (datadir.Checkpoint.Stream), and
	// if it is another (deleted and created again, another server's, or
	// ending before the checkpoint's sequence) starts that stream's
	// history: the checkpoint's events go into it first, so that no
	// container's ContainerDied reaches it without its ContainerStarted
	// (history.go). Run calls its Adopt and Disown.
	Checkpoint *datadir.Checkpoint
	// PodMeta, if set, gives a pod's labels and annotations to the events
	// Run carries from the checkpoint into a new stream, which the
	// checkpoint does not keep (generator.Generator.PodMeta). known false
	// means they cannot be known yet: Run asks again, for up to 10 s,
	// before it carries anything. It must not block.
	PodMeta func(podUID string) (meta *generator.PodMeta, known bool)
	// OnStored, if set, is called once, from Run's goroutine, with the
	// events of this node that an earlier run stored from From (the read
	// of readback.go, decoded), in stream order, after each was
	// reported to OnAck. The generator takes them as published
	// (generator.Generator.Restore): a container among them that is gone
	// gets the rest of its events. It must not block.
	OnStored func(events []generator.Event)
}

// Publisher delivers Lifecycle events to JetStream, exactly once and in
// order per pod (the README's "Delivery" section). Send records events in a bounded
// memory outbox, or in the spool on disk when the outbox is full, and never
// blocks for room; Run publishes them asynchronously.
//
// The outbox and the spool are one FIFO (outbox.go): once an event went to
// the spool, every later event follows it there until Run has taken the
// spool's entries back into memory, so the events of a pod are published
// in Send order whichever way they went. Run's delivery loop is in
// delivery.go.
//
// Per pod, at most one message is in flight: the next event of a pod is
// published only once JetStream acked the previous one, so a failed publish
// that is retried cannot be overtaken. Different pods pipeline, up to
// MaxInFlight messages in all. A failed attempt (an error or no ack within
// AckTimeout) is retried with the same Nats-Msg-Id after a capped,
// jittered, doubling backoff, so JetStream stores the event once even if
// the lost ack's publish did land; a retry that may come after the stream's
// duplicate window is checked against the stream first (verify.go).
//
// Send and Pending are safe for concurrent use.
type Publisher struct {
	nc *nats.Conn
	// js makes the API calls: the checks' and the read-back's stream
	// lookups.
	js jetstream.JetStream
	// ajs publishes; its handlers report each outcome on acks, which has
	// room for one outcome per message in flight.
	ajs     jetstream.JetStream
	acks    chan ackResult
	enc     *Encoder
	opts    Options // defaults applied
	log     *slog.Logger
	metrics *metrics

	// out holds the events Send records until Run's delivery takes them:
	// the memory outbox and the spool, one FIFO.
	out *outbox

	mu      sync.Mutex
	started bool // guarded by mu

	// carrying counts the events carried from the checkpoint into a new
	// stream and not yet delivered (history.go): Pending reads it, and
	// Run's delivery alone changes it.
	carrying atomic.Int64
}

var _ generator.Sink = (*Publisher)(nil)

// New returns a Publisher that publishes on nc. Run must be called for
// anything to be delivered. It makes its own JetStream handles on nc: one
// whose async publish handlers report every outcome to Run, and one for the
// stream lookups of the checks and the read of what an earlier run stored
// (the default API prefix and domain). It returns an error for a nil
// connection, a missing encoder, negative sizes or durations, or metrics
// that cannot be registered.
func New(nc *nats.Conn, opts Options) (*Publisher, error) {
	if nc == nil {
		return nil, errors.New("create publisher: nats connection is nil")
	}
	if opts.Encoder == nil {
		return nil, errors.New("create publisher: encoder is nil")
	}
	if opts.WriteThrough && opts.Spool == nil {
		return nil, errors.New("create publisher: write-through needs a spool")
	}
	if err := applyDefaults(&opts); err != nil {
		return nil, fmt.Errorf("create publisher: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "publisher")
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("create publisher: %w", err)
	}
	p := &Publisher{
		nc:   nc,
		js:   js,
		acks: make(chan ackResult, opts.MaxInFlight),
		enc:  opts.Encoder,
		opts: opts,
		log:  log,
		out:  newOutbox(opts.OutboxSize, opts.Spool, opts.WriteThrough, log),
	}
	m, err := newMetrics(opts.Registerer, p.out.Len, opts.OutboxSize, opts.Spool, opts.Repair.Retained)
	if err != nil {
		return nil, fmt.Errorf("create publisher: %w", err)
	}
	p.metrics = m
	// A JetStream context of our own reports every outcome through the
	// handlers, on the connection's goroutine: no goroutine per message in
	// flight, and one handoff fewer between the ack and the next publish.
	// nats.go calls exactly one handler per publish (an ack, an error, or
	// ErrAsyncPublishTimeout after AckTimeout).
	ajs, err := jetstream.New(nc,
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
		{"duplicate window", &o.DuplicateWindow, DefaultDuplicateWindow},
		{"repair quick hold", &o.Repair.QuickHold, DefaultRepairQuickHold},
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

// Send records events for delivery, in order: in the memory outbox, or in
// the spool when the outbox is full (or the spool still holds events,
// which go first; see outbox). It never blocks for room. When
// neither has room (or there is no spool), it returns a
// *generator.SinkFullError with the number of events recorded before the
// first it refused; the caller keeps that one and the rest. Run encodes an
// event when its turn to be published comes; one that cannot be encoded
// is then dropped, counted in pleg_bridge_events_dropped_total and logged
// at Warn, and its pod's next event goes. Once Run's ctx is done, Send
// returns an error wrapping ErrClosed. ctx is not used: nothing waits.
//
// The events of one Send call are recorded contiguously, also when other
// goroutines call Send at the same time.
func (p *Publisher) Send(_ context.Context, events []generator.Event) error {
	spooled, err := p.out.Put(events)
	p.metrics.spooled.Add(float64(spooled))
	if full, ok := errors.AsType[*generator.SinkFullError](err); ok {
		p.metrics.refused.Add(float64(len(events) - full.Recorded))
	}
	return err
}

// Pending returns the number of events recorded and not yet acked or given
// up: in memory (queued plus in flight) and in the spool, not yet taken,
// and those carried from the checkpoint into a new stream.
func (p *Publisher) Pending() int {
	n := p.out.Len() + int(p.carrying.Load())
	if p.opts.Spool != nil {
		n += p.opts.Spool.Untaken()
	}
	return n
}

// Progress returns how many events Send has recorded since the Publisher
// was made, and how many of those Run has settled: delivered (stored in
// the stream) or given up. Events that an earlier process left in the
// spool are in neither. Events are settled per pod in order, not all in
// Send's order: settled reaching the recorded count of a moment says that
// as many events have settled since, not which.
func (p *Publisher) Progress() (recorded, settled uint64) {
	return p.out.Progress()
}

// Run delivers the recorded events until ctx is done, then stops accepting
// events and keeps delivering what is in memory for up to DrainTimeout.
// Events Send kept in memory and still undelivered then are given up: each
// is counted in pleg_bridge_events_dropped_total and logged at Warn. Events
// from the spool are not given up: those not delivered stay in the spool,
// for the next Publisher over it; nor are events carried from the
// checkpoint into a new stream, which the next Run carries again (the
// checkpoint adopts the stream only once they are delivered). Run returns
// nil after that, or an error
// wrapping nats.ErrConnectionClosed if the NATS connection is closed under
// it (the memory events are given up the same way). Outcomes of publishes
// arrive through the JetStream context's handlers; Run starts a few
// goroutines for the checks against the stream (verify.go) and stops them
// before it returns. Run may be called once.
func (p *Publisher) Run(ctx context.Context) error {
	p.mu.Lock()
	started := p.started
	p.started = true
	p.mu.Unlock()
	if started {
		return errors.New("run publisher: already running or ran")
	}
	defer p.out.Close()
	// The checks, and the read of what an earlier run stored, serve the
	// drain too, after ctx is done.
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	chk := newChecker(p.js, p.opts.Stream, p.opts.MaxInFlight, p.opts.AckTimeout)
	chk.start(cctx, min(checkWorkers, p.opts.MaxInFlight))
	var reading sync.WaitGroup
	defer func() {
		cancel()
		chk.wait()
		reading.Wait()
	}()
	d := &delivery{
		out:      p.out,
		opts:     p.opts,
		nc:       p.nc,
		ajs:      p.ajs,
		acks:     p.acks,
		chk:      chk,
		log:      p.log,
		metrics:  p.metrics,
		pods:     make(map[string]*podQueue),
		inflight: make(map[*nats.Msg]inflight, p.opts.MaxInFlight),
		checking: make(map[*podQueue]struct{}),
		start:    newStartup(p.opts.Restart, p.opts.Spool, p.log, &p.carrying),
	}
	defer d.start.stop()
	d.rep = newRepairer(p.opts.Repair.Retained, p.nc, p.opts.Stream, func(kept []datadir.RetainedEvent, reason string) {
		results := d.rep.results
		reading.Go(func() {
			res, err := p.readKept(cctx, kept)
			res.reason, res.err = reason, err
			results <- res // room for one: one read at a time
		})
	})
	defer d.rep.close()
	if d.start.reading {
		// Nothing is published before the stream is read back (and, with
		// a checkpoint, known to be its stream).
		read := d.start.read
		reading.Go(func() { p.readBack(cctx, read) })
	} else {
		d.check("the bridge started", true) // else once the read-back is in
	}
	p.out.Resume()
	return d.run(ctx)
}
