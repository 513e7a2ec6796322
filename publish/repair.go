package publish

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/datadir"
)

// The repair of what the servers lost after acking it.
//
// An ack is not yet durable. nats-server acknowledges a write once it is
// in its files' page cache, and flushes them every sync_interval (2
// minutes by default): a power loss, or an OS crash of a server at the
// wrong moment, loses acknowledged writes, and a replica whose newest
// block is corrupt can lead with fewer messages than it acked. The
// Publisher forgets an event once it is acked, so without more, such an
// event is never published again.
//
// So, with Options.Repair.Retained, every acked event is kept for a window
// (datadir.Retained: on disk, longer than the servers' flush), and after
// anything that can follow a loss the Publisher checks that the stream
// still holds them:
//
//   - when Run starts (a node or its servers may have lost power
//     together);
//   - after every reconnect to NATS: a server that lost power or crashed
//     dropped its clients;
//   - after every election of the stream's leader (the advisory
//     $JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.<stream>): a leader that
//     comes back with fewer messages, or is elected without them, drops
//     them for every replica;
//   - when an ack's sequence is below one acked before: the stream's last
//     sequence went backwards.
//
// A check reads the ids (the Nats-Msg-Id header, no body) of this node's
// messages from the lowest sequence the kept events were acked with to the
// stream's last, one ephemeral consumer as the read-back of a restart
// (readback.go). A kept event whose id it does not find, acked at a
// sequence the stream still covers (at or after its first sequence: older
// ones went by the stream's limits or a purge), was lost. The read decides,
// not the duplicate window: an event that is there is never published
// again, however long after its ack the check runs.
//
// What was lost is put back at the front of its pod's queue, in the order
// it was acked, before anything of the pod not yet delivered, and
// published with its own id: downstream it is the same event (a consumer
// that read it before the loss sees it again, with the same id, and drops
// it: the consumer package does). It goes to OnAck again when acked, so
// the checkpoint, Retained and the state bucket see it as any ack. A loss
// is logged once at Warn with how many events go out again, and counted
// in pleg_bridge_events_republished_total{reason="lost_by_server"};
// pleg_bridge_repair_checks_total counts the checks by result.
//
// While the first read after a reconnect or an election is on its way,
// nothing is published for Options.Repair.QuickHold (a second; a check of a
// healthy stream takes milliseconds), and after that only while publishing
// fails too (servers still recovering), for a minute at most: so no later
// event of a pod reaches the stream before an earlier one the check puts
// back. A check slower than that while publishing works (a consumer
// created while the cluster's meta leader changes, say) lets publishing
// go on. Once an answer is in, nothing is published until the messages in
// flight settle and the lost events are in their queues. One window is
// left: a message handed to the connection in the instant it is lost,
// before the client knows, may be sent on the new connection before the
// check (nats.go keeps what it had not written); seen in about one run in
// thirty of a test that publishes at the moment of the reconnect, never in
// the soaks. An ack that
// shows the sequence going backwards was stored after the loss: events of
// its pod that were lost before it follow it, out of order; the reconnect
// that comes first with a server that restarts avoids that.
//
// A check that fails is logged once at Warn and tried again with the
// publish backoff. While publishing fails too (the servers are still
// recovering their streams after a power loss), the hold stays, for a
// minute at most (repairHoldMax); while publishing works (the check's
// consumer refused by permissions, say), publishing goes on, and the check
// is tried repairAttempts times until the next trigger.
// A stream created anew under the same name (another creation time) is a
// new history (history.go), which a restart starts: the check leaves it
// alone and says so.

// repairAttempts bounds the tries of one check that keeps failing while
// publishing works (the consumer refused by permissions, say).
const repairAttempts = 6

// DefaultRepairQuickHold is how long a check holds publishing in any case: a
// check of a healthy stream takes milliseconds. Past it, publishing waits
// on only while it fails too, for repairHoldMax at most: the servers
// recovering their streams after they all lost power take seconds to tens
// of seconds, and what is published before the check could overtake what
// it puts back. A check that is slow while publishing works (a consumer
// created while the cluster's meta leader changes) does not hold it.
const (
	DefaultRepairQuickHold = time.Second
	repairHoldMax          = time.Minute
)

