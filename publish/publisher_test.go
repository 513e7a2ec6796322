package publish_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

// waitTimeout bounds every wait on the in-process server; far above what
// any step takes, so a failure means a bug, not a slow machine.
const waitTimeout = 30 * time.Second

// testEvent returns event i of pod: a ContainerStarted of its own container,
// so every event has its own id.
func testEvent(pod string, i int) generator.Event {
	now := time.Date(2026, 1, 2, 3, 4, 5, i, time.UTC)
	return generator.Event{
		Type:       generator.ContainerStarted,
		Pod:        generator.Pod{UID: pod, Namespace: "default", Name: "pod-" + pod},
		Container:  generator.Container{ID: fmt.Sprintf("%s-c%d", pod, i), Name: fmt.Sprintf("c%d", i), Image: "busybox"},
		State:      generator.StateRunning,
		StartedAt:  now,
		Time:       now,
		DetectedBy: generator.SourceRelist,
		ObservedAt: now,
	}
}

// fixture is a server, a client, and a publisher with its metrics and acks.
type fixture struct {
	js   jetstream.JetStream
	pub  *publish.Publisher
	reg  *prometheus.Registry
	acks chan ackedEvent
	logs chan slog.Record
}

// ackedEvent is an event OnAck reported, with its watermark, and when.
type ackedEvent struct {
	ev  generator.Event
	seq uint64
	at  time.Time
}

type fixtureOptions struct {
	publish.Options
	noStream bool
}

func newFixture(t *testing.T, o fixtureOptions) *fixture {
	t.Helper()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	if !o.noStream {
		ensureStream(t, js)
	}
	return newFixtureOn(t, js, o.Options)
}

func newFixtureOn(t *testing.T, js jetstream.JetStream, opts publish.Options) *fixture {
	t.Helper()
	f := &fixture{
		js:   js,
		reg:  prometheus.NewRegistry(),
		acks: make(chan ackedEvent, 100000),
		logs: make(chan slog.Record, 100000),
	}
	if opts.Encoder == nil {
		opts.Encoder = newEncoder(t, publish.EncoderOptions{})
	}
	opts.Registerer = f.reg
	opts.Logger = slog.New(&recordHandler{records: f.logs})
	onAck := opts.OnAck // the test's own, called first
	opts.OnAck = func(ev generator.Event, seq uint64) {
		if onAck != nil {
			onAck(ev, seq)
		}
		f.acks <- ackedEvent{ev: ev, seq: seq, at: time.Now()}
	}
	pub, err := publish.New(js.Conn(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.pub = pub
	return f
}

func ensureStream(t testing.TB, js jetstream.JetStream) {
	t.Helper()
	if _, err := publish.EnsureStream(context.Background(), js, publish.StreamOptions{SubjectPrefix: "pleg"}); err != nil {
		t.Fatalf("EnsureStream: %v", err)
	}
}

// run starts Run and returns a function that cancels it and checks that it
// returns nil; t.Cleanup calls it too.
func (f *fixture) run(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- f.pub.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Run() = %v, want nil", err)
				}
			case <-time.After(waitTimeout):
				t.Errorf("Run did not return within %s of its ctx being done", waitTimeout)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (f *fixture) send(t *testing.T, events ...generator.Event) {
	t.Helper()
	if err := f.pub.Send(t.Context(), events); err != nil {
		t.Fatalf("Send: %v", err)
	}
}

// waitAcks returns the next n events OnAck reports.
func (f *fixture) waitAcks(t *testing.T, n int) []generator.Event {
	t.Helper()
	got := make([]generator.Event, 0, n)
	deadline := time.After(waitTimeout)
	for len(got) < n {
		select {
		case a := <-f.acks:
			got = append(got, a.ev)
		case <-deadline:
			t.Fatalf("got %d acks within %s, want %d", len(got), waitTimeout, n)
		}
	}
	return got
}

// waitLog returns the first log record whose message starts with msg.
func (f *fixture) waitLog(t *testing.T, msg string) slog.Record {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case r := <-f.logs:
			if strings.HasPrefix(r.Message, msg) {
				return r
			}
		case <-deadline:
			t.Fatalf("no log %q within %s", msg, waitTimeout)
		}
	}
}

