package datadir

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// SpoolEntry is an event in the spool.
type SpoolEntry struct {
	// Seq is the entry's sequence number: entries are taken in Seq order.
	Seq   uint64
	Event generator.Event
	// Earlier is true for an entry written by an earlier process (found at
	// Open): it may have been published already, its ack lost in the crash.
	Earlier bool
}

// Spool is a bounded FIFO on disk of the events that did not fit the
// publisher's memory outbox, in the order they were appended.
//
// Append only encodes the events and queues them in memory: it never waits
// for the disk, because the generator's goroutine calls it. The Store's
// Run writes the queued appends and removes the entries marked Done within
// 100 ms, with the checkpoint's acks: fsynced in batches, as Vector's disk
// buffer is. An entry Done before it was written
// is never written (nor, for AppendTaken's copies, encoded). Take
// reads entries back in order, from the file or from the queue of
// unwritten appends. Only that queue is held in memory, with the size of
// each entry taken and not yet Done (Fluent Bit likewise keeps most of its
// filesystem chunks "down", on disk only): the spool may be far larger
// than memory, and a Take reads no more of the file than it returns.
//
// The bound counts encoded bytes, as Fluent Bit's storage.total_limit_size
// does, but a full spool refuses the new events (Append returns how many
// it took) instead of discarding the oldest: the generator keeps what was
// refused and reports it later, so nothing is lost in silence.
//
// Crash windows: appends not yet written (up to 100 ms of them) are lost
// by a crash; the restarted generator derives them again from the
// checkpoint and the runtime, for the containers that still exist. A Done
// not yet written means the entry is found again at the restart: dropped
// when taken if its ack was written (see delivered), else offered with
// Earlier set, and the publisher recognises it in the stream if it was
// stored before it re-sends it.
//
// It is safe for concurrent use.
type Spool struct {
	db     *bolt.DB
	max    int64 // never modified
	logger *slog.Logger
	// earlier is the first sequence number of this process: lower entries
	// were found at Open. Never modified.
	earlier uint64
	// slotOf returns the slot of a container's checkpoint records
	// (Checkpoint.slot), to look for an entry's ack. Never modified.
	slotOf func(id string) (uint64, bool)

	// takeMu serialises Take, which holds it while it reads the file: only
	// another Take waits on it, never Append, Done or a flush.
	takeMu sync.Mutex

	mu sync.Mutex
	// The entries not yet taken are those of the file from takeNext up to
	// inFile, then those of queued. Below openSeq the file may have gaps
	// (entries Done out of order by an earlier process); above, it has
	// none.
	next     uint64           // guarded by mu; Seq of the next Append
	takeNext uint64           // guarded by mu; every entry below it was taken
	inFile   uint64           // guarded by mu; every entry below it is in the file (or was Done)
	queued   []queuedEntry    // guarded by mu; appended, not yet written: Seq inFile, inFile+1, ...
	untaken  int              // guarded by mu
	taken    map[uint64]int64 // guarded by mu; the encoded size of each entry taken and not Done
	bytes    int64            // guarded by mu; encoded size of the entries not Done
	// done holds the entries Done since the last write that are in the
	// file, or may be by then: those below writing. An entry Done while
	// it waits in queued at or above writing is marked there instead.
	// Guarded by mu.
	done []uint64
	// writing is the Seq after the last entry of the write in progress
	// (inFile when there is none). Guarded by mu.
	writing uint64
	// wake is the Store's: it is given a value, without waiting, when
	// something is appended or Done. Nil outside a Store.
	wake chan<- struct{}
}

// queuedEntry is an appended entry waiting to be written.
type queuedEntry struct {
	seq uint64
	// ev is the event, for Take and, for an entry appended taken (the
	// caller's own, not a copy), for its encoding when it is written: a
	// pointer, so that the queue does not hold room for one (312 bytes) in
	// each entry.
	ev *generator.Event
	// data is the encoded record: from Append, or for an entry appended
	// taken, from the write that finds it not Done. Encoding a copy only
	// when it is written takes the encoding off the path of the events
	// JetStream acks within 100 ms (nearly all of them while NATS is up),
	// and the encoded copies of a first relist's events out of memory.
	data []byte
	// done is set for an entry Done before a write took it: it is never
	// written.
	done bool
}

