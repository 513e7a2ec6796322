package publish

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// refillBatch bounds the spool entries Take reads at once: large enough
// that a read (one bbolt view) is worth it, small enough that an entry is
// not held in memory long before it has a slot.
const refillBatch = 1024

// outbox holds the events Send accepted until Run's delivery takes them: in
// memory, up to size events, and then in the spool (nil: none), on disk.
//
// Memory and spool are one FIFO. Once Put sent an event to the spool, every
// later one follows it there, behind it, until Take has taken every spool
// entry back into memory; only then does Put use memory again. So Take
// yields the events in Put order whichever way they went, and those of a
// pod in the order they were put.
//
// size bounds the events in memory, as slots: an event Put keeps in memory
// holds one from Put, a spool entry holds one from the Take that reads it,
// and either gives it back with Settle or Release. Take reads the spool
// only into free slots, so memory never goes over its bound; Put never
// blocks for room: what fits in neither memory nor spool is refused. After
// Close, Put refuses everything and Take reads nothing more from the spool,
// whose entries stay there for the next start.
//
// Put, Len, Progress, Ready and Close are safe for concurrent use; Take,
// Settle, Release and Done have one caller, Run's delivery, and Resume is
// called by Run before the delivery starts. The struct is above
// a dozen fields because the FIFO's state is what mu guards as one: the
// fields above mu never change after newOutbox.
type outbox struct {
	size         int
	spool        *datadir.Spool
	writeThrough bool // Options.WriteThrough
	log          *slog.Logger
	// ready has a token when Take may have something new: Put recorded an
	// event, or a slot was given back while entries wait in the spool.
	ready chan struct{}

	mu sync.Mutex
	// queue holds the events Put kept in memory and Take has not taken
	// yet, in Put order. guarded by mu
	queue []*outboxEvent
	// held counts the slots held: queue plus the events taken and not yet
	// settled or released, at most size. guarded by mu
	held int
	// spilling is set when Put sends an event to the spool, and cleared by
	// Take once it took every spool entry: while it is set, Put sends
	// every event to the spool. guarded by mu
	spilling bool
	// refusing is set while Put refuses events for want of room, so the
	// start and the end of that are logged once. guarded by mu
	refusing bool
	closed   bool // guarded by mu

	// recorded counts the events Put recorded (in memory or in the spool),
	// settled those of them that were settled (see Progress).
	recorded, settled atomic.Uint64

	// spoolInUse is set while events taken from the spool are undelivered,
	// so that the spool's emptying is logged once. Only the side of Run's
	// delivery touches it (Resume, Take, Done), without mu.
	spoolInUse bool
}

// newOutbox returns an outbox of size slots over spool (nil: memory only).
// Entries an earlier process left in the spool are taken before anything
// put later.
func newOutbox(size int, spool *datadir.Spool, writeThrough bool, log *slog.Logger) *outbox {
	o := &outbox{
		size:         size,
		spool:        spool,
		writeThrough: writeThrough,
		log:          log,
		ready:        make(chan struct{}, 1),
		spilling:     spool != nil && spool.Untaken() > 0,
	}
	if o.spilling {
		o.signal()
	}
	return o
}

// Put records events, in order: in memory while there are free slots and
// the spool holds none of the earlier events, else in the spool. With
// WriteThrough, each event kept in memory is also written to the spool as
// an entry taken already (datadir's AppendTaken; a full spool leaves it in
// memory only). Put does no I/O and never blocks for room. It returns the
// number of events it sent to the spool, and an error wrapping ErrClosed
// after Close, or a *generator.SinkFullError with the number recorded
// before the first event that fits neither memory nor spool: that one and
// the rest are not recorded.
//
// The events of one Put are recorded contiguously, also when other
// goroutines call Put at the same time.
func (o *outbox) Put(events []generator.Event) (spooled int, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return 0, fmt.Errorf("send events: %w", ErrClosed)
	}
	recorded := 0
	defer func() {
		if recorded > 0 {
			o.signal()
		}
	}()
	for i := range events {
		if !o.spilling && o.held < o.size {
			e := &outboxEvent{ev: events[i]}
			if o.writeThrough {
				// The spool keeps &e.ev, which nothing modifies.
				if seq, ok := o.spool.AppendTaken(&e.ev); ok {
					e.written, e.seq = true, seq
				}
			}
			o.queue = append(o.queue, e)
			o.held++
			o.recorded.Add(1)
			recorded++
			continue
		}
		// The spool stores the event, not the message: Run encodes it
		// again when it takes it back, with the encoder of that time.
		if o.spool == nil || o.spool.Append(events[i:i+1]) == 0 {
			o.refuse(i, len(events)-i)
			return spooled, &generator.SinkFullError{Recorded: i}
		}
		o.recorded.Add(1)
		recorded++
		spooled++
		if !o.spilling {
			o.spilling = true
			o.log.Warn("outbox full: spooling events to disk until NATS takes them",
				"outbox_size", o.size, "pending", o.held)
		}
	}
	if o.refusing {
		o.refusing = false
		o.log.Info("accepting events again")
	}
	return spooled, nil
}

// refuse logs the first refusal of a run of them. The caller holds mu.
func (o *outbox) refuse(recorded, n int) {
	if o.refusing {
		return
	}
	o.refusing = true
	where := "outbox full and no spool"
	if o.spool != nil {
		where = "outbox and spool full"
	}
	o.log.Warn(where+": refusing events; the generator keeps them and sends them again",
		"recorded", recorded, "refused", n, "outbox_size", o.size)
}

// Ready returns a channel that has a value when Take may have something
// new to yield.
func (o *outbox) Ready() <-chan struct{} { return o.ready }

