package datadir_test

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// spoolEvents returns n events of distinct containers, numbered from first.
func spoolEvents(first, n int) []generator.Event {
	evs := make([]generator.Event, n)
	for i := range evs {
		evs[i] = event(fmt.Sprintf("u%d", (first+i)/3), fmt.Sprintf("c%06d", first+i), generator.ContainerStarted, t0)
	}
	return evs
}

func eventsOf(entries []datadir.SpoolEntry) []generator.Event {
	evs := make([]generator.Event, len(entries))
	for i, e := range entries {
		evs[i] = e.Event
	}
	return evs
}

func checkOrder(t *testing.T, what string, got []generator.Event, want []generator.Event) {
	t.Helper()
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", what, diff)
	}
}

func TestSpoolDeliversInOrderAcrossCloseAndOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := datadir.Options{SpoolMaxBytes: 1 << 20}
	s, _ := open(t, dir, opts)
	sp := s.Spool()
	evs := spoolEvents(0, 10)
	if n := sp.Append(evs[:4]); n != 4 {
		t.Fatalf("appended %d of 4", n)
	}
	if n := sp.Append(evs[4:]); n != 6 {
		t.Fatalf("appended %d of 6", n)
	}
	taken := sp.Take(3)
	checkOrder(t, "taken", eventsOf(taken), evs[:3])
	for i, e := range taken {
		if e.Earlier || (i > 0 && e.Seq <= taken[i-1].Seq) {
			t.Errorf("entry %d: %+v", i, e)
		}
	}
	sp.Done(taken[0].Seq)
	if sp.Len() != 9 || sp.Untaken() != 7 {
		t.Errorf("Len %d Untaken %d, want 9 and 7", sp.Len(), sp.Untaken())
	}
	closeStore(t, s)

	// The entries taken and not Done (their delivery unknown) come back
	// first, marked Earlier, then the rest, then what is appended now.
	s, _ = open(t, dir, opts)
	defer closeStore(t, s)
	sp = s.Spool()
	checkOrder(t, "restored", sp.Restored(), evs[1:])
	if sp.Len() != 9 || sp.Untaken() != 9 {
		t.Errorf("after Open: Len %d Untaken %d, want 9 and 9", sp.Len(), sp.Untaken())
	}
	more := spoolEvents(10, 2)
	if n := sp.Append(more); n != 2 {
		t.Fatalf("appended %d of 2", n)
	}
	got := sp.Take(5)
	got = append(got, sp.Take(100)...)
	checkOrder(t, "taken after Open", eventsOf(got), slices.Concat(evs[1:], more))
	for i, e := range got {
		if want := i < 9; e.Earlier != want {
			t.Errorf("entry %d (seq %d): Earlier %v, want %v", i, e.Seq, e.Earlier, want)
		}
		if i > 0 && e.Seq <= got[i-1].Seq {
			t.Errorf("entry %d: seq %d after %d", i, e.Seq, got[i-1].Seq)
		}
	}
	if rest := sp.Take(10); len(rest) != 0 {
		t.Errorf("taken again: %v", rest)
	}
}

func TestSpoolAppendsThePrefixThatFits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	evs := spoolEvents(0, 10)
	// Measure one record's size with an unbounded spool.
	s, _ := open(t, dir, datadir.Options{SpoolMaxBytes: 1 << 20})
	s.Spool().Append(evs[:1])
	size := s.Spool().Bytes()
	closeStore(t, s)

	s, _ = open(t, t.TempDir(), datadir.Options{SpoolMaxBytes: 3*size + size/2})
	defer closeStore(t, s)
	sp := s.Spool()
	if n := sp.Append(evs[:5]); n != 3 {
		t.Fatalf("appended %d of 5 to a spool with room for 3", n)
	}
	if n := sp.Append(evs[3:5]); n != 0 {
		t.Fatalf("appended %d to a full spool", n)
	}
	if b := sp.Bytes(); b != 3*size {
		t.Errorf("Bytes %d, want %d", b, 3*size)
	}
	// Taking frees nothing; Done does, at once.
	taken := sp.Take(1)
	if n := sp.Append(evs[3:5]); n != 0 {
		t.Fatalf("appended %d after a Take", n)
	}
	sp.Done(taken[0].Seq)
	sp.Done(taken[0].Seq) // twice: the bytes are freed once
	if b := sp.Bytes(); b != 2*size {
		t.Errorf("Bytes after Done %d, want %d", b, 2*size)
	}
	if n := sp.Append(evs[3:5]); n != 1 {
		t.Fatalf("appended %d of 2 after a Done freed room for 1", n)
	}
	checkOrder(t, "taken", eventsOf(sp.Take(10)), evs[1:4])
}

