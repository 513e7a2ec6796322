package datadir

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// bucketRetained holds the retained events, keyed by an 8-byte big-endian
// counter in the order they were recorded.
const bucketRetained = "retained"

// retainedOverhead is what a retained entry costs beside its record: its
// key, its sequence and its time, and the bookkeeping in memory.
const retainedOverhead = 64

// Retained keeps the events JetStream acknowledged, each with its stream
// sequence and the time of its ack, for a window (Options.RetainWindow),
// so that the publisher can check that the stream still holds them and
// publish again what it lost.
//
// An ack is not yet durable: nats-server acknowledges a write before its
// files are flushed (every 2 minutes by default, its sync_interval), so a
// power loss or an OS crash of the servers loses acknowledged writes, and
// a corrupted replica that leads can too. The checkpoint and the spool
// forget an event once it is acked; Retained keeps it for longer than the
// servers' flush.
//
// One entry is kept per container and event type: recording an event
// again (its republication after a loss) replaces the entry, with the new
// sequence and time. Entries older than the window go first, and the
// oldest go when the entries' bytes pass Options.RetainMaxBytes: the
// window is then shorter than asked, which is logged once.
//
// Record only notes the event in memory; the Store's Run writes what was
// recorded within 100 ms, in the transaction of the checkpoint's acks,
// and deletes what left the window. A crash loses the entries of the last
// tick, whose events the checkpoint's read-back (publish.Restart.From)
// finds in the stream anyway.
//
// It is safe for concurrent use.
type Retained struct {
	window   time.Duration
	maxBytes int64
	logger   *slog.Logger

	mu sync.Mutex
	// byKey holds the live entry of each container and type. Guarded by mu.
	byKey map[string]*retainedEntry
	// order holds the entries in the order recorded, oldest first; an
	// entry replaced by a newer one is dead and skipped. Guarded by mu.
	order []*retainedEntry
	// bytes sums the live entries' sizes. Guarded by mu.
	bytes int64
	// next is the key of the next entry. Guarded by mu.
	next uint64
	// pending holds the entries recorded and not yet written; deletes the
	// keys of written entries that are dead or left the window. Guarded
	// by mu.
	pending []*retainedEntry
	deletes []uint64
	// cut is set while the byte bound holds the window below its length;
	// it is logged when it starts. Guarded by mu.
	cut bool
	// wake is the Store's: it is given a value, without waiting, when an
	// event is recorded. Nil outside a Store.
	wake chan<- struct{}
}

type retainedEntry struct {
	key     uint64
	ev      generator.Event
	seq     uint64
	at      time.Time
	size    int64
	dead    bool
	written bool
}

// RetainedEvent is an acknowledged event as Retained keeps it.
type RetainedEvent struct {
	Event generator.Event
	// Sequence is the stream sequence JetStream acknowledged it with.
	Sequence uint64
	// AckedAt is when the ack came.
	AckedAt time.Time
}

func newRetained(window time.Duration, maxBytes int64, logger *slog.Logger) *Retained {
	return &Retained{window: window, maxBytes: maxBytes, logger: logger, byKey: map[string]*retainedEntry{}, next: 1}
}

func retainedKey(ev *generator.Event) string {
	return ev.Container.ID + "\x00" + string(ev.Type)
}

// Window returns how long events are kept.
func (r *Retained) Window() time.Duration { return r.window }

// Record keeps ev, acknowledged at stream sequence seq at time at. It does
// no I/O.
func (r *Retained) Record(ev generator.Event, seq uint64, at time.Time) {
	rec := toRecord(ev)
	e := &retainedEntry{ev: ev, seq: seq, at: at, size: int64(recordSize(&rec)) + retainedOverhead}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := retainedKey(&ev)
	if old := r.byKey[k]; old != nil {
		r.killLocked(old)
	}
	e.key = r.next
	r.next++
	r.byKey[k] = e
	r.order = append(r.order, e)
	r.pending = append(r.pending, e)
	r.bytes += e.size
	r.trimLocked(at)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// killLocked makes e dead: replaced, out of the window or over the bound.
func (r *Retained) killLocked(e *retainedEntry) {
	if e.dead {
		return
	}
	e.dead = true
	r.bytes -= e.size
	if e.written {
		r.deletes = append(r.deletes, e.key)
	}
	if r.byKey[retainedKey(&e.ev)] == e {
		delete(r.byKey, retainedKey(&e.ev))
	}
}

// trimLocked drops, from the front, the dead entries, those acked a window
// or more before now, and the oldest while the live ones pass the bound.
func (r *Retained) trimLocked(now time.Time) {
	over := false
	i := 0
scan:
	for ; i < len(r.order); i++ {
		e := r.order[i]
		switch {
		case e.dead:
		case now.Sub(e.at) >= r.window:
			r.killLocked(e)
		case r.bytes > r.maxBytes:
			over = true
			r.killLocked(e)
		default:
			break scan
		}
		r.order[i] = nil
	}
	r.order = r.order[i:]
	if over && !r.cut {
		kept := time.Duration(0)
		if len(r.order) > 0 {
			kept = now.Sub(r.order[0].at)
		}
		r.logger.Warn("the acknowledged events kept for the repair reached their byte bound: the oldest go before the window ends, "+
			"and a loss by the NATS servers older than what is kept cannot be repaired (raise PLEG_REPAIR_MAX_BYTES)",
			"max_bytes", r.maxBytes, "window", r.window, "kept_for", kept)
	}
	if over {
		r.cut = true
	} else if r.bytes <= r.maxBytes/2 {
		r.cut = false
	}
}

// Since returns the live events acked at or after t, in the order they
// were recorded, and drops those that left the window by now.
func (r *Retained) Since(t, now time.Time) []RetainedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trimLocked(now)
	var out []RetainedEvent
	for _, e := range r.order {
		if e.dead || e.at.Before(t) {
			continue
		}
		out = append(out, RetainedEvent{Event: e.ev, Sequence: e.seq, AckedAt: e.at})
	}
	return out
}