// fetchAll reads the whole stream in order: exactly n messages, failing if
// fewer arrive in time or if there are more.
func fetchAll(t *testing.T, js jetstream.JetStream, n int) []jetstream.Msg {
	t.Helper()
	ctx := t.Context()
	cons, err := js.OrderedConsumer(ctx, "PLEG", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	var msgs []jetstream.Msg
	deadline := time.Now().Add(waitTimeout)
	for len(msgs) < n && time.Now().Before(deadline) {
		batch, err := cons.Fetch(n-len(msgs), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			t.Fatalf("fetch: %v", err)
		}
	}
	if len(msgs) != n {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), n)
	}
	s, err := js.Stream(ctx, "PLEG")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(n) {
		t.Fatalf("stream holds %d messages, want %d", info.State.Msgs, n)
	}
	return msgs
}

// checkPerPodOrder checks that the messages hold exactly sent, and the
// events of each pod in the order they were sent.
func checkPerPodOrder(t *testing.T, msgs []jetstream.Msg, sent []generator.Event) {
	t.Helper()
	byID := make(map[string]generator.Event, len(sent))
	wantOrder := map[string][]string{}
	for _, ev := range sent {
		id := publish.EventID(ev.Container.ID, ev.Type)
		byID[id] = ev
		wantOrder[ev.Pod.UID] = append(wantOrder[ev.Pod.UID], ev.Container.ID)
	}
	gotOrder := map[string][]string{}
	for _, m := range msgs {
		ev, ok := byID[m.Headers().Get(jetstream.MsgIDHeader)]
		if !ok {
			t.Fatalf("stream holds a message with unknown id %q", m.Headers().Get(jetstream.MsgIDHeader))
		}
		gotOrder[ev.Pod.UID] = append(gotOrder[ev.Pod.UID], ev.Container.ID)
	}
	if diff := cmp.Diff(wantOrder, gotOrder); diff != "" {
		t.Errorf("per-pod order in the stream (-sent +stored):\n%s", diff)
	}
}

func TestPublisherDeliversCloudEventsWithSubjectsIDsAndHeaders(t *testing.T) {
	t.Parallel()
	for _, mode := range []publish.Mode{publish.ModeStructured, publish.ModeBinary} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, fixtureOptions{Options: publish.Options{
				Encoder: newEncoder(t, publish.EncoderOptions{Mode: mode}),
			}})
			f.run(t)
			golden := goldenEvents(t)
			sent := []generator.Event{golden[generator.ContainerStarted], golden[generator.ContainerDied], golden[generator.ContainerRemoved]}
			f.send(t, sent...)

			if diff := cmp.Diff(sent, f.waitAcks(t, len(sent))); diff != "" {
				t.Errorf("OnAck events (-sent +acked):\n%s", diff)
			}
			msgs := fetchAll(t, f.js, len(sent))
			for i, m := range msgs {
				ev := sent[i]
				wantSubject := "pleg.node-1.default." + testPodUID + "." + string(ev.Type)
				if m.Subject() != wantSubject {
					t.Errorf("message %d subject = %q, want %q", i, m.Subject(), wantSubject)
				}
				if got, want := m.Headers().Get(jetstream.MsgIDHeader), publish.EventID(ev.Container.ID, ev.Type); got != want {
					t.Errorf("message %d Nats-Msg-Id = %q, want %q", i, got, want)
				}
				ceType := publish.CloudEventType(ev.Type)
				switch mode {
				case publish.ModeStructured:
					if got := m.Headers().Get("Content-Type"); got != "application/cloudevents+json" {
						t.Errorf("message %d Content-Type = %q", i, got)
					}
					schemastest.ValidateCloudEvent(t, m.Data())
				case publish.ModeBinary:
					if got := m.Headers().Get("ce-type"); got != ceType {
						t.Errorf("message %d ce-type = %q, want %q", i, got, ceType)
					}
					schemastest.Validate(t, ceType, m.Data())
				}
			}
		})
	}
}

