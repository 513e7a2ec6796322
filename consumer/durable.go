package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Defaults of DurableOptions.
const (
	// DefaultPartitions bounds how many events a group handles at once,
	// across all its members.
	DefaultPartitions = 8
	// DefaultAckWait is how long a member may hold an event without word
	// (the handler's progress is reported while it runs) before the event
	// goes to another member.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxDeliveries is how often an event is handed to the handler
	// before it is dead-lettered.
	DefaultMaxDeliveries = 5
	// maxPartitions keeps the per-member goroutines and server consumers in
	// proportion.
	maxPartitions = 1024
	// ackTimeout bounds an acknowledgement or a dead-letter publication
	// that is still made after ctx ended, so that a handler's success is
	// recorded even during shutdown.
	ackTimeout = 5 * time.Second
	// noRespondersPause spaces the pull requests of a partition while
	// JetStream does not answer, so that an outage costs no busy loop.
	noRespondersPause = time.Second
)

// defaultBackoff is the delay before the second, third and later
// deliveries after a handler error; the last value repeats.
func defaultBackoff() []time.Duration {
	return []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}
}

// groupName is what a group name may hold: it becomes part of stream and
// consumer names.
var groupName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Dead-letter headers, added to the original message's headers when it is
// published on DurableOptions.DeadLetterSubject.
const (
	HeaderDeadLetterGroup      = "Pleg-Dead-Letter-Group"
	HeaderDeadLetterSequence   = "Pleg-Dead-Letter-Sequence"
	HeaderDeadLetterSubject    = "Pleg-Dead-Letter-Subject"
	HeaderDeadLetterDeliveries = "Pleg-Dead-Letter-Deliveries"
	HeaderDeadLetterError      = "Pleg-Dead-Letter-Error"
)

// ErrDeliveriesExhausted is the error of a DeadLetter whose last permitted
// delivery ended without an answer from the handler (the member crashed or
// lost its connection), so that there is no handler error to report.
var ErrDeliveriesExhausted = errors.New("deliveries exhausted without a handler result")

// Handler processes one event of a durable group. It returns nil once the
// event is fully handled; then the event is acknowledged and never
// delivered to the group again. An error makes the event come back after
// the backoff, to this member or another. ctx ends when Consume is asked to
// stop or its connection closes; a handler that returns because of it
// leaves the event to be delivered again at once.
//
// Consume calls the handler from one goroutine per partition, so it must be
// safe for concurrent use. Calls for events of the same pod come in stream
// order and do not overlap, in any member, with one exception: a member cut
// off from the server for longer than AckWait while its handler runs loses
// the event to another member, and both may then run at once. Delivery is at least once: use
// e.Sequence (the event stream's sequence, the same in every member) or
// e.ID to recognise an event handled before.
type Handler func(ctx context.Context, e Event) error

// DeadLetter is an event the group gave up on: it was delivered
// MaxDeliveries times without success, or it is not a pleg-bridge event.
type DeadLetter struct {
	// Event is the event; for a message that did not decode only Sequence
	// and NATSSubject are set.
	Event Event
	// Deliveries is how often the event was delivered.
	Deliveries int
	// Err is the handler's last error, ErrDeliveriesExhausted, or a
	// *DecodeError.
	Err error
}