// repairResultLost and the other results of a check, the values of the
// result label of pleg_bridge_repair_checks_total.
const (
	repairIntact    = "intact"
	repairRepaired  = "repaired"
	repairError     = "error"
	repairNewStream = "new_stream"
)

// repairer is the state of the checks, in Run's goroutine.
type repairer struct {
	kept *datadir.Retained
	// launch starts the read of a check in a goroutine of Run's; its
	// answer comes on results.
	launch  func(kept []datadir.RetainedEvent, reason string)
	results chan repairResult
	// reading is set while a read is on its way; holding while publishing
	// waits for it. again is the trigger that came during a read: checked
	// again after it.
	reading, holding bool
	reason, again    string
	// againHolds is whether a trigger that came during the read would
	// have held publishing: the next check does.
	againHolds bool
	// heldSince is when the hold started; holdTimer fires when its quick
	// part (Options.Repair.QuickHold) is over, to wake the delivery.
	heldSince time.Time
	holdTimer *time.Timer
	// answer is a read's answer waiting for the messages in flight to
	// settle.
	answer *repairResult
	// failures counts the failed reads of this check; retry fires the next.
	failures int
	retry    *time.Timer
	retrying bool
	// highest is the highest sequence an ack (not a duplicate's) gave.
	highest uint64
	// reconnects is the connection's count of reconnects at the last look.
	reconnects uint64
	// stream is the stream the checks read, once one was read.
	stream datadir.StreamIdentity
	// advisories receives the stream's leader elections; sub is their
	// subscription (nil if it could not be made).
	advisories chan *nats.Msg
	sub        *nats.Subscription
	// queued holds the ids of the events put back and not yet delivered:
	// a check that finds them missing again does not queue them twice.
	queued map[string]struct{}
}

// repairResult is a check's answer.
type repairResult struct {
	reason string
	err    error
	// stream is the stream read; last its last sequence when the read
	// started, first its first.
	stream      datadir.StreamIdentity
	first, last uint64
	// kept is how many kept events the check covered; read how many ids
	// it read.
	kept, read int
	// lost holds the kept events the stream no longer holds, in ack order.
	lost []datadir.RetainedEvent
}

// newRepairer returns the checks' state for kept; nil without.
func newRepairer(kept *datadir.Retained, nc *nats.Conn, stream string, launch func([]datadir.RetainedEvent, string)) *repairer {
	if kept == nil {
		return nil
	}
	r := &repairer{
		kept: kept, launch: launch, results: make(chan repairResult, 1),
		retry: time.NewTimer(time.Hour), holdTimer: time.NewTimer(time.Hour), queued: map[string]struct{}{},
		reconnects: nc.Stats().Reconnects,
	}
	r.retry.Stop()
	r.holdTimer.Stop()
	if stream == "" {
		stream = "*"
	}
	r.advisories = make(chan *nats.Msg, 16)
	// An error here (a closed connection) leaves the other triggers; a
	// subscription the server refuses is reported by the connection's
	// error handler, once.
	r.sub, _ = nc.ChanSubscribe("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED."+stream, r.advisories)
	return r
}

// close ends the subscription and the timer.
func (r *repairer) close() {
	if r == nil {
		return
	}
	r.retry.Stop()
	r.holdTimer.Stop()
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
	}
}

// forget drops the events kept for the checks: they were acked by a
// stream that is not the one Run publishes to.
func (r *repairer) forget() {
	if r == nil {
		return
	}
	r.kept.Clear()
}

// retryC returns the channel of the next try of a failed check, or nil.
func (r *repairer) retryC() <-chan time.Time {
	if r == nil || !r.retrying {
		return nil
	}
	return r.retry.C
}

// advisoryC returns the channel of the leader elections, or nil.
func (r *repairer) advisoryC() <-chan *nats.Msg {
	if r == nil {
		return nil
	}
	return r.advisories
}

// resultC returns the channel of the checks' answers, or nil.
func (r *repairer) resultC() <-chan repairResult {
	if r == nil {
		return nil
	}
	return r.results
}

