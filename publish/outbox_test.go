package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// outboxTestEvent returns the i-th event of pod, told apart by its
// container.
func outboxTestEvent(pod string, i int) generator.Event {
	return generator.Event{
		Type:      generator.ContainerStarted,
		Pod:       generator.Pod{UID: pod, Namespace: "default", Name: pod},
		Container: generator.Container{ID: fmt.Sprintf("%s-c%d", pod, i), Name: "app"},
		State:     generator.StateRunning,
	}
}

// outboxSpool returns the spool of a fresh durable store of maxBytes. The
// store does not run: its entries stay queued in memory, where Take finds
// them as it finds those in the file.
func outboxSpool(t *testing.T, maxBytes int64) *datadir.Spool {
	t.Helper()
	st, err := datadir.Open(t.TempDir(), datadir.Options{Node: "node-1", SpoolMaxBytes: maxBytes})
	if err != nil {
		t.Fatalf("open durable store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st.Spool()
}

// outboxTest drives an outbox as Run's delivery does, and records what it
// yields.
type outboxTest struct {
	t *testing.T
	o *outbox
	// taken holds what Take yielded and nobody settled or released yet.
	taken []*outboxEvent
}

func newOutboxTest(t *testing.T, size int, spool *datadir.Spool) *outboxTest {
	return &outboxTest{t: t, o: newOutbox(size, spool, false, slog.New(slog.DiscardHandler))}
}

// put puts events and fails the test unless all are recorded.
func (ot *outboxTest) put(events ...generator.Event) {
	ot.t.Helper()
	if _, err := ot.o.Put(events); err != nil {
		ot.t.Fatalf("Put(%d events) = %v, want nil", len(events), err)
	}
}

// take returns the container IDs of what Take yields now, after waiting
// for the goroutines of the bubble, or nil when Ready says nothing is new.
func (ot *outboxTest) take() []string {
	ot.t.Helper()
	synctest.Wait()
	select {
	case <-ot.o.Ready():
	default:
		return nil
	}
	var ids []string
	for _, e := range ot.o.Take(nil) {
		ot.taken = append(ot.taken, e)
		ids = append(ids, e.ev.Container.ID)
	}
	return ids
}

// settle settles the n oldest events taken.
func (ot *outboxTest) settle(n int) {
	for _, e := range ot.taken[:n] {
		ot.o.Settle(e)
	}
	ot.taken = ot.taken[n:]
}

func ids(events []generator.Event) []string {
	var out []string
	for _, ev := range events {
		out = append(out, ev.Container.ID)
	}
	return out
}

func TestOutboxYieldsEventsInPutOrderAcrossTheSpoolAndBackToMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ot := newOutboxTest(t, 4, outboxSpool(t, 1<<20))
		var ev []generator.Event
		for i := range 10 {
			ev = append(ev, outboxTestEvent("pod-"+string(rune('a'+i%2)), i))
		}

		ot.put(ev[:6]...) // four in memory, the rest spilled to the spool
		if got, want := ot.take(), ids(ev[:4]); !cmp.Equal(got, want) {
			t.Fatalf("first take = %v, want memory's %v", got, want)
		}
		if got := ot.take(); got != nil {
			t.Fatalf("take with every slot held = %v, want nothing: the spool waits for a slot", got)
		}
		ot.put(ev[6]) // behind the spool's entries, not in memory
		ot.settle(1)
		if got, want := ot.take(), ids(ev[4:5]); !cmp.Equal(got, want) {
			t.Fatalf("take after one slot came back = %v, want the oldest spool entry %v", got, want)
		}
		ot.settle(4)
		if got, want := ot.take(), ids(ev[5:7]); !cmp.Equal(got, want) {
			t.Fatalf("take with the spool's last entries = %v, want %v", got, want)
		}
		ot.settle(2)
		ot.put(ev[7:]...) // the spool is empty: memory again
		if got, want := ot.take(), ids(ev[7:]); !cmp.Equal(got, want) {
			t.Fatalf("take after the spool emptied = %v, want %v", got, want)
		}
		var spooled []string
		for _, e := range ot.taken {
			if e.spooled {
				spooled = append(spooled, e.ev.Container.ID)
			}
		}
		if spooled != nil {
			t.Errorf("events put after the spool emptied came from the spool: %v", spooled)
		}
	})
}