// DurableOptions configure a durable group: its name, which events it
// receives, how they are split and how failures are retried and reported.
type DurableOptions struct {
	// Name names the group; required, letters, digits, '-' and '_'. Every
	// member (replica) of a service uses the same name and the same
	// Stream, SubjectPrefix, Filter and Partitions.
	Name string
	// Stream is the event stream, schemas.DefaultStream if empty.
	Stream string
	// SubjectPrefix is the first token of every subject,
	// schemas.DefaultSubjectPrefix if empty.
	SubjectPrefix string
	// Filter selects the events by node, namespace, pod and type. The
	// server applies it while it copies events into the group's work
	// stream; the fields it cannot (Filter's doc) are checked by the
	// members, which acknowledge the events that do not match without
	// calling the handler.
	Filter Filter
	// StartTime or DeliverAll say where a new group starts: at the first
	// event stored at or after StartTime, or at the beginning of the stream.
	// Without either a new group starts with the events published after it
	// is created. Both are ignored once the group exists: it resumes where
	// it stopped.
	StartTime  time.Time
	DeliverAll bool
	// Partitions is the number of partitions, DefaultPartitions if zero: at
	// most this many events are handled at once across all members.
	// Fixed for the group's life (see ErrGroupChanged).
	Partitions int
	// AckWait is how long a member may hold an event without word before
	// the event is delivered again, DefaultAckWait if zero. While the
	// handler runs, its progress is reported every AckWait/3, so this is
	// the time a crash costs, not a limit on the handler.
	AckWait time.Duration
	// MaxDeliveries is how often an event is delivered before it is
	// dead-lettered, DefaultMaxDeliveries if zero.
	MaxDeliveries int
	// Backoff holds the delays before the second, third and later
	// deliveries after a handler error; the last one repeats. Empty means
	// 1s, 5s, 30s.
	Backoff []time.Duration
	// Replicas is the replica count of the work stream and its consumers;
	// 0 means the server's default (1).
	Replicas int
	// DeadLetterSubject, if set, receives each dead letter: the original
	// message with the Pleg-Dead-Letter-* headers, published to JetStream.
	// A stream must capture the subject; until the publication is
	// acknowledged the event stays in the group and is retried.
	DeadLetterSubject string
	// OnDeadLetter, if set, is called with each dead letter, after it was
	// published to DeadLetterSubject. It is called from the partition
	// goroutines, so it must be safe for concurrent use. It may be called
	// twice for the same event if the member crashes right after it.
	OnDeadLetter func(DeadLetter)
	// Repeats say how an event the group handled before, which the event
	// stream holds again at a later sequence with the same id (the bridges
	// published it again after the servers lost it), is kept from the
	// handler. Twice: the work stream, when the first member creates it,
	// gets Repeats.Window as its duplicate window, so that the server does
	// not copy the repeat into the group at all (it checks the message's
	// Nats-Msg-Id, the CloudEvent id); and each member keeps the ids of the
	// events it handled in memory (RepeatOptions) and acknowledges a repeat
	// of one of them without calling the handler, reporting it to
	// Repeats.OnRepeat. What neither catches is handled again, as
	// at-least-once delivery allows: a repeat more than the window after
	// the first copy, or one that arrives after the work stream's servers
	// restarted (they rebuild the window from the messages they hold, and
	// an acknowledged event is gone) and reaches a member that did not
	// handle the first copy, or was restarted since. The zero value drops
	// repeats within DefaultRepeatWindow; Off creates the work stream
	// without a window, as groups were made before.
	Repeats RepeatOptions
	// RollbackCheck is how often each member checks that the event
	// stream still holds the last events it handled (one get of a
	// message), DefaultRollbackCheck if zero; it also checks at once after
	// its connection reconnects. A stream whose servers came back with an
	// older store stores new events at sequences the work stream's source
	// has copied already, and the server would not copy them: the member
	// that notices has the source copy again from where the stream
	// diverged (the package documentation, "Rollbacks").
	RollbackCheck time.Duration
	// OnRollback, if set, is called once for each rollback a member
	// noticed and had the work stream copy again after (Rollback; From is
	// where the source starts again): log it. It is called from a
	// goroutine of Consume's own.
	OnRollback func(Rollback)
}

// WorkStream returns the name of the group's work stream:
// "<Stream>_<Name>".
func (o DurableOptions) WorkStream() string { return o.stream() + "_" + o.Name }

func (o DurableOptions) stream() string { return cmp.Or(o.Stream, schemas.DefaultStream) }
func (o DurableOptions) subjectPrefix() string {
	return cmp.Or(o.SubjectPrefix, schemas.DefaultSubjectPrefix)
}