// holdC returns the channel that fires when the quick part of a hold is
// over, or nil.
func (r *repairer) holdC() <-chan time.Time {
	if r == nil || !r.holding {
		return nil
	}
	return r.holdTimer.C
}

// repairHolds reports whether publishing waits for a check: an answer that
// is not applied yet, or a check on its way for Repair.QuickHold, and for
// up to repairHoldMax while publishing fails too.
func (d *delivery) repairHolds() bool {
	r := d.rep
	if r == nil {
		return false
	}
	if r.answer != nil {
		return true
	}
	if !r.holding {
		return false
	}
	held := time.Since(r.heldSince)
	switch {
	case held >= repairHoldMax:
		r.holding = false
		d.log.Debug("publishing goes on while the check of the acknowledged events is on its way", "held_for", held, "reason", r.reason)
		return false
	case held < d.opts.Repair.QuickHold:
		return true
	}
	// Past the quick hold, publishing goes on while it works, and waits
	// again once it fails: a stream that is not back yet takes nothing,
	// and what it takes once back must not overtake what the check puts
	// back.
	return !d.stall.since.IsZero() || d.nc.IsReconnecting()
}

// check starts a check for reason, holding publishing until it answers
// when hold; a check on its way takes reason as the next.
func (d *delivery) check(reason string, hold bool) {
	r := d.rep
	if r == nil {
		return
	}
	now := time.Now()
	if r.reading {
		// The read on its way may have been made before what this trigger
		// says happened: another follows it, and a trigger that holds
		// holds publishing from now on, until that one answers.
		if r.again == "" {
			r.again = reason
		}
		r.againHolds = r.againHolds || hold
		if hold && !d.draining {
			if !r.holding {
				r.heldSince = now
				r.holdTimer.Reset(d.opts.Repair.QuickHold)
			}
			r.holding = true
		}
		return
	}
	kept := r.kept.Since(time.Time{}, now)
	if len(kept) == 0 {
		r.holding = false
		return
	}
	r.reading, r.reason, r.failures = true, reason, 0
	r.retrying = false
	r.retry.Stop()
	if hold && !r.holding && !d.draining {
		r.heldSince = now
		r.holdTimer.Reset(d.opts.Repair.QuickHold)
	}
	r.holding = hold && !d.draining
	r.launch(kept, reason)
}

// noticeReconnect starts a check if the connection reconnected since the
// last look, and reports whether publishing must wait for it. dispatch
// calls it before each publish: the status listener's news may come after
// the first publish on the new connection.
func (d *delivery) noticeReconnect() bool {
	r := d.rep
	if r == nil {
		return false
	}
	if n := d.nc.Stats().Reconnects; n != r.reconnects {
		r.reconnects = n
		d.check("reconnected to NATS", true)
		return d.repairHolds()
	}
	return false
}

// noticeAck takes in the sequence of an ack: one below an earlier ack's
// says the stream went backwards.
func (d *delivery) noticeAck(ack *jetstream.PubAck) {
	r := d.rep
	if r == nil || ack.Duplicate {
		return
	}
	if ack.Sequence < r.highest {
		d.check(fmt.Sprintf("the stream's sequence went backwards, from %d to %d", r.highest, ack.Sequence), false)
	}
	r.highest = max(r.highest, ack.Sequence)
}

// repairAnswered takes in a check's answer: a failure is tried again
// later; lost events are put back once nothing is in flight.
func (d *delivery) repairAnswered(res repairResult) {
	r := d.rep
	r.reading = false
	if res.err != nil {
		// A hold goes on (repairHolds says how long) with the next try.
		d.metrics.repairChecks.WithLabelValues(repairError).Inc()
		r.failures++
		if r.failures == 1 {
			d.log.Warn("cannot check that the stream still holds the acknowledged events; publishing goes on, checking again",
				"reason", res.reason, "err", res.err)
		} else {
			d.log.Debug("check that the stream still holds the acknowledged events, will try again",
				"attempt", r.failures, "err", res.err)
		}
		if r.again != "" {
			d.checkAgain()
			return
		}
		if r.holding || r.failures < repairAttempts {
			r.retry.Reset(RetryDelay(d.opts.RetryBackoffMin, d.opts.RetryBackoffMax, r.failures))
			r.retrying, r.reason = true, res.reason
		}
		return
	}
	if r.failures > 0 {
		d.log.Info("checked that the stream still holds the acknowledged events, after failed attempts", "failed_attempts", r.failures)
	}
	r.failures = 0
	// Nothing more is published until the answer is applied: the
	// messages in flight settle, and the heads of the pods' queues may
	// change then.
	r.answer, r.holding = &res, false
	d.applyRepair()
}