func TestSpoolDisabledWithoutABound(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, datadir.Options{SpoolMaxBytes: 1 << 20})
	evs := spoolEvents(0, 2)
	s.Spool().Append(evs)
	closeStore(t, s)

	// Entries of an earlier run with a spool stay, with a warning, for the
	// next bridge with one.
	s, logs := open(t, dir, datadir.Options{})
	if s.Spool() != nil {
		t.Error("a store without SpoolMaxBytes has a spool")
	}
	if w := logs.Records(t, "WARN"); len(w) != 1 || w[0]["spool_entries"] != 2.0 {
		t.Errorf("want one warning counting 2 entries, got %v", w)
	}
	closeStore(t, s)
	s, _ = open(t, dir, datadir.Options{SpoolMaxBytes: 1 << 20})
	defer closeStore(t, s)
	checkOrder(t, "spooled", eventsOf(s.Spool().Take(10)), evs)
}

// TestSpoolCrashWindows takes crash images while Run runs: an append is
// durable after the next tick, and an entry Done before a crash, but
// after the last tick, comes back Earlier.
func TestSpoolCrashWindows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		opts := datadir.Options{SpoolMaxBytes: 1 << 20}
		s, _ := open(t, dir, opts)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		synctest.Wait()

		evs := spoolEvents(0, 3)
		s.Spool().Append(evs)
		spooledAfterCrash := func() []datadir.SpoolEntry {
			s2, _ := open(t, crashImage(t, dir), opts)
			defer closeStore(t, s2)
			return s2.Spool().Take(10)
		}
		if got := spooledAfterCrash(); len(got) != 0 {
			t.Errorf("found %d entries before the tick that writes them", len(got))
		}
		advance(100 * time.Millisecond)
		got := spooledAfterCrash()
		checkOrder(t, "after a tick", eventsOf(got), evs)

		taken := s.Spool().Take(2)
		s.Spool().Done(taken[0].Seq)
		got = spooledAfterCrash()
		checkOrder(t, "after a Done, before the tick", eventsOf(got), evs)
		if !got[0].Earlier {
			t.Error("an entry found after a crash is not Earlier")
		}
		advance(100 * time.Millisecond)
		checkOrder(t, "after a Done and a tick", eventsOf(spooledAfterCrash()), evs[1:])

		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		closeStore(t, s)
	})
}

// TestSpoolNeverWritesAnEntryDoneBeforeItsWrite: an entry taken from
// memory and delivered before the tick is not in the file afterwards.
func TestSpoolNeverWritesAnEntryDoneBeforeItsWrite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := datadir.Options{SpoolMaxBytes: 1 << 20}
	s, _ := open(t, dir, opts)
	evs := spoolEvents(0, 3)
	s.Spool().Append(evs)
	taken := s.Spool().Take(2)
	s.Spool().Done(taken[0].Seq)
	s.Spool().Done(taken[1].Seq)
	closeStore(t, s)
	s, _ = open(t, dir, opts)
	defer closeStore(t, s)
	checkOrder(t, "after Close and Open", eventsOf(s.Spool().Take(10)), evs[2:])
}

