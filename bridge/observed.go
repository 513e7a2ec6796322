package bridge

import (
	"context"
	"slices"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// observedSink holds the events the generator sends to the definition of
// observedAt (docs/events.md): when the bridge observed the state an event
// reports, never before the bridge process that observed it started. The
// generator stamps an event with its observation's time, a relist's start
// or a stream payload's timestamp from the runtime; containerd 2.x keeps
// the payloads of the last 5 minutes while nobody listens and replays them
// to the next subscriber, so a starting bridge takes in, stamped before it
// existed, transitions that happened while no bridge ran. Those are
// stamped with the time the bridge took them in (Send), the generator's
// ordering of observations left as it is. It is safe for concurrent use.
type observedSink struct {
	generator.Sink
	// started is when the bridge process started observing: no
	// observation it made is older.
	started time.Time
}

func (s observedSink) Send(ctx context.Context, events []generator.Event) error {
	cloned := false
	var now time.Time
	for i := range events {
		if !events[i].ObservedAt.Before(s.started) {
			continue
		}
		if !cloned {
			// The generator keeps the events it sends until they are
			// recorded: its own stay as it made them.
			events, cloned, now = slices.Clone(events), true, time.Now()
		}
		events[i].ObservedAt = now
	}
	return s.Sink.Send(ctx, events)
}
