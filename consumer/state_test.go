package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
	"github.com/pleg-bridge/pleg-bridge/statebucket"
	"github.com/pleg-bridge/pleg-bridge/statebucket/statebuckettest"
)

const testBucket = "STATE"

// stateNode is a bridge's state writer for one node, over a bucket of the
// in-process server, run until the test ends.
type stateNode struct {
	node string
	w    *statebucket.Writer
}

func newStateNode(t *testing.T, js jetstream.JetStream, node string) *stateNode {
	t.Helper()
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: node, SubjectPrefix: "pleg"})
	if err != nil {
		t.Fatal(err)
	}
	w := statebuckettest.Start(t, js, statebucket.Options{Bucket: testBucket, Encoder: enc, Manage: true})
	return &stateNode{node: node, w: w}
}

// record records the event typ of container id (named name) of the pod
// namespace/pod with UID uid.
func (n *stateNode) record(typ generator.LifecycleEventType, namespace, pod, uid, id string) {
	at := fixtureTime
	ev := generator.Event{
		Type: typ, Pod: generator.Pod{UID: uid, Namespace: namespace, Name: pod},
		Container: generator.Container{ID: id, Name: "c-" + id}, StartedAt: at, Time: at,
		DetectedBy: generator.SourceRelist, ObservedAt: at,
	}
	switch typ {
	case generator.ContainerStarted:
		ev.State = generator.StateRunning
	case generator.ContainerDied:
		code := int32(137)
		ev.State, ev.ExitCode, ev.Reason, ev.FinishedAt = generator.StateExited, &code, "OOMKilled", at.Add(time.Minute)
	case generator.ContainerRemoved:
		ev.State = generator.StateRemoved
	}
	n.w.Record(ev)
}

// stateWatch runs WatchState and hands its changes to the test.
type stateWatch struct {
	changes chan consumer.StateChange
	errs    chan error
}

func watchState(t *testing.T, js jetstream.JetStream, opts consumer.StateOptions) *stateWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	s := &stateWatch{changes: make(chan consumer.StateChange), errs: make(chan error, 16)}
	opts.Bucket = testBucket
	opts.OnError = func(err error) { s.errs <- err }
	done := make(chan error, 1)
	go func() {
		done <- consumer.WatchState(ctx, js, opts, func(ch consumer.StateChange) error {
			select {
			case s.changes <- ch:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchState: %v", err)
		}
	})
	return s
}

// next returns the next change as "<op> <key> <type>", failing the test
// after waitTimeout.
func (s *stateWatch) next(t *testing.T) string {
	t.Helper()
	select {
	case ch := <-s.changes:
		line := ch.Op.String()
		if ch.Op != consumer.StateSynced {
			line += " " + ch.Container.Key
		}
		if ch.Container.Event.Type != "" {
			line += " " + ch.Container.Event.LifecycleType()
		}
		return line
	case <-time.After(waitTimeout):
		t.Fatal("no state change within the timeout")
		return ""
	}
}

// waitKeys waits until the bucket holds exactly the keys want, following
// every key as a reader would.
func waitKeys(t *testing.T, js jetstream.JetStream, want ...string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		// The writers create the bucket at once; until then ListState
		// says it is not found, and the loop waits for the create.
		got, err := consumer.ListState(t.Context(), js, consumer.StateOptions{Bucket: testBucket})
		if err == nil {
			var keys []string
			for _, c := range got {
				keys = append(keys, c.Key)
			}
			if cmp.Equal(keys, want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("bucket keys: %v, %v; want %q", got, err, want)
		}
		// Each round waits for a change of the bucket, not for time.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_ = consumer.WatchState(ctx, js, consumer.StateOptions{Bucket: testBucket}, func(ch consumer.StateChange) error {
			if ch.Op == consumer.StateUpdated || ch.Op == consumer.StateRemoved {
				cancel()
			}
			return nil
		})
		cancel()
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			publishtest.WaitStream(t, js, "KV_"+testBucket)
		}
	}
}

func key(node, namespace, pod, uid, id string) string {
	return schemas.StateKey(schemas.StateRef{Node: node, Namespace: namespace, Pod: pod, PodUID: uid, ContainerID: id})
}

