package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// consumerDeleteTimeout bounds the clean-up request when Subscribe or Replay
// returns. The server removes an abandoned consumer by itself after its
// inactive threshold, so giving up early loses nothing.
const consumerDeleteTimeout = 2 * time.Second

// Subscribe follows the events that match opts.Filter and calls fn for each,
// in stream order, from the goroutine that called it. fn takes no context:
// it runs within the call, so ctx is its context too (Consume's handler
// takes one because it runs on goroutines of its own). It starts with the
// events published from now on, or with those stored since opts.StartTime
// or since the beginning of the stream (opts.DeliverAll).
//
// It blocks until ctx is done, then returns nil, or until fn returns an
// error, which it returns unchanged. A message that does not decode is
// skipped and reported to opts.OnError. It uses an ordered consumer, which
// the nats.go library recreates after a reconnect or a gap, so no event is
// skipped or delivered twice while Subscribe runs. An event that the stream
// holds again at a later sequence, with the same id, is dropped within
// opts.Repeats' window (RepeatOptions). The consumer is deleted on return.
// opts.EndTime must be zero; bounded reads are Replay's job.
//
// A stream whose servers lost messages they had acknowledged and came
// back with an older store stores new messages at sequences Subscribe
// has read already, which the ordered consumer, resuming after the last
// sequence it read, would never deliver. So Subscribe checks that the
// stream still holds the last message it read (a get of that message,
// and the stream's info if it is gone): before it hands on the first
// message of a consumer that nats.go recreated, at once after the
// connection reconnects, and every opts.RollbackCheck. If not, it reads
// again from where the stream diverged, drops what it had delivered as
// repeats, and reports the rollback once to opts.OnRollback (Rollback).
func Subscribe(ctx context.Context, js jetstream.JetStream, opts Options, fn func(Event) error) error {
	if !opts.EndTime.IsZero() {
		return errors.New("subscribe: EndTime is for Replay only")
	}
	if opts.RollbackCheck < 0 {
		return fmt.Errorf("subscribe: option RollbackCheck %s is negative", opts.RollbackCheck)
	}
	lookup := lookupOnce(js, opts.stream())
	cfg, err := opts.consumerConfig(ctx, lookup, jetstream.DeliverNewPolicy)
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	cons, err := js.OrderedConsumer(ctx, opts.stream(), cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("create consumer on stream %s: %w", opts.stream(), err)
	}
	caughtUp := opts.OnCaughtUp
	if info := cons.CachedInfo(); caughtUp != nil && info != nil && info.NumPending == 0 {
		caughtUp()
		caughtUp = nil
	}
	f := &follower{js: js, opts: opts, cfg: cfg, cons: cons, check: rollbackCheck{lookup: lookup}}
	defer func() { deleteConsumer(ctx, js, opts.stream(), f.cons) }()
	if f.it, err = cons.Messages(); err != nil {
		return fmt.Errorf("consume stream %s: %w", opts.stream(), err)
	}
	defer func() { f.it.Stop() }()

	var w waker
	interval := cmp.Or(opts.RollbackCheck, DefaultRollbackCheck)
	w.rearm(ctx, interval)
	// CONNECTED, registered once connected, is each reconnect.
	reconnected := js.Conn().StatusChanged(nats.CONNECTED)
	var wg sync.WaitGroup
	wctx, stop := context.WithCancel(ctx)
	wg.Go(func() { w.watch(wctx, reconnected) })
	defer func() {
		stop()
		wg.Wait()
		js.Conn().RemoveStatusListener(reconnected)
		w.stop()
	}()

	recent := opts.Repeats.newRecent()
	for {
		msg, err := f.it.Next(jetstream.NextContext(w.wait()))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("read stream %s: %w", opts.stream(), err)
		}
		if w.due() {
			// A check is due, or the connection reconnected: make sure
			// the last sequence read is still what was read before
			// handing on anything after it.
			restarted, err := f.rollback(ctx)
			next := interval
			if err != nil {
				next = rollbackRetry
			}
			w.rearm(ctx, next)
			if restarted {
				continue
			}
		}
		if err != nil {
			continue
		}
		meta, merr := msg.Metadata()
		if merr == nil {
			if f.consumer != "" && meta.Consumer != f.consumer {
				// nats.go recreated its consumer after the last sequence
				// read: the same check before handing on its first
				// message.
				restarted, err := f.rollback(ctx)
				if err != nil {
					w.rearm(ctx, rollbackRetry)
				}
				if restarted {
					continue
				}
			}
			f.consumer = meta.Consumer
			f.check.read(readPos{seq: meta.Sequence.Stream, id: msg.Headers().Get(jetstream.MsgIDHeader), stored: meta.Timestamp})
		}
		if e, ok := opts.decode(msg); ok && (merr != nil || !opts.Repeats.drop(recent, e, meta.Timestamp)) {
			if err := fn(e); err != nil {
				return err
			}
		}
		if caughtUp != nil && merr == nil && meta.NumPending == 0 {
			caughtUp()
			caughtUp = nil
		}
	}
}