// spoolExtent is what Open finds in the file.
type spoolExtent struct {
	first, next uint64 // the lowest Seq in the file and the one after the highest; both 1 when empty
	count       int
	bytes       int64
}

// readSpoolExtent reads the extent of the spool in tx. It reads keys and
// value sizes only, never decodes.
func readSpoolExtent(tx *bolt.Tx, path string) (spoolExtent, error) {
	e := spoolExtent{first: 1, next: 1}
	c := tx.Bucket([]byte(bucketSpool)).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return e, corrupt(fmt.Errorf("%s holds a spool key of %d bytes", path, len(k)))
		}
		seq := binary.BigEndian.Uint64(k)
		if e.count == 0 {
			e.first = seq
		}
		e.next = seq + 1
		e.count++
		e.bytes += int64(len(v))
	}
	return e, nil
}

func newSpool(db *bolt.DB, maxBytes int64, e spoolExtent, slotOf func(string) (uint64, bool), logger *slog.Logger) *Spool {
	return &Spool{
		db: db, max: maxBytes, logger: logger, earlier: e.next, slotOf: slotOf,
		next: e.next, takeNext: e.first, inFile: e.next, writing: e.next,
		untaken: e.count, bytes: e.bytes, taken: map[uint64]int64{},
	}
}

// Append appends the longest prefix of events that fits the spool's bound
// and returns its length. It does no I/O: the entries are durable after
// the Store's next write, within 100 ms. It is safe for concurrent use.
func (s *Spool) Append(events []generator.Event) int {
	s.mu.Lock()
	room := s.max - s.bytes
	s.mu.Unlock()
	data := s.encode(events, room)
	defer s.wakeStore()
	s.mu.Lock()
	defer s.mu.Unlock()
	// Another Append may have taken some of the room since.
	for i, d := range data {
		size := int64(len(d))
		if s.bytes+size > s.max {
			return i
		}
		ev := events[i] // the caller's slice is its own
		s.queued = append(s.queued, queuedEntry{seq: s.next, ev: &ev, data: d})
		s.next++
		s.untaken++
		s.bytes += size
	}
	return len(data)
}

// AppendTaken appends ev as an entry already taken, as a write-ahead copy
// of an event the caller delivers from memory: Take never returns it, and
// the caller marks it Done once delivered. Written by the Store's next
// write, it survives a crash of the process, and the next process finds it
// (if not Done) and delivers it as an Earlier entry, rather than losing what
// waited in memory. It appends only while every entry is taken (else the
// copy would overtake what waits to be taken) and the spool has room: it
// returns the entry's Seq, and false when it appended nothing.
//
// The spool keeps ev itself, not a copy, until the entry is written or
// Done: the caller must not modify *ev before then. It does no I/O, and
// does not encode: the write that finds the entry not Done does, and the
// entry counts against the bound with an estimate of its size until then
// (recordSizeEstimate). It is safe for concurrent use.
func (s *Spool) AppendTaken(ev *generator.Event) (seq uint64, ok bool) {
	size := recordSizeEstimate(ev)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.untaken > 0 || s.bytes+size > s.max {
		return 0, false
	}
	seq = s.next
	s.queued = append(s.queued, queuedEntry{seq: seq, ev: ev})
	s.taken[seq] = size
	s.next++
	s.takeNext = s.next
	s.bytes += size
	s.wakeStore()
	return seq, true
}

// recordSizeEstimate is about the encoded size of ev's record, from the
// lengths of its strings (recordSize), without encoding it: what an entry
// appended taken counts against the bound until a write encodes it.
// Escapes make a record longer than the estimate, and the write corrects
// it.
func recordSizeEstimate(ev *generator.Event) int64 {
	r := toRecord(*ev)
	return int64(recordSize(&r))
}

