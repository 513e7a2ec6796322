package publish

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// The read-back of what an earlier run stored, and the sequence OnAck reports.
//
// The checkpoint writes its acks every 100 ms, so a crash loses the acks of
// the last tenth of a second or so, and of the messages in flight. Those
// events are in the stream, and the checkpoint does not know them. Two
// things follow, and the read below answers both:
//
//   - The restarted generator reports those events again, with the same
//     ids; if the restart comes after the stream's duplicate window,
//     JetStream would store them a second time.
//   - A container among them that went away while the bridge was down is
//     unknown to a generator restored from the checkpoint alone: its
//     ContainerStarted is in the stream, and nothing would ever report its
//     ContainerDied and ContainerRemoved.
//
// So before the first publish of a run, the Publisher reads back every
// message this node stored after the checkpoint's sequence
// (Options.Restart.From), or, while the checkpoint has written none, since
// the durable store was created (Options.Restart.Since: a bridge killed
// before its first checkpoint write), and decodes it (stored.go). Each event read is
// reported to OnAck, in stream order, as an ack is (the checkpoint and the
// state bucket record it), and all of them are given to OnStored (the
// generator takes them as published, and reports what is left of a
// container that is gone). An event the generator reports again whose id
// the read found is delivered without being published: OnAck reports it
// (again), a spool entry is Done, and
// pleg_bridge_publish_checks_total{result="reconciled"} counts it.
//
// The read is one ephemeral pull consumer, filtered to this node's subjects
// (<prefix>.<node>.>), from Restart.From up to the stream's last sequence
// when the read starts: typically the few hundred messages of the half
// second before a crash, a few hundred bytes each, held in memory only
// until they are handed on. Nothing of this run is published before it
// succeeds; a failure (NATS away, no stream yet) is retried with the
// publish backoff, and at once after a reconnect. It is a plain consumer,
// not an OrderedConsumer: the ordered consumer recreates itself with
// retries that no context of ours can cut short, and Run must return when
// told. Its consumer sequence shows a message lost on the way, as the
// ordered consumer's would, and the read then starts again.
//
// What makes that read enough is the sequence OnAck reports, which the
// checkpoint writes with the acks (datadir.Checkpoint.RecordAck): every
// message this node stored at or below it was acked and reported to OnAck,
// by this run or an earlier one whose checkpoint recorded it. The highest
// ack's own sequence would not do: acks come back out of order when a
// publish is retried (its first attempt may have been stored long before
// the retry's ack, with many messages of other nodes between), so the
// Publisher keeps a watermark instead. A message sent once the Publisher
// knew of sequence h (an ack, a check, the read) is stored after h, so the
// watermark is h at the first send of the oldest message that may be
// stored and is not acked yet, or the highest sequence known when there is
// none.
//
// A message the read could not decode (not an event of this bridge's
// encoding: written by hand, or by a newer version) is not reported; it
// holds the watermark at Restart.From−1 until the generator reports its
// event again, or readBackHold has passed, so that a run that crashes
// soon after its start leaves it to the next read. Every decoded message
// is reported to OnAck with the read, so it holds nothing.
//
// The set of ids read lives for the run: an event reported again later in
// it (a backfill, a second source) is still recognised.

// readBackBatch bounds the messages of one pull: the whole read, after a
// crash, most of the time.
const readBackBatch = 1024

// readBackHold is how long the messages the read found and could not
// decode hold the watermark back, waiting for the generator to report their
// events again. Its first
// relist and the runtime's replay of recent events come within seconds,
// also on a full node; a minute leaves room for a slow start and costs the
// next read no more than a minute of this node's messages.
const readBackHold = time.Minute

// readBackInactive is how long the server keeps the read's consumer when
// the Publisher is gone without deleting it (a crash during the read).
const readBackInactive = 30 * time.Second

