package publish_test

import (
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// renewedStream is the message of the warning a Publisher logs when its
// stream is not the one its checkpoint belongs to.
const renewedStream = "the stream is not the one the checkpoint belongs to"

// typed returns ev with type typ (and, for a ContainerDied, exit code 3).
func typed(ev generator.Event, typ generator.LifecycleEventType) generator.Event {
	ev.Type = typ
	if typ == generator.ContainerDied {
		code := int32(3)
		ev.State, ev.ExitCode, ev.FinishedAt = generator.StateExited, &code, ev.Time.Add(time.Minute)
		ev.Time, ev.ObservedAt = ev.FinishedAt, ev.FinishedAt
	}
	return ev
}

// streamIdentity returns the identity of the stream PLEG.
func streamIdentity(t *testing.T, js jetstream.JetStream) datadir.StreamIdentity {
	t.Helper()
	s, err := js.Stream(t.Context(), "PLEG")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return datadir.StreamIdentity{Name: info.Config.Name, Created: info.Created}
}

// lifecycles returns, for each container, the types of its events in msgs,
// in stream order.
func lifecycles(t *testing.T, msgs []jetstream.Msg) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range msgs {
		e, err := consumer.DecodeMsg(m)
		if err != nil {
			t.Fatal(err)
		}
		out[e.ContainerID] = strings.TrimSpace(out[e.ContainerID] + " " + e.LifecycleType())
	}
	return out
}

// warnings returns the Warn records f logged so far.
func (f *fixture) warnings() []slog.Record {
	var out []slog.Record
	for {
		select {
		case r := <-f.logs:
			if r.Level == slog.LevelWarn {
				out = append(out, r)
			}
		default:
			return out
		}
	}
}

// TestANewStreamGetsTheCheckpointsHistoryFirst: the checkpoint belongs to
// a stream that is gone (it names one created at another time), and the
// spool holds a ContainerDied whose ContainerStarted the old stream took.
// The Publisher puts, into the stream it finds, the checkpoint's events of
// each container before what waited and what is new, with the labels the
// generator gives; says so once; and the checkpoint adopts the stream once
// they are in. A second Publisher over that checkpoint publishes nothing
// again, and warns of nothing.
func TestANewStreamGetsTheCheckpointsHistoryFirst(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ensureShortWindowStream(t, js)
	renewed := streamIdentity(t, js)

	a, b, c := testEvent("pod-a", 0), testEvent("pod-b", 0), testEvent("pod-a", 1)
	dir := t.TempDir()
	st, closeStore := openStore(t, dir, 1<<20)
	ck := st.Checkpoint()
	ck.RecordAck(a, 7)
	ck.RecordAck(b, 8)
	ck.RecordAck(typed(b, generator.ContainerDied), 9)
	ck.Adopt(datadir.StreamIdentity{Name: "PLEG", Created: renewed.Created.Add(-time.Hour)})
	if n := st.Spool().Append([]generator.Event{typed(a, generator.ContainerDied)}); n != 1 {
		t.Fatalf("Append stored %d events, want 1", n)
	}
	closeStore()

	labels := generator.NewPodMeta(map[string]string{"app": "web"}, nil)
	run := func() (*fixture, func()) {
		st, closeStore := openStore(t, dir, 1<<20)
		ck := st.Checkpoint()
		return newFixtureOn(t, js, publish.Options{
			Stream: "PLEG", DuplicateWindow: shortWindow, Spool: st.Spool(),
			Restart: publish.Restart{From: ck.Sequence() + 1, Checkpoint: ck,
				PodMeta: func(string) (*generator.PodMeta, bool) { return labels, true }},
			OnAck: func(ev generator.Event, seq uint64) { ck.RecordAck(ev, seq) },
		}), closeStore
	}
	f, closeStore := run()
	stop := f.run(t)
	f.send(t, c)
	f.waitAcks(t, 5)
	msgs := fetchAll(t, js, 5)
	checkPerPodOrder(t, msgs, []generator.Event{a, typed(a, generator.ContainerDied), c, b, typed(b, generator.ContainerDied)})
	want := map[string]string{
		a.Container.ID: "ContainerStarted ContainerDied",
		b.Container.ID: "ContainerStarted ContainerDied",
		c.Container.ID: "ContainerStarted",
	}
	if got := lifecycles(t, msgs); !maps.Equal(got, want) {
		t.Errorf("the stream's histories %v, want %v", got, want)
	}
	for _, m := range msgs {
		e, err := consumer.DecodeMsg(m)
		if err != nil {
			t.Fatal(err)
		}
		carried := e.ContainerID == b.Container.ID || (e.ContainerID == a.Container.ID && e.LifecycleType() == "ContainerStarted")
		if carried && e.Data.Pod.Labels["app"] != "web" {
			t.Errorf("%s of %s: labels %v, want app=web", e.LifecycleType(), e.ContainerID, e.Data.Pod.Labels)
		}
	}
	logs := f.logsUntil(t, "the checkpoint belongs to the stream from now on")
	stop()
	closeStore()
	var warnings []slog.Record
	for _, r := range logs {
		if r.Level == slog.LevelWarn {
			warnings = append(warnings, r)
		}
	}
	if len(warnings) != 1 || !strings.HasPrefix(warnings[0].Message, renewedStream) {
		t.Fatalf("warnings %v, want one: %q", warnings, renewedStream)
	}
	attrs := map[string]string{}
	warnings[0].Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	if attrs["stream"] != "PLEG" || attrs["new_stream"] != renewed.String() || !strings.HasPrefix(attrs["old_stream"], "PLEG created ") {
		t.Errorf("the warning says %v; want stream PLEG, the old identity and the new %s", attrs, renewed)
	}
	st, closeStore = openStore(t, dir, 0)
	if id, ok := st.Checkpoint().Stream(); !ok || !id.Equal(renewed) {
		t.Errorf("the checkpoint names stream %v, %v; want %v", id, ok, renewed)
	}
	closeStore()

	f, closeStore = run()
	defer closeStore()
	f.run(t)
	logs = f.logsUntil(t, "read the messages an earlier run stored")
	publishtest.WaitOutDuplicateWindow(t, js, "PLEG") // anything published again would be stored
	f.send(t, typed(c, generator.ContainerDied))
	f.waitAcks(t, 1)
	fetchAll(t, js, 6)
	for _, r := range append(logs, f.warnings()...) {
		if r.Level == slog.LevelWarn {
			t.Errorf("a warning of a Publisher over the adopted checkpoint: %s", r.Message)
		}
	}
}