// withDefaults validates the options and fills in the defaults. All errors
// are reported together.
func (o DurableOptions) withDefaults() (DurableOptions, error) {
	var errs []error
	if !groupName.MatchString(o.Name) {
		errs = append(errs, fmt.Errorf("group name %q: want 1 to 64 letters, digits, '-' or '_'", o.Name))
	}
	if o.DeliverAll && !o.StartTime.IsZero() {
		errs = append(errs, errors.New("options DeliverAll and StartTime cannot be combined"))
	}
	if o.Partitions < 0 || o.Partitions > maxPartitions {
		errs = append(errs, fmt.Errorf("partitions %d: want 1 to %d, or 0 for %d", o.Partitions, maxPartitions, DefaultPartitions))
	}
	if o.AckWait < 0 {
		errs = append(errs, fmt.Errorf("ack wait %s is negative", o.AckWait))
	}
	if o.MaxDeliveries < 0 {
		errs = append(errs, fmt.Errorf("max deliveries %d is negative", o.MaxDeliveries))
	}
	for _, d := range o.Backoff {
		if d < 0 {
			errs = append(errs, fmt.Errorf("backoff %s is negative", d))
		}
	}
	if o.DeadLetterSubject == "" && o.OnDeadLetter == nil {
		errs = append(errs, errors.New("neither DeadLetterSubject nor OnDeadLetter is set: dead letters would be lost"))
	}
	if err := o.Repeats.validate(); err != nil {
		errs = append(errs, err)
	}
	if o.RollbackCheck < 0 {
		errs = append(errs, fmt.Errorf("option RollbackCheck %s is negative", o.RollbackCheck))
	}
	if _, err := partitionTransform(o.subjectPrefix(), o.Filter, max(o.Partitions, 1)); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return DurableOptions{}, errors.Join(errs...)
	}
	o.Partitions = cmp.Or(o.Partitions, DefaultPartitions)
	o.AckWait = cmp.Or(o.AckWait, DefaultAckWait)
	o.MaxDeliveries = cmp.Or(o.MaxDeliveries, DefaultMaxDeliveries)
	o.RollbackCheck = cmp.Or(o.RollbackCheck, DefaultRollbackCheck)
	if len(o.Backoff) == 0 {
		o.Backoff = defaultBackoff()
	}
	return o, nil
}

// backoff returns the delay after the n-th delivery failed (n from 1).
func (o DurableOptions) backoff(n int) time.Duration {
	return o.Backoff[min(n, len(o.Backoff))-1]
}

// Consume makes the caller a member of the durable group opts.Name and calls
// fn for each event that the group receives and this member is given. The
// first member creates the group: a work stream that sources the event
// stream's matching events, split into partitions by pod UID, and one
// durable consumer per partition (see the package documentation); the
// group keeps its place while no member runs.
//
// It blocks until ctx is done, then returns nil, or until it cannot
// consume any more, then it returns the error: one wrapping
// nats.ErrConnectionClosed when the connection closes (the handler's ctx
// ends then too), or the error of a partition's consumer (the group
// deleted, say). It starts one goroutine per partition and stops them
// all before it returns. Handler errors are not returned: the event is
// delivered again after opts.Backoff, up to opts.MaxDeliveries times, then
// dead-lettered. An event the handler was given when Consume stopped or
// crashed, but not answered, is delivered again after opts.AckWait.
//
// It returns an error wrapping ErrGroupChanged if the group exists with
// another filter or partition count, and an error naming each bad option.
func Consume(ctx context.Context, js jetstream.JetStream, opts DurableOptions, fn Handler) error {
	if fn == nil {
		return errors.New("consume: handler is nil")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	conss, err := ensureGroup(ctx, js, o)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("consume: %w", err)
	}
	m := &member{js: js, opts: o, fn: fn, recent: o.Repeats.newRecent(),
		origin: &rollbackCheck{lookup: lookupOnce(js, o.stream()), idOnly: true}}
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel(nil)
		wg.Wait()
	}()

	// A closed connection ends consumption at once, also for a handler
	// that is running: its acknowledgement could not be sent anyway. A
	// fetch would only notice after its heartbeats were missed.
	closed := js.Conn().StatusChanged(nats.CLOSED)
	wg.Go(func() {
		defer js.Conn().RemoveStatusListener(closed)
		select {
		case <-closed:
			cancel(nats.ErrConnectionClosed)
		case <-ctx.Done():
		}
	})
	if js.Conn().IsClosed() {
		cancel(nats.ErrConnectionClosed)
	}
	// CONNECTED, registered once connected, is each reconnect.
	reconnected := js.Conn().StatusChanged(nats.CONNECTED)
	wg.Go(func() {
		defer js.Conn().RemoveStatusListener(reconnected)
		m.watchRollback(ctx, reconnected)
	})

	errs := make([]error, len(conss))
	var partitions sync.WaitGroup
	for k, cons := range conss {
		partitions.Go(func() {
			if err := m.consumePartition(ctx, k, cons); err != nil {
				errs[k] = err
				cancel(err)
			}
		})
	}
	partitions.Wait()
	if cause := context.Cause(ctx); parent.Err() == nil && errors.Is(cause, nats.ErrConnectionClosed) {
		return fmt.Errorf("consume group %s: %w", o.Name, cause)
	}
	return errors.Join(errs...)
}

