package datadir_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

func TestStoreRestoresTheCheckpointAfterCloseAndOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, datadir.Options{})
	if got := s.Checkpoint().Restored(); len(got) != 0 {
		t.Fatalf("a fresh store restored %v", got)
	}
	acked := []generator.Event{
		event("u1", "a", generator.ContainerStarted, t0),
		event("u1", "a", generator.ContainerDied, t0.Add(time.Second)),
		event("u1", "sb", generator.ContainerStarted, t0),
		event("u2", "b", generator.ContainerStarted, t0),
		event("u2", "b", generator.ContainerDied, t0.Add(time.Second)),
		event("u2", "b", generator.ContainerRemoved, time.Now()),
	}
	acked[2].Container = generator.Container{ID: "sb", Sandbox: true}
	for _, ev := range acked {
		s.Checkpoint().RecordAck(ev, 0)
	}
	// Recorded twice, as a retry acks it twice: restored once.
	s.Checkpoint().RecordAck(acked[0], 0)
	closeStore(t, s)

	s, logs := open(t, dir, datadir.Options{})
	defer closeStore(t, s)
	// b was removed before its earlier acks were written: its removal is
	// all that is kept of it.
	checkEvents(t, "restored", s.Checkpoint().Restored(), acked[0], acked[1], acked[2], acked[5])
	if w := logs.Records(t, "WARN"); len(w) != 0 {
		t.Errorf("warnings opening a good store: %v", w)
	}
}

// TestCheckpointSequenceIsWrittenWithItsAcks: the sequence a checkpoint
// holds is the highest recorded with an ack, written in the ack's
// transaction: a crash image has it exactly when it has the acks, and it
// survives Close and Open.
func TestCheckpointSequenceIsWrittenWithItsAcks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, datadir.Options{})
	if got := s.Checkpoint().Sequence(); got != 0 {
		t.Fatalf("a fresh store's Sequence() = %d, want 0", got)
	}
	a, b := event("u1", "a", generator.ContainerStarted, t0), event("u1", "b", generator.ContainerStarted, t0)
	s.Checkpoint().RecordAck(a, 7)
	s.Checkpoint().RecordAck(b, 5) // the publisher reported a lower one later: the highest is kept
	img := crashImage(t, dir)
	s2, _ := open(t, img, datadir.Options{})
	if got := s2.Checkpoint().Sequence(); got != 0 || len(s2.Checkpoint().Restored()) != 0 {
		t.Errorf("crash image before the write: Sequence() = %d with %d acks, want 0 with none", got, len(s2.Checkpoint().Restored()))
	}
	closeStore(t, s2)

	if err := datadir.Flush(s, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	img = crashImage(t, dir)
	s2, _ = open(t, img, datadir.Options{})
	if got := s2.Checkpoint().Sequence(); got != 7 {
		t.Errorf("crash image after the write: Sequence() = %d, want 7", got)
	}
	checkEvents(t, "crash image after the write", s2.Checkpoint().Restored(), a, b)
	closeStore(t, s2)

	// A sequence is written only with acks, and never lowered; an ack
	// without one (0) leaves it.
	c := event("u1", "c", generator.ContainerStarted, t0)
	s.Checkpoint().RecordAck(c, 0)
	closeStore(t, s)
	s, _ = open(t, dir, datadir.Options{})
	if got := s.Checkpoint().Sequence(); got != 7 {
		t.Errorf("after Close and Open: Sequence() = %d, want 7", got)
	}
	s.Checkpoint().RecordAck(c, 3)
	s.Checkpoint().RecordAck(a, 9)
	// Sequence is what Open read, whatever is recorded since.
	if got := s.Checkpoint().Sequence(); got != 7 {
		t.Errorf("Sequence() after new acks = %d, want 7 (what Open read)", got)
	}
	closeStore(t, s)
	s, _ = open(t, dir, datadir.Options{})
	defer closeStore(t, s)
	if got := s.Checkpoint().Sequence(); got != 9 {
		t.Errorf("after a second Close and Open: Sequence() = %d, want 9", got)
	}
}