func TestPublisherKeepsPerPodOrderAcrossManyPods(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{Options: publish.Options{MaxInFlight: 3, OutboxSize: 64, Spool: newSpool(t, 1<<20)}})
	f.run(t)
	const pods, perPod = 40, 15
	var sent []generator.Event
	// Interleaved, the way relists of a busy node produce them.
	for i := range perPod {
		for p := range pods {
			sent = append(sent, testEvent(fmt.Sprintf("pod-%02d", p), i))
		}
	}
	// Several small Sends from one goroutine, as the generator makes them;
	// the outbox (64) is smaller than the total, so events go to the spool
	// and back while Run delivers.
	for chunk := range slices.Chunk(sent, 25) {
		f.send(t, chunk...)
	}
	f.waitAcks(t, len(sent))
	checkPerPodOrder(t, fetchAll(t, f.js, len(sent)), sent)
	if got := f.pub.Pending(); got != 0 {
		t.Errorf("Pending() = %d after every ack, want 0", got)
	}
}

func TestPublisherStoresTheSameEventOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{})
	f.run(t)
	ev := testEvent("pod-a", 1)
	// The same transition seen by the relist and by the event stream.
	seenByStream := ev
	seenByStream.DetectedBy = generator.SourceEvented
	f.send(t, ev)
	f.send(t, seenByStream)
	f.waitAcks(t, 2)

	fetchAll(t, f.js, 1)
	want := `
# HELP pleg_bridge_publish_total Publish attempts to JetStream by result: acked, duplicate (acked, already stored), error (failed, will be retried).
# TYPE pleg_bridge_publish_total counter
pleg_bridge_publish_total{result="acked"} 1
pleg_bridge_publish_total{result="duplicate"} 1
pleg_bridge_publish_total{result="error"} 0
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want), "pleg_bridge_publish_total"); err != nil {
		t.Error(err)
	}
}

func TestPublisherRetriesUntilTheStreamExistsAndKeepsPerPodOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{
		noStream: true,
		Options: publish.Options{
			MaxInFlight:     2,
			RetryBackoffMin: 5 * time.Millisecond,
			RetryBackoffMax: 50 * time.Millisecond,
		},
	})
	f.run(t)
	var sent []generator.Event
	for i := range 6 {
		for _, p := range []string{"pod-a", "pod-b", "pod-c"} {
			sent = append(sent, testEvent(p, i))
		}
	}
	f.send(t, sent...)

	// With no stream, nothing answers the publishes: they fail and are
	// retried. The first failure, which stalls publishing, is logged at
	// Warn; the next ack logs at Info that publishing resumed.
	r := f.waitLog(t, "publishing stalled")
	if r.Level != slog.LevelWarn {
		t.Errorf("stall logged at %v, want WARN", r.Level)
	}
	select {
	case a := <-f.acks:
		t.Fatalf("event %s acked without a stream", a.ev.Container.ID)
	default:
	}

	ensureStream(t, f.js)
	f.waitAcks(t, len(sent))
	checkPerPodOrder(t, fetchAll(t, f.js, len(sent)), sent)
	if r := f.waitLog(t, "publishing resumed"); r.Level != slog.LevelInfo {
		t.Errorf("recovery logged at %v, want INFO", r.Level)
	}

	failed := metricstest.Value(t, f.reg, "pleg_bridge_publish_total", map[string]string{"result": "error"})
	if failed < 1 {
		t.Errorf("pleg_bridge_publish_total{result=\"error\"} = %v, want at least 1", failed)
	}
}

func TestPublisherRecoversFromAServerRestartInOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, url := publishtest.StartServer(t, natsembed.Options{DataDir: dir, Port: -1})
	port := s.Addr().(*net.TCPAddr).Port
	_, js := publishtest.Connect(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	ensureStream(t, js)
	f := newFixtureOn(t, js, publish.Options{
		AckTimeout:      200 * time.Millisecond,
		RetryBackoffMin: 10 * time.Millisecond,
		RetryBackoffMax: 100 * time.Millisecond,
	})
	f.run(t)

	var before, after []generator.Event
	for i := range 4 {
		for _, p := range []string{"pod-a", "pod-b"} {
			before = append(before, testEvent(p, i))
			after = append(after, testEvent(p, 100+i))
		}
	}
	f.send(t, before...)
	f.waitAcks(t, len(before))

	s.Shutdown()
	s.WaitForShutdown()
	f.send(t, after...)
	f.waitLog(t, "publishing stalled")

	publishtest.StartServer(t, natsembed.Options{DataDir: dir, Port: port})
	f.waitAcks(t, len(after))
	checkPerPodOrder(t, fetchAll(t, f.js, len(before)+len(after)), append(before, after...))
	if got := metricstest.Value(t, f.reg, "pleg_bridge_events_dropped_total", nil); got != 0 {
		t.Errorf("pleg_bridge_events_dropped_total = %v, want 0", got)
	}
}

func TestPublisherDrainsQueuedEventsWhenStopped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{})
	var sent []generator.Event
	for i := range 50 {
		sent = append(sent, testEvent(fmt.Sprintf("pod-%d", i%7), i))
	}
	f.send(t, sent...)
	if got := f.pub.Pending(); got != len(sent) {
		t.Errorf("Pending() = %d before Run, want %d", got, len(sent))
	}

	// Run with its ctx already done: it only drains.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.pub.Run(ctx); err != nil {
		t.Fatalf("Run() = %v, want nil", err)
	}
	checkPerPodOrder(t, fetchAll(t, f.js, len(sent)), sent)
	if got := f.pub.Pending(); got != 0 {
		t.Errorf("Pending() = %d after the drain, want 0", got)
	}
	err := f.pub.Send(t.Context(), []generator.Event{testEvent("pod-late", 0)})
	if !errors.Is(err, publish.ErrClosed) {
		t.Errorf("Send after Run returned: error = %v, want ErrClosed", err)
	}
}

func TestPublisherGivesUpWhatItCannotDeliverWithinTheDrainTimeout(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{
		noStream: true,
		Options: publish.Options{
			DrainTimeout:    300 * time.Millisecond,
			RetryBackoffMin: 5 * time.Millisecond,
			RetryBackoffMax: 20 * time.Millisecond,
		},
	})
	f.send(t, testEvent("pod-a", 0), testEvent("pod-a", 1), testEvent("pod-b", 0))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.pub.Run(ctx); err != nil {
		t.Fatalf("Run() = %v, want nil", err)
	}

	want := `
