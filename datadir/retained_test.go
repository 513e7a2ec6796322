package datadir_test

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
)

func openRetaining(t *testing.T, dir string, window time.Duration, maxBytes int64, logs *logtest.Buffer) *datadir.Store {
	t.Helper()
	opts := datadir.Options{Node: "node-1", RetainWindow: window, RetainMaxBytes: maxBytes}
	if logs != nil {
		opts.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	}
	s, err := datadir.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ids returns the container ID and type of each retained event, in order.
func retainedIDs(evs []datadir.RetainedEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Event.Container.ID+"/"+string(e.Event.Type))
	}
	return out
}

// TestRetainedSurvivesARestartInAckOrder: what was recorded and written is
// read back by the next Open, whole and in the order of the acks, with
// each event's sequence and ack time.
func TestRetainedSurvivesARestartInAckOrder(t *testing.T) {
	dir := t.TempDir()
	s := openRetaining(t, dir, 5*time.Minute, 1<<20, nil)
	kept := s.Retained()
	now := time.Now()
	want := []generator.Event{
		event("p1", "c1", generator.ContainerStarted, t0),
		event("p2", "c2", generator.ContainerStarted, t0),
		event("p1", "c1", generator.ContainerDied, t0.Add(time.Second)),
	}
	want[0].Pod.Meta = &generator.PodMeta{Labels: map[string]string{"app": "web"}}
	for i, ev := range want {
		kept.Record(ev, uint64(10+i), now.Add(time.Duration(i)*time.Millisecond))
	}
	if err := datadir.Flush(s, now, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openRetaining(t, dir, 5*time.Minute, 1<<20, nil)
	defer s.Close()
	got := s.Retained().Since(time.Time{}, now)
	if len(got) != len(want) {
		t.Fatalf("read back %v, want 3 events", retainedIDs(got))
	}
	for i, g := range got {
		if diff := gocmp.Diff(want[i], g.Event); diff != "" {
			t.Errorf("event %d differs (-want +got):\n%s", i, diff)
		}
		if g.Sequence != uint64(10+i) || !g.AckedAt.Equal(now.Add(time.Duration(i)*time.Millisecond)) {
			t.Errorf("event %d: sequence %d acked at %v, want %d at %v", i, g.Sequence, g.AckedAt, 10+i, now.Add(time.Duration(i)*time.Millisecond))
		}
	}
}

// TestRetainedKeepsTheWindowOnly: an event acked a window ago leaves, in
// memory and on disk; recording an event again replaces its entry.
func TestRetainedKeepsTheWindowOnly(t *testing.T) {
	dir := t.TempDir()
	s := openRetaining(t, dir, time.Minute, 1<<20, nil)
	kept := s.Retained()
	now := time.Now()
	kept.Record(event("p1", "old", generator.ContainerStarted, t0), 1, now.Add(-2*time.Minute))
	kept.Record(event("p1", "c1", generator.ContainerStarted, t0), 2, now.Add(-30*time.Second))
	kept.Record(event("p1", "c2", generator.ContainerStarted, t0), 3, now.Add(-20*time.Second))
	// Published again after a loss: the newer entry replaces the older.
	kept.Record(event("p1", "c1", generator.ContainerStarted, t0), 7, now.Add(-10*time.Second))
	if got, want := retainedIDs(kept.Since(time.Time{}, now)), []string{"c2/ContainerStarted", "c1/ContainerStarted"}; !slices.Equal(got, want) {
		t.Fatalf("kept %v, want %v", got, want)
	}
	if err := datadir.Flush(s, now, false); err != nil {
		t.Fatal(err)
	}
	// 50 s later c2 has left the window too.
	later := now.Add(45 * time.Second)
	if got, want := retainedIDs(kept.Since(time.Time{}, later)), []string{"c1/ContainerStarted"}; !slices.Equal(got, want) {
		t.Fatalf("kept %v at +45s, want %v", got, want)
	}
	if err := datadir.Flush(s, later, false); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openRetaining(t, dir, time.Hour, 1<<20, nil) // a longer window reads only what is on disk
	defer s.Close()
	got := s.Retained().Since(time.Time{}, later)
	if len(got) != 1 || got[0].Sequence != 7 {
		t.Fatalf("after a restart kept %v, want c1 at sequence 7 only", retainedIDs(got))
	}
}

// TestRetainedByteBoundDropsTheOldestAndSaysSo: past RetainMaxBytes the
// oldest go first, and the shortened window is logged once.
func TestRetainedByteBoundDropsTheOldestAndSaysSo(t *testing.T) {
	logs := &logtest.Buffer{}
	s := openRetaining(t, t.TempDir(), time.Hour, 4096, logs)
	defer s.Close()
	kept := s.Retained()
	now := time.Now()
	for i := range 100 {
		kept.Record(event("p1", "c"+string(rune('A'+i%26))+string(rune('a'+i/26)), generator.ContainerStarted, t0), uint64(i+1), now)
	}
	n, bytes := kept.Len()
	if bytes > 4096 || n == 0 || n >= 100 {
		t.Fatalf("kept %d events in %d bytes, want fewer than 100 within 4096 bytes", n, bytes)
	}
	got := kept.Since(time.Time{}, now)
	if last := got[len(got)-1]; last.Sequence != 100 {
		t.Fatalf("the newest kept is sequence %d, want 100: the oldest go first", last.Sequence)
	}
	if warns := logs.Records(t, "WARN"); len(warns) != 1 {
		t.Fatalf("logged %d warnings, want 1 about the byte bound: %v", len(warns), warns)
	}
}