// TestSpoolDropsEntriesTheCheckpointHoldsAsAcked: a flush can write an
// entry's ack before its removal (the Done came after the flush took the
// spool's changes). A crash in between leaves a delivered entry in the
// spool, which the restarted spool drops instead of offering it again.
func TestSpoolDropsEntriesTheCheckpointHoldsAsAcked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := datadir.Options{SpoolMaxBytes: 1 << 20}
	s, _ := open(t, dir, opts)
	started := event("u1", "a", generator.ContainerStarted, t0)
	died := event("u1", "a", generator.ContainerDied, t0.Add(time.Second)) // same container, another type
	other := event("u2", "b", generator.ContainerStarted, t0)
	if n := s.Spool().Append([]generator.Event{started, died, other}); n != 3 {
		t.Fatalf("appended %d of 3", n)
	}
	if err := datadir.Flush(s, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	s.Spool().Take(3)
	s.Checkpoint().RecordAck(started, 11) // its Done never comes: the crash
	if err := datadir.Flush(s, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	img := crashImage(t, dir)
	closeStore(t, s)

	s, logs := open(t, img, opts)
	checkOrder(t, "spool restored", s.Spool().Restored(), []generator.Event{died, other})
	entries := s.Spool().Take(10)
	checkOrder(t, "spool entries", eventsOf(entries), []generator.Event{died, other})
	if got := s.Spool().Len(); got != 2 {
		t.Errorf("Spool().Len() = %d after the Take, want 2", got)
	}
	checkEvents(t, "checkpoint restored", s.Checkpoint().Restored(), started)
	info := logs.Records(t, "INFO")
	if !slices.ContainsFunc(info, func(r map[string]any) bool {
		return strings.HasPrefix(r["msg"].(string), "dropped spool entries") && r["spool_entries"] == 1.0
	}) {
		t.Errorf("no Info log of the one entry dropped: %v", info)
	}
	// Dropped from the file too.
	closeStore(t, s)
	s, _ = open(t, img, opts)
	defer closeStore(t, s)
	if got := s.Spool().Len(); got != 2 {
		t.Errorf("Spool().Len() after Close and Open = %d, want 2", got)
	}
}

// TestStoreRunWritesWithinItsIntervalsAndIdlesWithoutIO takes crash images
// of the file while Run runs: what they hold is what a crash at that moment
// leaves.
func TestStoreRunWritesWithinItsIntervalsAndIdlesWithoutIO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		s, _ := open(t, dir, datadir.Options{SpoolMaxBytes: 1 << 20})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		synctest.Wait()
		// Ticks, the first of which collects (nothing here), and nothing
		// to write.
		advance(500 * time.Millisecond)

		// An ack is written within a tick of it, and not before: a
		// crash loses at most a tick of acks.
		a := event("u1", "a", generator.ContainerStarted, t0)
		s.Checkpoint().RecordAck(a, 0)
		if got := restoredAfterCrash(t, dir); len(got) != 0 {
			t.Errorf("the checkpoint was written before the tick (%v)", got)
		}
		advance(100 * time.Millisecond)
		checkEvents(t, "restored 100 ms after the ack", restoredAfterCrash(t, dir), a)

		// Idle: ticks come and go, and the file does not change.
		before := fileHash(t, dir)
		advance(3 * time.Second)
		if fileHash(t, dir) != before {
			t.Error("the file changed while nothing was recorded")
		}

		// A spool append is written within a tick, with the acks recorded
		// so far.
		b := event("u1", "b", generator.ContainerStarted, t0)
		s.Checkpoint().RecordAck(b, 0)
		spooled := event("u2", "c", generator.ContainerStarted, t0)
		if n := s.Spool().Append([]generator.Event{spooled}); n != 1 {
			t.Fatalf("appended %d of 1", n)
		}
		advance(100 * time.Millisecond)
		img := crashImage(t, dir)
		s2, _ := open(t, img, datadir.Options{SpoolMaxBytes: 1 << 20})
		checkEvents(t, "restored with the spool's write", s2.Checkpoint().Restored(), a, b)
		checkEvents(t, "spooled", s2.Spool().Restored(), spooled)
		closeStore(t, s2)

		// Acks after the last write are lost by a crash; the final write
		// at shutdown keeps them.
		c := event("u1", "c", generator.ContainerStarted, t0)
		s.Checkpoint().RecordAck(c, 0)
		checkEvents(t, "restored after a crash", restoredAfterCrash(t, dir), a, b)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		checkEvents(t, "restored after Run returned", restoredAfterCrash(t, dir), a, b, c)
		closeStore(t, s)
	})
}

// advance moves a synctest bubble's virtual clock on by d and returns once
// every goroutine in it is blocked again.
func advance(d time.Duration) {
	time.Sleep(d) // inside a bubble, sleeping is how the clock moves
	synctest.Wait()
}