# HELP pleg_bridge_events_dropped_total Lifecycle events given up without delivery: not encodable, or still undelivered when the drain timeout ended.
# TYPE pleg_bridge_events_dropped_total counter
pleg_bridge_events_dropped_total 3
# HELP pleg_bridge_outbox_events Lifecycle events accepted by the publisher and not yet acked: queued plus in flight.
# TYPE pleg_bridge_outbox_events gauge
pleg_bridge_outbox_events 0
# HELP pleg_bridge_publish_in_flight Messages published to JetStream and waiting for their ack.
# TYPE pleg_bridge_publish_in_flight gauge
pleg_bridge_publish_in_flight 0
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want),
		"pleg_bridge_events_dropped_total", "pleg_bridge_outbox_events", "pleg_bridge_publish_in_flight"); err != nil {
		t.Error(err)
	}
	dropped := map[string]bool{}
	for range 3 {
		r := f.waitLog(t, "drop event")
		if r.Level != slog.LevelWarn {
			t.Errorf("drop logged at %v, want WARN", r.Level)
		}
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		dropped[attrs["container_id"]] = attrs["pod_uid"] != "" && attrs["event_type"] == "ContainerStarted"
	}
	if diff := cmp.Diff(map[string]bool{"pod-a-c0": true, "pod-a-c1": true, "pod-b-c0": true}, dropped); diff != "" {
		t.Errorf("dropped events logged with pod_uid and event_type (-want +got):\n%s", diff)
	}
}

func TestSendRefusesWhatDoesNotFitInMemoryWithoutASpool(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{Options: publish.Options{OutboxSize: 2}})
	sent := []generator.Event{testEvent("pod-a", 0), testEvent("pod-b", 0), testEvent("pod-a", 1), testEvent("pod-a", 2)}

	// Nothing delivers yet (no Run): the third event finds the outbox full.
	// Send neither blocks nor drops: it says how many it recorded.
	err := f.pub.Send(t.Context(), sent)
	var full *generator.SinkFullError
	if !errors.As(err, &full) || full.Recorded != 2 {
		t.Fatalf("Send of 4 events to an outbox of 2: error = %v, want a SinkFullError with Recorded 2", err)
	}
	if got := f.pub.Pending(); got != 2 {
		t.Errorf("Pending() = %d, want 2", got)
	}
	if got := metricstest.Value(t, f.reg, "pleg_bridge_events_refused_total", nil); got != 2 {
		t.Errorf("pleg_bridge_events_refused_total = %v, want 2", got)
	}
	if r := f.waitLog(t, "outbox full and no spool"); r.Level != slog.LevelWarn {
		t.Errorf("refusal logged at %v, want WARN", r.Level)
	}

	// The caller sends the rest again once there is room, as the
	// generator's backfill does.
	f.run(t)
	f.waitAcks(t, 2)
	f.send(t, sent[2:]...)
	if r := f.waitLog(t, "accepting events again"); r.Level != slog.LevelInfo {
		t.Errorf("end of the refusal logged at %v, want INFO", r.Level)
	}
	f.waitAcks(t, 2)
	checkPerPodOrder(t, fetchAll(t, f.js, len(sent)), sent)
}

