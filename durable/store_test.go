package durable_test

import (
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/durable"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

func TestSmoke(t *testing.T) {
	dir := t.TempDir()
	s, err := durable.Open(dir, durable.Options{Node: "n1", SpoolMaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ev := generator.Event{Type: generator.ContainerStarted, Pod: generator.Pod{UID: "u"}, Container: generator.Container{ID: "c"}, State: generator.StateRunning, ObservedAt: time.Now()}
	s.Checkpoint().RecordAck(ev)
	if n := s.Spool().Append([]generator.Event{ev, ev}); n != 2 {
		t.Fatal(n)
	}
	if got := s.Spool().Take(1); len(got) != 1 || got[0].Seq != 1 {
		t.Fatal(got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = durable.Open(dir, durable.Options{Node: "n1", SpoolMaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Checkpoint().Restored(); len(got) != 1 {
		t.Fatal(got)
	}
	got := s.Spool().Take(5)
	if len(got) != 2 || !got[0].Earlier || got[1].Seq != 2 {
		t.Fatal(got)
	}
}
