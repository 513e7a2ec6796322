package publish

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// startup is the start-up protocol of one Run (Options.Restart): the
// read-back of what an earlier run stored (readback.go) and, when the
// stream is not the checkpoint's, the carry of the checkpoint's history
// into it (history.go). Nothing is published while it holds (holds): until
// the read arrives, and then until the carried events are in their pods'
// queues. Part of it lasts the run: the ids the read found are recognised
// whenever the generator reports their events again, and the carried
// events adopt the stream once the last is delivered.
//
// Only Run's goroutine touches it. The delivery asks it (holds, storedBy,
// carryWaits) and tells it what happened (arrived, recognise, carriedOne);
// the watermark it holds back while the read's messages are not
// recognised is the delivery's, passed in.
type startup struct {
	opts Restart
	// spool holds the events an earlier run left, carried with the
	// checkpoint's when they need it; nil without a spool.
	spool *datadir.Spool
	log   *slog.Logger

	// reading is set until the read of what an earlier run stored arrives
	// on read; nothing is published before.
	reading bool
	read    chan storedSet
	// found maps the ids the read found to their sequences, for the run;
	// recognised holds those that were reported again.
	found      map[string]uint64
	recognised map[string]struct{}

	// renewing is the stream whose history Run is starting, until the
	// checkpoint adopts it; nil otherwise.
	renewing *datadir.StreamIdentity
	// carry holds the events to carry into it until they are inserted
	// (carryInto); nothing is published before. carryMeta holds the pod
	// labels of the spooled events, carryUntil ends the wait for the
	// generator's. carryTimer fires while carryArmed.
	carry      []generator.Event
	carryMeta  map[string]*generator.PodMeta
	carryUntil time.Time
	carryTimer *time.Timer
	carryArmed bool
	// carrying is the Publisher's count of the events carried and not yet
	// delivered, which Pending reads.
	carrying *atomic.Int64
}

// newStartup returns the start-up state of a Run over opts. With anything
// to read back (a checkpoint, or a sequence or time to read from), it is
// reading: the caller starts the read, which sends its set on s.read.
func newStartup(opts Restart, spool *datadir.Spool, log *slog.Logger, carrying *atomic.Int64) startup {
	s := startup{opts: opts, spool: spool, log: log, carrying: carrying, carryTimer: time.NewTimer(time.Hour)}
	s.carryTimer.Stop()
	if opts.From > 0 || !opts.Since.IsZero() || opts.Checkpoint != nil {
		s.reading = true
		s.read = make(chan storedSet, 1)
	}
	return s
}

// stop stops the timer of the wait for the pods' labels.
func (s *startup) stop() { s.carryTimer.Stop() }

// holds reports whether publishing waits for the start-up: the read, or
// the carried events not yet in their pods' queues.
func (s *startup) holds() bool { return s.reading || s.carry != nil }

// readC returns the channel the read's set arrives on; nil without a read.
func (s *startup) readC() <-chan storedSet { return s.read }

// carryWaits reports whether carried events wait to be inserted.
func (s *startup) carryWaits() bool { return s.carry != nil }

// carryC returns the channel of the wait for the pods' labels, or nil.
func (s *startup) carryC() <-chan time.Time {
	if !s.carryArmed {
		return nil
	}
	return s.carryTimer.C
}

// arrived takes in the read of what an earlier run stored: with a
// checkpoint, it adopts the stream (a checkpoint that named none), or
// starts the stream's history (renew); it keeps the ids found for the run,
// holds w at Restart.From−1 until they are recognised or readBackHold is
// over, and returns the decoded events in stream order, for OnAck and
// OnStored.
func (s *startup) arrived(set storedSet, w *watermark, now time.Time) []generator.Event {
	s.reading = false
	switch {
	case set.renew != "":
		s.renew(set, now)
	case set.adopt:
		s.opts.Checkpoint.Adopt(set.stream)
		s.log.Info("the checkpoint names no stream yet: it belongs to this one", "stream", set.stream.String())
	}
	if len(set.ids) == 0 {
		return nil // found left nil: publish looks nothing up
	}
	s.found = set.ids
	s.recognised = make(map[string]struct{}, len(set.ids))
	w.holding = true
	w.holdAt = max(set.from, 1) - 1
	w.holdUntil = now.Add(readBackHold)
	events := make([]generator.Event, 0, len(set.events))
	for _, e := range set.events {
		s.recognised[EventID(e.ev.Container.ID, e.ev.Type)] = struct{}{}
		events = append(events, e.ev)
	}
	return events
}

// storedBy returns the id of msg and the sequence an earlier run stored it
// at, if the read found it.
func (s *startup) storedBy(msg *nats.Msg) (id string, seq uint64, ok bool) {
	if s.found == nil {
		return "", 0, false
	}
	id = msg.Header.Get(jetstream.MsgIDHeader)
	seq, ok = s.found[id]
	return id, seq, ok
}

// recognise takes in that the event of id, which the read found, was
// reported again, and ends the hold on w if it was the last.
func (s *startup) recognise(id string, w *watermark, now time.Time) {
	s.recognised[id] = struct{}{}
	s.checkHold(w, now)
}

// checkHold ends the hold of the read's messages on w once every one was
// recognised, or readBackHold is over, and logs how many were.
func (s *startup) checkHold(w *watermark, now time.Time) {
	if !w.holding || (len(s.recognised) < len(s.found) && now.Before(w.holdUntil)) {
		return
	}
	w.holding = false
	s.log.Info("recognised the events an earlier run stored after its checkpoint",
		"recognised", len(s.recognised), "messages", len(s.found))
}

