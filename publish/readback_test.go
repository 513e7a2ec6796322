package publish_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// shortWindow is the shortest duplicate window JetStream accepts: the
// tests below wait it out.
const shortWindow = 100 * time.Millisecond

// ensureShortWindowStream creates the stream PLEG with the shortest
// duplicate window.
func ensureShortWindowStream(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{SubjectPrefix: "pleg", DuplicateWindow: shortWindow}); err != nil {
		t.Fatalf("EnsureStream: %v", err)
	}
}

// waitAcked returns the next n acks OnAck reports, with their watermarks.
func (f *fixture) waitAcked(t *testing.T, n int) []ackedEvent {
	t.Helper()
	got := make([]ackedEvent, 0, n)
	deadline := time.After(waitTimeout)
	for len(got) < n {
		select {
		case a := <-f.acks:
			got = append(got, a)
		case <-deadline:
			t.Fatalf("got %d acks within %s, want %d", len(got), waitTimeout, n)
		}
	}
	return got
}

// TestARestartAfterTheDuplicateWindowDoesNotStoreWhatTheCrashForgot is the
// crash the checkpoint cannot cover: an earlier run had events acked whose
// acks were never written, and the restart comes after the stream's
// duplicate window. The restarted generator reports them again; the
// Publisher finds them in the stream and publishes only what is new, also
// for two containers of one pod started after the checkpoint (their
// messages share a subject), and not fooled by another node's message with
// the id of a new event.
func TestARestartAfterTheDuplicateWindowDoesNotStoreWhatTheCrashForgot(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ensureShortWindowStream(t, js)

	// The first run: one event whose ack the checkpoint wrote, with the
	// watermark, then three whose acks the crash lost.
	first := newFixtureOn(t, js, publish.Options{Stream: "PLEG", DuplicateWindow: shortWindow})
	stop := first.run(t)
	recorded := testEvent("pod-a", 0)
	first.send(t, recorded)
	checkpoint := first.waitAcked(t, 1)[0].seq
	if checkpoint == 0 {
		t.Fatal("OnAck reported watermark 0 for an acked event")
	}
	forgotten := []generator.Event{testEvent("pod-a", 1), testEvent("pod-a", 2), testEvent("pod-b", 0)}
	first.send(t, forgotten...)
	first.waitAcks(t, len(forgotten))
	stop()

	// Another node stores an event with the id of one this node is about
	// to publish: it is not this node's, so it must not count.
	fresh := []generator.Event{testEvent("pod-a", 3), testEvent("pod-c", 0)}
	other := encode(t, newEncoder(t, publish.EncoderOptions{Node: "node-2"}), fresh[1])
	if _, err := js.PublishMsg(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	publishtest.WaitOutDuplicateWindow(t, js, "PLEG")

	second := newFixtureOn(t, js, publish.Options{Stream: "PLEG", DuplicateWindow: shortWindow, Restart: publish.Restart{From: checkpoint + 1}})
	second.run(t)
	// As the generator seeded with the checkpoint reports them: the
	// forgotten events again, among new ones.
	second.send(t, forgotten[0], forgotten[1], fresh[0], forgotten[2], fresh[1])
	acked := second.waitAcked(t, 5)

	all := []generator.Event{recorded, forgotten[0], forgotten[1], forgotten[2], fresh[0], fresh[1]}
	msgs := fetchAll(t, js, len(all)+1) // and node-2's
	var mine []jetstream.Msg
	for _, m := range msgs {
		if m.Subject() != other.Subject {
			mine = append(mine, m)
		}
	}
	checkPerPodOrder(t, mine, all)
	for result, want := range map[string]float64{"reconciled": 3, "stored": 0, "missing": 0} {
		if got := metricstest.Value(t, second.reg, "pleg_bridge_publish_checks_total", map[string]string{"result": result}); got != want {
			t.Errorf("pleg_bridge_publish_checks_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	if got := metricstest.Value(t, second.reg, "pleg_bridge_publish_total", map[string]string{"result": "acked"}); got != 2 {
		t.Errorf("pleg_bridge_publish_total{result=\"acked\"} = %v, want 2: only the new events published", got)
	}
	// The watermark never goes back, and stays at the checkpoint while
	// what the read found is not all reported again.
	for i, a := range acked {
		if a.seq < checkpoint {
			t.Errorf("ack %d (%s): watermark %d is below the checkpoint's %d", i, a.ev.Container.ID, a.seq, checkpoint)
		}
		if i > 0 && a.seq < acked[i-1].seq {
			t.Errorf("ack %d: watermark went back from %d to %d", i, acked[i-1].seq, a.seq)
		}
	}
	second.waitLog(t, "recognised the events an earlier run stored")
}

// TestSpoolEntriesOfACrashedRunAreRecognisedInTheStream: the earlier run
// published two spool entries of one pod, the same event type for two
// containers, and crashed before their acks and Done were written. The
// last message on their subject is the second entry's; the read knows both.
func TestSpoolEntriesOfACrashedRunAreRecognisedInTheStream(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ensureShortWindowStream(t, js)
	enc := newEncoder(t, publish.EncoderOptions{})

	recorded := testEvent("pod-a", 0)
	ack, err := js.PublishMsg(t.Context(), encode(t, enc, recorded))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, closeStore := openStore(t, dir, 1<<20)
	landed := []generator.Event{testEvent("pod-a", 1), testEvent("pod-a", 2)}
	notLanded := testEvent("pod-a", 3)
	if n := st.Spool().Append(append(landed, notLanded)); n != 3 {
		t.Fatalf("Append stored %d events, want 3", n)
	}
	for _, ev := range landed {
		if _, err := js.PublishMsg(t.Context(), encode(t, enc, ev)); err != nil {
			t.Fatal(err)
		}
	}
	closeStore()
	publishtest.WaitOutDuplicateWindow(t, js, "PLEG")

	st, _ = openStore(t, dir, 1<<20)
	// No stream name: the read finds the stream by this node's subjects.
	f := newFixtureOn(t, js, publish.Options{Encoder: enc, Spool: st.Spool(),
		DuplicateWindow: shortWindow, Restart: publish.Restart{From: ack.Sequence + 1}})
	f.run(t)
	f.waitAcks(t, 3)
	checkPerPodOrder(t, fetchAll(t, js, 4), []generator.Event{recorded, landed[0], landed[1], notLanded})
	for result, want := range map[string]float64{"reconciled": 2, "stored": 0, "missing": 0} {
		if got := metricstest.Value(t, f.reg, "pleg_bridge_publish_checks_total", map[string]string{"result": result}); got != want {
			t.Errorf("pleg_bridge_publish_checks_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	if got := st.Spool().Len(); got != 0 {
		t.Errorf("spool holds %d entries after delivery, want 0", got)
	}
}

// TestNothingIsPublishedBeforeTheStreamIsReadBack starts a Publisher with
// something to reconcile and no stream: the read fails and is retried, and
// no publish is attempted until it succeeds once the stream exists.
func TestNothingIsPublishedBeforeTheStreamIsReadBack(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	f := newFixtureOn(t, js, publish.Options{
		Stream:          "PLEG",
		Restart:         publish.Restart{From: 5},
		RetryBackoffMin: 20 * time.Millisecond,
		RetryBackoffMax: 50 * time.Millisecond,
	})
	f.run(t)
	evs := []generator.Event{testEvent("pod-a", 0), testEvent("pod-b", 0)}
	f.send(t, evs...)
	f.waitLog(t, "cannot read what an earlier run stored")
	// Two more failed reads: a publish attempted meanwhile is in flight by
	// now (nats.go retries a publish nothing answers before it fails it).
	f.waitLog(t, "read what an earlier run stored, will retry")
	f.waitLog(t, "read what an earlier run stored, will retry")
	for name, labels := range map[string]map[string]string{
		"pleg_bridge_publish_in_flight": nil,
		"pleg_bridge_publish_total":     {"result": "error"},
	} {
		if got := metricstest.Value(t, f.reg, name, labels); got != 0 {
			t.Errorf("before the stream exists: %s%v = %v, want 0", name, labels, got)
		}
	}
	ensureStream(t, js)
	f.waitAcks(t, len(evs))
	f.waitLog(t, "read the messages an earlier run stored")
	checkPerPodOrder(t, fetchAll(t, js, 2), evs)
}

// TestRunReturnsWhileTheReadIsRetried: a Publisher whose read cannot
// succeed (NATS is gone) still returns when its ctx is done, within the
// drain timeout, and gives up what it could not publish.
func TestRunReturnsWhileTheReadIsRetried(t *testing.T) {
	t.Parallel()
	rs, stop := newRestartableServer(t)
	_, js := publishtest.Connect(t, rs.url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	ensureStream(t, js)
	stop()
	f := newFixtureOn(t, js, publish.Options{Restart: publish.Restart{From: 1}, DrainTimeout: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- f.pub.Run(ctx) }()
	f.send(t, testEvent("pod-a", 0))
	f.waitLog(t, "cannot read what an earlier run stored")
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Run() = %v, want nil", err)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("Run did not return within %s of its ctx being done", waitTimeout)
	}
	if got := metricstest.Value(t, f.reg, "pleg_bridge_events_dropped_total", nil); got != 1 {
		t.Errorf("pleg_bridge_events_dropped_total = %v, want 1", got)
	}
}

// TestTheReadGivesBackTheEventsAnEarlierRunStored: an earlier run stored a
// pod's events (the last with an exit code, labels and both times) after
// what its checkpoint wrote, in both content modes, and something else
// stored a message on this node's subjects that is no event of ours. The
// next run, before it publishes anything, reports every event it decoded to
// OnAck and gives them to OnStored, in stream order and equal to what was
// sent; the foreign message is counted, not given, and holds the watermark
// at the checkpoint. With no checkpoint sequence at all, Restart.Since
// reads the same messages.
func TestTheReadGivesBackTheEventsAnEarlierRunStored(t *testing.T) {
	t.Parallel()
	for _, mode := range []publish.Mode{publish.ModeStructured, publish.ModeBinary} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			_, url := publishtest.NewServer(t)
			_, js := publishtest.Connect(t, url)
			ensureShortWindowStream(t, js)
			enc := newEncoder(t, publish.EncoderOptions{Mode: mode})
			began := time.Now()

			started := testEvent("pod-a", 0)
			started.Pod.Meta = generator.NewPodMeta(map[string]string{"app": "web"}, nil)
			died := started
			died.Type, died.State = generator.ContainerDied, generator.StateExited
			code := int32(3)
			died.ExitCode, died.Reason, died.Message = &code, "Error", "it failed"
			died.FinishedAt = started.StartedAt.Add(time.Second)
			died.Time = died.FinishedAt
			sent := []generator.Event{testEvent("pod-b", 0), started, died}
			var firstSeq uint64
			for i, ev := range sent {
				ack, err := js.PublishMsg(t.Context(), encode(t, enc, ev))
				if err != nil {
					t.Fatal(err)
				}
				if i == 1 {
					firstSeq = ack.Sequence
				}
			}
			foreign := nats.NewMsg("pleg.node-1.default.pod-c.ContainerStarted")
			foreign.Header.Set(jetstream.MsgIDHeader, "not-an-event")
			foreign.Data = []byte("{}")
			if _, err := js.PublishMsg(t.Context(), foreign); err != nil {
				t.Fatal(err)
			}

			for _, tc := range []struct {
				name string
				opts publish.Options
				want []generator.Event
			}{
				{"after the checkpoint's sequence", publish.Options{Restart: publish.Restart{From: firstSeq}}, sent[1:]},
				{"since the store was made", publish.Options{Restart: publish.Restart{Since: began.Add(-time.Minute)}}, sent},
			} {
				stored := make(chan []generator.Event, 1)
				tc.opts.Encoder, tc.opts.Stream = enc, "PLEG"
				tc.opts.Restart.OnStored = func(evs []generator.Event) { stored <- evs }
				f := newFixtureOn(t, js, tc.opts)
				stop := f.run(t)
				acked := f.waitAcked(t, len(tc.want))
				var got []generator.Event
				select {
				case got = <-stored:
				case <-time.After(waitTimeout):
					t.Fatalf("%s: OnStored not called", tc.name)
				}
				stop()
				for i, ev := range tc.want {
					if i >= len(got) || !sameEvent(got[i], ev) {
						t.Fatalf("%s: OnStored got %+v, want %+v", tc.name, got, tc.want)
					}
					if !sameEvent(acked[i].ev, ev) {
						t.Errorf("%s: OnAck %d got %+v, want %+v", tc.name, i, acked[i].ev, ev)
					}
					if want := max(tc.opts.Restart.From, 1) - 1; acked[i].seq != want {
						t.Errorf("%s: OnAck %d with watermark %d, want %d: the foreign message holds it", tc.name, i, acked[i].seq, want)
					}
				}
				if len(got) != len(tc.want) {
					t.Errorf("%s: OnStored got %d events, want %d", tc.name, len(got), len(tc.want))
				}
				for result, want := range map[string]float64{"decoded": float64(len(tc.want)), "undecoded": 1} {
					if got := metricstest.Value(t, f.reg, "pleg_bridge_read_back_messages_total", map[string]string{"result": result}); got != want {
						t.Errorf("%s: pleg_bridge_read_back_messages_total{result=%q} = %v, want %v", tc.name, result, got, want)
					}
				}
			}
		})
	}
}

// sameEvent compares what a stored message carries of an event.
func sameEvent(a, b generator.Event) bool {
	eqTime := func(x, y time.Time) bool { return x.Equal(y) }
	eqCode := (a.ExitCode == nil) == (b.ExitCode == nil) && (a.ExitCode == nil || *a.ExitCode == *b.ExitCode)
	eqMeta := a.Pod.Meta.Equal(b.Pod.Meta)
	a.Pod.Meta, b.Pod.Meta, a.ExitCode, b.ExitCode = nil, nil, nil, nil
	return eqCode && eqMeta && eqTime(a.Time, b.Time) && eqTime(a.StartedAt, b.StartedAt) &&
		eqTime(a.FinishedAt, b.FinishedAt) && eqTime(a.ObservedAt, b.ObservedAt) &&
		a.Type == b.Type && a.Pod == b.Pod && a.Container == b.Container && a.State == b.State &&
		a.Reason == b.Reason && a.Message == b.Message && a.DetectedBy == b.DetectedBy
}