// checkAgain starts the check that a trigger during the last read asked
// for, holding publishing if that trigger would have, or if the last
// check still holds it.
func (d *delivery) checkAgain() {
	r := d.rep
	reason, hold := r.again, r.againHolds || r.holding
	r.again, r.againHolds = "", false
	d.check(reason, hold)
}

// retryCheck tries a failed check again.
func (d *delivery) retryCheck() {
	r := d.rep
	r.retrying = false
	failures := r.failures
	d.check(r.reason, r.holding)
	r.failures = failures
}

// applyRepair puts the lost events of the waiting answer back at the front
// of their pods' queues, once no message is in flight: the head of a pod's
// queue may change then.
func (d *delivery) applyRepair() {
	r := d.rep
	if r == nil || r.answer == nil || d.busy() > 0 {
		return
	}
	res := *r.answer
	r.answer = nil
	defer func() {
		if r.again != "" {
			d.checkAgain()
		}
	}()
	own := r.stream
	if ck := d.opts.Restart.Checkpoint; ck != nil {
		if id, named := ck.Stream(); named && !id.IsZero() {
			own = id // what was kept was acked by the checkpoint's stream
		}
	}
	if !own.IsZero() && !own.Equal(res.stream) {
		d.metrics.repairChecks.WithLabelValues(repairNewStream).Inc()
		d.log.Warn("the stream was created anew while the bridge ran: the acknowledged events kept for the repair belong to the old one, "+
			"and are not published into it (a restart of the bridge starts the new stream's history)",
			"old_stream", own.String(), "new_stream", res.stream.String())
		return
	}
	r.stream = res.stream
	if res.last < r.highest {
		d.log.Warn("the stream's last sequence is below one this node was acknowledged: the NATS servers lost acknowledged writes",
			"stream", res.stream.Name, "last_sequence", res.last, "acked_sequence", r.highest, "reason", res.reason)
		r.highest = res.last
		d.wm.rewind(res.last)
		if ck := d.opts.Restart.Checkpoint; ck != nil {
			ck.Rewind(res.last)
		}
	}
	var lost []datadir.RetainedEvent
	for _, k := range res.lost {
		id := EventID(k.Event.Container.ID, k.Event.Type)
		if _, ok := r.queued[id]; ok {
			continue
		}
		if at, ok := r.kept.AckedAt(k.Event); ok && at.After(k.AckedAt) {
			// Acked again since the check began (put back by an earlier
			// check, stored after this one's read): not lost.
			continue
		}
		r.queued[id] = struct{}{}
		lost = append(lost, k)
	}
	if len(lost) == 0 {
		d.metrics.repairChecks.WithLabelValues(repairIntact).Inc()
		d.log.Debug("the stream holds every acknowledged event kept", "reason", res.reason, "kept", res.kept, "read", res.read)
		return
	}
	d.metrics.repairChecks.WithLabelValues(repairRepaired).Inc()
	d.metrics.republished.Add(float64(len(lost)))
	front := make([]*outboxEvent, len(lost))
	for i, k := range lost {
		front[i] = &outboxEvent{ev: k.Event, repaired: true, earlier: true}
	}
	// Nothing is in flight or being checked: the heads may change. A pod
	// waiting for a retry keeps its place in the retry line.
	pods := d.putFront(front)
	d.log.Warn("the NATS servers lost events they had acknowledged; publishing them again with their ids, before anything newer of their pods",
		"events", len(lost), "pods", pods, "kept", res.kept, "stream", res.stream.Name,
		"first_sequence", res.first, "last_sequence", res.last, "reason", res.reason,
		"oldest_acked_at", lost[0].AckedAt)
	if on := d.opts.Repair.OnRepaired; on != nil {
		on(len(lost))
	}
}

