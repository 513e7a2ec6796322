package publish

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// stallAfter is how long publishing may go without an ack, with messages
// in flight, before it counts as stalled (and is logged so) even though no
// attempt failed yet: an ack takes well under 100 ms, even replicated
// across zones, so a second without one is an election or an outage.
// stallCheckInterval is how often that is looked at.
const (
	stallAfter         = time.Second
	stallCheckInterval = 250 * time.Millisecond
	// stragglerAfter is how much earlier than a message JetStream acked
	// another must have been sent, unanswered, to be taken as lost. One
	// stream leader stores a connection's messages in order, so an
	// unanswered one sent well before an acked one went to a leader that
	// died (an election): it is retried now, not after AckTimeout.
	stragglerAfter = time.Second
	// stalledResendAfter is how long publishing may go without any ack,
	// with messages in flight, before they are all taken as lost and
	// retried: when every pod's head went to a leader that died, no later
	// ack can overtake them.
	stalledResendAfter = 3 * time.Second
)

// errReconnecting fails an attempt made while the NATS connection is down.
var errReconnecting = errors.New("nats connection is reconnecting")

// errOvertaken fails an attempt left unanswered while later ones were acked
// (abandonStragglers).
var errOvertaken = errors.New("no ack, while messages sent more than a second later were acked")

// delivery is the state of one Run. Only Run's goroutine touches it, with
// no lock: Send reaches it through the outbox only, and the NATS
// connection's goroutine through acks. It holds what Run gives it (the
// outbox, the options, the connection and its publishing handle, the
// checker), then the pods' queues and the messages in flight, the stall,
// the watermark OnAck reports, and the start-up protocol (startup.go) and
// the repair checks (repair.go), each a type of its own.
type delivery struct {
	out  *outbox
	opts Options // the Publisher's, defaults applied; read only
	nc   *nats.Conn
	// ajs publishes; the outcome of each publish arrives on acks.
	ajs     jetstream.JetStream
	acks    <-chan ackResult
	chk     *checker
	log     *slog.Logger
	metrics *metrics

	// pods holds the events in memory of each pod with any. A pod is in
	// exactly one of: ready, in flight (published or being checked),
	// retries, or (while draining) set aside with only spooled events.
	pods    map[string]*podQueue
	ready   []*podQueue
	retries retryLine
	// inflight maps each published message to its pod until its outcome
	// comes back on acks.
	inflight map[*nats.Msg]inflight
	// checking holds the pods whose head event is being checked against
	// the stream; with inflight, they are bounded by MaxInFlight.
	checking map[*podQueue]struct{}
	// volatile counts the events in pods that Send kept in memory: the
	// drain waits for those only, the spooled ones stay in the spool.
	volatile int
	// draining is set once Run's ctx is done: Send refuses events, and
	// what is in memory is delivered for up to DrainTimeout.
	draining bool
	// stall tells whether, and since when, publishing stalled.
	stall stall
	// taken is the buffer of takeIn, reused.
	taken []*outboxEvent
	// wm is the sequence OnAck reports (watermark.go).
	wm watermark

	// start is the start-up protocol: the read-back of what an earlier
	// run stored and a new stream's history (startup.go).
	start startup
	// rep checks that the stream still holds what it acked (repair.go);
	// nil without Options.Repair.Retained.
	rep *repairer
}

// stall tells whether publishing stalled, and since when: no ack while
// messages are in flight, as during a stream leader's election or an
// outage (checkStall, failed, delivered), and which messages in flight to
// take as lost (abandonStragglers).
type stall struct {
	// progressAt is when publishing last made progress: the last ack, or
	// the first publish after nothing was in flight.
	progressAt time.Time
	// since is when publishing stalled: the last progress, once an
	// attempt failed since or it is stallAfter ago with messages in
	// flight. Zero while publishing flows. failures counts the failed
	// attempts since.
	since    time.Time
	failures int
	// lastAckedSent is when the latest-sent message that JetStream acked
	// was sent.
	lastAckedSent time.Time
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
	volatile int       // events not from the spool
	failures int       // consecutive failed attempts of events[0]
	retryAt  time.Time // when events[0] is retried, while in retries
}