// storedSet is what the read found: the stream sequence of each message id
// this node stored from Restart.From, the events of those it decoded in
// stream order, and the stream's last sequence when the read started.
type storedSet struct {
	ids    map[string]uint64
	events []storedEvent
	// undecoded counts the messages whose event could not be decoded.
	undecoded int
	last      uint64
	// stream is the identity of the stream read.
	stream datadir.StreamIdentity
	// from is the first sequence the read covered; 0 when it started at a
	// time (Restart.Since), or read nothing.
	from uint64
	// renew, when not empty, says why the stream is not the one
	// Options.Checkpoint belongs to (history.go): the read covered all of
	// it.
	renew string
	// adopt says the checkpoint names no stream and adopts this one.
	adopt bool
}

// storedEvent is one decoded message of the read and its stream sequence.
type storedEvent struct {
	ev  generator.Event
	seq uint64
}

// readBack reads the stored set, retrying until it succeeds or ctx is
// done, and sends it on out, which has room for it. It logs the first
// failure of a series at Warn, and the success after failures at Info.
func (p *Publisher) readBack(ctx context.Context, out chan<- storedSet) {
	var reconnected chan nats.Status
	if nc := p.js.Conn(); nc != nil {
		reconnected = nc.StatusChanged(nats.CONNECTED)
		defer nc.RemoveStatusListener(reconnected)
	}
	start := time.Now()
	warned, waiting := false, false
	for failures := 0; ; {
		set, err := p.readStored(ctx)
		if err == nil {
			p.log.Info("read the messages an earlier run stored after its checkpoint; publishing starts",
				"stream", set.stream.String(), "messages", len(set.ids), "undecoded", set.undecoded, "from_sequence", set.from,
				"since", p.opts.Restart.Since, "to_sequence", set.last, "took", time.Since(start), "failed_attempts", failures)
			out <- set
			return
		}
		if ctx.Err() != nil {
			return
		}
		failures++
		delay := RetryDelay(p.opts.RetryBackoffMin, p.opts.RetryBackoffMax, failures)
		// With a checkpoint, whose stream it is, is known only once it
		// exists: a reinstall's stream is created by the bridge meanwhile.
		missing := p.opts.Restart.Checkpoint != nil && errors.Is(err, jetstream.ErrStreamNotFound)
		switch {
		case missing && !waiting:
			waiting = true
			p.log.Info("the stream does not exist (yet); nothing is published until it does",
				"stream", p.opts.Stream, "retry_in", delay, "err", err)
		case !missing && !warned:
			warned = true
			p.log.Warn("cannot read what an earlier run stored; nothing is published until then, retrying",
				"from_sequence", p.opts.Restart.From, "retry_in", delay, "err", err)
		default:
			p.log.Debug("read what an earlier run stored, will retry", "attempt", failures, "retry_in", delay, "err", err)
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-reconnected:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// readStored reads every message on this node's subjects stored from
// sequence Restart.From (or, with that 0, stored since Restart.Since) up
// to the stream's last sequence: its Nats-Msg-Id, and the event it reports
// (decodeStored). With a Checkpoint, it first tells whether the stream is
// the checkpoint's (history.go): if not, it reads from the stream's first
// sequence. A message it cannot decode is logged at Warn and counted, and
// only its id is kept. Each request is bounded by AckTimeout.
func (p *Publisher) readStored(ctx context.Context) (storedSet, error) {
	set := storedSet{ids: map[string]uint64{}}
	from, since := p.opts.Restart.From, p.opts.Restart.Since
	filter := p.enc.nodeSubjects()
	rctx, cancel := context.WithTimeout(ctx, p.opts.AckTimeout)
	defer cancel()
	stream, err := lookUpStream(rctx, p.js, p.opts.Stream, filter)
	if from == 0 && p.opts.Restart.Checkpoint == nil && errors.Is(err, jetstream.ErrStreamNotFound) {
		// No checkpoint sequence, no stream: a first start, with the
		// stream being set up. Nothing of this node's is stored.
		return set, nil
	}
	if err != nil {
		return set, err
	}
	info, err := stream.Info(rctx)
	if err != nil {
		return set, fmt.Errorf("get stream info: %w", err)
	}
	set.last = info.State.LastSeq
	set.stream = datadir.StreamIdentity{Name: info.Config.Name, Created: info.Created}
	if ck := p.opts.Restart.Checkpoint; ck != nil {
		if set.renew = renewal(ck, set.stream, set.last); set.renew != "" {
			from, since = 1, time.Time{}
		} else if _, named := ck.Stream(); !named {
			set.adopt = true
		}
	}
	set.from = from
	if set.last == 0 || (from == 0 && since.IsZero()) {
		return set, nil
	}
	if from > 0 && set.last < from {
		if from > 1 && set.last+1 < from {
			// The stream holds fewer messages than the checkpoint saw:
			// it was created anew (a purge keeps the sequence numbers).
			// Nothing after the checkpoint can be in it. With a
			// Checkpoint, history.go starts its history instead.
			p.log.Warn("the stream ends before the checkpoint's sequence: was it created anew?",
				"stream", info.Config.Name, "last_sequence", set.last, "checkpoint_sequence", from-1)
		}
		return set, nil
	}
	cfg := jetstream.ConsumerConfig{
		Description:       "pleg-bridge: reconciliation with an earlier run",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       from,
		FilterSubject:     filter,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: readBackInactive,
	}
	if from == 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, 0, &since
	}
	cons, err := stream.CreateConsumer(rctx, cfg)
	if err != nil {
		return set, fmt.Errorf("create consumer on stream %s: %w", info.Config.Name, err)
	}
	name := cons.CachedInfo().Name
	defer func() {
		// The consumer would go after readBackInactive; deleted now, it
		// does not linger in listings.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.AckTimeout)
		defer cancel()
		if err := stream.DeleteConsumer(dctx, name); err != nil {
			p.log.Debug("delete the reconciliation consumer", "consumer", name, "err", err)
		}
	}()
	pending := cons.CachedInfo().NumPending
	var delivered uint64 // consumer sequence of the last message
	for pending > 0 {
		if err := ctx.Err(); err != nil {
			return set, err
		}
		// No wait: the server sends what it has and says when it is
		// done, so the last pull does not wait out an expiry.
		batch, err := cons.FetchNoWait(int(min(pending, readBackBatch)))
		if err != nil {
			return set, fmt.Errorf("fetch from consumer %s: %w", name, err)
		}
		got := 0
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return set, fmt.Errorf("read message metadata: %w", err)
			}
			if md.Sequence.Consumer != delivered+1 {
				return set, fmt.Errorf("consumer %s skipped from delivery %d to %d: a message was lost on the way",
					name, delivered, md.Sequence.Consumer)
			}
			delivered = md.Sequence.Consumer
			got++
			pending = md.NumPending
			if md.Sequence.Stream > set.last {
				// Stored after the read started: not an earlier run's.
				pending = 0
				continue
			}
			id := m.Headers().Get(jetstream.MsgIDHeader)
			if id == "" {
				continue
			}
			set.ids[id] = md.Sequence.Stream
			ev, err := decodeStored(m)
			if err != nil {
				set.undecoded++
				p.metrics.readBackUndecoded.Inc()
				p.log.Warn("cannot decode a message this node stored after the checkpoint; its event is only recognised by id",
					"sequence", md.Sequence.Stream, "subject", m.Subject(), "err", err)
				continue
			}
			set.events = append(set.events, storedEvent{ev: ev, seq: md.Sequence.Stream})
		}
		if err := batch.Error(); err != nil {
			return set, fmt.Errorf("fetch from consumer %s: %w", name, err)
		}
		if got == 0 && pending > 0 {
			return set, fmt.Errorf("consumer %s delivered nothing with %d messages pending", name, pending)
		}
	}
	return set, nil
}

// lookUpStream returns the stream named name, or, if name is empty, the
// one whose subjects take subject.
func lookUpStream(ctx context.Context, js jetstream.JetStream, name, subject string) (jetstream.Stream, error) {
	if name == "" {
		n, err := js.StreamNameBySubject(ctx, subject)
		if err != nil {
			return nil, fmt.Errorf("look up the stream of %s: %w", subject, err)
		}
		name = n
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", name, err)
	}
	return s, nil
}