// encode encodes the longest prefix of events that fits room bytes.
// Encoding is done outside the lock, and only for as many events as the
// room seen takes: a full spool costs its caller nothing but the check.
// An event that does not encode (a time beyond the year 9999) ends the
// prefix, as if the spool were full.
func (s *Spool) encode(events []generator.Event, room int64) [][]byte {
	var data [][]byte
	for _, ev := range events {
		d, err := encodeRecord(toRecord(ev))
		if err != nil {
			s.logger.Warn("cannot spool an event", "pod_uid", ev.Pod.UID, "container_id", ev.Container.ID, "event_type", ev.Type, "err", err)
			break
		}
		if room -= int64(len(d)); room < 0 {
			break
		}
		data = append(data, d)
	}
	return data
}

// Take returns up to max of the oldest entries not yet taken, in Seq order.
// They stay in the spool until Done; no entry is returned twice by one
// process. It may read the file, which waits for a write only while bbolt
// maps the file anew (when it grows past its mapping, a doubling up to
// 1 GiB). It is safe for concurrent use.
func (s *Spool) Take(max int) []SpoolEntry {
	s.takeMu.Lock()
	defer s.takeMu.Unlock()
	var out []SpoolEntry
	for len(out) < max {
		s.mu.Lock()
		from, inFile := s.takeNext, s.inFile
		if from >= inFile {
			// Everything in the file was taken: the rest is queued.
			out = s.takeQueued(out, max)
			s.mu.Unlock()
			return out
		}
		s.mu.Unlock()
		var ok bool
		if out, ok = s.readFile(out, max, from, inFile); !ok {
			return out
		}
	}
	return out
}

// takeQueued appends to out, up to max, the queued entries not yet taken.
// The caller holds mu, and has taken everything in the file.
func (s *Spool) takeQueued(out []SpoolEntry, max int) []SpoolEntry {
	i := int(s.takeNext - s.inFile)
	for ; i < len(s.queued) && len(out) < max; i++ {
		q := s.queued[i]
		out = append(out, SpoolEntry{Seq: q.seq, Event: *q.ev})
		s.taken[q.seq] = int64(len(q.data))
		s.untaken--
		s.takeNext = q.seq + 1
	}
	return out
}

// readFile appends to out, up to max, the entries of the file from Seq
// from up to inFile, and marks them taken. Entries below inFile stay in
// the file until Done, and no Done comes for an entry not yet taken, so
// none disappears under the read. An entry that does not decode is dropped
// with a warning: it cannot be published, and the spool must not stop at
// it. So is, with a note at Info, an earlier process's entry that was
// delivered (see delivered). ok is false if the file could not be read.
// The caller holds takeMu.
func (s *Spool) readFile(out []SpoolEntry, max int, from, inFile uint64) (_ []SpoolEntry, ok bool) {
	next := inFile // unless max stops the read first
	var sizes []int64
	var bad []uint64
	var badBytes int64
	dropped := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		ckpt := tx.Bucket([]byte(bucketCheckpoint))
		c := tx.Bucket([]byte(bucketSpool)).Cursor()
		for k, v := c.Seek(seqKey(from)); k != nil; k, v = c.Next() {
			seq := binary.BigEndian.Uint64(k)
			if seq >= inFile {
				break
			}
			if len(out) == max {
				next = seq
				break
			}
			r, err := decodeRecord(v)
			if err != nil {
				s.logger.Warn("dropping a spool entry that does not decode", "seq", seq, "err", err)
				bad = append(bad, seq)
				badBytes += int64(len(v))
				continue
			}
			if seq < s.earlier && delivered(ckpt, s.slotOf, r) {
				dropped++
				bad = append(bad, seq)
				badBytes += int64(len(v))
				continue
			}
			out = append(out, SpoolEntry{Seq: seq, Event: r.event(), Earlier: seq < s.earlier})
			sizes = append(sizes, int64(len(v)))
		}
		return nil
	})
	if err != nil {
		// A read transaction fails only on a closed store: nothing is
		// taken, and the entries stay for the next process.
		s.logger.Warn("cannot read the spool", "err", err)
		return out[:len(out)-len(sizes)], false
	}
	if dropped > 0 {
		s.logger.Info("dropped spool entries of an earlier run that the checkpoint holds as delivered", "spool_entries", dropped)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range out[len(out)-len(sizes):] {
		s.taken[e.Seq] = sizes[i]
	}
	s.takeNext = next
	// A dropped entry counts as taken and Done.
	s.untaken -= len(sizes) + len(bad)
	s.bytes -= badBytes
	s.done = append(s.done, bad...)
	return out, true
}