// TestSpoolReadsALargeSpoolInOrderWithoutHoldingIt: a spool many times the
// size of what it keeps in memory is read back whole and in order, while
// the heap stays far below the spool's size.
func TestSpoolReadsALargeSpoolInOrderWithoutHoldingIt(t *testing.T) {
	// Not parallel: it measures the heap.
	const entries, batch = 50000, 500
	dir := t.TempDir()
	opts := datadir.Options{SpoolMaxBytes: 1 << 30}
	size := fillSpool(t, dir, opts, entries, batch)

	base := heapInUse()
	s, _ := open(t, dir, opts)
	defer closeStore(t, s)
	sp := s.Spool()
	if sp.Len() != entries || sp.Bytes() != size {
		t.Fatalf("found %d entries, %d bytes; want %d, %d", sp.Len(), sp.Bytes(), entries, size)
	}
	var peak uint64
	next := 0
	for next < entries {
		got := sp.Take(batch)
		if len(got) == 0 {
			t.Fatalf("Take returned nothing after %d of %d entries", next, entries)
		}
		for _, e := range got {
			if want := fmt.Sprintf("c%06d", next); e.Event.Container.ID != want || !e.Earlier {
				t.Fatalf("entry %d is %s (Earlier %v), want %s", next, e.Event.Container.ID, e.Earlier, want)
			}
			next++
			sp.Done(e.Seq)
		}
		if next%(entries/10) == 0 {
			peak = max(peak, heapInUse())
		}
	}
	if sp.Len() != 0 || sp.Bytes() != 0 {
		t.Errorf("after every Done: Len %d, Bytes %d", sp.Len(), sp.Bytes())
	}
	// What is read stays in bbolt's file mapping, outside the heap; the
	// heap holds a batch.
	if grew := int64(peak) - int64(base); grew > size/8 {
		t.Errorf("the heap grew by %d bytes reading a spool of %d bytes", grew, size)
	}
	t.Logf("spool of %d bytes; heap grew by at most %d bytes", size, int64(peak)-int64(base))
}

// fillSpool appends entries to the spool in dir, in batches, closes the
// store and returns the spool's size. Nothing of it stays referenced.
func fillSpool(t *testing.T, dir string, opts datadir.Options, entries, batch int) int64 {
	t.Helper()
	s, _ := open(t, dir, opts)
	for i := 0; i < entries; i += batch {
		if n := s.Spool().Append(spoolEvents(i, batch)); n != batch {
			t.Fatalf("appended %d of %d", n, batch)
		}
	}
	size := s.Spool().Bytes()
	closeStore(t, s)
	return size
}