func TestOutboxKeepsEachPodsOrderUnderChurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const size, pods = 16, 5
		ot := newOutboxTest(t, size, outboxSpool(t, 1<<20))
		rng := rand.New(rand.NewPCG(1, 2))
		var put []generator.Event
		var got []string
		next := make([]int, pods)
		for range 200 {
			var batch []generator.Event
			for range rng.IntN(8) {
				p := rng.IntN(pods)
				batch = append(batch, outboxTestEvent(fmt.Sprintf("pod-%d", p), next[p]))
				next[p]++
			}
			ot.put(batch...)
			put = append(put, batch...)
			got = append(got, ot.take()...)
			if n := ot.o.Len(); n > size {
				t.Fatalf("Len() = %d, above the outbox's %d slots", n, size)
			}
			ot.settle(rng.IntN(len(ot.taken) + 1))
		}
		for i := 0; len(ot.taken) > 0 || len(got) < len(put); i++ {
			if i == 100 {
				t.Fatalf("took %d of %d events, and Ready says nothing is left", len(got), len(put))
			}
			ot.settle(len(ot.taken))
			got = append(got, ot.take()...)
		}
		if diff := cmp.Diff(ids(put), got); diff != "" {
			t.Errorf("Take's events differ from Put's order (-put +taken):\n%s", diff)
		}
		if n := ot.o.Len(); n != 0 {
			t.Errorf("Len() = %d with everything settled, want 0", n)
		}
		if rec, set := ot.o.Progress(); rec != uint64(len(put)) || set != rec {
			t.Errorf("Progress() = %d recorded, %d settled, want %d of each", rec, set, len(put))
		}
	})
}

func TestOutboxRefusesWhatFitsNeitherMemoryNorTheSpool(t *testing.T) {
	t.Run("without a spool", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ot := newOutboxTest(t, 3, nil)
			_, err := ot.o.Put([]generator.Event{outboxTestEvent("a", 0), outboxTestEvent("a", 1), outboxTestEvent("b", 0), outboxTestEvent("b", 1)})
			var full *generator.SinkFullError
			if !errors.As(err, &full) || full.Recorded != 3 {
				t.Fatalf("Put(4 events) into 3 slots = %v, want a SinkFullError with 3 recorded", err)
			}
			if got := ot.take(); len(got) != 3 {
				t.Fatalf("take = %v, want the 3 recorded", got)
			}
			if _, err := ot.o.Put([]generator.Event{outboxTestEvent("b", 1)}); !errors.As(err, &full) || full.Recorded != 0 {
				t.Fatalf("Put with every slot taken and not settled = %v, want a SinkFullError with 0 recorded", err)
			}
			ot.settle(1)
			ot.put(outboxTestEvent("b", 1)) // a settled event's slot takes the next
			if got, want := ot.take(), []string{"b-c1"}; !cmp.Equal(got, want) {
				t.Errorf("take = %v, want %v", got, want)
			}
		})
	})
	t.Run("with a full spool", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ot := newOutboxTest(t, 1, outboxSpool(t, 1))
			ot.put(outboxTestEvent("a", 0))
			n, err := ot.o.Put([]generator.Event{outboxTestEvent("a", 1), outboxTestEvent("a", 2)})
			var full *generator.SinkFullError
			if !errors.As(err, &full) {
				t.Fatalf("Put beyond memory and a spool of 1 byte = %v, want a SinkFullError", err)
			}
			if n != full.Recorded {
				t.Errorf("Put spooled %d events, recorded %d: want every recorded one spooled", n, full.Recorded)
			}
		})
	})
}