// delivered reports whether the checkpoint ckpt holds r's event as acked.
// A flush writes an entry's ack no later than its removal, and in an
// earlier flush when the Done came after the flush took the spool's
// changes (see Store.flush): a crash in between leaves the entry in the
// spool, delivered. The event id depends on the container and the event
// type only, as the checkpoint's key does, so an ack under that key is
// this entry's. Offered again, it could be published again: the
// publisher's read of the stream at start covers only the messages stored
// after the checkpoint's sequence, and the sequence written with this
// entry's ack may be past its message.
func delivered(ckpt *bolt.Bucket, slotOf func(string) (uint64, bool), r record) bool {
	slot, ok := slotOf(r.ID)
	if !ok {
		return false // no record of the container
	}
	// The publisher delivers a pod's events in order, each once the one
	// before it is acked (or given up): an acked ContainerRemoved means
	// the container's earlier events were, and the checkpoint may keep
	// only that (Checkpoint.RecordAck).
	return ckpt.Get([]byte(ckptKey(slot, r.ID, r.Type))) != nil ||
		ckpt.Get([]byte(ckptKey(slot, r.ID, generator.ContainerRemoved))) != nil
}

// Done marks a taken entry delivered (acked) or given up: its bytes are
// free at once, and it is removed from the file by the Store's next write
// (within 100 ms), or never written if no write took it yet. Record the entry's ack (Checkpoint.RecordAck) before calling Done, so
// that they reach the disk in the same transaction. Done of an entry not
// taken, or already Done, does nothing. It is safe for concurrent use.
func (s *Spool) Done(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	size, ok := s.taken[seq]
	if !ok {
		return
	}
	delete(s.taken, seq)
	s.bytes -= size
	if seq >= s.writing {
		// Still queued, and no write has it: it is never written, and
		// the event is the caller's again.
		q := &s.queued[seq-s.inFile]
		q.done, q.ev = true, nil
		return
	}
	s.done = append(s.done, seq)
	s.wakeStore()
}

// wakeStore tells the Store's Run that there is something to write.
func (s *Spool) wakeStore() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// waiting reports whether appends or Dones wait to be written.
func (s *Spool) waiting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queued) > 0 || len(s.done) > 0
}

// Untaken returns the number of entries waiting to be taken.
func (s *Spool) Untaken() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.untaken
}

// Len returns the number of entries not Done.
func (s *Spool) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.untaken + len(s.taken)
}

// Bytes returns the encoded size of the entries not Done, which
// Options.SpoolMaxBytes bounds.
func (s *Spool) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// MaxBytes returns the bound on Bytes: Options.SpoolMaxBytes. It is safe
// for concurrent use (the bound never changes).
func (s *Spool) MaxBytes() int64 { return s.max }

// Restored returns the events of the entries the spool held at Open that
// are still in the file and not delivered, in order: the generator is
// seeded with them, as with the checkpoint, so that it does not report
// them again. Call it before delivery starts. It reads the file.
func (s *Spool) Restored() []generator.Event {
	var evs []generator.Event
	err := s.db.View(func(tx *bolt.Tx) error {
		ckpt := tx.Bucket([]byte(bucketCheckpoint))
		c := tx.Bucket([]byte(bucketSpool)).Cursor()
		for k, v := c.First(); k != nil && binary.BigEndian.Uint64(k) < s.earlier; k, v = c.Next() {
			r, err := decodeRecord(v)
			if err != nil || delivered(ckpt, s.slotOf, r) {
				continue // Take drops it
			}
			evs = append(evs, r.event())
		}
		return nil
	})
	if err != nil {
		s.logger.Warn("cannot read the spool", "err", err)
	}
	return evs
}