func TestListStateSelectsOnTheServerByNodeNamespaceAndPod(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	n1 := newStateNode(t, js, "node-1")
	n2 := newStateNode(t, js, "node-2.example")
	n1.record(generator.ContainerStarted, "shop", "web-0", "u1", "a")
	n1.record(generator.ContainerStarted, "shop", "web-0", "u1", "b")
	n1.record(generator.ContainerDied, "shop", "web-0", "u1", "b")
	n1.record(generator.ContainerStarted, "kube-system", "dns", "u2", "c")
	n2.record(generator.ContainerStarted, "shop", "web-1", "u3", "d")
	n2.record(generator.ContainerStarted, "shop", "web-1", "u3", "gone")
	n2.record(generator.ContainerDied, "shop", "web-1", "u3", "gone")
	n2.record(generator.ContainerRemoved, "shop", "web-1", "u3", "gone")
	all := []string{
		key("node-1", "kube-system", "dns", "u2", "c"),
		key("node-1", "shop", "web-0", "u1", "a"),
		key("node-1", "shop", "web-0", "u1", "b"),
		key("node-2.example", "shop", "web-1", "u3", "d"),
	}
	waitKeys(t, js, all...)

	tests := []struct {
		name   string
		filter consumer.StateFilter
		want   []string
	}{
		{"no filter lists the cluster", consumer.StateFilter{}, all},
		{"a node lists its containers", consumer.StateFilter{Node: "node-2.example"}, all[3:]},
		{"a namespace lists it on every node", consumer.StateFilter{Namespace: "shop"}, all[1:]},
		{"a pod by namespace and name", consumer.StateFilter{Namespace: "shop", Pod: "web-0"}, all[1:3]},
		{"a pod by UID", consumer.StateFilter{PodUID: "u2"}, all[:1]},
		{"a filter that matches nothing lists nothing", consumer.StateFilter{Node: "node-3"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := consumer.ListState(t.Context(), js, consumer.StateOptions{Bucket: testBucket, Filter: tt.filter})
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, c := range got {
				keys = append(keys, c.Key)
			}
			if diff := cmp.Diff(tt.want, keys); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
		})
	}

	got, err := consumer.ListState(t.Context(), js, consumer.StateOptions{Bucket: testBucket, Filter: consumer.StateFilter{PodUID: "u1"}})
	if err != nil || len(got) != 2 {
		t.Fatalf("ListState of u1 = %v, %v", got, err)
	}
	died := got[1]
	wantRef := schemas.StateRef{Node: "node-1", Namespace: "shop", Pod: "web-0", PodUID: "u1", ContainerID: "b"}
	if died.Ref != wantRef || died.Event.LifecycleType() != "ContainerDied" || died.Event.Data.ExitCode == nil ||
		*died.Event.Data.ExitCode != 137 || died.Event.Data.Container.Name != "c-b" || died.Revision == 0 || died.Stored.IsZero() {
		t.Errorf("container b = %+v, want its Died event with exit code 137 under %+v", died, wantRef)
	}
}

func TestWatchStateListsThenFollowsUpdatesAndRemovals(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	n1 := newStateNode(t, js, "node-1")
	n1.record(generator.ContainerStarted, "shop", "web-0", "u1", "a")
	n1.record(generator.ContainerStarted, "shop", "web-0", "u1", "old")
	n1.record(generator.ContainerDied, "shop", "web-0", "u1", "old")
	n1.record(generator.ContainerRemoved, "shop", "web-0", "u1", "old")
	n1.record(generator.ContainerStarted, "other", "x", "u2", "b")
	waitKeys(t, js, key("node-1", "other", "x", "u2", "b"), key("node-1", "shop", "web-0", "u1", "a"))

	w := watchState(t, js, consumer.StateOptions{Filter: consumer.StateFilter{Namespace: "shop"}})
	a := key("node-1", "shop", "web-0", "u1", "a")
	// The removed container's marker is not part of the starting state.
	for _, want := range []string{"listed " + a + " ContainerStarted", "synced"} {
		if got := w.next(t); got != want {
			t.Fatalf("change %q, want %q", got, want)
		}
	}
	n1.record(generator.ContainerDied, "other", "x", "u2", "b") // not in the filter
	n1.record(generator.ContainerDied, "shop", "web-0", "u1", "a")
	n1.record(generator.ContainerStarted, "shop", "web-0", "u1", "new")
	n1.record(generator.ContainerRemoved, "shop", "web-0", "u1", "a")
	// A writer coalesces by key: a's Died may be overtaken by its
	// removal before it is written, but a's changes keep their order.
	got := []string{w.next(t), w.next(t)}
	if got[0] == "updated "+a+" ContainerDied" {
		got = append(got[:0], got[1], w.next(t))
	}
	want := []string{"updated " + key("node-1", "shop", "web-0", "u1", "new") + " ContainerStarted", "removed " + a}
	if !cmp.Equal(got, want) && !cmp.Equal(got, []string{want[1], want[0]}) {
		t.Errorf("changes %q, want %q in either order", got, want)
	}
}

func TestWatchStateSkipsAndReportsWhatDoesNotDecode(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: testBucket})
	if err != nil {
		t.Fatal(err)
	}
	good := newStateNode(t, js, "node-1")
	good.record(generator.ContainerStarted, "shop", "web-0", "u1", "a")
	waitKeys(t, js, key("node-1", "shop", "web-0", "u1", "a"))
	for k, v := range map[string]string{
		key("node-1", "shop", "web-0", "u1", "junk"): "not json",
		"not.a.state.key": `{}`,
	} {
		if _, err := kv.Put(t.Context(), k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	w := watchState(t, js, consumer.StateOptions{})
	for _, want := range []string{"listed " + key("node-1", "shop", "web-0", "u1", "a") + " ContainerStarted", "synced"} {
		if got := w.next(t); got != want {
			t.Fatalf("change %q, want %q", got, want)
		}
	}
	for range 2 {
		select {
		case err := <-w.errs:
			var de *consumer.DecodeError
			if !errors.As(err, &de) || de.Sequence == 0 {
				t.Errorf("OnError got %v, want a *DecodeError with the revision", err)
			}
		case <-time.After(waitTimeout):
			t.Fatal("an undecodable entry was not reported")
		}
	}
	if _, err := consumer.ListState(t.Context(), js, consumer.StateOptions{Bucket: "MISSING"}); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("ListState of a missing bucket = %v, want ErrBucketNotFound", err)
	}
}