func TestOutboxTakesSpoolEntriesOnlyIntoFreeSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ot := newOutboxTest(t, 2, outboxSpool(t, 1<<20))
		var ev []generator.Event
		for i := range 5 {
			ev = append(ev, outboxTestEvent("a", i))
		}
		ot.put(ev...)
		ot.take()
		// A delivery loop waiting for the outbox: nothing comes while
		// every slot is held, however much waits in the spool.
		yielded := make(chan []*outboxEvent)
		go func() {
			<-ot.o.Ready()
			yielded <- ot.o.Take(nil)
		}()
		synctest.Wait()
		select {
		case got := <-yielded:
			t.Fatalf("Take yielded %d events with no slot free", len(got))
		default:
		}
		if n := ot.o.Len(); n != 2 {
			t.Errorf("Len() = %d, want the 2 slots", n)
		}
		// Released (left for the spool, not delivered): the slot comes
		// back, the event is not settled.
		ot.o.Release(ot.taken[0])
		got := <-yielded
		if len(got) != 1 || got[0].ev.Container.ID != "a-c2" || !got[0].spooled {
			t.Fatalf("Take after one slot came back yielded %v, want spool entry a-c2", got)
		}
		if n := ot.o.Len(); n != 2 {
			t.Errorf("Len() = %d, want the 2 slots", n)
		}
		ot.o.Settle(ot.taken[1])
		ot.o.Settle(got[0])
		if rec, set := ot.o.Progress(); rec != 5 || set != 2 {
			t.Errorf("Progress() = %d recorded, %d settled, want 5 and 2", rec, set)
		}
	})
}

func TestOutboxAfterCloseRefusesEventsAndLeavesTheSpoolsEntries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spool := outboxSpool(t, 1<<20)
		ot := newOutboxTest(t, 2, spool)
		ot.put(outboxTestEvent("a", 0))
		ot.put(outboxTestEvent("a", 1), outboxTestEvent("a", 2), outboxTestEvent("a", 3))
		ot.o.Close()
		if _, err := ot.o.Put([]generator.Event{outboxTestEvent("b", 0)}); !errors.Is(err, ErrClosed) {
			t.Errorf("Put after Close = %v, want ErrClosed", err)
		}
		if got, want := ot.take(), []string{"a-c0", "a-c1"}; !cmp.Equal(got, want) {
			t.Errorf("take after Close = %v, want what memory holds, %v", got, want)
		}
		ot.o.Release(ot.taken[0])
		ot.o.Release(ot.taken[1])
		if got := ot.o.Take(nil); len(got) != 0 {
			t.Errorf("Take after Close with free slots yielded %d events, want nothing from the spool", len(got))
		}
		if n := spool.Untaken(); n != 2 {
			t.Errorf("spool holds %d untaken entries after Close, want 2 for the next start", n)
		}

		// A loop waiting for the outbox ends with its ctx, not with the
		// outbox: Close yields nothing more.
		ctx, cancel := context.WithCancel(t.Context())
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			select {
			case <-ot.o.Ready():
				t.Error("Ready after Close with nothing left")
			case <-ctx.Done():
			}
		}()
		synctest.Wait()
		cancel()
		<-ended
	})
}

func TestOutboxYieldsWhatAnEarlierProcessSpooledBeforeAnythingNewer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		st, err := datadir.Open(dir, datadir.Options{Node: "node-1", SpoolMaxBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		earlier := []generator.Event{outboxTestEvent("a", 0), outboxTestEvent("b", 0), outboxTestEvent("a", 1)}
		if n := st.Spool().Append(earlier); n != len(earlier) {
			t.Fatalf("spooled %d of %d events", n, len(earlier))
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st, err = datadir.Open(dir, datadir.Options{Node: "node-1", SpoolMaxBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })

		ot := newOutboxTest(t, 8, st.Spool())
		ot.put(outboxTestEvent("a", 2)) // behind the earlier process's entries
		want := ids(append(earlier, outboxTestEvent("a", 2)))
		if got := ot.take(); !cmp.Equal(got, want) {
			t.Fatalf("take = %v, want %v", got, want)
		}
		for _, e := range ot.taken[:3] {
			if !e.earlier || !e.unchecked {
				t.Errorf("entry %s of an earlier process: earlier %t, unchecked %t, want both", e.ev.Container.ID, e.earlier, e.unchecked)
			}
		}
		ot.put(outboxTestEvent("b", 1)) // every entry was taken: memory again
		if got := ot.take(); len(got) != 1 || ot.taken[4].spooled {
			t.Errorf("take after the spool emptied = %v, want b-c1 from memory", got)
		}
		ot.settle(len(ot.taken))
		if rec, set := ot.o.Progress(); rec != 2 || set != 2 {
			t.Errorf("Progress() = %d recorded, %d settled, want 2 and 2: an earlier process's entries are in neither", rec, set)
		}
	})
}
