package main

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// benchEvent is a Lifecycle event with the fields a real one carries, so
// that the encoded sizes are representative.
func benchEvent(i int, typ generator.LifecycleEventType, at time.Time) generator.Event {
	ev := generator.Event{
		Type: typ,
		Pod:  generator.Pod{UID: fmt.Sprintf("7d3f0c2e-5b1a-4f7e-9c0d-%012d", i/3), Namespace: "team-payments", Name: fmt.Sprintf("checkout-api-7f9c8d6b5-%05d", i/3)},
		Container: generator.Container{
			ID: fmt.Sprintf("%064x", i), Name: "app", Attempt: 1,
			Image:    "registry.example.com/payments/checkout-api:v1.42.3",
			ImageRef: "registry.example.com/payments/checkout-api@sha256:3b1f0c9e8d7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c",
		},
		State: generator.StateRunning, StartedAt: at, Time: at, DetectedBy: generator.SourceRelist, ObservedAt: at,
	}
	if typ == generator.ContainerDied {
		code := int32(137)
		ev.State, ev.ExitCode, ev.Reason, ev.FinishedAt = generator.StateExited, &code, "OOMKilled", at
	}
	return ev
}

// BenchmarkCheckpointFlush measures one flush of a checkpoint that tracks
// 30,000 containers after 100 new acks (containers dying):
//
//   - rewrite: a compaction, which is what every flush cost before the
//     journal (the whole snapshot encoded, written and fsynced);
//   - append: the journal append a flush normally is;
//   - flush: what Run does, appending and compacting when the journal has
//     outgrown the snapshot, so the compactions are amortised over the
//     appends.
func BenchmarkCheckpointFlush(b *testing.B) {
	const containers, acks = 30000, 100
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, bb := range []struct {
		name  string
		flush func(c *checkpoint) error
	}{
		{"rewrite", func(c *checkpoint) error { return c.compact(now) }},
		{"append", func(c *checkpoint) error { return c.appendPending() }},
		{"flush", func(c *checkpoint) error { return c.flush(now) }},
	} {
		b.Run(bb.name, func(b *testing.B) {
			c, _ := openCheckpoint(b.TempDir(), "node-1", slog.New(slog.DiscardHandler))
			b.Cleanup(c.closeJournal)
			for i := range containers {
				c.OnAck(benchEvent(i, generator.ContainerStarted, now))
			}
			if err := c.compact(now); err != nil {
				b.Fatal(err)
			}
			snapshot := c.snapshotSize
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				for range acks {
					c.OnAck(benchEvent(n%containers, generator.ContainerDied, now))
					n++
				}
				if err := bb.flush(c); err != nil {
					b.Fatal(err)
				}
			}
			// After the loop: b.Loop's first call resets reported metrics.
			b.ReportMetric(float64(snapshot), "snapshot-bytes")
		})
	}
}