// member is one member's view of a group.
type member struct {
	js   jetstream.JetStream
	opts DurableOptions
	fn   Handler
	// recent holds the ids of the events this member handled, shared by
	// its partitions: a pod's events, and so an event and its repeat, are
	// always in the same partition, but partitions come and go between
	// members.
	recent *recentIDs
	// origin holds where in the event stream the last events this member
	// handled were, to notice a rollback of it (watchRollback).
	origin *rollbackCheck
}

// consumePartition handles the events of partition k, one at a time, until
// ctx is done (it returns nil) or the consumer cannot be read.
//
// Each event is fetched with its own pull request rather than through the
// Messages iterator: with nats.go v1.55's iterator and one message per
// request, partitions were seen to stall under load with no pull request
// at the server (its re-request is skipped while the previous request is
// still marked in progress), until the request's expiry. A request per
// event keeps no such state.
func (m *member) consumePartition(ctx context.Context, k int, cons jetstream.Consumer) error {
	for {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		switch {
		case err == nil && ctx.Err() != nil:
			// Fetched as the member stops: let another member have it now.
			_ = msg.Nak()
			return nil
		case err == nil:
			m.process(ctx, msg)
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrNoHeartbeat),
			errors.Is(err, jetstream.ErrConsumerLeadershipChanged):
			// The request expired or was lost: ask again.
		case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrServerShutdown):
			// JetStream is not answering, or the server is going down (to
			// restart: the connection reconnects): ask again shortly.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(noRespondersPause):
			}
		default:
			return fmt.Errorf("read partition %d of group %s: %w", k, m.opts.Name, err)
		}
	}
}

// process hands one message to the handler and acknowledges, retries or
// dead-letters it. Failures to acknowledge are not returned: the server
// then delivers the message again, which at-least-once delivery allows.
func (m *member) process(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		// Not a JetStream message: nothing to acknowledge.
		return
	}
	deliveries := int(meta.NumDelivered)
	e, err := m.decode(msg)
	if err != nil {
		m.deadLetter(ctx, msg, DeadLetter{Event: e, Deliveries: deliveries, Err: err})
		return
	}
	m.origin.read(readPos{seq: e.Sequence, id: msg.Headers().Get(jetstream.MsgIDHeader), stored: meta.Timestamp})
	if deliveries > m.opts.MaxDeliveries {
		m.deadLetter(ctx, msg, DeadLetter{Event: e, Deliveries: deliveries - 1, Err: ErrDeliveriesExhausted})
		return
	}
	if !m.opts.Filter.Matches(e) {
		// Copied by the legacy source, which cannot select a namespace:
		// not the group's, done with.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
		defer cancel()
		_ = msg.DoubleAck(actx)
		return
	}
	// A message delivered before is a retry, which the handler gets
	// again; at the same sequence of the event stream for the first
	// time, it is that event copied again after a rollback.
	if m.opts.Repeats.repeat(m.recent, e, meta.Timestamp, meta.NumDelivered > 1) {
		// Handled before, at another sequence of the event stream: done
		// with.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
		defer cancel()
		_ = msg.DoubleAck(actx)
		return
	}
	err = m.call(ctx, msg, e)
	switch {
	case err == nil:
		// Recorded before the acknowledgement: if that is lost, the event
		// comes back at the same sequence, a redelivery the handler is
		// given again, not a repeat.
		m.recent.add(e.ID, e.Sequence, meta.Timestamp)
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
		defer cancel()
		_ = msg.DoubleAck(actx)
	case ctx.Err() != nil:
		// Stopping: let the next member have it now.
		_ = msg.Nak()
	case deliveries >= m.opts.MaxDeliveries:
		m.deadLetter(ctx, msg, DeadLetter{Event: e, Deliveries: deliveries, Err: err})
	default:
		_ = msg.NakWithDelay(m.opts.backoff(deliveries))
	}
}