// AckedAt returns when ev's container and type was last acknowledged, if
// it is kept.
func (r *Retained) AckedAt(ev generator.Event) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byKey[retainedKey(&ev)]
	if !ok {
		return time.Time{}, false
	}
	return e.at, true
}

// Clear drops every entry, in memory now and on disk at the next write:
// they were acked by a stream that is not the one the bridge publishes to
// any more.
func (r *Retained) Clear() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.order {
		r.killLocked(e)
	}
	r.order = nil
}

// Len returns the number of live entries, and their bytes.
func (r *Retained) Len() (int, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byKey), r.bytes
}

// retainedWrites is what a flush writes for Retained.
type retainedWrites struct {
	puts    []*retainedEntry
	deletes []uint64
}

func (w retainedWrites) writesNothing() bool { return len(w.puts) == 0 && len(w.deletes) == 0 }

// waiting reports whether something waits to be written.
func (r *Retained) waiting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending) > 0 || len(r.deletes) > 0
}

// take returns, for a flush, the live entries not yet written and the
// keys to delete, after dropping what left the window by now.
func (r *Retained) take(now time.Time) retainedWrites {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trimLocked(now)
	var w retainedWrites
	for _, e := range r.pending {
		if !e.dead {
			w.puts = append(w.puts, e)
		}
	}
	r.pending = nil
	w.deletes, r.deletes = r.deletes, nil
	return w
}

// written takes in that a flush wrote w: its entries are on disk, and an
// entry that died meanwhile is to be deleted.
func (r *Retained) written(w retainedWrites) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range w.puts {
		e.written = true
		if e.dead {
			r.deletes = append(r.deletes, e.key)
		}
	}
}

// writeFailed returns what a failed flush took.
func (r *Retained) writeFailed(w retainedWrites) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(w.puts, r.pending...)
	r.deletes = append(w.deletes, r.deletes...)
}

// putRetained writes w in tx.
func putRetained(tx *bolt.Tx, w retainedWrites) error {
	if w.writesNothing() {
		return nil
	}
	b, err := tx.CreateBucketIfNotExists([]byte(bucketRetained))
	if err != nil {
		return fmt.Errorf("create %s bucket: %w", bucketRetained, err)
	}
	for _, k := range w.deletes {
		if err := b.Delete(seqKey(k)); err != nil {
			return fmt.Errorf("delete retained event: %w", err)
		}
	}
	for _, e := range w.puts {
		v := binary.BigEndian.AppendUint64(make([]byte, 0, 16+e.size), e.seq)
		v = binary.BigEndian.AppendUint64(v, uint64(e.at.UnixNano()))
		rec := toRecord(e.ev)
		v, err = appendRecord(v, &rec)
		if err != nil {
			return fmt.Errorf("encode retained event %s %s: %w", e.ev.Container.ID, e.ev.Type, err)
		}
		if err := b.Put(seqKey(e.key), v); err != nil {
			return fmt.Errorf("put retained event: %w", err)
		}
	}
	return nil
}

// load reads the retained events of tx into r, in key order; those out of
// the window are deleted by the next flush.
func (r *Retained) load(tx *bolt.Tx, path string) error {
	b := tx.Bucket([]byte(bucketRetained))
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		if len(k) != 8 || len(v) < 16 {
			return corrupt(fmt.Errorf("%s holds a retained event of key %x and %d bytes", path, k, len(v)))
		}
		rec, err := decodeRecord(v[16:])
		if err != nil {
			return corrupt(fmt.Errorf("decode %s retained event %x: %w", path, k, err))
		}
		ev := rec.event()
		e := &retainedEntry{
			key: binary.BigEndian.Uint64(k), ev: ev, seq: binary.BigEndian.Uint64(v), written: true,
			at: time.Unix(0, int64(binary.BigEndian.Uint64(v[8:]))), size: int64(len(v)) + retainedOverhead,
		}
		if old := r.byKey[retainedKey(&ev)]; old != nil {
			r.killLocked(old)
		}
		r.byKey[retainedKey(&ev)] = e
		r.order = append(r.order, e)
		r.bytes += e.size
		r.next = max(r.next, e.key+1)
		return nil
	})
}
