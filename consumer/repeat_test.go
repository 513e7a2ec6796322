package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// The repeats these tests make are what a bridge's repair publishes after
// the NATS servers lost events they had acknowledged: the same CloudEvent,
// with the same id as its Nats-Msg-Id, stored again at a later sequence.
// The stream's duplicate window is short (100 ms, the server's least), and
// publishtest.WaitOutDuplicateWindow lets the server forget the id first,
// as a server that lost the event has forgotten it.

// shortWindowStream starts an in-process JetStream server with the
// pleg-bridge stream (prefix "pleg") whose duplicate window is 100 ms, and
// returns its URL and a JetStream handle.
func shortWindowStream(t *testing.T) (string, jetstream.JetStream) {
	t.Helper()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{SubjectPrefix: "pleg", DuplicateWindow: 100 * time.Millisecond}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	return url, js
}

// publishAsBridge publishes each fixture in structured mode with its id as
// the Nats-Msg-Id, as the bridge does, and returns the events Decode makes
// of them with their stream sequences. It fails the test if the stream
// takes one for a duplicate.
func publishAsBridge(t *testing.T, js jetstream.JetStream, fs ...fixture) []consumer.Event {
	t.Helper()
	var events []consumer.Event
	for _, f := range fs {
		h, body := f.structured(t)
		h.Set(jetstream.MsgIDHeader, f.id())
		subject := f.subject("pleg")
		ack, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: subject, Header: h, Data: body})
		if err != nil {
			t.Fatalf("publish %s: %v", subject, err)
		}
		if ack.Duplicate {
			t.Fatalf("the stream took %s (%s) for a duplicate of sequence %d", f.id(), subject, ack.Sequence)
		}
		e := f.event(t, subject)
		e.Sequence = ack.Sequence
		events = append(events, e)
	}
	return events
}

// republish publishes f again as a bridge's repair does once the stream
// lost it: after the stream forgot its id, the same message.
func republish(t *testing.T, js jetstream.JetStream, f fixture) consumer.Event {
	t.Helper()
	publishtest.WaitOutDuplicateWindow(t, js, "PLEG")
	return publishAsBridge(t, js, f)[0]
}

// repeatsOf returns RepeatOptions that send each repeat to the returned
// channel, which holds up to 16.
func repeatsOf() (consumer.RepeatOptions, chan consumer.Repeat) {
	ch := make(chan consumer.Repeat, 16)
	return consumer.RepeatOptions{OnRepeat: func(r consumer.Repeat) { ch <- r }}, ch
}

// checkRepeats fails the test unless ch holds exactly want.
func checkRepeats(t *testing.T, ch chan consumer.Repeat, want ...consumer.Repeat) {
	t.Helper()
	var got []consumer.Repeat
	for len(ch) > 0 {
		got = append(got, <-ch)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("repeats reported (-want +got):\n%s", diff)
	}
}

func TestSubscribeDropsAnEventItDeliveredBeforeWhenTheStreamHoldsItAgain(t *testing.T) {
	t.Parallel()
	_, js := shortWindowStream(t)
	fs := containers(4)
	first := publishAsBridge(t, js, fs[:3]...)
	repeats, reported := repeatsOf()
	s := subscribe(t, js, consumer.Options{DeliverAll: true, Repeats: repeats})
	if diff := cmp.Diff(first, s.next(t, 3)); diff != "" {
		t.Fatalf("Subscribe delivered (-want +got):\n%s", diff)
	}

	again := republish(t, js, fs[1])
	last := publishAsBridge(t, js, fs[3])
	// The event after the repeat comes next: the repeat was not delivered.
	if diff := cmp.Diff(last, s.next(t, 1)); diff != "" {
		t.Errorf("after the repeat Subscribe delivered (-want +got):\n%s", diff)
	}
	checkRepeats(t, reported, consumer.Repeat{Event: again, FirstSequence: first[1].Sequence})
}