// decode decodes a work stream message as the event it was in the event
// stream. On error the returned Event still has Sequence and NATSSubject,
// where they are known, and the error is a *DecodeError.
func (m *member) decode(msg jetstream.Msg) (Event, error) {
	seq, subject, err := origin(msg, m.opts.stream())
	if err != nil {
		return Event{NATSSubject: msg.Subject()}, &DecodeError{NATSSubject: msg.Subject(), Err: err}
	}
	e, err := Decode(subject, msg.Headers(), msg.Data())
	if err != nil {
		return Event{Sequence: seq, NATSSubject: subject}, &DecodeError{NATSSubject: subject, Sequence: seq, Err: err}
	}
	e.Sequence = seq
	return e, nil
}

// call runs the handler, telling the server every AckWait/3 that the event
// is in progress so that it is not delivered to another member meanwhile.
func (m *member) call(ctx context.Context, msg jetstream.Msg, e Event) error {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(m.opts.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	})
	defer wg.Wait()
	defer close(stop)
	return m.fn(ctx, e)
}

// deadLetter publishes d to the dead-letter subject, reports it to
// OnDeadLetter and removes the message from the group. If the publication
// fails, the message stays and is dead-lettered again after the backoff.
func (m *member) deadLetter(ctx context.Context, msg jetstream.Msg, d DeadLetter) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	if m.opts.DeadLetterSubject != "" {
		if _, err := m.js.PublishMsg(actx, m.deadLetterMsg(msg, d)); err != nil {
			_ = msg.NakWithDelay(m.opts.backoff(max(d.Deliveries, 1)))
			return
		}
	}
	if m.opts.OnDeadLetter != nil {
		m.opts.OnDeadLetter(d)
	}
	_ = msg.TermWithReason("dead letter")
}

// deadLetterMsg is the original message with the dead-letter headers. Its
// message ID names the group and the sequence, so that a retried
// publication is stored once.
func (m *member) deadLetterMsg(msg jetstream.Msg, d DeadLetter) *nats.Msg {
	h := nats.Header{}
	for k, v := range msg.Headers() {
		h[k] = append([]string(nil), v...)
	}
	h.Del(sourceHeader)
	seq := strconv.FormatUint(d.Event.Sequence, 10)
	h.Set(jetstream.MsgIDHeader, "dead-letter/"+m.opts.Name+"/"+seq)
	h.Set(HeaderDeadLetterGroup, m.opts.Name)
	h.Set(HeaderDeadLetterSequence, seq)
	h.Set(HeaderDeadLetterSubject, d.Event.NATSSubject)
	h.Set(HeaderDeadLetterDeliveries, strconv.Itoa(d.Deliveries))
	h.Set(HeaderDeadLetterError, oneLine(d.Err.Error()))
	return &nats.Msg{Subject: m.opts.DeadLetterSubject, Header: h, Data: msg.Data()}
}

// oneLine replaces line breaks, which a header value cannot hold.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, s)
}