func TestSendAfterStopReturnsErrClosed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{noStream: true, Options: publish.Options{OutboxSize: 1, DrainTimeout: 50 * time.Millisecond}})
	f.send(t, testEvent("pod-a", 0))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.pub.Run(ctx); err != nil {
		t.Fatalf("Run() = %v, want nil", err)
	}
	if err := f.pub.Send(t.Context(), []generator.Event{testEvent("pod-a", 1)}); !errors.Is(err, publish.ErrClosed) {
		t.Errorf("Send after Run returned: error = %v, want ErrClosed", err)
	}
	if err := f.pub.Run(context.Background()); err == nil {
		t.Error("a second Run succeeded")
	}
}

func TestSendDropsAnEventItCannotEncodeAndGoesOn(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{})
	f.run(t)
	bad := testEvent("pod-a", 1)
	bad.Container.ID = ""
	f.send(t, testEvent("pod-a", 0), bad, testEvent("pod-a", 2))

	f.waitAcks(t, 2)
	fetchAll(t, f.js, 2)
	if got := metricstest.Value(t, f.reg, "pleg_bridge_events_dropped_total", nil); got != 1 {
		t.Errorf("pleg_bridge_events_dropped_total = %v, want 1", got)
	}
	r := f.waitLog(t, "drop event")
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	if r.Level != slog.LevelWarn || attrs["pod_uid"] != "pod-a" || attrs["event_type"] != "ContainerStarted" || attrs["err"] == "" {
		t.Errorf("drop logged at %v with %v, want WARN with pod_uid, event_type and err", r.Level, attrs)
	}
}

