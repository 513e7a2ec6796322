package consumer

import (
	"context"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
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

// TestRollbackCheckFindsWhereTheStreamDiverged runs the check against a
// real stream holding sequences 1 to 3, with positions recorded as if the
// reader had read more.
func TestRollbackCheckFindsWhereTheStreamDiverged(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	stream, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		t.Fatal(err)
	}
	var held []readPos
	for i := range 3 {
		id := "id-" + strconv.Itoa(i+1)
		if _, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: "s.x", Header: nats.Header{jetstream.MsgIDHeader: {id}}}); err != nil {
			t.Fatal(err)
		}
		msg, err := stream.GetMsg(t.Context(), uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, readPos{seq: msg.Sequence, id: id, stored: msg.Time})
	}
	last := held[2].stored
	lost := []readPos{{seq: 4, id: "lost-4", stored: last.Add(time.Millisecond)}, {seq: 6, id: "lost-6", stored: last.Add(2 * time.Millisecond)}}
	stale := []readPos{held[0], held[1], {seq: 3, id: "id-3", stored: last.Add(-time.Millisecond)}}

	for _, tc := range []struct {
		name       string
		read       []readPos
		noGets     bool
		idOnly     bool
		want       *restartPoint
		streamLast uint64
	}{
		{name: "a stream that holds what was read did not diverge", read: held},
		{name: "a stream that ends before the last sequence read diverged after the last one it holds",
			read: append(slices.Clone(held), lost...), want: &restartPoint{seq: 4}, streamLast: 3},
		{name: "a message stored again at the last sequence read is a divergence, by its storage time",
			read: stale, want: &restartPoint{seq: 3}},
		{name: "by id only, a message with the same id at the same sequence is held",
			read: stale, idOnly: true},
		{name: "a reader that may not get messages reads again after the last storage time",
			read: append(slices.Clone(held), lost...), noGets: true, want: &restartPoint{after: lost[1].stored}, streamLast: 3},
		{name: "a reader none of whose positions is held reads again after the last storage time",
			read: lost, want: &restartPoint{after: lost[1].stored}, streamLast: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &rollbackCheck{lookup: lookupOnce(js, "S"), noGets: tc.noGets, idOnly: tc.idOnly}
			for _, p := range tc.read {
				c.read(p)
			}
			p, gotLast, streamLast, err := c.check(t.Context())
			if err != nil {
				t.Fatalf("check: %v", err)
			}
			if !reflect.DeepEqual(p, tc.want) || streamLast != tc.streamLast || gotLast.seq != tc.read[len(tc.read)-1].seq {
				t.Errorf("check = %+v, last %d, stream last %d; want %+v, last %d, stream last %d",
					p, gotLast.seq, streamLast, tc.want, tc.read[len(tc.read)-1].seq, tc.streamLast)
			}
		})
	}
}