func TestSubscribeWithRepeatsOffDeliversTheRepeat(t *testing.T) {
	t.Parallel()
	_, js := shortWindowStream(t)
	fs := containers(2)
	first := publishAsBridge(t, js, fs...)
	s := subscribe(t, js, consumer.Options{DeliverAll: true, Repeats: consumer.RepeatOptions{Off: true}})
	if diff := cmp.Diff(first, s.next(t, 2)); diff != "" {
		t.Fatalf("Subscribe delivered (-want +got):\n%s", diff)
	}
	again := republish(t, js, fs[0])
	if diff := cmp.Diff([]consumer.Event{again}, s.next(t, 1)); diff != "" {
		t.Errorf("with Repeats.Off, Subscribe delivered (-want +got):\n%s", diff)
	}
}

func TestReplayDeliversAnEventTheStreamHoldsTwiceOnce(t *testing.T) {
	t.Parallel()
	_, js := shortWindowStream(t)
	fs := containers(4)
	want := publishAsBridge(t, js, fs[:3]...)
	again := republish(t, js, fs[1])
	want = append(want, publishAsBridge(t, js, fs[3])...)

	t.Run("from the beginning, the repeat is dropped", func(t *testing.T) {
		repeats, reported := repeatsOf()
		got := replayAll(t, js, consumer.Options{Repeats: repeats})
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Replay delivered (-want +got):\n%s", diff)
		}
		checkRepeats(t, reported, consumer.Repeat{Event: again, FirstSequence: want[1].Sequence})
	})
	t.Run("from after the first copy, the second is the only one", func(t *testing.T) {
		repeats, reported := repeatsOf()
		got := replayAll(t, js, consumer.Options{StartSeq: want[2].Sequence, Repeats: repeats})
		if diff := cmp.Diff([]consumer.Event{want[2], again, want[3]}, got); diff != "" {
			t.Errorf("Replay delivered (-want +got):\n%s", diff)
		}
		checkRepeats(t, reported)
	})
	t.Run("with a window shorter than between the copies, both are delivered", func(t *testing.T) {
		// The second copy was stored after the stream forgot the id, so
		// more than 100 ms after the first.
		got := replayAll(t, js, consumer.Options{Repeats: consumer.RepeatOptions{Window: 50 * time.Millisecond}})
		if diff := cmp.Diff([]consumer.Event{want[0], want[1], want[2], again, want[3]}, got); diff != "" {
			t.Errorf("Replay delivered (-want +got):\n%s", diff)
		}
	})
}

func TestConsumeGroupDoesNotReceiveARepeatWhicheverMemberHandledTheFirst(t *testing.T) {
	t.Parallel()
	url, js := shortWindowStream(t)
	// Events of one pod, so of one partition: the handler is given the
	// event after the repeat only once the repeat is out of the way.
	fs := podEvents(1, 4)
	repeats, reported := repeatsOf()
	opts := consumer.DurableOptions{Name: "repeats", DeliverAll: true, OnDeadLetter: ignoreDeadLetters, Repeats: repeats}
	first := publishAsBridge(t, js, fs[:3]...)
	calls := make(chan consumer.Event)
	m := startMember(t, url, opts, handled(calls, nil))
	if diff := cmp.Diff(first, receive(t, calls, 3)); diff != "" {
		t.Fatalf("handler got (-want +got):\n%s", diff)
	}
	if err := m.stop(t); err != nil {
		t.Fatalf("Consume after cancel = %v, want nil", err)
	}

	// Another member, which has handled nothing: the work stream's
	// duplicate window keeps the repeat from the group.
	other := startMember(t, url, opts, handled(calls, nil))
	republish(t, js, fs[1])
	last := publishAsBridge(t, js, fs[3])
	if diff := cmp.Diff(last, receive(t, calls, 1)); diff != "" {
		t.Errorf("after the repeat the other member's handler got (-want +got):\n%s", diff)
	}
	if err := other.stop(t); err != nil {
		t.Errorf("Consume after cancel = %v, want nil", err)
	}
	checkRepeats(t, reported) // the server dropped it: no member saw it
	checkDrained(t, js, opts)
}

