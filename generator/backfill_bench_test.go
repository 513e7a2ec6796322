package generator

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// roomSink is a Sink that records nothing while full and counts what it
// records otherwise.
type roomSink struct {
	full   bool
	events int
}

func (s *roomSink) Send(_ context.Context, evs []Event) error {
	if s.full {
		return &SinkFullError{}
	}
	s.events += len(evs)
	return nil
}

// heldNode merges the relist of a node of pods*perPod running containers
// (and a sandbox per pod) into a generator whose sink is full, so that every
// event is held.
func heldNode(b *testing.B, pods, perPod int) (*Generator, *roomSink) {
	b.Helper()
	sink := &roomSink{full: true}
	g := New(nil, sink, Options{})
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	batch := &batch{source: SourceRelist, at: at}
	for p := range pods {
		sb := fmt.Sprintf("sb-%d", p)
		obs := podObservation{pod: Pod{UID: fmt.Sprintf("uid-%d", p), Namespace: "bench", Name: sb}, complete: true}
		obs.containers = append(obs.containers, sighting{info: Container{ID: sb, Sandbox: true}, sandboxID: sb, state: stateRunning, createdAt: at})
		for c := range perPod {
			id := fmt.Sprintf("%s-c%d", sb, c)
			obs.containers = append(obs.containers, sighting{info: Container{ID: id, Name: fmt.Sprintf("c%d", c)}, sandboxID: sb, state: stateRunning, startedAt: at})
		}
		batch.pods = append(batch.pods, obs)
	}
	if err := g.merge.apply(b.Context(), batch); err != nil {
		b.Fatal(err)
	}
	if want := pods * (perPod + 1); g.merge.held.count != want {
		b.Fatalf("held %d events, want %d", g.merge.held.count, want)
	}
	return g, sink
}

// BenchmarkBackfill measures a backfill of a 30,000-container node whose
// every container started while the sink was full: rebuilding the events
// from their records, sending them, and clearing the records.
func BenchmarkBackfill(b *testing.B) {
	for _, tc := range []struct{ pods, perPod int }{{100, 10}, {3000, 10}} {
		b.Run(fmt.Sprintf("containers=%d", tc.pods*tc.perPod), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				g, sink := heldNode(b, tc.pods, tc.perPod)
				sink.full = false
				b.StartTimer()
				if err := g.merge.backfill(b.Context()); err != nil {
					b.Fatal(err)
				}
				if g.merge.held.count != 0 || sink.events != tc.pods*(tc.perPod+1) {
					b.Fatalf("after the backfill %d held, %d sent", g.merge.held.count, sink.events)
				}
			}
		})
	}
}

// BenchmarkBackfillWhileFull measures a backfill that the sink refuses: the
// cost of each second of an outage with a 30,000-container node held.
func BenchmarkBackfillWhileFull(b *testing.B) {
	g, _ := heldNode(b, 3000, 10)
	for b.Loop() {
		if err := g.merge.backfill(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}
