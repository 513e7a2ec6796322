package consumer

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// BenchmarkRollbackBookkeeping measures what Subscribe's rollback check
// costs each message read: the bounded wait for it and recording where it
// was read.
func BenchmarkRollbackBookkeeping(b *testing.B) {
	var (
		w waker
		c rollbackCheck
	)
	ctx := context.Background()
	w.rearm(ctx, time.Hour)
	defer w.stop()
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = "3b9f0d2c5e7a" + strconv.Itoa(i) + "/ContainerDied"
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = w.wait()
		w.due()
		c.read(readPos{seq: uint64(i), id: ids[i%len(ids)], stored: t0})
	}
}

func TestReadRingKeepsTheLastPositionsBySequence(t *testing.T) {
	t.Parallel()
	var r readRing
	for seq := uint64(1); seq <= rollbackRing+10; seq++ {
		// Recorded out of order, as a group's partitions record.
		r.add(readPos{seq: seq ^ 1})
	}
	ps := r.sorted()
	if len(ps) != rollbackRing {
		t.Fatalf("holds %d positions, want %d", len(ps), rollbackRing)
	}
	for i := 1; i < len(ps); i++ {
		if ps[i].seq <= ps[i-1].seq {
			t.Fatalf("positions %d and %d out of order: %d, %d", i-1, i, ps[i-1].seq, ps[i].seq)
		}
	}
	r.keep(ps[10].seq)
	if got := r.sorted(); len(got) != 10 || got[len(got)-1].seq != ps[9].seq {
		t.Errorf("after keep(%d): %d positions, last %v; want 10, last %d", ps[10].seq, len(got), got[len(got)-1].seq, ps[9].seq)
	}
	r.keep(0)
	if r.n != 0 {
		t.Errorf("keep(0) left %d positions, want none", r.n)
	}
}
