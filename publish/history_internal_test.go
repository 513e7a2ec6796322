package publish

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

var historyT0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// historyEvent is the event of type typ of container id in pod uid, as the
// generator reports it: started at historyT0, exited with code 3 a minute
// later, removed a minute after that.
func historyEvent(uid, id string, typ generator.LifecycleEventType) generator.Event {
	ev := generator.Event{
		Type: typ, Pod: generator.Pod{UID: uid, Namespace: "shop", Name: "web-" + uid},
		Container: generator.Container{ID: id, Name: "app-" + id}, StartedAt: historyT0,
		DetectedBy: generator.SourceRelist,
	}
	code := int32(3)
	switch typ {
	case generator.ContainerStarted:
		ev.State, ev.Time, ev.ObservedAt = generator.StateRunning, historyT0, historyT0.Add(time.Second)
	case generator.ContainerDied:
		ev.State, ev.ExitCode, ev.FinishedAt = generator.StateExited, &code, historyT0.Add(time.Minute)
		ev.Time, ev.ObservedAt = ev.FinishedAt, ev.FinishedAt.Add(time.Second)
	case generator.ContainerRemoved:
		ev.State, ev.ExitCode, ev.FinishedAt = generator.StateRemoved, &code, historyT0.Add(time.Minute)
		ev.Time, ev.ObservedAt = historyT0.Add(2*time.Minute), historyT0.Add(2*time.Minute)
	}
	return ev
}

// sandboxEvent is historyEvent for the sandbox id: no started_at.
func sandboxEvent(uid, id string, typ generator.LifecycleEventType) generator.Event {
	ev := historyEvent(uid, id, typ)
	ev.Container = generator.Container{ID: id, Sandbox: true}
	ev.StartedAt = time.Time{}
	if typ == generator.ContainerDied {
		ev.State, ev.ExitCode = generator.StateUnknown, nil
	}
	return ev
}

func foundIDs(evs ...generator.Event) map[string]uint64 {
	out := map[string]uint64{}
	for i, ev := range evs {
		out[EventID(ev.Container.ID, ev.Type)] = uint64(i + 1)
	}
	return out
}

func TestCarryHistory(t *testing.T) {
	t.Parallel()
	const (
		started = generator.ContainerStarted
		died    = generator.ContainerDied
		removed = generator.ContainerRemoved
	)
	now := historyT0.Add(time.Hour)
	synthesizedStart := historyEvent("u1", "a", started)
	synthesizedStart.ObservedAt = historyEvent("u1", "a", died).ObservedAt
	synthesizedDied := historyEvent("u1", "a", died)
	synthesizedDied.ObservedAt = historyEvent("u1", "a", removed).ObservedAt
	synthesizedStartBeforeRemoved := historyEvent("u1", "a", started)
	synthesizedStartBeforeRemoved.ObservedAt = synthesizedDied.ObservedAt
	legacy := historyEvent("u1", "a", started)
	legacy.DetectedBy, legacy.ObservedAt = "", time.Time{}
	legacyCarried := historyEvent("u1", "a", started)
	legacyCarried.ObservedAt = now
	for _, tc := range []struct {
		name               string
		published, spooled []generator.Event
		found              map[string]uint64
		want               []generator.Event
	}{
		{
			name:      "a running container the stream holds nothing of gets its ContainerStarted",
			published: []generator.Event{historyEvent("u1", "a", started)},
			want:      []generator.Event{historyEvent("u1", "a", started)},
		},
		{
			name:      "an exited container gets its ContainerStarted and ContainerDied",
			published: []generator.Event{historyEvent("u1", "a", died), historyEvent("u1", "a", started)},
			want:      []generator.Event{historyEvent("u1", "a", started), historyEvent("u1", "a", died)},
		},
		{
			name: "a container removed before belongs to the old history only",
			published: []generator.Event{historyEvent("u1", "a", started), historyEvent("u1", "a", died),
				historyEvent("u1", "a", removed)},
		},
		{
			name:      "a container whose ContainerStarted the stream holds gets only what follows it",
			published: []generator.Event{historyEvent("u1", "a", started), historyEvent("u1", "a", died)},
			found:     foundIDs(historyEvent("u1", "a", started)),
			want:      []generator.Event{historyEvent("u1", "a", died)},
		},
		{
			name: "a removed container whose start a backup kept gets the rest of its history",
			published: []generator.Event{historyEvent("u1", "a", started), historyEvent("u1", "a", died),
				historyEvent("u1", "a", removed)},
			found: foundIDs(historyEvent("u1", "a", started)),
			want:  []generator.Event{historyEvent("u1", "a", died), historyEvent("u1", "a", removed)},
		},
		{
			name:      "a container the stream holds all of gets nothing",
			published: []generator.Event{historyEvent("u1", "a", started)},
			found:     foundIDs(historyEvent("u1", "a", started)),
		},
		{
			name:      "a spooled ContainerDied follows the ContainerStarted the checkpoint holds",
			published: []generator.Event{historyEvent("u1", "a", started)},
			spooled:   []generator.Event{historyEvent("u1", "a", died)},
			want:      []generator.Event{historyEvent("u1", "a", started)},
		},
		{
			name:    "a spooled ContainerDied whose ContainerStarted no checkpoint holds gets one from its started_at",
			spooled: []generator.Event{historyEvent("u1", "a", died), historyEvent("u1", "a", removed)},
			want:    []generator.Event{synthesizedStart},
		},
		{
			name:    "a spooled ContainerRemoved whose ContainerStarted and ContainerDied no checkpoint holds gets both",
			spooled: []generator.Event{historyEvent("u1", "a", removed)},
			want:    []generator.Event{synthesizedStartBeforeRemoved, synthesizedDied},
		},
		{
			name:    "a spooled ContainerStarted needs nothing before it",
			spooled: []generator.Event{historyEvent("u1", "a", started), historyEvent("u1", "a", died)},
		},
		{
			name:    "a spooled ContainerDied of a sandbox gets no ContainerStarted, as a first relist reports none",
			spooled: []generator.Event{sandboxEvent("u1", "sb", died)},
		},
		{
			name: "a pod's sandbox starts before its containers and dies after them",
			published: []generator.Event{historyEvent("u1", "b", died), sandboxEvent("u1", "sb", died),
				historyEvent("u1", "b", started), sandboxEvent("u1", "sb", started), historyEvent("u1", "a", started)},
			want: []generator.Event{sandboxEvent("u1", "sb", started), historyEvent("u1", "a", started),
				historyEvent("u1", "b", started), historyEvent("u1", "b", died), sandboxEvent("u1", "sb", died)},
		},
		{
			name:      "pods come in UID order",
			published: []generator.Event{historyEvent("u2", "b", started), historyEvent("u1", "a", started)},
			want:      []generator.Event{historyEvent("u1", "a", started), historyEvent("u2", "b", started)},
		},
		{
			name:      "a record without source or observation time is taken as found by a relist now",
			published: []generator.Event{legacy},
			want:      []generator.Event{legacyCarried},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := carryHistory(tc.published, tc.spooled, tc.found, now)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("carried (-want +got):\n%s", diff)
			}
		})
	}
}