// logsUntil returns the records f logs up to the first whose message starts
// with msg, that one included.
func (f *fixture) logsUntil(t *testing.T, msg string) []slog.Record {
	t.Helper()
	deadline := time.After(waitTimeout)
	var out []slog.Record
	for {
		select {
		case r := <-f.logs:
			out = append(out, r)
			if strings.HasPrefix(r.Message, msg) {
				return out
			}
		case <-deadline:
			t.Fatalf("no log %q within %s", msg, waitTimeout)
		}
	}
}

// TestAnInterruptedCarryIsCompletedWithoutStoringTwice: an earlier run
// disowned the checkpoint and stored part of its history in the new stream
// before it stopped. The next run reads the new stream from its start and
// carries only what is missing, after the stream's duplicate window.
func TestAnInterruptedCarryIsCompletedWithoutStoringTwice(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ensureShortWindowStream(t, js)

	a, b := testEvent("pod-a", 0), testEvent("pod-b", 0)
	dir := t.TempDir()
	st, closeStore := openStore(t, dir, 0)
	st.Checkpoint().RecordAck(a, 7)
	st.Checkpoint().RecordAck(b, 8)
	st.Checkpoint().Disown()
	closeStore()
	if _, err := js.PublishMsg(t.Context(), encode(t, newEncoder(t, publish.EncoderOptions{}), a)); err != nil {
		t.Fatal(err)
	}
	publishtest.WaitOutDuplicateWindow(t, js, "PLEG")

	st, closeStore = openStore(t, dir, 0)
	defer closeStore()
	f := newFixtureOn(t, js, publish.Options{Stream: "PLEG", Restart: publish.Restart{Checkpoint: st.Checkpoint()}, DuplicateWindow: shortWindow})
	f.run(t)
	f.waitLog(t, renewedStream)
	f.waitLog(t, "the checkpoint belongs to the stream from now on")
	checkPerPodOrder(t, fetchAll(t, js, 2), []generator.Event{a, b})
}

