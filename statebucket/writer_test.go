package statebucket_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
	"github.com/pleg-bridge/pleg-bridge/statebucket"
	"github.com/pleg-bridge/pleg-bridge/statebucket/statebuckettest"
)

// waitTimeout bounds every wait on the server or the writer.
const waitTimeout = 30 * time.Second

// stateEvent returns the event of type typ of container id of pod uid.
func stateEvent(typ generator.LifecycleEventType, uid, id string) generator.Event {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ev := generator.Event{
		Type:       typ,
		Pod:        generator.Pod{UID: uid, Namespace: "shop", Name: "pod-" + uid},
		Container:  generator.Container{ID: id, Name: "c-" + id, Image: "busybox"},
		StartedAt:  at,
		Time:       at,
		DetectedBy: generator.SourceRelist,
		ObservedAt: at,
	}
	switch typ {
	case generator.ContainerStarted:
		ev.State = generator.StateRunning
	case generator.ContainerDied:
		code := int32(1)
		ev.State, ev.ExitCode, ev.FinishedAt = generator.StateExited, &code, at.Add(time.Second)
	case generator.ContainerRemoved:
		ev.State = generator.StateRemoved
	}
	return ev
}

// stateKeyOf is the key of stateEvent's container on node-1.
func stateKeyOf(uid, id string) string {
	return schemas.StateKey(schemas.StateRef{Node: "node-1", Namespace: "shop", Pod: "pod-" + uid, PodUID: uid, ContainerID: id})
}

func newWriter(t *testing.T, js jetstream.JetStream, opts statebucket.Options) *statebucket.Writer {
	t.Helper()
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: "node-1", SubjectPrefix: "pleg", Mode: publish.ModeBinary})
	if err != nil {
		t.Fatal(err)
	}
	opts.Encoder = enc
	if opts.Bucket == "" {
		opts.Bucket = "STATE"
	}
	opts.Manage = true
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	opts.RetryBackoffMin, opts.RetryBackoffMax = 10*time.Millisecond, 200*time.Millisecond
	w, err := statebucket.New(js, opts)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// bucketWatch follows a bucket's keys as a reader does.
type bucketWatch struct {
	w    jetstream.KeyWatcher
	keys map[string]jetstream.KeyValueEntry
}

// watchBucket waits for bucket to exist and watches every key.
func watchBucket(t *testing.T, js jetstream.JetStream, bucket string) *bucketWatch {
	t.Helper()
	// Every writer creates the bucket at once; this waits for that
	// request, not for time to pass.
	publishtest.WaitStream(t, js, "KV_"+bucket)
	kv, err := js.KeyValue(context.Background(), bucket)
	if err != nil {
		t.Fatalf("bucket %s: %v", bucket, err)
	}
	w, err := kv.WatchAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	return &bucketWatch{w: w, keys: map[string]jetstream.KeyValueEntry{}}
}

// until reads updates until the keys and the type of the event each holds
// are want, or fails the test after waitTimeout.
func (b *bucketWatch) until(t *testing.T, want map[string]string) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		got := map[string]string{}
		for k, e := range b.keys {
			var ce struct {
				Type string `json:"type"`
			}
			if err := json.Unmarshal(e.Value(), &ce); err != nil {
				t.Fatalf("key %s: value is not a CloudEvent: %v", k, err)
			}
			got[k] = ce.Type
		}
		if cmp.Equal(got, want) {
			for k, e := range b.keys {
				if strings.HasPrefix(got[k], "pleg.") {
					schemastest.ValidateCloudEvent(t, e.Value())
				}
			}
			return
		}
		select {
		case e := <-b.w.Updates():
			if e == nil {
				continue
			}
			if e.Operation() == jetstream.KeyValuePut {
				b.keys[e.Key()] = e
			} else {
				delete(b.keys, e.Key())
			}
		case <-deadline:
			t.Fatalf("bucket did not converge (-want +got):\n%s", cmp.Diff(want, got))
		}
	}
}