func fileHash(t *testing.T, dir string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, datadir.FileName))
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

func TestStoreDropsRemovedContainersAfterTheTombstoneTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		s, _ := open(t, dir, datadir.Options{})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()

		now := time.Now() // the bubble's clock
		removed := []generator.Event{
			event("u1", "gone", generator.ContainerStarted, now.Add(-time.Hour)),
			event("u1", "gone", generator.ContainerDied, now.Add(-time.Hour)),
			event("u1", "gone", generator.ContainerRemoved, now),
		}
		// A removal observed at an unknown time is kept from when it was
		// recorded.
		unknown := event("u1", "unknown", generator.ContainerRemoved, time.Time{})
		removed = append(removed, unknown)
		running := event("u1", "running", generator.ContainerStarted, now.Add(-time.Hour))
		// An ID that the removed one is a prefix of stays.
		longer := event("u1", "gone2", generator.ContainerStarted, now.Add(-time.Hour))
		for _, ev := range append(removed, running, longer) {
			s.Checkpoint().RecordAck(ev, 0)
		}
		advance(generator.DefaultTombstoneTTL)
		// Removed before its earlier acks were written: only the removal
		// is kept of "gone".
		checkEvents(t, "restored within the TTL", restoredAfterCrash(t, dir), removed[2], unknown, running, longer)
		// Collected at the first collection after the TTL: within a minute.
		advance(time.Minute + time.Second)
		checkEvents(t, "restored after the TTL", restoredAfterCrash(t, dir), running, longer)

		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		closeStore(t, s)
	})
}

// TestOpenDoesNotRestoreContainersRemovedLongAgo: a bridge that was down
// longer than the TTL does not restore what it would have dropped.
func TestOpenDoesNotRestoreContainersRemovedLongAgo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		s, _ := open(t, dir, datadir.Options{})
		now := time.Now()
		old := event("u1", "old", generator.ContainerRemoved, now.Add(-generator.DefaultTombstoneTTL-time.Second))
		recent := event("u1", "recent", generator.ContainerRemoved, now.Add(-generator.DefaultTombstoneTTL+time.Minute))
		s.Checkpoint().RecordAck(old, 0)
		s.Checkpoint().RecordAck(recent, 0)
		closeStore(t, s)

		s, _ = open(t, dir, datadir.Options{})
		checkEvents(t, "restored", s.Checkpoint().Restored(), recent)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		advance(100 * time.Millisecond) // the first tick collects
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		closeStore(t, s)
		// Deleted from the file too: a later Open at a time when it would
		// not have expired yet (a clock set back) does not find it.
		s, _ = open(t, dir, datadir.Options{})
		defer closeStore(t, s)
		checkEvents(t, "restored after the collection", s.Checkpoint().Restored(), recent)
	})
}

func TestOpenSetsAnotherNodesStoreAside(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, datadir.Options{})
	a := event("u1", "a", generator.ContainerStarted, t0)
	s.Checkpoint().RecordAck(a, 0)
	closeStore(t, s)

	s, logs := open(t, dir, datadir.Options{Node: "node-2"})
	if got := s.Checkpoint().Restored(); len(got) != 0 {
		t.Errorf("node-2 restored node-1's %v", got)
	}
	w := logs.Records(t, "WARN")
	aside := glob(t, dir, datadir.FileName+".other-node-*")
	if len(w) != 1 || len(aside) != 1 || w[0]["aside"] != aside[0] || !strings.Contains(w[0]["err"].(string), `"node-1"`) {
		t.Fatalf("want one warning naming the file set aside (%v) and node-1, got %v", aside, w)
	}
	b := event("u1", "b", generator.ContainerStarted, t0)
	s.Checkpoint().RecordAck(b, 0)
	closeStore(t, s)
	s, _ = open(t, dir, datadir.Options{Node: "node-2"})
	checkEvents(t, "node-2's store", s.Checkpoint().Restored(), b)
	closeStore(t, s)

	// Set aside, not deleted: it is node-1's store still.
	if err := os.Rename(aside[0], filepath.Join(dir, datadir.FileName)); err != nil {
		t.Fatal(err)
	}
	s, _ = open(t, dir, datadir.Options{})
	defer closeStore(t, s)
	checkEvents(t, "the store set aside", s.Checkpoint().Restored(), a)
}