// TestACheckpointThatNamesNoStreamAdoptsOneThatCoversItsSequence: a
// checkpoint written before checkpoints named their stream is taken as the
// stream's when the stream covers its sequence: nothing is published
// again, nothing is warned of, and the checkpoint names the stream from
// then on.
func TestACheckpointThatNamesNoStreamAdoptsOneThatCoversItsSequence(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ensureShortWindowStream(t, js)
	a, b := testEvent("pod-a", 0), testEvent("pod-a", 1)
	ack, err := js.PublishMsg(t.Context(), encode(t, newEncoder(t, publish.EncoderOptions{}), a))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, closeStore := openStore(t, dir, 0)
	st.Checkpoint().RecordAck(a, ack.Sequence)
	closeStore()
	publishtest.WaitOutDuplicateWindow(t, js, "PLEG")

	st, closeStore = openStore(t, dir, 0)
	ck := st.Checkpoint()
	if _, named := ck.Stream(); named {
		t.Fatal("the checkpoint names a stream before any was adopted")
	}
	f := newFixtureOn(t, js, publish.Options{Stream: "PLEG", DuplicateWindow: shortWindow,
		Restart: publish.Restart{Checkpoint: ck, From: ck.Sequence() + 1}, OnAck: func(ev generator.Event, seq uint64) { ck.RecordAck(ev, seq) }})
	stop := f.run(t)
	logs := f.logsUntil(t, "the checkpoint names no stream yet")
	f.send(t, b)
	f.waitAcks(t, 1)
	checkPerPodOrder(t, fetchAll(t, js, 2), []generator.Event{a, b})
	stop()
	for _, r := range append(logs, f.warnings()...) {
		if r.Level == slog.LevelWarn {
			t.Errorf("a warning: %s", r.Message)
		}
	}
	closeStore()
	st, closeStore = openStore(t, dir, 0)
	defer closeStore()
	if id, named := st.Checkpoint().Stream(); !named || !id.Equal(streamIdentity(t, js)) {
		t.Errorf("the checkpoint names stream %v, %v; want %v", id, named, streamIdentity(t, js))
	}
}

// TestTheCarryWaitsForThePodsLabels: the checkpoint keeps no labels, and
// the generator knows them only once it has relisted. Until it says it
// can know them, nothing is published; then the carried events have them.
func TestTheCarryWaitsForThePodsLabels(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ensureStream(t, js)
	a := testEvent("pod-a", 0)
	dir := t.TempDir()
	st, closeStore := openStore(t, dir, 0)
	st.Checkpoint().RecordAck(a, 3)
	st.Checkpoint().Adopt(datadir.StreamIdentity{Name: "PLEG", Created: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)})
	closeStore()

	st, closeStore = openStore(t, dir, 0)
	defer closeStore()
	asked := make(chan struct{}, 100)
	relisted := make(chan struct{})
	labels := generator.NewPodMeta(map[string]string{"app": "web"}, nil)
	f := newFixtureOn(t, js, publish.Options{Stream: "PLEG", Restart: publish.Restart{Checkpoint: st.Checkpoint(),
		PodMeta: func(string) (*generator.PodMeta, bool) {
			select {
			case <-relisted:
				return labels, true
			default:
				select {
				case asked <- struct{}{}:
				default:
				}
				return nil, false
			}
		}}})
	f.run(t)
	f.waitLog(t, renewedStream)
	for range 2 { // asked, and asked again: waiting
		select {
		case <-asked:
		case <-time.After(waitTimeout):
			t.Fatal("the labels were not asked for")
		}
	}
	if n := streamMsgs(t, js); n != 0 {
		t.Fatalf("%d messages published before the labels could be known", n)
	}
	close(relisted)
	f.waitAcks(t, 1)
	e, err := consumer.DecodeMsg(fetchAll(t, js, 1)[0])
	if err != nil {
		t.Fatal(err)
	}
	if e.Data.Pod.Labels["app"] != "web" {
		t.Errorf("the carried event's labels are %v, want app=web", e.Data.Pod.Labels)
	}
}

// streamMsgs returns how many messages the stream PLEG holds.
func streamMsgs(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(t.Context(), "PLEG")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}
