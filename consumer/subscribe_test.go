package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// waitTimeout bounds every wait on the in-process server; the tests never
// come near it unless something is broken.
const waitTimeout = 10 * time.Second

// subscription runs Subscribe in a goroutine and hands its events, decode
// errors and result to the test through channels.
type subscription struct {
	events chan consumer.Event
	errs   chan error
	done   chan error
	cancel context.CancelFunc
}

func subscribe(t *testing.T, js jetstream.JetStream, opts consumer.Options) *subscription {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	s := &subscription{
		events: make(chan consumer.Event),
		errs:   make(chan error, 16),
		done:   make(chan error, 1),
		cancel: cancel,
	}
	opts.OnError = func(err error) { s.errs <- err }
	go func() {
		s.done <- consumer.Subscribe(ctx, js, opts, func(e consumer.Event) error {
			select {
			case s.events <- e:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// next returns the next n events, failing the test after waitTimeout.
func (s *subscription) next(t *testing.T, n int) []consumer.Event {
	t.Helper()
	var got []consumer.Event
	timeout := time.After(waitTimeout)
	for len(got) < n {
		select {
		case e := <-s.events:
			got = append(got, e)
		case err := <-s.done:
			t.Fatalf("Subscribe returned %v after %d of %d events", err, len(got), n)
		case <-timeout:
			t.Fatalf("got %d of %d events within %s", len(got), n, waitTimeout)
		}
	}
	return got
}

// stop cancels Subscribe and returns its result.
func (s *subscription) stop(t *testing.T) error {
	t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(waitTimeout):
		t.Fatalf("Subscribe did not return within %s of cancel", waitTimeout)
		return nil
	}
}

// consumerCreated subscribes to the stream's consumer-created advisories,
// so a test can wait until Subscribe's consumer exists.
func consumerCreated(t *testing.T, nc *nats.Conn) *nats.Subscription {
	t.Helper()
	sub, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.CREATED.PLEG.>")
	if err != nil {
		t.Fatalf("subscribe to advisories: %v", err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return sub
}

func TestSubscribeDeliversNewEventsUntilCanceled(t *testing.T) {
	t.Parallel()
	nc, js := newStream(t)
	old := died()
	old.containerID = "old"
	publishEvents(t, js, old)

	created := consumerCreated(t, nc)
	s := subscribe(t, js, consumer.Options{})
	if _, err := created.NextMsg(waitTimeout); err != nil {
		t.Fatalf("wait for the consumer: %v", err)
	}

	started, removed := died(), died()
	started.lifecycle, removed.lifecycle = "ContainerStarted", "ContainerRemoved"
	want := publishEvents(t, js, started, died(), removed)

	if diff := cmp.Diff(want, s.next(t, len(want))); diff != "" {
		t.Errorf("Subscribe delivered (-want +got):\n%s", diff)
	}
	if err := s.stop(t); err != nil {
		t.Errorf("Subscribe after cancel = %v, want nil", err)
	}
}

func TestSubscribeFromTheBeginningSkipsAndReportsBadMessages(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	first := publishEvents(t, js, died())
	publishRaw(t, js, "pleg.node-1.default.x.ContainerDied", "not a CloudEvent")
	removed := died()
	removed.lifecycle = "ContainerRemoved"
	want := append(first, publishEvents(t, js, removed)...)

	s := subscribe(t, js, consumer.Options{DeliverAll: true})
	if diff := cmp.Diff(want, s.next(t, len(want))); diff != "" {
		t.Errorf("Subscribe delivered (-want +got):\n%s", diff)
	}
	select {
	case err := <-s.errs:
		var de *consumer.DecodeError
		if !errors.As(err, &de) || de.Sequence != 2 || de.NATSSubject != "pleg.node-1.default.x.ContainerDied" {
			t.Errorf("OnError got %v, want a *DecodeError for message 2 on pleg.node-1.default.x.ContainerDied", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("OnError was not called for the bad message")
	}
	if err := s.stop(t); err != nil {
		t.Errorf("Subscribe after cancel = %v, want nil", err)
	}
}

func TestSubscribeFromStartTime(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	var fs []fixture
	for _, id := range []string{"a", "b", "c", "d"} {
		f := died()
		f.containerID = id
		fs = append(fs, f)
	}
	all := publishEvents(t, js, fs...)
	stored := storedTimes(t, js)
	start := stored[2]
	var want []consumer.Event
	for _, e := range all {
		if !stored[e.Sequence].Before(start) {
			want = append(want, e)
		}
	}

	s := subscribe(t, js, consumer.Options{StartTime: start})
	if diff := cmp.Diff(want, s.next(t, len(want))); diff != "" {
		t.Errorf("Subscribe from %s delivered (-want +got):\n%s", start, diff)
	}
}

func TestSubscribeFromStartSeq(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	var fs []fixture
	for _, id := range []string{"a", "b", "c", "d"} {
		f := died()
		f.containerID = id
		fs = append(fs, f)
	}
	all := publishEvents(t, js, fs...)
	s := subscribe(t, js, consumer.Options{StartSeq: all[2].Sequence})
	if diff := cmp.Diff(all[2:], s.next(t, 2)); diff != "" {
		t.Errorf("Subscribe from sequence %d delivered (-want +got):\n%s", all[2].Sequence, diff)
	}
}

// TestSubscribeSaysWhenItCaughtUp checks OnCaughtUp: after the last stored
// matching event, or at once when nothing stored matches.
func TestSubscribeSaysWhenItCaughtUp(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	start := died()
	start.lifecycle, start.exitCode, start.reason, start.containerID = "ContainerStarted", nil, "", "4c0a1e3d6f8b"
	again := died()
	again.containerID = "5d1b2f4e7a9c"
	publishEvents(t, js, died(), start, again)
	tests := []struct {
		name string
		opts consumer.Options
		want []string
	}{
		{name: "after the stored events", opts: consumer.Options{DeliverAll: true}, want: []string{"ContainerDied", "ContainerStarted", "ContainerDied", "caught up"}},
		{name: "after the stored events that match", opts: consumer.Options{DeliverAll: true, Filter: consumer.Filter{Type: "ContainerStarted"}}, want: []string{"ContainerStarted", "caught up"}},
		{name: "at once when nothing stored matches", opts: consumer.Options{DeliverAll: true, Filter: consumer.Filter{Type: "ContainerRemoved"}}, want: []string{"caught up"}},
		{name: "at once from now", opts: consumer.Options{}, want: []string{"caught up"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
			defer cancel()
			var got []string
			tt.opts.OnCaughtUp = func() {
				got = append(got, "caught up")
				cancel()
			}
			err := consumer.Subscribe(ctx, js, tt.opts, func(e consumer.Event) error {
				got = append(got, e.LifecycleType())
				return nil
			})
			if err != nil {
				t.Fatalf("Subscribe = %v", err)
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Fatalf("OnCaughtUp not called within %s; got %q", waitTimeout, got)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Subscribe delivered (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSubscribeReturnsTheCallbacksError(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	publishEvents(t, js, died(), died())
	errStop := errors.New("stop here")
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	calls := 0
	err := consumer.Subscribe(ctx, js, consumer.Options{DeliverAll: true}, func(consumer.Event) error {
		calls++
		return errStop
	})
	if !errors.Is(err, errStop) {
		t.Errorf("Subscribe = %v, want the callback's error", err)
	}
	if calls != 1 {
		t.Errorf("callback called %d times, want 1", calls)
	}
}

func TestSubscribeRefusesBadOptions(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)
	now := time.Now()
	tests := []struct {
		name    string
		opts    consumer.Options
		wantErr string
		wantIs  error
	}{
		{name: "an end time is for replay only", opts: consumer.Options{EndTime: now}, wantErr: "EndTime"},
		{name: "DeliverAll and StartTime contradict each other", opts: consumer.Options{DeliverAll: true, StartTime: now}, wantErr: "DeliverAll and StartTime"},
		{name: "StartSeq and StartTime contradict each other", opts: consumer.Options{StartSeq: 3, StartTime: now}, wantErr: "StartSeq"},
		{name: "StartSeq and DeliverAll contradict each other", opts: consumer.Options{StartSeq: 3, DeliverAll: true}, wantErr: "StartSeq"},
		{name: "an unknown type is named", opts: consumer.Options{Filter: consumer.Filter{Type: "Boom"}}, wantErr: `"Boom"`},
		{name: "a missing stream is named", opts: consumer.Options{Stream: "NOPE"}, wantErr: "NOPE", wantIs: jetstream.ErrStreamNotFound},
		{name: "a negative repeat window is named", opts: consumer.Options{Repeats: consumer.RepeatOptions{Window: -time.Minute}}, wantErr: "Repeats.Window -1m0s"},
		{name: "a negative repeat bound is named", opts: consumer.Options{Repeats: consumer.RepeatOptions{MaxIDs: -1}}, wantErr: "Repeats.MaxIDs -1"},
		{name: "a negative rollback check is named", opts: consumer.Options{RollbackCheck: -time.Second}, wantErr: "RollbackCheck -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
			defer cancel()
			err := consumer.Subscribe(ctx, js, tt.opts, func(consumer.Event) error { return nil })
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Subscribe = %v, want an error containing %q", err, tt.wantErr)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("Subscribe = %v, want it to wrap %v", err, tt.wantIs)
			}
		})
	}
}

// storedTimes returns the time the stream stored each message, by sequence
// (index 0 unused).
func storedTimes(t *testing.T, js jetstream.JetStream) []time.Time {
	t.Helper()
	stream, err := js.Stream(t.Context(), schemas.DefaultStream)
	if err != nil {
		t.Fatalf("look up stream: %v", err)
	}
	last := stream.CachedInfo().State.LastSeq
	times := make([]time.Time, last+1)
	for seq := uint64(1); seq <= last; seq++ {
		msg, err := stream.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		times[seq] = msg.Time
	}
	return times
}