func heapInUse() uint64 {
	// Twice: the first collection runs the finalizers (of the closed
	// store's file) that keep the rest alive until the second.
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestSpoolConcurrentAppendTakeDone runs under -race: appenders, takers
// and Run at once. Every entry is taken exactly once, each appender's in
// its order, and after Close and Open nothing Done is found again.
func TestSpoolConcurrentAppendTakeDone(t *testing.T) {
	t.Parallel()
	const appenders, perAppender, takers = 3, 2000, 2
	dir := t.TempDir()
	opts := datadir.Options{SpoolMaxBytes: 1 << 30}
	s, _ := open(t, dir, opts)
	sp := s.Spool()
	ctx, cancel := context.WithCancel(t.Context())
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()

	var wg sync.WaitGroup
	for a := range appenders {
		wg.Go(func() {
			for i := 0; i < perAppender; i += 10 {
				if n := sp.Append(spoolEvents(a*perAppender+i, 10)); n != 10 {
					t.Errorf("appended %d of 10", n)
					return
				}
			}
		})
	}
	appended := make(chan struct{})
	go func() { wg.Wait(); close(appended) }()

	var mu sync.Mutex
	var taken []datadir.SpoolEntry
	var tg sync.WaitGroup
	for range takers {
		tg.Go(func() {
			for {
				got := sp.Take(7)
				if len(got) == 0 {
					select {
					case <-appended:
						if sp.Untaken() == 0 {
							return
						}
					default:
					}
					runtime.Gosched()
					continue
				}
				mu.Lock()
				taken = append(taken, got...)
				mu.Unlock()
				for _, e := range got {
					sp.Done(e.Seq)
				}
			}
		})
	}
	tg.Wait()
	cancel()
	if err := <-runDone; err != nil {
		t.Fatalf("Run: %v", err)
	}

	if len(taken) != appenders*perAppender {
		t.Fatalf("took %d entries, want %d", len(taken), appenders*perAppender)
	}
	// In Seq order, each appender's events come in the order it appended
	// them, and no entry or event comes twice.
	slices.SortFunc(taken, func(a, b datadir.SpoolEntry) int { return cmp.Compare(a.Seq, b.Seq) })
	last := make([]string, appenders)
	for i, e := range taken {
		if i > 0 && e.Seq == taken[i-1].Seq {
			t.Fatalf("entry %d taken twice", e.Seq)
		}
		id := e.Event.Container.ID
		var n int
		if _, err := fmt.Sscanf(id, "c%d", &n); err != nil {
			t.Fatalf("container %q: %v", id, err)
		}
		a := n / perAppender
		if id <= last[a] {
			t.Fatalf("appender %d: %s taken after %s", a, id, last[a])
		}
		last[a] = id
	}
	if sp.Len() != 0 || sp.Bytes() != 0 {
		t.Errorf("Len %d, Bytes %d after every Done", sp.Len(), sp.Bytes())
	}
	closeStore(t, s)
	s, _ = open(t, dir, opts)
	defer closeStore(t, s)
	if n := s.Spool().Len(); n != 0 {
		t.Errorf("found %d entries again after every one was Done", n)
	}
}

// TestSpoolKeepsAWriteAheadCopyOfWhatIsDeliveredFromMemory appends events
// as taken: Take never hands them out, Done frees them, and those not Done
// when the process goes come back at the next Open, marked Earlier, so
// that what waited in memory outlives the process. It refuses while
// entries wait to be taken, which the copies would overtake.
func TestSpoolKeepsAWriteAheadCopyOfWhatIsDeliveredFromMemory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := datadir.Options{SpoolMaxBytes: 1 << 20}
	s, _ := open(t, dir, opts)
	sp := s.Spool()
	evs := spoolEvents(0, 6)
	first := appendTaken(t, sp, evs[:4])
	if got := sp.Take(10); len(got) != 0 {
		t.Errorf("Take handed out copies: %v", got)
	}
	if sp.Len() != 4 || sp.Untaken() != 0 {
		t.Errorf("Len %d Untaken %d, want 4 and 0", sp.Len(), sp.Untaken())
	}
	sp.Done(first)     // delivered
	sp.Done(first + 2) // delivered; first+1 and first+3 are not
	if sp.Append(evs[4:5]) != 1 {
		t.Fatal("Append refused")
	}
	if _, ok := sp.AppendTaken(&evs[5]); ok {
		t.Error("AppendTaken appended while an entry waits to be taken")
	}
	closeStore(t, s)

	s, _ = open(t, dir, opts)
	defer closeStore(t, s)
	sp = s.Spool()
	got := sp.Take(10)
	checkOrder(t, "after Open", eventsOf(got), []generator.Event{evs[1], evs[3], evs[4]})
	for _, e := range got {
		if !e.Earlier {
			t.Errorf("entry %d: not Earlier", e.Seq)
		}
	}
}

// bigEvents returns n events of distinct containers whose pods carry a
// 3 KB annotation, as kubectl's last-applied-configuration does.
func bigEvents(n int) []generator.Event {
	evs := spoolEvents(0, n)
	meta := generator.NewPodMeta(map[string]string{"app": "web"}, map[string]string{
		"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat(`{"spec":"<&>"}`, 220),
	})
	for i := range evs {
		evs[i].Pod.Meta = meta
	}
	return evs
}

