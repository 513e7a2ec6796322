package datadir_test

import (
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// TestCheckpointNamesItsStreamOnceAdoptionIsWritten: a fresh store names
// no stream; Adopt is written by the next write, with the acks recorded
// before it, and a reopened store names the stream.
func TestCheckpointNamesItsStreamOnceAdoptionIsWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, datadir.Options{})
	if id, ok := s.Checkpoint().Stream(); ok {
		t.Fatalf("a fresh store names stream %v", id)
	}
	pleg := datadir.StreamIdentity{Name: "PLEG", Created: t0}
	a := event("u1", "a", generator.ContainerStarted, t0)
	s.Checkpoint().RecordAck(a, 4)
	s.Checkpoint().Adopt(pleg)
	img := crashImage(t, dir)
	s2, _ := open(t, img, datadir.Options{})
	if id, ok := s2.Checkpoint().Stream(); ok {
		t.Errorf("crash image before the write names stream %v", id)
	}
	closeStore(t, s2)

	if err := datadir.Flush(s, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	closeStore(t, s)
	s, logs := open(t, dir, datadir.Options{})
	defer closeStore(t, s)
	if id, ok := s.Checkpoint().Stream(); !ok || !id.Equal(pleg) {
		t.Errorf("Stream() = %v, %v; want %v, true", id, ok, pleg)
	}
	if got := s.Checkpoint().Sequence(); got != 4 {
		t.Errorf("Sequence() = %d, want 4: adopting a stream keeps the sequence", got)
	}
	checkEvents(t, "restored", s.Checkpoint().Restored(), a)
	if infos := logs.Records(t, "INFO"); len(infos) == 0 || infos[len(infos)-1]["stream"] != pleg.String() {
		t.Errorf("the open log does not name the stream %q: %v", pleg, infos)
	}
}

// TestDisownDropsTheSequenceAndNamesNoStream: the checkpoint of a stream
// that is gone keeps its records (what was published, to be carried into
// the new stream) but not its sequence, a position in the old stream, and
// names the zero identity until the new stream is adopted; the sequence
// it holds then is the new stream's, even where it is lower.
func TestDisownDropsTheSequenceAndNamesNoStream(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, datadir.Options{})
	old := datadir.StreamIdentity{Name: "PLEG", Created: t0}
	a := event("u1", "a", generator.ContainerStarted, t0)
	s.Checkpoint().RecordAck(a, 900)
	s.Checkpoint().Adopt(old)
	if err := datadir.Flush(s, time.Now(), false); err != nil {
		t.Fatal(err)
	}

	s.Checkpoint().RecordAck(event("u1", "x", generator.ContainerStarted, t0), 901) // the old stream's, recorded before the Disown
	s.Checkpoint().Disown()
	if err := datadir.Flush(s, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	img := crashImage(t, dir)
	s2, _ := open(t, img, datadir.Options{})
	if id, ok := s2.Checkpoint().Stream(); !ok || !id.IsZero() {
		t.Errorf("after Disown: Stream() = %v, %v; want the zero identity, true", id, ok)
	}
	if got := s2.Checkpoint().Sequence(); got != 0 {
		t.Errorf("after Disown: Sequence() = %d, want 0", got)
	}
	if got := len(s2.Checkpoint().Restored()); got != 2 {
		t.Errorf("after Disown: %d records restored, want 2: the records stay", got)
	}
	closeStore(t, s2)

	// The new stream's acks, then its adoption.
	b := event("u1", "b", generator.ContainerStarted, t0)
	s.Checkpoint().RecordAck(a, 2)
	s.Checkpoint().RecordAck(b, 3)
	renewed := datadir.StreamIdentity{Name: "PLEG", Created: t0.Add(time.Hour)}
	s.Checkpoint().Adopt(renewed)
	closeStore(t, s)
	s, _ = open(t, dir, datadir.Options{})
	defer closeStore(t, s)
	if id, ok := s.Checkpoint().Stream(); !ok || !id.Equal(renewed) {
		t.Errorf("Stream() = %v, %v; want %v, true", id, ok, renewed)
	}
	if got := s.Checkpoint().Sequence(); got != 3 {
		t.Errorf("Sequence() = %d, want 3, the new stream's", got)
	}
}

// TestDisownAndAdoptInOneWrite: a Disown and an Adopt between two writes
// are written as both: the old sequence dropped, the acks recorded after
// the Disown bringing the new one, and the stream named.
func TestDisownAndAdoptInOneWrite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, datadir.Options{})
	s.Checkpoint().RecordAck(event("u1", "a", generator.ContainerStarted, t0), 50)
	if err := datadir.Flush(s, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	s.Checkpoint().Disown()
	s.Checkpoint().RecordAck(event("u1", "a", generator.ContainerStarted, t0), 1)
	renewed := datadir.StreamIdentity{Name: "PLEG", Created: t0}
	s.Checkpoint().Adopt(renewed)
	closeStore(t, s)
	s, _ = open(t, dir, datadir.Options{})
	defer closeStore(t, s)
	if id, ok := s.Checkpoint().Stream(); !ok || !id.Equal(renewed) {
		t.Errorf("Stream() = %v, %v; want %v, true", id, ok, renewed)
	}
	if got := s.Checkpoint().Sequence(); got != 1 {
		t.Errorf("Sequence() = %d, want 1", got)
	}
}

func TestStreamIdentityString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id   datadir.StreamIdentity
		want string
	}{
		{datadir.StreamIdentity{}, "none"},
		{datadir.StreamIdentity{Name: "PLEG", Created: time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))}, "PLEG created 2026-01-02T02:04:05.000000006Z"},
	} {
		if got := tc.id.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.id, got, tc.want)
		}
	}
}