// ackResult is the outcome of one publish, as the connection's goroutine
// reports it: an ack or an error, and when it came. The message's pod and
// send time are in inflight.
type ackResult struct {
	msg  *nats.Msg
	ack  *jetstream.PubAck
	err  error
	done time.Time
}

func (d *delivery) run(ctx context.Context) error {
	d.retries = newRetryLine()
	defer d.retries.timer.Stop()
	stallCheck := time.NewTicker(stallCheckInterval)
	defer stallCheck.Stop()
	// A reconnect ends an outage: what waits for a retry goes at once,
	// rather than after a backoff that grew during the outage (up to
	// RetryBackoffMax).
	reconnected := d.nc.StatusChanged(nats.CONNECTED)
	defer d.nc.RemoveStatusListener(reconnected)

	done := ctx.Done()
	var drainDeadline <-chan time.Time
	for {
		d.applyRepair()
		if err := d.dispatch(); err != nil {
			d.out.Close()
			d.giveUp("nats connection closed")
			return err
		}
		if d.draining && d.volatile == 0 && d.busy() == 0 {
			d.giveUp("") // only spooled events are left, and they stay
			return nil
		}
		select {
		case <-d.out.Ready():
			d.takeIn()
		case r := <-d.acks:
			d.handle(r)
		case r := <-d.chk.results:
			d.checked(r)
		case set := <-d.start.readC():
			d.readBackIn(set, time.Now())
		case now := <-d.start.carryC():
			d.tryCarry(now)
		case res := <-d.rep.resultC():
			d.repairAnswered(res)
		case <-d.rep.advisoryC():
			d.check("the stream's leader was elected", true)
		case <-d.rep.retryC():
			d.retryCheck()
		case <-d.rep.holdC():
			// The quick hold is over: dispatch looks again.
		case now := <-d.retries.C():
			d.ready = d.retries.due(d.ready, now)
		case now := <-d.stallC(stallCheck):
			d.abandonStragglers(now)
			d.checkStall(now)
			d.start.checkHold(&d.wm, now)
		case <-reconnected:
			d.retryAllNow()
			d.noticeReconnect() // a check at once, also with nothing to publish
		case <-done:
			done = nil
			// From here on the queue only shrinks: Send refuses events,
			// and the spool keeps its entries for the next start.
			d.out.Close()
			d.takeIn() // the last events Send kept in memory
			d.draining = true
			if d.rep != nil {
				d.rep.holding = false // a check does not hold the drain
			}
			if d.start.carryWaits() {
				d.tryCarry(time.Now()) // no more waiting for labels
			}
			t := time.NewTimer(d.opts.DrainTimeout)
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
	if !e.spooled {
		pq.volatile++
		d.volatile++
	}
}

// putFront puts events, in their order, at the front of their pods'
// queues, before what the pods hold; a pod with nothing queued becomes
// ready. It returns how many pods they are for. The caller sees to it that
// no pod of theirs has its head event in flight or being checked.
func (d *delivery) putFront(events []*outboxEvent) int {
	byPod := map[string][]*outboxEvent{}
	var uids []string
	for _, e := range events {
		uid := e.ev.Pod.UID
		if _, ok := byPod[uid]; !ok {
			uids = append(uids, uid)
		}
		byPod[uid] = append(byPod[uid], e)
	}
	for _, uid := range uids {
		pq, ok := d.pods[uid]
		if !ok {
			pq = &podQueue{uid: uid}
			d.pods[uid] = pq
			d.ready = append(d.ready, pq)
		}
		pq.events = append(byPod[uid], pq.events...)
	}
	return len(uids)
}

// takeIn adds what the outbox yields to the pods' queues, in order.
func (d *delivery) takeIn() {
	d.taken = d.out.Take(d.taken[:0])
	for i, e := range d.taken {
		d.add(e)
		d.taken[i] = nil
	}
}

// dispatch publishes (or checks) the head event of ready pods while there
// is room in flight. It returns an error only when the connection is
// closed for good.
func (d *delivery) dispatch() error {
	if d.start.holds() || d.repairHolds() {
		return nil
	}
	for d.busy() < d.opts.MaxInFlight && len(d.ready) > 0 {
		// Before each publish: the connection may come back in the
		// middle of the loop, and what it publishes first must wait for
		// the check a reconnect starts.
		if d.noticeReconnect() {
			return nil
		}
		pq := d.ready[0]
		d.ready[0] = nil
		d.ready = d.ready[1:]
		if d.draining && pq.volatile == 0 {
			// Only spooled events: they stay in the spool. The pod stays
			// in pods, out of every line, until giveUp.
			continue
		}
		if err := d.publish(pq); err != nil {
			return err
		}
	}
	return nil
}

// busy returns the number of pods whose head event is in flight: published
// and waiting for its outcome, or being checked against the stream.
// MaxInFlight bounds it.
func (d *delivery) busy() int {
	return len(d.inflight) + len(d.checking)
}

// needsCheck reports whether e must be checked against the stream before it
// is published again: it may have been stored longer ago than JetStream's
// duplicate detection can be relied on (verify.go).
func (d *delivery) needsCheck(e *outboxEvent, now time.Time) bool {
	if e.unchecked && d.opts.Restart.From == 0 {
		// Without the read (readback.go), which knows every message an
		// earlier run stored after its checkpoint, the entry is asked for.
		return true
	}
	return !e.maybeStoredAt.IsZero() && now.Sub(e.maybeStoredAt) >= d.opts.DuplicateWindow/2
}

func (d *delivery) publish(pq *podQueue) error {
	e := pq.events[0]
	if e.msg == nil {
		// Encoded when its turn comes, not when recorded: what waits
		// holds its event only, and the encoded messages alive at a time
		// are those in flight. The first relist of 30,000 containers
		// held 30-40 MB of messages at its peak when Send encoded them
		// (pleg-bench, heap profile).
		msg, err := d.opts.Encoder.Encode(e.ev)
		if err != nil {
			d.giveUpHead(pq, "cannot encode it", err)
			return nil
		}
		e.msg = msg
	}
	sent := time.Now()
	if d.busy() == 0 {
		d.stall.progressAt = sent
	}
	if id, seq, ok := d.start.storedBy(e.msg); ok {
		d.recognise(pq, id, seq, sent)
		return nil
	}
	if d.needsCheck(e, sent) {
		d.checking[pq] = struct{}{}
		// Never blocks: reqs has room for MaxInFlight requests.
		d.chk.reqs <- checkRequest{pod: pq, subject: e.msg.Subject, id: e.msg.Header.Get(jetstream.MsgIDHeader)}
		return nil
	}
	if st := d.nc.Status(); st == nats.CLOSED {
		return fmt.Errorf("publish event: %w", nats.ErrConnectionClosed)
	} else if st != nats.CONNECTED {
		// nats.go would buffer the message and send it once reconnected,
		// however late: a retry that reaches the server long after it was
		// sent defeats the duplicate window (verify.go). So nothing is
		// published while the connection is down: the attempt fails, not
		// sent, and is retried with the backoff.
		d.metrics.failed.Inc()
		d.failed(pq, errReconnecting)
		return nil
	}
	_, err := d.ajs.PublishMsgAsync(e.msg)
	if err != nil {
		if d.nc.IsClosed() {
			return fmt.Errorf("publish event: %w (%w)", nats.ErrConnectionClosed, err)
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			// Retrying cannot help; holding it would stall the pod forever.
			d.giveUpHead(pq, "message exceeds the server's max payload", err)
			return nil
		}
		// Not sent at all, so not stored: maybeStoredAt stays as it is.
		d.metrics.failed.Inc()
		d.failed(pq, err)
		return nil
	}
	if e.mark == nil {
		e.mark = d.wm.sent()
	}
	d.metrics.inFlight.Inc()
	d.inflight[e.msg] = inflight{pod: pq, sent: sent}
	return nil
}

func (d *delivery) handle(r ackResult) {
	f, ok := d.inflight[r.msg]
	if !ok {
		return // given up already
	}
	delete(d.inflight, r.msg)
	d.metrics.inFlight.Dec()
	pq := f.pod
	if r.err != nil {
		d.metrics.failed.Inc()
		if e := pq.events[0]; e.maybeStoredAt.IsZero() {
			if maybeStored(r.err) {
				e.maybeStoredAt = f.sent
			} else if e.mark != nil {
				// No attempt of it can be stored: it holds the
				// watermark back no more, until it is sent again.
				d.wm.settled(e.mark)
				e.mark = nil
			}
		}
		d.failed(pq, r.err)
		return
	}
	d.wm.stored(r.ack.Sequence)
	d.noticeAck(r.ack)
	if f.sent.After(d.stall.lastAckedSent) {
		d.stall.lastAckedSent = f.sent
	}
	if r.ack.Duplicate {
		d.metrics.duplicate.Inc()
	} else {
		d.metrics.acked.Inc()
	}
	d.metrics.ackDuration.Observe(r.done.Sub(f.sent).Seconds())
	d.delivered(pq, r.ack.Sequence)
}

// checked takes in the answer of a check against the stream.
func (d *delivery) checked(r checkResult) {
	pq := r.pod
	if _, ok := d.checking[pq]; !ok {
		return // given up already
	}
	delete(d.checking, pq)
	e := pq.events[0]
	switch {
	case r.err != nil:
		// NATS is still away, most likely: a failed attempt like any.
		d.metrics.checkError.Inc()
		d.failed(pq, r.err)
	case r.seq > 0:
		d.wm.stored(r.seq)
		d.metrics.checkStored.Inc()
		d.log.Debug("event already stored: not publishing it again",
			"pod_uid", e.ev.Pod.UID, "container_id", e.ev.Container.ID, "event_type", string(e.ev.Type))
		d.delivered(pq, r.seq)
	default:
		// Not stored. An attempt still on its way would be stored after
		// this answer, within the window of the publish that follows.
		d.metrics.checkMissing.Inc()
		e.unchecked = false
		e.maybeStoredAt = time.Time{}
		d.ready = append(d.ready, pq)
	}
}

// delivered takes the head event of pq as stored in the stream at seq: it
// is reported to OnAck and kept in Retained, then marked Done in the spool
// (in that order, so that the checkpoint's ack and the entry's removal
// reach the disk together).
func (d *delivery) delivered(pq *podQueue, seq uint64) {
	now := time.Now()
	d.stall.progressAt = now
	if !d.stall.since.IsZero() {
		d.log.Info("publishing resumed",
			"stalled_for", now.Sub(d.stall.since), "failed_attempts", d.stall.failures)
		d.stall.since = time.Time{}
		d.stall.failures = 0
		// As after a reconnect: the stall (an election, say) is over.
		d.retryAllNow()
	}
	pq.failures = 0
	e := pq.events[0]
	d.advance(pq)
	if e.mark != nil {
		d.wm.settled(e.mark)
		e.mark = nil
	}
	if d.opts.OnAck != nil {
		d.opts.OnAck(e.ev, d.wm.value())
	}
	if kept := d.opts.Repair.Retained; kept != nil {
		kept.Record(e.ev, seq, now)
	}
	d.out.Done(e)
}

// giveUpHead drops the head event of pq, which cannot be delivered.
func (d *delivery) giveUpHead(pq *podQueue, reason string, err error) {
	e := pq.events[0]
	d.drop(e, reason, err)
	d.advance(pq) // frees its slot
	d.out.Done(e)
}

// advance removes the head event of pq, which is delivered or given up, and
// frees its outbox slot. The pod goes to the back of the ready line if it
// has more events.
func (d *delivery) advance(pq *podQueue) {
	e := pq.events[0]
	switch {
	case e.carried:
		defer d.start.carriedOne() // once the event is out of the queue
	case e.repaired:
		d.repairedOne(e)
	case !e.spooled:
		pq.volatile--
		d.volatile--
	}
	pq.events[0] = nil
	pq.events = pq.events[1:]
	d.out.Settle(e)
	if len(pq.events) == 0 {
		delete(d.pods, pq.uid)
		return
	}
	d.ready = append(d.ready, pq)
}

// failed logs a failed attempt and schedules the retry of the pod's head
// event; the caller counts it. The failure that stalls publishing (the
// first since an ack) logs at Warn, the following ones at Debug, so an
// outage does not flood the log; the next ack logs that publishing resumed.
func (d *delivery) failed(pq *podQueue, err error) {
	pq.failures++
	d.stall.failures++
	delay := RetryDelay(d.opts.RetryBackoffMin, d.opts.RetryBackoffMax, pq.failures)
	ev := pq.events[0].ev
	attrs := []any{"pod_uid", ev.Pod.UID, "container_id", ev.Container.ID, "event_type", string(ev.Type),
		"attempt", pq.failures, "retry_in", delay, "err", err}
	now := time.Now()
	if d.stall.since.IsZero() {
		d.stall.since = d.stall.progressAt
		d.log.Warn("publishing stalled: publish event failed, will retry until acks resume", attrs...)
	} else {
		d.log.Debug("publish event failed, will retry", attrs...)
	}
	pq.retryAt = now.Add(delay)
	d.retries.add(pq)
}

// abandonStragglers takes every message in flight that was sent more than
// stragglerAfter before one JetStream has acked, or every one sent more than
// stalledResendAfter ago when nothing was acked for as long, as lost, and
// schedules its retry: it went to a stream leader that died, whose successor will never
// answer it, and waiting out AckTimeout would hold its pod's events back
// (and, should the bridge be killed meanwhile, lose them with the memory
// outbox). It may have been stored all the same, so the retry is checked
// against the stream if it comes late for the duplicate window (verify.go).
// A late answer to the abandoned attempt is ignored.
func (d *delivery) abandonStragglers(now time.Time) {
	stalled := now.Sub(d.stall.progressAt) > stalledResendAfter
	if d.stall.lastAckedSent.IsZero() && !stalled {
		return
	}
	for msg, f := range d.inflight {
		overtaken := !d.stall.lastAckedSent.IsZero() && d.stall.lastAckedSent.Sub(f.sent) > stragglerAfter
		if !overtaken && !(stalled && now.Sub(f.sent) > stalledResendAfter) {
			continue
		}
		delete(d.inflight, msg)
		d.metrics.inFlight.Dec()
		d.metrics.failed.Inc()
		if e := f.pod.events[0]; e.maybeStoredAt.IsZero() {
			e.maybeStoredAt = f.sent
		}
		d.failed(f.pod, errOvertaken)
	}
}

// checkStall logs a stall that no failure reported yet: messages in
// flight and no ack for stallAfter, as while a stream leader is elected
// (an ack timeout would say so only after AckTimeout).
func (d *delivery) checkStall(now time.Time) {
	if !d.stall.since.IsZero() || d.busy() == 0 || now.Sub(d.stall.progressAt) < stallAfter {
		return
	}
	d.stall.since = d.stall.progressAt
	d.log.Warn("publishing stalled: no ack, will wait and retry until acks resume",
		"for", now.Sub(d.stall.progressAt), "in_flight", d.busy())
}

// RetryDelay is the wait before the next attempt after failures failed ones
// in a row: minDelay doubled for each failure after the first, at most
// maxDelay, drawn uniformly from the upper half of that, which spreads the
// retries of pods (or of nodes' writers) that failed together. The
// publisher's retries and the state bucket's writer use it.
func RetryDelay(minDelay, maxDelay time.Duration, failures int) time.Duration {
	d := minDelay
	for i := 1; i < failures && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	return d/2 + rand.N(d/2+1)
}

// stallC returns the stall check's channel while there is something to
// check (messages in flight or being checked, the watermark on hold), else
// nil: an idle publisher is not woken four times a second for nothing (a
// ticker whose channel nobody waits on does not fire, Go 1.23 and later).
func (d *delivery) stallC(t *time.Ticker) <-chan time.Time {
	if d.busy() == 0 && !d.wm.holding {
		return nil
	}
	return t.C
}

// retryAllNow moves every pod waiting for a retry to the ready line, with
// its backoff reset: whatever failed them has just ended.
func (d *delivery) retryAllNow() {
	for _, pq := range d.retries.pods {
		pq.failures = 0
		d.ready = append(d.ready, pq)
	}
	d.retries.pods = d.retries.pods[:0]
}

// giveUp takes in the outcomes that arrived and what Send still left, stops
// waiting for acks and checks, and drops every undelivered event that Send
// kept in memory only. The spooled ones, and the memory events written
// through to the spool, stay in the spool (not Done), for the next start;
// reason empty means only spooled ones are left.
func (d *delivery) giveUp(reason string) {
	for {
		select {
		case r := <-d.acks:
			if r.err == nil {
				d.handle(r)
				continue
			}
			// Failed, and no time is left to retry it.
			if _, ok := d.inflight[r.msg]; ok {
				delete(d.inflight, r.msg)
				d.metrics.inFlight.Dec()
				d.metrics.failed.Inc()
			}
			continue
		case r := <-d.chk.results:
			if r.err == nil && r.seq > 0 {
				d.checked(r)
			}
			continue
		default:
		}
		break
	}
	d.takeIn()
	// Whatever is still in flight is given up below with its pod's queue;
	// it may yet be stored, but nobody waits for the ack any more.
	d.metrics.inFlight.Sub(float64(len(d.inflight)))
	clear(d.inflight)
	clear(d.checking)
	left := 0
	for _, pq := range d.pods {
		for _, e := range pq.events {
			switch {
			case e.carried:
				left++ // not adopted: the next Run carries it again
			case e.repaired:
				left++ // still kept: the next Run's check finds it lost again
			case e.spooled || e.written:
				left++
				d.out.Release(e)
			default:
				d.drop(e, reason, nil)
				d.out.Settle(e) // given up
			}
		}
	}
	clear(d.pods)
	d.volatile = 0
	d.ready = nil
	d.retries.pods = nil
	if left > 0 {
		d.log.Info("left undelivered events in the spool for the next start", "events", left)
	}
}

// drop counts and logs an event that is given up. The caller removes it
// from its pod's queue and frees its outbox slot.
func (d *delivery) drop(e *outboxEvent, reason string, err error) {
	d.metrics.dropped.Inc()
	attrs := []any{"reason", reason,
		"pod_uid", e.ev.Pod.UID, "container_id", e.ev.Container.ID, "event_type", string(e.ev.Type)}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	d.log.Warn("drop event", attrs...)
}

// retryLine holds the pods waiting to retry their head event, the earliest
// retry first, and the timer that fires at the earliest.
type retryLine struct {
	pods retryHeap
	// timer fires at armedAt, the earliest retry when it was armed.
	timer   *time.Timer
	armedAt time.Time
}

// newRetryLine returns an empty line, its timer stopped.
func newRetryLine() retryLine {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return retryLine{timer: t}
}

// add puts pq in the line, for a retry at pq.retryAt.
func (l *retryLine) add(pq *podQueue) { heap.Push(&l.pods, pq) }

// C arms the timer for the earliest retry and returns its channel, or nil
// when no pod waits for a retry.
func (l *retryLine) C() <-chan time.Time {
	if len(l.pods) == 0 {
		return nil
	}
	if at := l.pods[0].retryAt; !at.Equal(l.armedAt) {
		l.timer.Reset(time.Until(at))
		l.armedAt = at
	}
	return l.timer.C
}

// due takes in that the timer fired at now: it removes the pods whose retry
// time has come from the line and appends them to ready.
func (l *retryLine) due(ready []*podQueue, now time.Time) []*podQueue {
	l.armedAt = time.Time{}
	for len(l.pods) > 0 && !l.pods[0].retryAt.After(now) {
		ready = append(ready, heap.Pop(&l.pods).(*podQueue))
	}
	return ready
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