// repairedOne takes in that an event put back was delivered or given up.
func (d *delivery) repairedOne(e *outboxEvent) {
	delete(d.rep.queued, EventID(e.ev.Container.ID, e.ev.Type))
}

// readKept reads the ids of this node's messages that the stream holds
// from the lowest sequence of kept to its last, and returns the kept
// events it lacks. Bounded by AckTimeout.
func (p *Publisher) readKept(ctx context.Context, kept []datadir.RetainedEvent) (repairResult, error) {
	res := repairResult{kept: len(kept)}
	rctx, cancel := context.WithTimeout(ctx, p.opts.AckTimeout)
	defer cancel()
	filter := p.enc.nodeSubjects()
	stream, err := lookUpStream(rctx, p.js, p.opts.Stream, filter)
	if err != nil {
		return res, err
	}
	info, err := stream.Info(rctx)
	if err != nil {
		return res, fmt.Errorf("get stream info: %w", err)
	}
	res.stream = datadir.StreamIdentity{Name: info.Config.Name, Created: info.Created}
	res.first, res.last = info.State.FirstSeq, info.State.LastSeq
	from := uint64(0)
	var covered []datadir.RetainedEvent
	for _, k := range kept {
		// Below the first sequence: gone by the stream's limits or a
		// purge, not lost.
		if k.Sequence < res.first {
			continue
		}
		covered = append(covered, k)
		if from == 0 || k.Sequence < from {
			from = k.Sequence
		}
	}
	res.kept = len(covered)
	if len(covered) == 0 {
		return res, nil
	}
	ids := map[string]struct{}{}
	if from <= res.last {
		cons, err := stream.CreateConsumer(rctx, jetstream.ConsumerConfig{
			Description:       "pleg-bridge: check that acknowledged events are stored",
			DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:       from,
			FilterSubject:     filter,
			AckPolicy:         jetstream.AckNonePolicy,
			HeadersOnly:       true,
			MemoryStorage:     true,
			Replicas:          1,
			InactiveThreshold: readBackInactive,
		})
		if err != nil {
			return res, fmt.Errorf("create consumer on stream %s: %w", info.Config.Name, err)
		}
		name := cons.CachedInfo().Name
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.AckTimeout)
			defer cancel()
			if err := stream.DeleteConsumer(dctx, name); err != nil {
				p.log.Debug("delete the repair check's consumer", "consumer", name, "err", err)
			}
		}()
		if err := readIDs(rctx, cons, res.last, ids); err != nil {
			return res, fmt.Errorf("read consumer %s: %w", name, err)
		}
	}
	res.read = len(ids)
	for _, k := range covered {
		if _, ok := ids[EventID(k.Event.Container.ID, k.Event.Type)]; !ok {
			res.lost = append(res.lost, k)
		}
	}
	return res, nil
}

// readIDs adds to ids the Nats-Msg-Id of every message cons delivers up to
// stream sequence last. A message lost on the way (a gap in the consumer
// sequence) fails the read: a missing id would be taken as a loss.
func readIDs(ctx context.Context, cons jetstream.Consumer, last uint64, ids map[string]struct{}) error {
	pending := cons.CachedInfo().NumPending
	var delivered uint64
	for pending > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch, err := cons.FetchNoWait(int(min(pending, readBackBatch)))
		if err != nil {
			return err
		}
		got := 0
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("read message metadata: %w", err)
			}
			if md.Sequence.Consumer != delivered+1 {
				return fmt.Errorf("skipped from delivery %d to %d: a message was lost on the way", delivered, md.Sequence.Consumer)
			}
			delivered = md.Sequence.Consumer
			got++
			pending = md.NumPending
			if md.Sequence.Stream > last {
				pending = 0
				continue
			}
			if id := m.Headers().Get(jetstream.MsgIDHeader); id != "" {
				ids[id] = struct{}{}
			}
		}
		if err := batch.Error(); err != nil {
			return err
		}
		if got == 0 && pending > 0 {
			return fmt.Errorf("delivered nothing with %d messages pending", pending)
		}
	}
	return nil
}