func TestOpenSetsACorruptStoreAside(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		spoil func(data []byte) []byte
	}{
		{"when it is not a bbolt file", func([]byte) []byte { return []byte("not a database\n") }},
		{"when a record does not decode", func(data []byte) []byte {
			return bytes.Replace(data, []byte(`{"type":"ContainerStarted"`), []byte(`{"type":ContainerStarted"`), 1)
		}},
		{"when a page is overwritten", func(data []byte) []byte {
			// The pages after the two meta pages: the freelist and the
			// buckets' pages.
			for i := 2 * 4096; i < len(data); i++ {
				data[i] = 0xff
			}
			return data
		}},
		{"when it is cut short", func(data []byte) []byte { return data[:2*4096+100] }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s, _ := open(t, dir, datadir.Options{})
			s.Checkpoint().RecordAck(event("u1", "a", generator.ContainerStarted, t0), 0)
			closeStore(t, s)
			path := filepath.Join(dir, datadir.FileName)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			spoiled := tt.spoil(data)
			writeFile(t, path, spoiled)

			s, logs := open(t, dir, datadir.Options{})
			if got := s.Checkpoint().Restored(); len(got) != 0 {
				t.Errorf("restored %v from a corrupt store", got)
			}
			w := logs.Records(t, "WARN")
			aside := glob(t, dir, datadir.FileName+".corrupt-*")
			if len(w) != 1 || len(aside) != 1 || w[0]["aside"] != aside[0] || w[0]["path"] != path {
				t.Fatalf("want one warning naming %s and the file set aside (%v), got %v", path, aside, w)
			}
			if kept, err := os.ReadFile(aside[0]); err != nil || !bytes.Equal(kept, spoiled) {
				t.Errorf("the file set aside is not the corrupt one (read: %v)", err)
			}
			// The fresh store works.
			b := event("u1", "b", generator.ContainerStarted, t0)
			s.Checkpoint().RecordAck(b, 0)
			closeStore(t, s)
			s, logs = open(t, dir, datadir.Options{})
			defer closeStore(t, s)
			checkEvents(t, "the fresh store", s.Checkpoint().Restored(), b)
			if w := logs.Records(t, "WARN"); len(w) != 0 {
				t.Errorf("warnings opening the fresh store: %v", w)
			}
		})
	}
}

func TestOpenFailsAtOnceWhenAnotherProcessHoldsTheStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, datadir.Options{})
	defer closeStore(t, s)
	// bbolt's lock is an flock of the file, which a second open file in
	// the same process contends for as another process does.
	start := time.Now()
	_, err := datadir.Open(dir, datadir.Options{Node: "node-1"})
	path := filepath.Join(dir, datadir.FileName)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "another process holds it") {
		t.Fatalf("second Open: %v, want an error naming %s and saying another process holds it", err, path)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the second Open took %v to fail", d)
	}
	if aside := glob(t, dir, datadir.FileName+".*"); len(aside) != 0 {
		t.Errorf("a held store was set aside: %v", aside)
	}
}

func TestOpenRejectsBadOptions(t *testing.T) {
	t.Parallel()
	for _, opts := range []datadir.Options{{}, {Node: "node-1", SpoolMaxBytes: -1}} {
		if _, err := datadir.Open(t.TempDir(), opts); err == nil {
			t.Errorf("Open(%+v) succeeded", opts)
		}
	}
	file := filepath.Join(t.TempDir(), "file")
	writeFile(t, file, nil)
	if _, err := datadir.Open(file, datadir.Options{Node: "node-1"}); err == nil || errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open of a data directory that is a file: %v", err)
	}
}

// TestFlushWritesManyAcksAndTheirSequence: a first relist's acks outnumber
// a transaction's share; one flush writes them all, and the sequence of
// the last.
func TestFlushWritesManyAcksAndTheirSequence(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, datadir.Options{})
	const n = 3000
	for i := range n {
		// Recorded in an order unlike the keys'.
		id := fmt.Sprintf("c%05d", (i*7919)%n)
		s.Checkpoint().RecordAck(event("u", id, generator.ContainerStarted, t0), uint64(i+1))
	}
	before := datadir.CommittedTx(s)
	if err := datadir.Flush(s, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	if txs := datadir.CommittedTx(s) - before; txs != 3 {
		t.Errorf("one flush of %d acks wrote %d transactions, want 3 of at most 1,024", n, txs)
	}
	s2, _ := open(t, crashImage(t, dir), datadir.Options{})
	defer closeStore(t, s2)
	if got := len(s2.Checkpoint().Restored()); got != n {
		t.Errorf("restored %d acks, want %d", got, n)
	}
	if got := s2.Checkpoint().Sequence(); got != n {
		t.Errorf("Sequence() = %d, want %d", got, n)
	}
	closeStore(t, s)
}

