package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

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
func Subscribe(ctx context.Context, js jetstream.JetStream, opts Options, fn func(Event) error) error {
	if !opts.EndTime.IsZero() {
		return errors.New("subscribe: EndTime is for Replay only")
	}
	cfg, err := opts.consumerConfig(ctx, lookupOnce(js, opts.stream()), jetstream.DeliverNewPolicy)
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
	defer deleteConsumer(ctx, js, opts.stream(), cons)
	caughtUp := opts.OnCaughtUp
	if info := cons.CachedInfo(); caughtUp != nil && info != nil && info.NumPending == 0 {
		caughtUp()
		caughtUp = nil
	}
	recent := opts.Repeats.newRecent()
	err = readMessages(ctx, cons, opts.stream(), func(msg jetstream.Msg) (bool, error) {
		meta, merr := msg.Metadata()
		if e, ok := opts.decode(msg); ok && (merr != nil || !opts.Repeats.drop(recent, e, meta.Timestamp)) {
			if err := fn(e); err != nil {
				return true, err
			}
		}
		if caughtUp != nil && merr == nil && meta.NumPending == 0 {
			caughtUp()
			caughtUp = nil
		}
		return false, nil
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
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