// spoolWrites is what a flush writes for the spool.
type spoolWrites struct {
	appends []queuedEntry
	done    []uint64
	// more is set when queued entries were left for another write, to
	// keep this one within its budget.
	more bool
}

// writesNothing reports whether putSpool would write nothing for w.
func (w spoolWrites) writesNothing() bool {
	if len(w.done) > 0 {
		return false
	}
	for _, q := range w.appends {
		if !q.done {
			return false
		}
	}
	return true
}

// writeBudget bounds the encoded appends of one write, which bbolt holds
// in memory until the transaction commits: a first relist of a large node
// appends its whole listing's events at once (6,000 at 1,000/5,000, most
// of them not acked by the first write), and written in one transaction
// they made the bridge's peak memory.
const writeBudget = 1 << 20

// writes returns what the next flush writes: the queued appends up to
// about writeBudget bytes of them (encoding the entries appended taken),
// and the entries Done since the last write that took them. Nothing is
// written for an entry Done before a write took it, so nothing at all
// while every event is acked before the next write.
func (s *Spool) writes() spoolWrites {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := spoolWrites{done: s.done}
	s.done = nil
	budget := writeBudget
	n := 0
	for ; n < len(s.queued) && budget > 0; n++ {
		q := &s.queued[n]
		if q.done || q.data != nil {
			budget -= len(q.data)
			continue
		}
		d, err := encodeRecord(toRecord(*q.ev))
		if err != nil {
			// A time beyond the year 9999: the event is delivered
			// from memory, with no copy on disk.
			s.logger.Warn("cannot write an event through to the spool", "pod_uid", q.ev.Pod.UID, "container_id", q.ev.Container.ID, "event_type", q.ev.Type, "err", err)
			q.done = true
			continue
		}
		q.data = d
		budget -= len(d)
		if size, ok := s.taken[q.seq]; ok {
			s.taken[q.seq] = int64(len(d))
			s.bytes += int64(len(d)) - size
		}
	}
	// queued is only shortened by written, after this flush: the entries
	// in this slice are not modified under it (Done marks only those at or
	// above writing), and Append's appends go beyond its length.
	w.appends = s.queued[:n:n]
	w.more = n < len(s.queued)
	s.writing = s.inFile + uint64(n)
	return w
}

// putSpool writes w in tx. An entry Done before it was written is not
// written at all.
func putSpool(tx *bolt.Tx, w spoolWrites) error {
	if len(w.appends) == 0 && len(w.done) == 0 {
		return nil
	}
	b := tx.Bucket([]byte(bucketSpool))
	done := make(map[uint64]bool, len(w.done))
	for _, seq := range w.done {
		done[seq] = true
	}
	// bbolt fills pages to the brim when keys come in order, as a FIFO's
	// appends do.
	b.FillPercent = 1
	for _, q := range w.appends {
		if q.done {
			continue
		}
		if done[q.seq] {
			// Done after a failed write took it: never written, nothing
			// to delete either.
			delete(done, q.seq)
			continue
		}
		if err := b.Put(seqKey(q.seq), q.data); err != nil {
			return fmt.Errorf("put spool entry: %w", err)
		}
	}
	for seq := range done {
		if err := b.Delete(seqKey(seq)); err != nil {
			return fmt.Errorf("delete spool entry: %w", err)
		}
	}
	return nil
}

// written drops the written appends from the queue.
func (s *Spool) written(w spoolWrites) {
	n := len(w.appends)
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.queued[:n]) // let the events go
	s.queued = s.queued[n:]
	s.inFile += uint64(n)
	s.writing = s.inFile
}

// writeFailed puts back the Done of a failed write, for the next one. Its
// appends stay queued; those Done since it took them are in done, and the
// next write neither writes nor deletes them.
func (s *Spool) writeFailed(w spoolWrites) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writing = s.inFile
	s.done = append(w.done, s.done...)
}