// TestCheckpointKnowsWhenItsStoreWasCreated: a fresh store records when it
// was created, and a reopened one reports that time, not the time it was
// reopened: with no sequence written yet, it bounds what a bridge killed
// before its first checkpoint write may have stored.
func TestCheckpointKnowsWhenItsStoreWasCreated(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	before := time.Now()
	s, _ := open(t, dir, datadir.Options{})
	created := s.Checkpoint().Created()
	closeStore(t, s)
	if created.Before(before.Add(-time.Second)) || created.After(time.Now()) {
		t.Fatalf("Created() = %v of a store made at %v", created, before)
	}
	s, _ = open(t, dir, datadir.Options{})
	defer closeStore(t, s)
	if got := s.Checkpoint().Created(); !got.Equal(created) {
		t.Errorf("reopened: Created() = %v, want %v", got, created)
	}
	if s.Checkpoint().Sequence() != 0 {
		t.Errorf("Sequence() = %d with nothing acked", s.Checkpoint().Sequence())
	}
}

// setFormatVersion writes v as the format version of the closed store in
// dir, as a bridge of that format would have.
func setFormatVersion(t *testing.T, dir, v string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, datadir.FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("version"), []byte(v)) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestOpenRefusesAStoreOfANewerFormat: after a downgrade, the store a newer
// bridge wrote is neither read nor set aside (its spool may hold events
// JetStream never acknowledged), and the error says which directory, which
// versions, and what to do.
func TestOpenRefusesAStoreOfANewerFormat(t *testing.T) {
	t.Parallel()
	cur, err := strconv.Atoi(datadir.FormatVersion)
	if err != nil {
		t.Fatalf("FormatVersion %q is not a number", datadir.FormatVersion)
	}
	newer := strconv.Itoa(cur + 1)
	dir := t.TempDir()
	s, _ := open(t, dir, datadir.Options{SpoolMaxBytes: 1 << 20})
	a := event("u1", "a", generator.ContainerStarted, t0)
	s.Checkpoint().RecordAck(a, 0)
	closeStore(t, s)
	setFormatVersion(t, dir, newer)
	path := filepath.Join(dir, datadir.FileName)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	_, err = datadir.Open(dir, datadir.Options{Node: "node-1"})
	var nerr *datadir.NewerFormatError
	if !errors.As(err, &nerr) || nerr.Version != newer || nerr.Path != path {
		t.Fatalf("Open = %v, want a *NewerFormatError of version %s for %s", err, newer, path)
	}
	for _, want := range []string{"data directory " + dir + " ", "format version " + newer, "this build's " + datadir.FormatVersion,
		"run that version", "move the data directory aside", "spooled events"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
	if aside := glob(t, dir, datadir.FileName+".*"); len(aside) != 0 {
		t.Errorf("the newer store was set aside: %v", aside)
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, before) {
		t.Errorf("the newer store was changed (read: %v)", err)
	}

	// The newer version can go on with it.
	setFormatVersion(t, dir, datadir.FormatVersion)
	s, _ = open(t, dir, datadir.Options{})
	defer closeStore(t, s)
	checkEvents(t, "the store back at this format", s.Checkpoint().Restored(), a)
}

// TestOpenSetsAStoreOfAnUnknownFormatAside: a format version that no
// pleg-bridge writes is corruption, not a downgrade.
func TestOpenSetsAStoreOfAnUnknownFormatAside(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "0", "x", "02", "-3"} {
		t.Run(fmt.Sprintf("when it is %q", v), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s, _ := open(t, dir, datadir.Options{})
			s.Checkpoint().RecordAck(event("u1", "a", generator.ContainerStarted, t0), 0)
			closeStore(t, s)
			setFormatVersion(t, dir, v)
			s, logs := open(t, dir, datadir.Options{})
			defer closeStore(t, s)
			if got := s.Checkpoint().Restored(); len(got) != 0 {
				t.Errorf("restored %v", got)
			}
			if aside := glob(t, dir, datadir.FileName+".corrupt-*"); len(aside) != 1 || len(logs.Records(t, "WARN")) != 1 {
				t.Errorf("want the store set aside once with a warning, got %v", aside)
			}
		})
	}
}