// TestSpoolCountsWriteThroughCopiesByTheirEncodedSizeOnceWritten: a copy
// counts an estimate of its size until a write encodes it, and then what
// Append counts for the same event.
func TestSpoolCountsWriteThroughCopiesByTheirEncodedSizeOnceWritten(t *testing.T) {
	t.Parallel()
	opts := datadir.Options{SpoolMaxBytes: 1 << 24}
	evs := bigEvents(20)
	appended, _ := open(t, t.TempDir(), opts)
	defer closeStore(t, appended)
	if n := appended.Spool().Append(evs); n != len(evs) {
		t.Fatalf("Append took %d of %d", n, len(evs))
	}
	copies, _ := open(t, t.TempDir(), opts)
	defer closeStore(t, copies)
	appendTaken(t, copies.Spool(), evs)
	// The annotation's escapes (\u003c for '<') make the encoding longer
	// than its strings.
	estimate, exact := copies.Spool().Bytes(), appended.Spool().Bytes()
	if estimate < exact/3 || estimate > exact {
		t.Errorf("estimated %d bytes for the copies, encoded %d", estimate, exact)
	}
	if err := datadir.Flush(copies, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	if got := copies.Spool().Bytes(); got != exact {
		t.Errorf("after the write, the copies count %d bytes, Append counts %d", got, exact)
	}
}

// TestSpoolWritesMoreThanAWriteBudgetInOneFlush: a first relist appends
// megabytes at once; one flush writes them all (in transactions of a
// bounded size), in order, and a crash after it finds them.
func TestSpoolWritesMoreThanAWriteBudgetInOneFlush(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := datadir.Options{SpoolMaxBytes: 1 << 26}
	s, _ := open(t, dir, opts)
	defer closeStore(t, s)
	evs := bigEvents(3000) // about 10 MB encoded
	half := len(evs) / 2
	appendTaken(t, s.Spool(), evs[:half])
	if n := s.Spool().Append(evs[half:]); n != len(evs)-half {
		t.Fatalf("Append took %d of %d", n, len(evs)-half)
	}
	if b := s.Spool().Bytes(); b < 4<<20 {
		t.Fatalf("the events encode to %d bytes: too few to need several writes", b)
	}
	before := datadir.CommittedTx(s)
	if err := datadir.Flush(s, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	// A transaction per megabyte, so that bbolt never holds all of them
	// in memory at once.
	if txs := datadir.CommittedTx(s) - before; txs < 4 {
		t.Errorf("one flush of %d bytes wrote %d transactions, want one per megabyte", s.Spool().Bytes(), txs)
	}
	s2, _ := open(t, crashImage(t, dir), opts)
	defer closeStore(t, s2)
	got := s2.Spool().Take(len(evs) + 1)
	checkOrder(t, "after one flush and a crash", eventsOf(got), evs)
}

// appendTaken appends evs as taken entries, and returns the first one's
// Seq.
func appendTaken(t *testing.T, sp *datadir.Spool, evs []generator.Event) uint64 {
	t.Helper()
	var first uint64
	for i := range evs {
		seq, ok := sp.AppendTaken(&evs[i])
		if !ok {
			t.Fatalf("AppendTaken refused event %d of %d", i, len(evs))
		}
		if i == 0 {
			first = seq
		}
	}
	return first
}

// TestSpoolDropsAnEarlierEntryOfAContainerWhoseRemovalWasAcked: the
// checkpoint may keep only a removed container's ContainerRemoved; an
// earlier process's spool entry of one of its earlier events was
// delivered (a pod's events are acked in order), and is dropped.
func TestSpoolDropsAnEarlierEntryOfAContainerWhoseRemovalWasAcked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := datadir.Options{SpoolMaxBytes: 1 << 20}
	s, _ := open(t, dir, opts)
	died := event("u1", "x", generator.ContainerDied, t0)
	kept := event("u1", "y", generator.ContainerDied, t0)
	if n := s.Spool().Append([]generator.Event{died, kept}); n != 2 {
		t.Fatalf("appended %d of 2", n)
	}
	if err := datadir.Flush(s, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	s.Spool().Take(2) // delivered, but the process ends before Done
	s.Checkpoint().RecordAck(event("u1", "x", generator.ContainerStarted, t0), 0)
	s.Checkpoint().RecordAck(died, 0)
	s.Checkpoint().RecordAck(event("u1", "x", generator.ContainerRemoved, time.Now()), 0) // within the tombstone TTL
	closeStore(t, s)

	s, logs := open(t, dir, opts)
	defer closeStore(t, s)
	if got := s.Checkpoint().Restored(); len(got) != 1 || got[0].Type != generator.ContainerRemoved {
		t.Fatalf("restored %v, want x's removal alone", got)
	}
	got := s.Spool().Take(10)
	checkOrder(t, "taken after the restart", eventsOf(got), []generator.Event{kept})
	if !slices.ContainsFunc(logs.Records(t, "INFO"), func(r map[string]any) bool {
		return strings.HasPrefix(r["msg"].(string), "dropped spool entries") && r["spool_entries"] == 1.0
	}) {
		t.Error("no Info log of the one entry dropped")
	}
}
