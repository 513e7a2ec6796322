package datadir_test

import (
	"testing"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// TestSpoolKeepsPodMetadataAndTheCheckpointDoesNot checks that an event
// delivered from the spool after an outage still carries its pod's labels
// and annotations (a service routing by label would miss it otherwise),
// known-empty labels included, while the checkpoint, which only tells the
// generator what was published, stays free of them.
func TestSpoolKeepsPodMetadataAndTheCheckpointDoesNot(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := datadir.Options{SpoolMaxBytes: 1 << 20}
	s, _ := open(t, dir, opts)
	labelled := event("u1", "a", generator.ContainerStarted, t0)
	labelled.Pod.Meta = generator.NewPodMeta(map[string]string{"app": "web"}, map[string]string{"team": "payments"})
	unlabelled := event("u2", "b", generator.ContainerStarted, t0)
	unlabelled.Pod.Meta = generator.NewPodMeta(map[string]string{}, nil)
	unknown := event("u3", "c", generator.ContainerStarted, t0)
	spooled := []generator.Event{labelled, unlabelled, unknown}
	if n := s.Spool().Append(spooled); n != len(spooled) {
		t.Fatalf("appended %d of %d", n, len(spooled))
	}
	acked := event("u1", "d", generator.ContainerStarted, t0)
	acked.Pod.Meta = labelled.Pod.Meta
	s.Checkpoint().RecordAck(acked, 0)
	closeStore(t, s)

	s, _ = open(t, dir, opts)
	defer closeStore(t, s)
	checkOrder(t, "taken from the spool", eventsOf(s.Spool().Take(10)), spooled)
	restored := s.Checkpoint().Restored()
	if len(restored) != 1 {
		t.Fatalf("checkpoint restored %d events, want the one acked", len(restored))
	}
	for _, ev := range restored {
		if ev.Pod.Meta != nil {
			t.Errorf("checkpoint restored pod metadata %+v for %s", ev.Pod.Meta, ev.Container.ID)
		}
	}
}