// signal leaves a token on ready, unless one is there already.
func (o *outbox) signal() {
	select {
	case o.ready <- struct{}{}:
	default:
	}
}

// Take appends to dst the events recorded and not yet taken, in Put order,
// and returns it: first those Put kept in memory, then, before Close and
// while slots are free, the spool's entries behind them, each taking a
// slot. Once it has taken every spool entry, Put uses memory again. After
// Close it takes only what is in memory. It may read the spool's file,
// without holding the lock Put takes.
func (o *outbox) Take(dst []*outboxEvent) []*outboxEvent {
	o.mu.Lock()
	dst = append(dst, o.queue...)
	clear(o.queue)
	o.queue = o.queue[:0]
	// While spilling, Put keeps nothing in memory: what queue held was put
	// before every spool entry.
	refill := o.spilling && !o.closed
	o.mu.Unlock()
	if !refill {
		return dst
	}
	for {
		// Slots first, then entries: a slot that cannot be had leaves the
		// entry in the spool, rather than memory over its bound.
		n := o.reserve(refillBatch)
		if n == 0 {
			break
		}
		entries := o.spool.Take(n)
		o.unreserve(n - len(entries))
		if len(entries) > 0 {
			o.spoolInUse = true
		}
		for _, en := range entries {
			dst = append(dst, &outboxEvent{ev: en.Event, spooled: true, seq: en.Seq, earlier: en.Earlier, unchecked: en.Earlier})
		}
		if len(entries) < n {
			break
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	// Append runs under mu, so no entry can appear between this check and
	// the end of the spilling.
	if o.spool.Untaken() == 0 {
		o.spilling = false
	}
	return dst
}

// Resume logs, when Run starts, that an earlier run left events in the
// spool, which Take yields before anything newer; Done logs once they are
// all delivered.
func (o *outbox) Resume() {
	if o.spool == nil || o.spool.Len() == 0 {
		return
	}
	o.log.Info("delivering the events an earlier run left in the spool, before newer ones",
		"entries", o.spool.Len(), "bytes", o.spool.Bytes())
	o.spoolInUse = true
}

// Done marks the spool entry of e, which Take yielded from the spool or
// which was written through to it, delivered or given up (nothing for an
// event with no entry), and logs when that emptied the spool. The caller
// reported e's ack first: the checkpoint's ack and the entry's removal
// reach the disk together.
func (o *outbox) Done(e *outboxEvent) {
	if !e.spooled && !e.written {
		return
	}
	o.spool.Done(e.seq)
	if o.spoolInUse && o.spool.Len() == 0 {
		o.spoolInUse = false
		o.log.Info("spool empty: every spooled event is delivered")
	}
}

// reserve takes up to n free slots, and returns how many it took.
func (o *outbox) reserve(n int) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n = min(n, o.size-o.held)
	o.held += n
	return n
}

// unreserve gives back n slots reserve took for entries the spool did not
// have.
func (o *outbox) unreserve(n int) {
	if n == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.held -= n
}

// Settle takes in that e, which Take yielded, is delivered or given up:
// it gives back its slot, and counts it in Progress's settled unless it
// is not one Put recorded (an earlier process's spool entry, or an event
// carried from the checkpoint, which holds no slot either).
func (o *outbox) Settle(e *outboxEvent) {
	if !e.earlier {
		o.settled.Add(1)
	}
	o.Release(e)
}

// Release gives back the slot of e, which Take yielded and which leaves
// memory undelivered: Run stops, and e stays in the spool for the next
// start. It is not settled. An event carried from the checkpoint holds no
// slot.
func (o *outbox) Release(e *outboxEvent) {
	if e.carried || e.repaired {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.held--
	if o.spilling && !o.closed {
		o.signal() // a spool entry can have the slot
	}
}

// Len returns the number of events in memory: queued for Take, or taken
// and not yet settled or released.
func (o *outbox) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.held
}

// Progress returns how many events Put has recorded, and how many of those
// were settled: delivered or given up.
func (o *outbox) Progress() (recorded, settled uint64) {
	return o.recorded.Load(), o.settled.Load()
}

// Close makes Put refuse every event from now on, and Take read nothing
// more from the spool. What is in memory can still be taken.
func (o *outbox) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
}

// outboxEvent is an accepted event and its encoded message.
type outboxEvent struct {
	ev generator.Event
	// msg is ev encoded, from its first publication on (nil before).
	msg *nats.Msg
	// spooled is set for an event taken from the spool, as entry seq: it
	// is marked Done there once delivered or given up, and left there
	// when Run stops before.
	spooled bool
	// written is set for an event Send kept in memory and wrote through
	// to the spool, as entry seq (Options.WriteThrough): Done likewise.
	written bool
	seq     uint64
	// earlier is set for a spool entry of an earlier process, and for a
	// carried event: not one Send recorded (see Publisher.Progress).
	earlier bool
	// carried is set for an event carried from the checkpoint into a new
	// stream (history.go): it holds no outbox slot, and a Run that stops
	// before delivering it leaves it to the next, which carries it again.
	carried bool
	// repaired is set for an event put back after the servers lost it
	// (repair.go): it holds no outbox slot either, and is still kept in
	// Retained if Run stops before delivering it.
	repaired bool
	// unchecked is set with earlier, until a check found the entry is
	// not stored (see needsCheck).
	unchecked bool
	// mark holds the watermark back while the event may be stored and is
	// not delivered; nil before its first send.
	mark *sendMark
	// maybeStoredAt is when the first attempt that may have been stored
	// was sent (its outcome unknown); zero while every attempt is known
	// to have failed.
	maybeStoredAt time.Time
}