// follower is Subscribe's ordered consumer and iterator, which it replaces
// when it reads again after a rollback. It is used from Subscribe's
// goroutine.
type follower struct {
	js   jetstream.JetStream
	opts Options
	cfg  jetstream.OrderedConsumerConfig
	cons jetstream.Consumer
	it   jetstream.MessagesContext
	// consumer is the name of the server's consumer that delivered the
	// last message: nats.go names each one it creates anew.
	consumer string
	check    rollbackCheck
}

// rollback checks whether the stream still holds what was read last and,
// if not, reads again from where it diverged and reports the rollback. It
// returns whether it did; an error means it could not tell or could not
// start reading again, and should be tried again soon.
func (f *follower) rollback(ctx context.Context) (bool, error) {
	p, last, streamLast, err := f.check.check(ctx)
	if err != nil || p == nil {
		return false, err
	}
	cfg := f.cfg
	cfg.OptStartSeq, cfg.OptStartTime = 0, nil
	if p.seq != 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, p.seq
	} else {
		after := p.after.Add(time.Nanosecond)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &after
	}
	cons, err := f.js.OrderedConsumer(ctx, f.opts.stream(), cfg)
	if err != nil {
		return false, fmt.Errorf("create consumer on stream %s: %w", f.opts.stream(), err)
	}
	it, err := cons.Messages()
	if err != nil {
		deleteConsumer(ctx, f.js, f.opts.stream(), cons)
		return false, fmt.Errorf("consume stream %s: %w", f.opts.stream(), err)
	}
	f.it.Stop()
	deleteConsumer(ctx, f.js, f.opts.stream(), f.cons)
	f.cons, f.it, f.consumer = cons, it, ""
	f.check.forget(p.seq)
	lastRead := last.seq
	if f.opts.OnRollback != nil {
		f.opts.OnRollback(Rollback{LastRead: lastRead, StreamLast: streamLast, From: p.seq, After: p.after})
	}
	return true, nil
}

// readMessages hands each message of cons to each, in order, until each says
// it is done or fails, or ctx ends (then it returns ctx.Err()).
func readMessages(ctx context.Context, cons jetstream.Consumer, stream string, each func(jetstream.Msg) (done bool, err error)) error {
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("consume stream %s: %w", stream, err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("read stream %s: %w", stream, err)
		}
		if done, err := each(msg); done || err != nil {
			return err
		}
	}
}

// deleteConsumer removes the server side of an ordered consumer, best
// effort: on failure the server still removes it after its inactive
// threshold.
func deleteConsumer(ctx context.Context, js jetstream.JetStream, stream string, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), consumerDeleteTimeout)
	defer cancel()
	_ = js.DeleteConsumer(ctx, stream, info.Name)
}
