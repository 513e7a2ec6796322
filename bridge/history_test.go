package bridge_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

// renewedStream is the message of the warning a bridge logs when its
// stream is not the one its checkpoint belongs to.
const renewedStream = "the stream is not the one the checkpoint belongs to"

// readEvents reads the first n events of stream, checks each against the
// contract, and returns them decoded, in stream order.
func readEvents(t *testing.T, js jetstream.JetStream, stream string, n int) []consumer.Event {
	t.Helper()
	publishtest.WaitStream(t, js, stream)
	cons, err := js.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []consumer.Event
	for len(out) < n {
		msg, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
		if err != nil {
			t.Fatalf("after %d of %d events: %v", len(out), n, err)
		}
		schemastest.ValidateCloudEvent(t, msg.Data())
		e, err := consumer.DecodeMsg(msg)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// histories returns each container's event types in stream order, as
// "<type> <type> ...", by container ID.
func histories(evs []consumer.Event) map[string]string {
	out := map[string]string{}
	for _, e := range evs {
		out[e.ContainerID] = strings.TrimSpace(out[e.ContainerID] + " " + e.LifecycleType())
	}
	return out
}

// streamMsgs returns how many messages stream holds.
func streamMsgs(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// waitSettled waits until b has merged a relist and nothing is pending,
// or fails the test after 30 s.
func waitSettled(t *testing.T, b *bridge.Bridge) {
	t.Helper()
	waittest.Until(t, 30*time.Second, "the bridge to settle", func() (bool, error) {
		st := b.Status()
		return st.Synced && st.Pending == 0, fmt.Errorf("status %+v", st)
	})
}

// checkpointStream returns the stream the checkpoint in dir names.
func checkpointStream(t *testing.T, dir string) (datadir.StreamIdentity, bool) {
	t.Helper()
	st, err := datadir.Open(dir, datadir.Options{Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return st.Checkpoint().Stream()
}

// TestAReinstallAgainstANewStreamStartsItsHistory is an uninstall that
// deletes the stream and keeps the node's data directory, and a reinstall
// whose bridge creates the stream anew. While no bridge runs, a container
// exits, another is removed, and a third starts. The new stream holds a
// complete history of every container: ContainerStarted first for each
// (those running across the reinstall included, whose start the old stream
// had), with the labels the pod has; no ContainerDied or ContainerRemoved
// without it. The bridge says so in one warning. A restart after that
// against the same stream publishes nothing and warns of nothing.
func TestAReinstallAgainstANewStreamStartsItsHistory(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	dir := t.TempDir()
	logs := &logtest.Buffer{}
	opts := testOptions(n.endpoint, n.url, dir)
	opts.Stream.DuplicateWindow = 100 * time.Millisecond // the shortest JetStream takes
	opts.Logger = logs.JSONLogger(slog.LevelInfo)
	sb, ids := n.startPod(t, "keep", "exits", "goes")
	_, stop := runBridge(t, opts)
	fetchAll(t, n.js, "PLEG", 4)
	stop()
	old, ok := checkpointStream(t, dir)
	if !ok || old.Name != "PLEG" {
		t.Fatalf("the first run's checkpoint names stream %v, %v; want PLEG", old, ok)
	}
	if w := logs.TakeRecords(t, "WARN"); len(w) != 0 {
		t.Errorf("warnings of a first run: %v", w)
	}

	// The uninstall.
	if err := n.js.DeleteStream(t.Context(), "PLEG"); err != nil {
		t.Fatal(err)
	}
	if err := n.model.StopContainer(ids[1], 3, "Error", ""); err != nil {
		t.Fatal(err)
	}
	if err := n.model.StopContainer(ids[2], 0, "Completed", ""); err != nil {
		t.Fatal(err)
	}
	if err := n.model.RemoveContainer(ids[2]); err != nil {
		t.Fatal(err)
	}
	fresh := n.startContainer(t, sb, "fresh")

	// The reinstall.
	b, stop := runBridge(t, opts)
	want := map[string]string{
		sb:     "ContainerStarted",
		ids[0]: "ContainerStarted",
		ids[1]: "ContainerStarted ContainerDied",
		ids[2]: "ContainerStarted ContainerDied ContainerRemoved",
		fresh:  "ContainerStarted",
	}
	evs := readEvents(t, n.js, "PLEG", 8)
	waitSettled(t, b)
	stop()
	if got := histories(evs); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the new stream's histories:\n%v\nwant:\n%v", got, want)
	}
	for _, e := range evs {
		if e.Data.Pod.Labels == nil {
			t.Errorf("%s of %s: no pod labels", e.LifecycleType(), e.Subject)
		}
	}
	if got := streamMsgs(t, n.js, "PLEG"); got != 8 {
		t.Errorf("the new stream holds %d events, want 8", got)
	}
	warnings := logs.TakeRecords(t, "WARN")
	if len(warnings) != 1 || warnings[0]["msg"] == nil || !strings.HasPrefix(warnings[0]["msg"].(string), renewedStream) {
		t.Fatalf("warnings = %v, want one: %q", warnings, renewedStream)
	}
	w := warnings[0]
	renewed, ok := checkpointStream(t, dir)
	if !ok || renewed.Name != "PLEG" || renewed.Equal(old) {
		t.Errorf("the reinstall's checkpoint names stream %v, %v; want PLEG, created anew", renewed, ok)
	}
	if w["stream"] != "PLEG" || w["old_stream"] != old.String() || w["new_stream"] != renewed.String() {
		t.Errorf("the warning names stream %v, old %v, new %v; want PLEG, %s, %s", w["stream"], w["old_stream"], w["new_stream"], old, renewed)
	}

	// A restart against the same stream, after its duplicate window:
	// nothing is published again.
	publishtest.WaitOutDuplicateWindow(t, n.js, "PLEG")
	b, stop = runBridge(t, opts)
	waitSettled(t, b)
	stop()
	if got := streamMsgs(t, n.js, "PLEG"); got != 8 {
		t.Errorf("after a restart against the same stream, it holds %d events, want 8", got)
	}
	if w := logs.TakeRecords(t, "WARN"); len(w) != 0 {
		t.Errorf("warnings of a restart against the same stream: %v", w)
	}
}

// TestAReinstallPublishesTheStartBeforeWhatWaitedInTheSpool: a bridge
// whose NATS is unreachable keeps a container's ContainerDied in the spool
// (its ContainerStarted went to the old stream); the stream is deleted; the
// next bridge, against the stream created anew, publishes the container's
// ContainerStarted before that ContainerDied.
func TestAReinstallPublishesTheStartBeforeWhatWaitedInTheSpool(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	dir := t.TempDir()
	opts := testOptions(n.endpoint, n.url, dir)
	opts.SpoolMaxBytes = 1 << 20
	opts.ShutdownTimeout = 100 * time.Millisecond
	sb, ids := n.startPod(t, "app")
	_, stop := runBridge(t, opts)
	fetchAll(t, n.js, "PLEG", 2)
	stop()

	down := opts
	down.NATS.URL = "nats://127.0.0.1:1" // nothing listens there
	if err := n.model.StopContainer(ids[0], 3, "Error", ""); err != nil {
		t.Fatal(err)
	}
	died := make(chan struct{}, 1)
	down.Hooks.WrapSink = func(s generator.Sink) generator.Sink { return diedSink{s, died} }
	downAt := time.Now()
	_, stop = runBridge(t, down)
	select {
	case <-died:
	case <-time.After(30 * time.Second):
		t.Fatal("the ContainerDied was not sent within 30s")
	}
	stop() // gives it up in memory; its copy stays in the spool

	if err := n.js.DeleteStream(t.Context(), "PLEG"); err != nil {
		t.Fatal(err)
	}
	restart := time.Now()
	b, stop := runBridge(t, opts)
	evs := readEvents(t, n.js, "PLEG", 3)
	waitSettled(t, b)
	stop()
	want := map[string]string{sb: "ContainerStarted", ids[0]: "ContainerStarted ContainerDied"}
	if got := histories(evs); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the new stream's histories:\n%v\nwant:\n%v", got, want)
	}
	for _, e := range evs {
		if e.LifecycleType() != "ContainerDied" {
			continue
		}
		if e.Data.ExitCode == nil || *e.Data.ExitCode != 3 {
			t.Errorf("the ContainerDied is not the spooled one: exit code %v, want 3", e.Data.ExitCode)
		}
		// Observed by the bridge that spooled it, published by the next.
		if o := e.Data.ObservedAt; o.Before(downAt) || !o.Before(restart) || !e.Time.Before(downAt) {
			t.Errorf("the spooled ContainerDied: time %v, observedAt %v; want the exit before %v, observed from then on and before %v",
				e.Time, o, downAt, restart)
		}
	}
	if got := streamMsgs(t, n.js, "PLEG"); got != 3 {
		t.Errorf("the new stream holds %d events, want 3", got)
	}
}

// diedSink signals on died once a ContainerDied was recorded.
type diedSink struct {
	generator.Sink
	died chan<- struct{}
}

func (s diedSink) Send(ctx context.Context, events []generator.Event) error {
	err := s.Sink.Send(ctx, events)
	for _, ev := range events {
		if ev.Type == generator.ContainerDied && err == nil {
			select {
			case s.died <- struct{}{}:
			default:
			}
		}
	}
	return err
}