func TestConsumeMemberAcknowledgesARepeatOfAnEventItHandled(t *testing.T) {
	t.Parallel()
	url, js := shortWindowStream(t)
	fs := podEvents(1, 4)
	repeats, reported := repeatsOf()
	opts := consumer.DurableOptions{Name: "repeats", DeliverAll: true, OnDeadLetter: ignoreDeadLetters, Repeats: repeats}

	// The group is made without a duplicate window on its work stream, as
	// groups were before it had one (and as Repeats.Off makes them), so
	// the repeat reaches the member.
	off := opts
	off.Repeats = consumer.RepeatOptions{Off: true}
	maker := startMember(t, url, off, func(context.Context, consumer.Event) error { return nil })
	publishtest.WaitStream(t, js, opts.WorkStream())
	if err := maker.stop(t); err != nil {
		t.Fatalf("Consume after cancel = %v, want nil", err)
	}

	first := publishAsBridge(t, js, fs[:3]...)
	calls := make(chan consumer.Event)
	m := startMember(t, url, opts, handled(calls, nil))
	if diff := cmp.Diff(first, receive(t, calls, 3)); diff != "" {
		t.Fatalf("handler got (-want +got):\n%s", diff)
	}
	again := republish(t, js, fs[1])
	last := publishAsBridge(t, js, fs[3])
	if diff := cmp.Diff(last, receive(t, calls, 1)); diff != "" {
		t.Errorf("after the repeat the handler got (-want +got):\n%s", diff)
	}
	if err := m.stop(t); err != nil {
		t.Errorf("Consume after cancel = %v, want nil", err)
	}
	checkRepeats(t, reported, consumer.Repeat{Event: again, FirstSequence: first[1].Sequence})
	checkDrained(t, js, opts)
}

func TestWatchStateDropsAnUpdateThatRepeatsTheContainersLastEvent(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	n1 := newStateNode(t, js, "node-1")
	a, b := key("node-1", "shop", "web-0", "u1", "a"), key("node-1", "shop", "web-0", "u1", "b")
	n1.record(generator.ContainerStarted, "shop", "web-0", "u1", "a")
	waitKeys(t, js, a)

	repeats, reported := repeatsOf()
	w := watchState(t, js, consumer.StateOptions{Repeats: repeats})
	for i, want := range []string{"listed " + a + " ContainerStarted", "synced", "updated " + a + " ContainerDied"} {
		if i == 2 {
			n1.record(generator.ContainerDied, "shop", "web-0", "u1", "a")
		}
		if got := w.next(t); got != want {
			t.Fatalf("change %q, want %q", got, want)
		}
	}

	// a's Died written again, as a bridge repairs a bucket that lost it.
	kv, err := js.KeyValue(t.Context(), testBucket)
	if err != nil {
		t.Fatal(err)
	}
	died, err := kv.Get(t.Context(), a)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(t.Context(), a, died.Value())
	if err != nil {
		t.Fatal(err)
	}
	n1.record(generator.ContainerStarted, "shop", "web-0", "u1", "b")
	if got, want := w.next(t), "updated "+b+" ContainerStarted"; got != want {
		t.Errorf("after the repeat, change %q, want %q", got, want)
	}
	if len(reported) != 1 {
		t.Fatalf("%d repeats reported, want 1", len(reported))
	}
	r := <-reported
	if r.Event.LifecycleType() != "ContainerDied" || r.Event.Sequence != rev || r.FirstSequence != died.Revision() {
		t.Errorf("repeat reported: %s at revision %d, first %d; want ContainerDied at %d, first %d",
			r.Event.LifecycleType(), r.Event.Sequence, r.FirstSequence, rev, died.Revision())
	}
}
