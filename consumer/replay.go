package consumer

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Replay delivers the stored events that match opts.Filter to fn, in stream
// order, from the goroutine that called it: from opts.StartTime, or from the
// beginning of the stream, up to opts.EndTime, and never beyond the last
// message the stream held when Replay started, so it ends even while events
// keep arriving. It returns nil once it has delivered them all.
//
// It does not wait for the end by a timeout: it stops when the consumer
// reports nothing pending, at the stream's last sequence taken at the start,
// or at the first message stored after opts.EndTime. It returns ctx.Err()
// if ctx ends first, and an error from fn unchanged. A message that does not
// decode is skipped and reported to opts.OnError. opts.DeliverAll has no
// effect.
//
// History is judged as Subscribe judges live events: an event the stream
// holds twice with the same id (published again by its bridge after the
// servers lost it, where a copy of the first survived) is delivered once,
// at its first sequence, if the second was stored within opts.Repeats'
// window of the first. A Replay that starts between the two delivers the
// second.
//
// Messages removed by the stream's limits while Replay runs are not
// delivered; if the last pending one is removed before it is read, Replay
// waits for the next matching message or for ctx.
func Replay(ctx context.Context, js jetstream.JetStream, opts Options, fn func(Event) error) error {
	opts.DeliverAll = false
	lookup := lookupOnce(js, opts.stream())
	cfg, err := opts.consumerConfig(ctx, lookup, jetstream.DeliverAllPolicy)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	stream, err := lookup(ctx)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", opts.stream(), err)
	}
	last := stream.CachedInfo().State.LastSeq
	if last == 0 {
		return nil
	}
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("create consumer on stream %s: %w", opts.stream(), err)
	}
	defer deleteConsumer(ctx, js, opts.stream(), cons)
	// The consumer is created above, so its cached info counts what matched
	// at creation.
	if info := cons.CachedInfo(); info == nil || info.NumPending == 0 {
		return nil
	}
	recent := opts.Repeats.newRecent()
	return readMessages(ctx, cons, opts.stream(), func(msg jetstream.Msg) (bool, error) {
		meta, err := msg.Metadata()
		if err != nil {
			return true, fmt.Errorf("read message metadata: %w", err)
		}
		if meta.Sequence.Stream > last || (!opts.EndTime.IsZero() && meta.Timestamp.After(opts.EndTime)) {
			return true, nil
		}
		if e, ok := opts.decode(msg); ok && !opts.Repeats.drop(recent, e, meta.Timestamp) {
			if err := fn(e); err != nil {
				return true, err
			}
		}
		return meta.NumPending == 0 || meta.Sequence.Stream == last, nil
	})
}
