package datadir_test

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// benchContainers is the node size the checkpoint is measured at: ten
// times a busy node, to show the cost of a write does not grow with it.
const benchContainers = 30000

// benchEvent is a Lifecycle event with the fields a real one carries, so
// that the encoded sizes are representative. Its container ID is random
// looking, as a runtime's are, so that records land on bbolt's pages as
// they would on a node.
func benchEvent(i int, typ generator.LifecycleEventType, at time.Time) generator.Event {
	ev := generator.Event{
		Type: typ,
		Pod:  generator.Pod{UID: fmt.Sprintf("7d3f0c2e-5b1a-4f7e-9c0d-%012d", i/3), Namespace: "team-payments", Name: fmt.Sprintf("checkout-api-7f9c8d6b5-%05d", i/3)},
		Container: generator.Container{
			ID: fmt.Sprintf("%x", sha256.Sum256([]byte(strconv.Itoa(i)))), Name: "app", Attempt: 1,
			Image:    "registry.example.com/payments/checkout-api:v1.42.3",
			ImageRef: "registry.example.com/payments/checkout-api@sha256:3b1f0c9e8d7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c",
		},
		State: generator.StateRunning, StartedAt: at, Time: at, DetectedBy: generator.SourceRelist, ObservedAt: at,
	}
	switch typ {
	case generator.ContainerDied:
		code := int32(137)
		ev.State, ev.ExitCode, ev.Reason, ev.FinishedAt = generator.StateExited, &code, "OOMKilled", at
	case generator.ContainerRemoved:
		ev.State = generator.StateRemoved
	}
	return ev
}

// benchStore returns a store in a fresh directory that has written a
// ContainerStarted of benchContainers containers.
func benchStore(b *testing.B, now time.Time) (*datadir.Store, string) {
	b.Helper()
	dir := b.TempDir()
	s, err := datadir.Open(dir, datadir.Options{Node: "node-1", SpoolMaxBytes: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	for i := range benchContainers {
		s.Checkpoint().RecordAck(benchEvent(i, generator.ContainerStarted, now), 0)
	}
	if err := datadir.Flush(s, now, false); err != nil {
		b.Fatal(err)
	}
	return s, dir
}

func fileSize(b *testing.B, dir string) float64 {
	b.Helper()
	st, err := os.Stat(filepath.Join(dir, datadir.FileName))
	if err != nil {
		b.Fatal(err)
	}
	return float64(st.Size())
}

// BenchmarkCheckpointFlush measures one write of a checkpoint that tracks
// 30,000 containers: after 100 new acks (containers dying), and after 100
// new acks (containers removed long ago) that the same write collects,
// with 100 new containers to keep the size steady.
func BenchmarkCheckpointFlush(b *testing.B) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	b.Run("acks", func(b *testing.B) {
		s, dir := benchStore(b, now)
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			for range 100 {
				s.Checkpoint().RecordAck(benchEvent(n%benchContainers, generator.ContainerDied, now), 0)
				n++
			}
			if err := datadir.Flush(s, now, false); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(fileSize(b, dir), "file-bytes")
	})
	b.Run("acks+collect", func(b *testing.B) {
		s, dir := benchStore(b, now)
		removedAt := now.Add(-generator.DefaultTombstoneTTL - time.Minute)
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			for range 100 {
				s.Checkpoint().RecordAck(benchEvent(n, generator.ContainerRemoved, removedAt), 0)
				s.Checkpoint().RecordAck(benchEvent(n+benchContainers, generator.ContainerStarted, now), 0)
				n++
			}
			if err := datadir.Flush(s, now, true); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(fileSize(b, dir), "file-bytes")
	})
}

// BenchmarkOpen measures the restore at Open of a checkpoint of 30,000
// containers.
func BenchmarkOpen(b *testing.B) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	s, dir := benchStore(b, now)
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s, err := datadir.Open(dir, datadir.Options{Node: "node-1", SpoolMaxBytes: 1 << 30})
		if err != nil {
			b.Fatal(err)
		}
		if n := len(s.Checkpoint().Restored()); n != benchContainers {
			b.Fatalf("restored %d events", n)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(fileSize(b, dir), "file-bytes")
}

// BenchmarkSpool measures a write of 100 appended events, and the read of
// 100 entries from the file with their Done and its write, on a spool of
// 30,000 entries.
func BenchmarkSpool(b *testing.B) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	fill := func(b *testing.B) *datadir.Store {
		s, err := datadir.Open(b.TempDir(), datadir.Options{Node: "node-1", SpoolMaxBytes: 1 << 40})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		evs := make([]generator.Event, benchContainers)
		for i := range evs {
			evs[i] = benchEvent(i, generator.ContainerDied, now)
		}
		s.Spool().Append(evs)
		if err := datadir.Flush(s, now, false); err != nil {
			b.Fatal(err)
		}
		return s
	}
	b.Run("append", func(b *testing.B) {
		s := fill(b)
		evs := make([]generator.Event, 100)
		for i := range evs {
			evs[i] = benchEvent(i, generator.ContainerDied, now)
		}
		b.ReportAllocs()
		for b.Loop() {
			if n := s.Spool().Append(evs); n != len(evs) {
				b.Fatalf("appended %d", n)
			}
			if err := datadir.Flush(s, now, false); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("take+done", func(b *testing.B) {
		s := fill(b)
		b.ReportAllocs()
		for b.Loop() {
			got := s.Spool().Take(100)
			if len(got) == 0 {
				b.StopTimer()
				s = fill(b)
				b.StartTimer()
				continue
			}
			for _, e := range got {
				s.Spool().Done(e.Seq)
			}
			if err := datadir.Flush(s, now, false); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkChurnFlush measures the durable state's cost per transition
// under churn, as pleg-bench's throughput run makes it: each op is one
// 100 ms write of a node where 333 containers start and the 333 started
// two writes earlier die and are removed (about 10,000 transitions a
// second), on a checkpoint that already holds the removals of 30,000
// containers (kept generator.DefaultTombstoneTTL). It reports the file's
// pages written per write (bbolt writes each with a system call of its
// own); ns/op and B/op are one write, ns/transition the write's time over
// its 999 transitions.
func BenchmarkChurnFlush(b *testing.B) {
	const perTick = 333
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	s, err := datadir.Open(b.TempDir(), datadir.Options{Node: "node-1", SpoolMaxBytes: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	ck := s.Checkpoint()
	next := 0
	for range benchContainers {
		ck.RecordAck(benchEvent(next, generator.ContainerStarted, now), 0)
		ck.RecordAck(benchEvent(next, generator.ContainerRemoved, now), 0)
		next++
	}
	if err := datadir.Flush(s, now, false); err != nil {
		b.Fatal(err)
	}
	first := next // the containers of the churn start here
	pages0 := datadir.PagesWritten(s)
	b.ReportAllocs()
	ticks := 0
	for b.Loop() {
		for i := range perTick {
			ck.RecordAck(benchEvent(next+i, generator.ContainerStarted, now), 0)
		}
		if old := next - 2*perTick; old >= first {
			for i := range perTick {
				ck.RecordAck(benchEvent(old+i, generator.ContainerDied, now), 0)
				ck.RecordAck(benchEvent(old+i, generator.ContainerRemoved, now), 0)
			}
		}
		next += perTick
		if err := datadir.Flush(s, now, false); err != nil {
			b.Fatal(err)
		}
		ticks++
	}
	b.ReportMetric(float64(datadir.PagesWritten(s)-pages0)/float64(ticks), "pages/write")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ticks*3*perTick), "ns/transition")
}