func TestPublisherMetricsAfterDelivery(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{})
	f.run(t)
	f.send(t, testEvent("pod-a", 0), testEvent("pod-b", 0), testEvent("pod-a", 0))
	f.waitAcks(t, 3)

	want := `
# HELP pleg_bridge_events_dropped_total Lifecycle events given up without delivery: not encodable, or still undelivered when the drain timeout ended.
# TYPE pleg_bridge_events_dropped_total counter
pleg_bridge_events_dropped_total 0
# HELP pleg_bridge_outbox_events Lifecycle events accepted by the publisher and not yet acked: queued plus in flight.
# TYPE pleg_bridge_outbox_events gauge
pleg_bridge_outbox_events 0
# HELP pleg_bridge_publish_in_flight Messages published to JetStream and waiting for their ack.
# TYPE pleg_bridge_publish_in_flight gauge
pleg_bridge_publish_in_flight 0
# HELP pleg_bridge_publish_total Publish attempts to JetStream by result: acked, duplicate (acked, already stored), error (failed, will be retried).
# TYPE pleg_bridge_publish_total counter
pleg_bridge_publish_total{result="acked"} 2
pleg_bridge_publish_total{result="duplicate"} 1
pleg_bridge_publish_total{result="error"} 0
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want),
		"pleg_bridge_events_dropped_total", "pleg_bridge_outbox_events",
		"pleg_bridge_publish_in_flight", "pleg_bridge_publish_total"); err != nil {
		t.Error(err)
	}
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var observed uint64
	for _, mf := range mfs {
		if mf.GetName() == "pleg_bridge_publish_ack_duration_seconds" {
			observed = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	if observed != 3 {
		t.Errorf("pleg_bridge_publish_ack_duration_seconds count = %d, want 3", observed)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	enc := newEncoder(t, publish.EncoderOptions{})
	tests := []struct {
		name string
		opts publish.Options
		want string
	}{
		{"no encoder", publish.Options{}, "encoder is nil"},
		{"a negative outbox", publish.Options{Encoder: enc, OutboxSize: -1}, "outbox size -1"},
		{"a max backoff below the min", publish.Options{Encoder: enc, RetryBackoffMin: time.Second, RetryBackoffMax: time.Millisecond}, "retry backoff max 1ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := publish.New(js.Conn(), tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New(%+v) error = %v, want one containing %q", tt.opts, err, tt.want)
			}
		})
	}
	reg := prometheus.NewRegistry()
	if _, err := publish.New(js.Conn(), publish.Options{Encoder: enc, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := publish.New(js.Conn(), publish.Options{Encoder: enc, Registerer: reg}); err == nil {
		t.Error("a second Publisher registered the same metrics on one registry")
	}
}

// recordHandler sends the records it handles to records, dropping them when
// it is full.
type recordHandler struct {
	records chan slog.Record
	attrs   []slog.Attr
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	select {
	case h.records <- r:
	default:
	}
	return nil
}

func (h *recordHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &recordHandler{records: h.records, attrs: append(slices.Clip(h.attrs), attrs...)}
}

func (h *recordHandler) WithGroup(string) slog.Handler { return h }

func TestRunFailsWhenTheConnectionIsClosedUnderIt(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	nc, js := publishtest.Connect(t, url)
	ensureStream(t, js)
	f := newFixtureOn(t, js, publish.Options{})
	nc.Close()
	f.send(t, testEvent("pod-a", 0), testEvent("pod-a", 1))

	errc := make(chan error, 1)
	go func() { errc <- f.pub.Run(context.Background()) }()
	select {
	case err := <-errc:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Errorf("Run() = %v, want an error wrapping nats.ErrConnectionClosed", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return after the connection was closed")
	}
	if got := metricstest.Value(t, f.reg, "pleg_bridge_events_dropped_total", nil); got != 2 {
		t.Errorf("pleg_bridge_events_dropped_total = %v, want 2", got)
	}
	if got := f.pub.Pending(); got != 0 {
		t.Errorf("Pending() = %d, want 0", got)
	}
}

func TestPublisherRetriesAtOnceWhenTheConnectionIsBack(t *testing.T) {
	t.Parallel()
	rs, stop := newRestartableServer(t)
	_, js := publishtest.Connect(t, rs.url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	ensureStream(t, js)
	// A backoff longer than the test's wait: only the reconnect can
	// bring the retry in time.
	f := newFixtureOn(t, js, publish.Options{RetryBackoffMin: time.Hour, RetryBackoffMax: time.Hour})
	f.run(t)

	stop()
	sent := []generator.Event{testEvent("pod-a", 0), testEvent("pod-b", 0)}
	f.send(t, sent...)
	f.waitLog(t, "publishing stalled")
	rs.start(t)
	f.waitAcks(t, len(sent))
	checkPerPodOrder(t, fetchAll(t, js, len(sent)), sent)
}

func TestPublisherRetriesAtOnceWhenAcksResume(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{
		noStream: true,
		Options:  publish.Options{RetryBackoffMin: time.Hour, RetryBackoffMax: time.Hour},
	})
	f.run(t)
	first := testEvent("pod-a", 0)
	f.send(t, first)
	f.waitLog(t, "publishing stalled")

	// The stream appears (as a new stream leader would be elected); the
	// next ack, of another pod, ends the stall and brings pod-a's retry
	// forward.
	ensureStream(t, f.js)
	second := testEvent("pod-b", 0)
	f.send(t, second)
	f.waitAcks(t, 2)
	checkPerPodOrder(t, fetchAll(t, f.js, 2), []generator.Event{first, second})
}

func TestPublisherLogsAStallWithoutAFailure(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, direct := publishtest.Connect(t, url)
	ensureStream(t, direct)
	// The publish is stored, its ack never comes, and the ack timeout is
	// far: only the lack of acks tells of the stall.
	gate := newReplyGate(t, url[len("nats://"):])
	_, js := publishtest.Connect(t, gate.url())
	f := newFixtureOn(t, js, publish.Options{AckTimeout: time.Hour, DrainTimeout: 50 * time.Millisecond})
	f.run(t)
	gate.swallowReplies()
	f.send(t, testEvent("pod-a", 0))

	r := f.waitLog(t, "publishing stalled")
	attrs := attrsOf(r)
	if r.Level != slog.LevelWarn || !strings.Contains(attrs, "in_flight=1") {
		t.Errorf("stall logged at %v with %s, want WARN with in_flight=1", r.Level, attrs)
	}
}