func TestWriterHoldsTheLatestEventOfEachLiveContainer(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	reg := prometheus.NewRegistry()
	w := newWriter(t, js, statebucket.Options{Registerer: reg})
	statebuckettest.Run(t, w)
	b := watchBucket(t, js, "STATE")

	for _, ev := range []generator.Event{
		stateEvent(generator.ContainerStarted, "u1", "a"),
		stateEvent(generator.ContainerStarted, "u1", "b"),
		stateEvent(generator.ContainerStarted, "u2", "c"),
		stateEvent(generator.ContainerDied, "u1", "a"),
		stateEvent(generator.ContainerDied, "u2", "c"),
		stateEvent(generator.ContainerRemoved, "u2", "c"),
		// A late Started after Died is stale and changes nothing.
		stateEvent(generator.ContainerStarted, "u1", "a"),
	} {
		w.Record(ev)
	}
	b.until(t, map[string]string{
		stateKeyOf("u1", "a"): schemas.TypeContainerDied,
		stateKeyOf("u1", "b"): schemas.TypeContainerStarted,
	})
	// The bucket keeps one message per key and holds the structured event
	// even though the stream gets binary mode.
	kv, err := js.KeyValue(context.Background(), "STATE")
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.History() != 1 || st.LimitMarkerTTL() != statebucket.DefaultMarkerTTL {
		t.Errorf("bucket history %d, marker TTL %s; want 1 and %s", st.History(), st.LimitMarkerTTL(), statebucket.DefaultMarkerTTL)
	}
	waitNothingPending(t, w)
	if got := testutil.CollectAndCount(reg, "pleg_bridge_state_writes_total"); got == 0 {
		t.Error("no pleg_bridge_state_writes_total series")
	}
	// Nothing waits, nothing was forgotten, and without Ready no reconcile
	// ran.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP pleg_bridge_state_deletes_forgotten_total Deletes of state keys forgotten for want of room while NATS was away, left to a reconcile.
# TYPE pleg_bridge_state_deletes_forgotten_total counter
pleg_bridge_state_deletes_forgotten_total 0
# HELP pleg_bridge_state_pending_keys State bucket keys waiting to be written.
# TYPE pleg_bridge_state_pending_keys gauge
pleg_bridge_state_pending_keys 0
# HELP pleg_bridge_state_reconciles_total Reconciles of the node's keys in the state bucket with the containers the bridge holds.
# TYPE pleg_bridge_state_reconciles_total counter
pleg_bridge_state_reconciles_total 0
`), "pleg_bridge_state_deletes_forgotten_total", "pleg_bridge_state_pending_keys", "pleg_bridge_state_reconciles_total"); err != nil {
		t.Error(err)
	}
}

// TestWriterDoesNotBringBackARemovedContainer: an earlier event of a
// container recorded after its ContainerRemoved (published again by the
// repair after the servers lost it, and stored after the removal) leaves
// the container's key deleted.
func TestWriterDoesNotBringBackARemovedContainer(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	w := newWriter(t, js, statebucket.Options{})
	statebuckettest.Run(t, w)
	b := watchBucket(t, js, "STATE")
	for _, ev := range []generator.Event{
		stateEvent(generator.ContainerStarted, "u1", "a"),
		stateEvent(generator.ContainerStarted, "u1", "b"),
		stateEvent(generator.ContainerRemoved, "u1", "a"),
		stateEvent(generator.ContainerDied, "u1", "a"),
		stateEvent(generator.ContainerStarted, "u1", "a"),
	} {
		w.Record(ev)
	}
	b.until(t, map[string]string{stateKeyOf("u1", "b"): schemas.TypeContainerStarted})
	waitNothingPending(t, w)
	b.until(t, map[string]string{stateKeyOf("u1", "b"): schemas.TypeContainerStarted})
}

// TestWriterConvergesAfterAnOutage stops NATS while containers
// change: the changes wait, and once the server is back the bucket holds
// the truth, with the removed container's key gone.
func TestWriterConvergesAfterAnOutage(t *testing.T) {
	t.Parallel()
	rs, stopServer := publishtest.NewRestartableServer(t)
	_, js := publishtest.Connect(t, rs.URL, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	w := newWriter(t, js, statebucket.Options{})
	statebuckettest.Run(t, w)
	b := watchBucket(t, js, "STATE")
	w.Record(stateEvent(generator.ContainerStarted, "u1", "a"))
	w.Record(stateEvent(generator.ContainerStarted, "u1", "b"))
	b.until(t, map[string]string{
		stateKeyOf("u1", "a"): schemas.TypeContainerStarted,
		stateKeyOf("u1", "b"): schemas.TypeContainerStarted,
	})

	stopServer()
	reconnected := js.Conn().StatusChanged(nats.CONNECTED)
	w.Record(stateEvent(generator.ContainerDied, "u1", "a"))
	w.Record(stateEvent(generator.ContainerDied, "u1", "b"))
	w.Record(stateEvent(generator.ContainerRemoved, "u1", "b"))
	w.Record(stateEvent(generator.ContainerStarted, "u2", "c"))
	if n := w.Pending(); n == 0 {
		t.Error("nothing pending while NATS is away")
	}
	rs.Start(t)
	select {
	case <-reconnected:
	case <-time.After(waitTimeout):
		t.Fatal("no reconnect")
	}
	// A fresh reader: the watcher from before the restart would resume
	// too, but only once it misses enough heartbeats to notice.
	b = watchBucket(t, js, "STATE")
	b.until(t, map[string]string{
		stateKeyOf("u1", "a"): schemas.TypeContainerDied,
		stateKeyOf("u2", "c"): schemas.TypeContainerStarted,
	})
}

// TestWriterReconcilesTheNodesKeys starts over a bucket that an
// earlier run left: a key of a container gone while no bridge ran, a key
// whose value is out of date, another node's key. Seeded with what the
// checkpoint holds, the writer deletes the first, rewrites the second and
// leaves the other node's alone once Ready says the first relist is in.
func TestWriterReconcilesTheNodesKeys(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	first := newWriter(t, js, statebucket.Options{})
	stopFirst := statebuckettest.Run(t, first)
	b := watchBucket(t, js, "STATE")
	first.Record(stateEvent(generator.ContainerStarted, "u1", "gone"))
	first.Record(stateEvent(generator.ContainerStarted, "u1", "kept"))
	// same's event as an earlier run wrote it, with more than the
	// checkpoint keeps (an image digest here).
	same := stateEvent(generator.ContainerStarted, "u1", "same")
	same.Container.ImageRef = "busybox@sha256:1234"
	first.Record(same)
	b.until(t, map[string]string{
		stateKeyOf("u1", "gone"): schemas.TypeContainerStarted,
		stateKeyOf("u1", "kept"): schemas.TypeContainerStarted,
		stateKeyOf("u1", "same"): schemas.TypeContainerStarted,
	})
	stopFirst()
	kv, err := js.KeyValue(context.Background(), "STATE")
	if err != nil {
		t.Fatal(err)
	}
	sameBefore, err := kv.Get(context.Background(), stateKeyOf("u1", "same"))
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(stateKeyOf("u9", "x"), "node-1.", "node-2.", 1)
	if _, err := kv.Put(context.Background(), other, []byte(`{"type":"other-node"}`)); err != nil {
		t.Fatal(err)
	}

	ready := make(chan struct{})
	second := newWriter(t, js, statebucket.Options{
		// The checkpoint: kept died since, gone was removed.
		Seed: []generator.Event{
			stateEvent(generator.ContainerStarted, "u1", "kept"),
			stateEvent(generator.ContainerDied, "u1", "kept"),
			stateEvent(generator.ContainerStarted, "u1", "same"),
		},
		Ready: func() bool {
			select {
			case <-ready:
				return true
			default:
				return false
			}
		},
	})
	stopSecond := statebuckettest.Run(t, second)
	close(ready)
	b.until(t, map[string]string{
		stateKeyOf("u1", "kept"): schemas.TypeContainerDied,
		stateKeyOf("u1", "same"): schemas.TypeContainerStarted,
		other:                    "other-node",
	})
	stopSecond() // writes whatever the reconcile marked
	sameAfter, err := kv.Get(context.Background(), stateKeyOf("u1", "same"))
	if err != nil {
		t.Fatal(err)
	}
	if sameAfter.Revision() != sameBefore.Revision() {
		t.Errorf("the reconcile rewrote a key that holds the same event (revision %d, then %d)", sameBefore.Revision(), sameAfter.Revision())
	}
}

// TestWriterForgetsDeletesPastItsBoundAndReconcilesInstead records
// more removals than MaxDeletes before it can write: the deletes are
// forgotten, and the reconcile that follows removes the keys all the same.
func TestWriterForgetsDeletesPastItsBoundAndReconcilesInstead(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	first := newWriter(t, js, statebucket.Options{})
	stopFirst := statebuckettest.Run(t, first)
	b := watchBucket(t, js, "STATE")
	want := map[string]string{}
	var ids []string
	for i := range 5 {
		id := fmt.Sprintf("c%d", i)
		ids = append(ids, id)
		first.Record(stateEvent(generator.ContainerStarted, "u1", id))
		want[stateKeyOf("u1", id)] = schemas.TypeContainerStarted
	}
	b.until(t, want)
	stopFirst()

	reg := prometheus.NewRegistry()
	second := newWriter(t, js, statebucket.Options{
		MaxDeletes: 2,
		Registerer: reg,
		Seed: slices.Collect(func(yield func(generator.Event) bool) {
			for _, id := range ids {
				if !yield(stateEvent(generator.ContainerStarted, "u1", id)) {
					return
				}
			}
		}),
	})
	for _, id := range ids[:4] {
		second.Record(stateEvent(generator.ContainerRemoved, "u1", id))
	}
	if n := metricstest.Value(t, reg, "pleg_bridge_state_deletes_forgotten_total", nil); n == 0 {
		t.Error("no delete was forgotten past MaxDeletes")
	}
	statebuckettest.Run(t, second)
	b.until(t, map[string]string{stateKeyOf("u1", "c4"): schemas.TypeContainerStarted})
}

// TestWriterWritesWhatIsDirtyWhenStopped stops the writer right after
// events were recorded: Run writes them before it returns, as the bridge
// stops it only once the publisher delivered what it could.
func TestWriterWritesWhatIsDirtyWhenStopped(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	logs := &logtest.Buffer{}
	w := newWriter(t, js, statebucket.Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	stop := statebuckettest.Run(t, w)
	b := watchBucket(t, js, "STATE")
	want := map[string]string{}
	for i := range 20 {
		id := fmt.Sprintf("c%d", i)
		w.Record(stateEvent(generator.ContainerStarted, "u1", id))
		want[stateKeyOf("u1", id)] = schemas.TypeContainerStarted
	}
	stop()
	if n := w.Pending(); n != 0 {
		t.Errorf("Pending = %d after Run returned", n)
	}
	b.until(t, want)
	if l := logs.String(); l != "" {
		t.Errorf("a stop logged warnings:\n%s", l)
	}
}

// waitNothingPending waits, bounded, until w has written everything. The
// bucket can look converged to a watcher before the writer is done: the
// purge of a container whose key was never written (its start folded into
// the purge) shows nothing to a watcher that did not see the key.
func waitNothingPending(t *testing.T, w *statebucket.Writer) {
	t.Helper()
	waittest.Until(t, waitTimeout, "the state writer to have no key pending", func() (bool, error) {
		n := w.Pending()
		return n == 0, fmt.Errorf("%d keys pending", n)
	})
}