// renew starts the history of a stream that is not the checkpoint's (see
// the comment at the top of history.go), before the events the read found
// are reported: it works out what to carry into the stream, disowns the
// checkpoint and says so, once, at Warn. carryInto inserts the carried
// events once the read's events were reported.
func (s *startup) renew(set storedSet, now time.Time) {
	ck := s.opts.Checkpoint
	var spooled []generator.Event
	if s.spool != nil {
		spooled = s.spool.Restored() // nothing of this run is delivered yet
	}
	s.carry = carryHistory(ck.Restored(), spooled, set.ids, now)
	s.carryMeta = map[string]*generator.PodMeta{}
	for _, ev := range spooled {
		if ev.Pod.Meta != nil {
			s.carryMeta[ev.Pod.UID] = ev.Pod.Meta
		}
	}
	s.carryUntil = now.Add(carryMetaWait)
	s.renewing = &set.stream
	containers := map[string]struct{}{}
	for _, ev := range s.carry {
		containers[ev.Container.ID] = struct{}{}
	}
	own, _ := ck.Stream()
	ck.Disown()
	s.log.Warn("the stream is not the one the checkpoint belongs to; starting its history: "+
		"the checkpoint's events of the containers it does not hold go into it first, then what waits",
		"stream", set.stream.Name, "reason", set.renew, "old_stream", own.String(), "new_stream", set.stream.String(),
		"checkpoint_sequence", ck.Sequence(), "last_sequence", set.last, "found", len(set.ids),
		"carried_containers", len(containers), "carried_events", len(s.carry))
}

// carryInto inserts the carried events with put, which puts them at the
// front of their pods' queues and returns how many pods they are for,
// once the pods' labels can be known, carryMetaWait is over, or Run is
// draining: nothing is published before. With nothing to carry, the
// stream is adopted at once.
func (s *startup) carryInto(put func([]*outboxEvent) int, now time.Time, draining bool) {
	s.carryArmed = false
	s.carryTimer.Stop()
	if len(s.carry) == 0 {
		s.carry, s.carryMeta = nil, nil
		s.adopt()
		return
	}
	if pm := s.opts.PodMeta; pm != nil {
		if _, known := pm(s.carry[0].Pod.UID); !known && now.Before(s.carryUntil) && !draining {
			s.carryTimer.Reset(carryMetaPoll)
			s.carryArmed = true
			return
		}
	}
	front := make([]*outboxEvent, 0, len(s.carry))
	for i := range s.carry {
		ev := s.carry[i]
		if ev.Pod.Meta == nil {
			ev.Pod.Meta = s.carryMeta[ev.Pod.UID]
			if pm := s.opts.PodMeta; pm != nil {
				if m, _ := pm(ev.Pod.UID); m != nil {
					ev.Pod.Meta = m
				}
			}
		}
		front = append(front, &outboxEvent{ev: ev, carried: true, earlier: true})
	}
	pods := put(front)
	s.carrying.Store(int64(len(s.carry)))
	s.log.Debug("carrying the checkpoint's history into the stream",
		"stream", s.renewing.Name, "events", len(s.carry), "pods", pods)
	s.carry, s.carryMeta = nil, nil
}

// carriedOne takes in that a carried event is delivered or given up; the
// last adopts the stream.
func (s *startup) carriedOne() {
	if s.carrying.Add(-1) == 0 {
		s.adopt()
	}
}

// adopt makes the checkpoint the new stream's, once its history is in it.
func (s *startup) adopt() {
	id := *s.renewing
	s.renewing = nil
	s.opts.Checkpoint.Adopt(id)
	s.log.Info("the checkpoint belongs to the stream from now on", "stream", id.String())
}

// readBackIn takes in the read of what an earlier run stored (startup's
// arrived): each decoded event is reported to OnAck in stream order, all
// of them go to Restart.OnStored, and publishing may start, after the
// events carried into a new stream, if any.
func (d *delivery) readBackIn(set storedSet, now time.Time) {
	d.wm.stored(set.last)
	// The stream is known now: whether what was kept belongs to it.
	defer d.check("the bridge started", true)
	if set.renew != "" {
		// What was kept was acked by the old stream, at its sequences:
		// none of it is this stream's to repair.
		d.rep.forget()
		defer d.tryCarry(now) // after the events read are reported
	}
	events := d.start.arrived(set, &d.wm, now)
	if len(events) == 0 {
		return
	}
	// Reported with the watermark held at Restart.From−1: a checkpoint
	// written between two of these calls must not record a sequence past
	// events it does not hold yet. The next ack carries the hold's end.
	if d.opts.OnAck != nil {
		for _, ev := range events {
			d.opts.OnAck(ev, d.wm.value())
		}
	}
	d.start.checkHold(&d.wm, now)
	d.metrics.readBack.Add(float64(len(events)))
	if on := d.opts.Restart.OnStored; on != nil {
		on(events)
	}
}

// recognise delivers the head event of pq, which the read found stored by
// an earlier run at seq, without publishing it.
func (d *delivery) recognise(pq *podQueue, id string, seq uint64, now time.Time) {
	e := pq.events[0]
	d.metrics.checkReconciled.Inc()
	d.log.Debug("event stored by an earlier run: not publishing it again",
		"pod_uid", e.ev.Pod.UID, "container_id", e.ev.Container.ID, "event_type", string(e.ev.Type), "sequence", seq)
	d.start.recognise(id, &d.wm, now)
	d.delivered(pq, seq)
}

// tryCarry inserts the events carried into a new stream at the front of
// their pods' queues, when startup's carryInto says it is time. Nothing
// was published yet: no pod is in flight, checked or waiting for a retry,
// and its queue's head may change.
func (d *delivery) tryCarry(now time.Time) {
	d.start.carryInto(d.putFront, now, d.draining)
}
