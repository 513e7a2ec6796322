package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

// containers returns n ContainerDied fixtures of different containers.
func containers(n int) []fixture {
	var fs []fixture
	for i := range n {
		f := died()
		f.containerID = fmt.Sprintf("c%d", i)
		f.container = fmt.Sprintf("app-%d", i)
		fs = append(fs, f)
	}
	return fs
}

func TestReplayReturnsTheStoredEventsInOrderAndEnds(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	fs := containers(5)
	want := publishEvents(t, js, fs[:2]...)
	publishRaw(t, js, "pleg.node-1.default.x.ContainerDied", "{}")
	want = append(want, publishEvents(t, js, fs[2:]...)...)

	var errs []error
	var got []consumer.Event
	err := consumer.Replay(t.Context(), js, consumer.Options{OnError: func(err error) { errs = append(errs, err) }}, collect(&got))
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Replay delivered (-want +got):\n%s", diff)
	}
	var de *consumer.DecodeError
	if len(errs) != 1 || !errors.As(errs[0], &de) || de.Sequence != 3 {
		t.Errorf("OnError got %v, want one *DecodeError for message 3", errs)
	}
}

func TestReplayWithNothingToDeliverEnds(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	if got := replayAll(t, js, consumer.Options{}); len(got) != 0 {
		t.Errorf("Replay of an empty stream delivered %d events", len(got))
	}
	publishEvents(t, js, containers(3)...)
	if got := replayAll(t, js, consumer.Options{Filter: consumer.Filter{Node: "node-2"}}); len(got) != 0 {
		t.Errorf("Replay of another node delivered %d events", len(got))
	}
	if got := replayAll(t, js, consumer.Options{StartTime: time.Now().Add(time.Hour)}); len(got) != 0 {
		t.Errorf("Replay from the future delivered %d events", len(got))
	}
}

func TestReplayStopsAtWhatWasStoredWhenItStarted(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	fs := containers(6)
	want := publishEvents(t, js, fs[:3]...)

	var got []consumer.Event
	err := consumer.Replay(t.Context(), js, consumer.Options{}, func(e consumer.Event) error {
		if len(got) == 0 {
			publishEvents(t, js, fs[3:]...) // arrive while Replay runs
		}
		got = append(got, e)
		return nil
	})
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Replay delivered (-want +got):\n%s", diff)
	}
}

func TestReplayTimeRange(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	all := publishEvents(t, js, containers(6)...)
	stored := storedTimes(t, js)

	between := func(start, end time.Time) []consumer.Event {
		var want []consumer.Event
		for _, e := range all {
			at := stored[e.Sequence]
			if (start.IsZero() || !at.Before(start)) && (end.IsZero() || !at.After(end)) {
				want = append(want, e)
			}
		}
		return want
	}
	tests := []struct {
		name       string
		start, end time.Time
	}{
		{name: "a start and an end select the events stored between them", start: stored[2], end: stored[4]},
		{name: "an end alone selects from the beginning", end: stored[3]},
		{name: "a start alone selects up to the last event", start: stored[5]},
		{name: "an instant selects the event stored then", start: stored[4], end: stored[4]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			want := between(tt.start, tt.end)
			got := replayAll(t, js, consumer.Options{StartTime: tt.start, EndTime: tt.end})
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Replay from %s to %s delivered (-want +got):\n%s", tt.start, tt.end, diff)
			}
		})
	}
}

func TestReplayReturnsTheCallbacksError(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	publishEvents(t, js, containers(3)...)
	errStop := errors.New("stop here")
	calls := 0
	err := consumer.Replay(t.Context(), js, consumer.Options{}, func(consumer.Event) error {
		calls++
		return errStop
	})
	if !errors.Is(err, errStop) || calls != 1 {
		t.Errorf("Replay = %v after %d calls, want the callback's error after 1", err, calls)
	}
}

func TestReplayErrors(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	publishEvents(t, js, containers(1)...)
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	now := time.Now()
	tests := []struct {
		name    string
		ctx     context.Context
		opts    consumer.Options
		wantErr string
	}{
		{name: "an end before the start is refused", ctx: t.Context(), opts: consumer.Options{StartTime: now, EndTime: now.Add(-time.Minute)}, wantErr: "before start time"},
		{name: "a missing stream is named", ctx: t.Context(), opts: consumer.Options{Stream: "NOPE"}, wantErr: "NOPE"},
		{name: "a bad prefix is named", ctx: t.Context(), opts: consumer.Options{SubjectPrefix: "a..b"}, wantErr: "subject prefix"},
		{name: "a canceled context ends it with the context's error", ctx: canceled, wantErr: context.Canceled.Error()},
		{name: "a negative repeat window is named", ctx: t.Context(), opts: consumer.Options{Repeats: consumer.RepeatOptions{Window: -time.Minute}}, wantErr: "Repeats.Window -1m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := consumer.Replay(tt.ctx, js, tt.opts, func(consumer.Event) error { return nil })
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Replay = %v, want an error containing %q", err, tt.wantErr)
			}
			if tt.ctx.Err() != nil && !errors.Is(err, tt.ctx.Err()) {
				t.Errorf("Replay = %v, want it to wrap %v", err, tt.ctx.Err())
			}
		})
	}
}