// checkpointOf returns the checkpoint of a store in a new directory that
// recorded an ack with sequence seq and then did what names the stream.
func checkpointOf(t *testing.T, seq uint64, name func(*datadir.Checkpoint)) *datadir.Checkpoint {
	t.Helper()
	dir := t.TempDir()
	for i := range 2 {
		st, err := datadir.Open(dir, datadir.Options{Node: "node-1"})
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			t.Cleanup(func() { st.Close() })
			return st.Checkpoint()
		}
		st.Checkpoint().RecordAck(historyEvent("u1", "a", generator.ContainerStarted), seq)
		if name != nil {
			name(st.Checkpoint())
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	panic("unreachable")
}

func TestRenewal(t *testing.T) {
	t.Parallel()
	pleg := datadir.StreamIdentity{Name: "PLEG", Created: historyT0}
	adopt := func(id datadir.StreamIdentity) func(*datadir.Checkpoint) {
		return func(c *datadir.Checkpoint) { c.Adopt(id) }
	}
	for _, tc := range []struct {
		name  string
		ckpt  *datadir.Checkpoint
		id    datadir.StreamIdentity
		last  uint64
		renew bool
	}{
		{"the checkpoint's own stream, grown since, is the same history", checkpointOf(t, 5, adopt(pleg)), pleg, 9, false},
		{"the checkpoint's own stream, purged (its sequence kept), is the same history", checkpointOf(t, 5, adopt(pleg)), pleg, 5, false},
		{"a stream created anew under the name is another history", checkpointOf(t, 5, adopt(pleg)),
			datadir.StreamIdentity{Name: "PLEG", Created: historyT0.Add(time.Hour)}, 9, true},
		{"a stream of another name is another history", checkpointOf(t, 5, adopt(pleg)),
			datadir.StreamIdentity{Name: "EVENTS", Created: historyT0}, 9, true},
		{"the checkpoint's stream ending before its sequence (a backup restored) is another history",
			checkpointOf(t, 5, adopt(pleg)), pleg, 4, true},
		{"a checkpoint that names no stream adopts one that covers its sequence", checkpointOf(t, 5, nil), pleg, 5, false},
		{"a checkpoint that names no stream does not adopt one that ends before its sequence", checkpointOf(t, 5, nil), pleg, 4, true},
		{"a checkpoint an earlier run was carrying into a new stream is no stream's",
			checkpointOf(t, 5, func(c *datadir.Checkpoint) { c.Disown() }), pleg, 9, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := renewal(tc.ckpt, tc.id, tc.last); (got != "") != tc.renew {
				t.Errorf("renewal = %q, want another history: %v", got, tc.renew)
			}
		})
	}
}
