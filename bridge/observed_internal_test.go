package bridge

import (
	"context"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

type sentEvents struct{ got []generator.Event }

func (s *sentEvents) Send(_ context.Context, events []generator.Event) error {
	s.got = append(s.got, events...)
	return nil
}

// TestObservedSinkStampsWhatPrecedesTheBridge: an event observed before the
// bridge started is stamped when the sink takes it in; the others keep
// their time; the generator's slice is left as it was.
func TestObservedSinkStampsWhatPrecedesTheBridge(t *testing.T) {
	t.Parallel()
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	inner := &sentEvents{}
	s := observedSink{Sink: inner, started: started}
	replayed := generator.Event{Type: generator.ContainerDied, ObservedAt: started.Add(-time.Minute)}
	relisted := generator.Event{Type: generator.ContainerStarted, ObservedAt: started}
	events := []generator.Event{relisted, replayed}
	before := time.Now()
	if err := s.Send(t.Context(), events); err != nil {
		t.Fatal(err)
	}
	if got := inner.got[0].ObservedAt; !got.Equal(started) {
		t.Errorf("an event observed as the bridge started: observedAt %v, want %v", got, started)
	}
	if got := inner.got[1].ObservedAt; got.Before(before) || got.After(time.Now()) {
		t.Errorf("an event observed before the bridge started: observedAt %v, want when it was sent", got)
	}
	if !events[1].ObservedAt.Equal(started.Add(-time.Minute)) {
		t.Errorf("the generator's event was changed: observedAt %v", events[1].ObservedAt)
	}
}
