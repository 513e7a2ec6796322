package datadir

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

const (
	// FileName is the store's file in the data directory.
	FileName = "state.db"

	// lockTimeout is how long Open waits for the file lock: long enough for
	// a bridge that is being replaced to exit, short enough that a second
	// bridge on the same directory fails at start, not after a while.
	lockTimeout = time.Second
	// tick is how often Run looks for something to write: the
	// checkpoint's acks and the spool's appends and removals are written
	// within a tick. It bounds what a crash loses: the acks of the last
	// tick, whose containers the restarted bridge knows of only if they
	// still exist (a container started and acked, then removed while the
	// bridge was down, is reported gone only if its ack was written).
	// Writing the acks every 500 ms instead, to save fsyncs, lost such
	// removals in the containerd 1.7 soak's bridge kill.
	tick = 100 * time.Millisecond
	// gcInterval is how often Run looks for removed containers to drop:
	// once a minute. They are kept generator.DefaultTombstoneTTL, so a
	// minute more or less changes nothing, and no flush pays for the search.
	gcInterval = time.Minute
	// initialMmapSize is the address space bbolt maps for the file from
	// the start. Growing the mapping makes bbolt copy every node a write
	// transaction holds off the old mapping: the first relist of a large
	// node, written through to the spool in one transaction, held 10 MB
	// of such copies at its peak at 1,000/5,000 (pleg-bench, heap profile).
	// It is only address space: pages count as resident once touched.
	initialMmapSize = 64 << 20
	// keepRemoved is how long a removed container stays in the checkpoint:
	// as long as the generator's tombstones, so that a stale replay after a
	// restart is recognised.
	keepRemoved = generator.DefaultTombstoneTTL

	// FormatVersion is the on-disk format of the store this build writes,
	// in the meta bucket. A store of format "1" (keys without slots, see
	// ckptKey) is rewritten at Open; one of a newer format, which only a
	// newer pleg-bridge writes, is refused (NewerFormatError); any other
	// value is corrupt and set aside. CHANGELOG.md records each change.
	FormatVersion = "2"
	formatV1      = "1"

	bucketMeta       = "meta"
	bucketCheckpoint = "checkpoint"
	bucketSpool      = "spool"
	keyVersion       = "version"
	keyNode          = "node"
	// keySequence holds the checkpoint's stream sequence (Checkpoint.Sequence),
	// 8 bytes big-endian, written with the acks; absent until the first.
	keySequence = "sequence"
	// keyImported marks a store into which the earlier checkpoint files
	// were imported (see legacy.go).
	keyImported = "imported"
	// keyCreated holds when the store was created, RFC 3339 with
	// nanoseconds (Checkpoint.Created); absent in stores created before
	// it was written.
	keyCreated = "created"
)

// Options configure a Store.
type Options struct {
	// Node is the node the bridge runs on. Required: a store written for
	// another node is set aside with a warning.
	Node string
	// SpoolMaxBytes bounds the spool's encoded records (entries not Done).
	// The file holds them in about as many bytes, in bbolt's pages; pages
	// freed by Done are reused, and the file never shrinks. Zero disables
	// the spool: Store.Spool returns nil.
	SpoolMaxBytes int64
	// RetainWindow is how long the events JetStream acknowledged are kept
	// (Retained); zero or negative keeps none: Store.Retained returns nil.
	RetainWindow time.Duration
	// RetainMaxBytes bounds the retained events' bytes; it must be
	// positive with RetainWindow.
	RetainMaxBytes int64
	// Logger receives warnings about files set aside and write errors; nil
	// discards them.
	Logger *slog.Logger
}

// Store is the node-local durable state of a bridge: the Checkpoint and
// the Spool, in one bbolt file under the data directory. Open it, hand
// Checkpoint and Spool to their users, Run it, and Close it after Run
// returned. Its methods are safe for concurrent use.
type Store struct {
	path   string
	db     *bolt.DB
	logger *slog.Logger
	ckpt   *Checkpoint
	spool  *Spool    // nil when disabled
	kept   *Retained // nil when disabled

	// flushMu serialises writes: Run's, and Close's last one.
	flushMu sync.Mutex
	// wake has a value once the spool or the checkpoint has something to
	// write: Run ticks only while there is, so that an idle bridge is not
	// woken ten times a second for nothing.
	wake chan struct{}
}

// Open opens the store in dir, creating dir and the file if need be, and
// reads what it holds: the checkpoint's events (Checkpoint.Restored) and
// the spool's extent. A data directory with the checkpoint files of an
// earlier version (checkpoint.json, checkpoint.journal) is imported once,
// and those files are removed.
//
// A store that is not a valid bbolt file, does not decode, or belongs to
// another node is renamed aside (state.db.corrupt-<time> or
// state.db.other-node-<time>) with a warning, and a fresh one is opened:
// losing it costs re-publishing, which the event ids make harmless within
// the stream's duplicate window, and a person may want to look at it.
//
// Open fails at once, within a second, when another process holds the
// store (a second bridge on the same data directory), and when the
// directory or the file cannot be created or read. It fails with a
// *NewerFormatError, leaving the file untouched, for a store of a newer
// format than FormatVersion: setting that aside would lose its spool.
func Open(dir string, opts Options) (*Store, error) {
	if opts.Node == "" {
		return nil, errors.New("open durable state: Options.Node is empty")
	}
	if opts.SpoolMaxBytes < 0 {
		return nil, fmt.Errorf("open durable state: Options.SpoolMaxBytes is negative (%d)", opts.SpoolMaxBytes)
	}
	if opts.RetainWindow > 0 && opts.RetainMaxBytes <= 0 {
		return nil, fmt.Errorf("open durable state: Options.RetainMaxBytes is %d with a retain window", opts.RetainMaxBytes)
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "datadir")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	s := &Store{path: filepath.Join(dir, FileName), logger: logger, wake: make(chan struct{}, 1)}
	now := time.Now()
	// A fresh file cannot be corrupt nor another node's, so the second
	// attempt either works or fails for a reason that is no file's fault.
	for attempt := 0; ; attempt++ {
		db, err := openBolt(s.path)
		var lerr *loadError
		if err == nil {
			var l loaded
			l, err = s.load(db, dir, opts, now)
			if err == nil {
				s.db = db
				s.ckpt = newCheckpoint(l.checkpoint, l.sequence, l.removed, l.slots)
				s.ckpt.created = l.created
				s.ckpt.stream, s.ckpt.streamKnown = l.stream, l.streamKnown
				s.ckpt.wake = s.wake
				if s.kept = l.retained; s.kept != nil {
					s.kept.wake = s.wake
				}
				if opts.SpoolMaxBytes > 0 {
					s.spool = newSpool(db, opts.SpoolMaxBytes, l.spool, s.ckpt.slot, logger)
					s.spool.wake = s.wake
				} else if l.spool.count > 0 {
					logger.Warn("the spool is disabled and holds events of an earlier run; they wait for a bridge with a spool",
						"path", s.path, "spool_entries", l.spool.count)
				}
				stream := "not named yet"
				if l.streamKnown {
					stream = l.stream.String()
				}
				logger.Info("opened durable state", "path", s.path, "containers", l.containers,
					"stream", stream, "sequence", l.sequence, "spool_entries", l.spool.count, "spool_bytes", l.spool.bytes)
				return s, nil
			}
			_ = db.Close() // only read, or its writes are set aside with it
		}
		if !errors.As(err, &lerr) || attempt > 0 {
			return nil, err
		}
		aside, rerr := setAside(s.path, lerr.reason, now)
		if rerr != nil {
			return nil, fmt.Errorf("set aside %s (%w): %w", s.path, lerr, rerr)
		}
		logger.Warn("set the durable state aside and started a fresh one; what it held will be re-published",
			"path", s.path, "aside", aside, "err", lerr)
	}
}

// NewerFormatError is returned by Open for a store of a newer format than
// FormatVersion: one written by a newer pleg-bridge, which this build
// cannot read (a downgrade). Open leaves the file as it is.
type NewerFormatError struct {
	// Path is the store's file.
	Path string
	// Version is the store's format version.
	Version string
}

func (e *NewerFormatError) Error() string {
	return fmt.Sprintf("data directory %s holds durable state of format version %s (%s), newer than this build's %s: "+
		"a newer pleg-bridge wrote it; run that version (or a later one) again, "+
		"or move the data directory aside to start this one fresh, which loses the spooled events that JetStream has not acknowledged",
		filepath.Dir(e.Path), e.Version, filepath.Base(e.Path), FormatVersion)
}

// newerFormat reports whether v is a format version after FormatVersion:
// a decimal number, as every version so far.
func newerFormat(v string) bool {
	n, err := strconv.ParseUint(v, 10, 32)
	cur, _ := strconv.ParseUint(FormatVersion, 10, 32)
	return err == nil && n > cur && strconv.FormatUint(n, 10) == v
}

// loadError is a store that must be set aside: its reason names the
// file it is renamed to.
type loadError struct {
	reason string // "corrupt" or "other-node"
	err    error
}

func (e *loadError) Error() string { return e.err.Error() }
func (e *loadError) Unwrap() error { return e.err }

func corrupt(err error) error { return &loadError{reason: "corrupt", err: err} }

// openBolt opens the bbolt file at path. A file bbolt rejects, or that
// makes it panic (it trusts its pages) or fault (a file cut short is mapped
// beyond its end), is a *loadError.
func openBolt(path string) (db *bolt.DB, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			// The panicking Open may keep its descriptor and lock; the
			// file is renamed aside, so the fresh one has neither.
			db, err = nil, corrupt(fmt.Errorf("open %s: %v", path, r))
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout, InitialMmapSize: initialMmapSize})
	switch {
	case err == nil:
		return db, nil
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("open %s: another process holds it (is another bridge using this data directory?): %w", path, err)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
		return nil, corrupt(fmt.Errorf("open %s: %w", path, err))
	default:
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
}

// setAside renames the file at path so that nothing opens it again, and
// returns the new name.
func setAside(path, reason string, now time.Time) (string, error) {
	aside := fmt.Sprintf("%s.%s-%s", path, reason, now.UTC().Format("20060102T150405.000000000Z"))
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	return aside, syncDir(filepath.Dir(path))
}

// syncDir makes the renames and removals in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open data directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync data directory: %w", err)
	}
	return nil
}

// loaded is what Open reads from the file.
type loaded struct {
	checkpoint []generator.Event
	sequence   uint64
	created    time.Time
	stream     StreamIdentity
	// streamKnown says the store names its stream (see Checkpoint.Stream).
	streamKnown bool
	removed     map[string]time.Time
	slots       slots // the slots of the containers' records' keys
	containers  int
	spool       spoolExtent
	retained    *Retained // nil without Options.RetainWindow
}

// load checks that db is this node's store, creating its buckets in a
// fresh one, imports the earlier checkpoint files of dir, and reads the
// checkpoint and the spool's extent. Records of containers removed more
// than keepRemoved before now are not restored; the first collection
// deletes them.
func (s *Store) load(db *bolt.DB, dir string, opts Options, now time.Time) (l loaded, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = corrupt(fmt.Errorf("read %s: %v", s.path, r))
		}
	}()
	if err := db.Update(func(tx *bolt.Tx) error { return initBuckets(tx, opts.Node, now) }); err != nil {
		return l, err
	}
	if err := importLegacy(db, dir, opts.Node, s.logger, now); err != nil {
		return l, err
	}
	l.removed = map[string]time.Time{}
	l.slots = newSlots()
	err = db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket([]byte(bucketMeta)).Get([]byte(keySequence)); v != nil {
			if len(v) != 8 {
				return corrupt(fmt.Errorf("%s holds a checkpoint sequence of %d bytes", s.path, len(v)))
			}
			l.sequence = binary.BigEndian.Uint64(v)
		}
		if v := tx.Bucket([]byte(bucketMeta)).Get([]byte(keyCreated)); v != nil {
			if err := l.created.UnmarshalText(v); err != nil {
				return corrupt(fmt.Errorf("%s holds a creation time %q: %w", s.path, v, err))
			}
		}
		var err error
		if l.stream, l.streamKnown, err = readStream(tx.Bucket([]byte(bucketMeta)), s.path); err != nil {
			return err
		}
		var last string
		err = tx.Bucket([]byte(bucketCheckpoint)).ForEach(func(k, v []byte) error {
			r, err := decodeRecord(v)
			if err != nil {
				return corrupt(fmt.Errorf("decode %s checkpoint record %q: %w", s.path, k, err))
			}
			slot, ok := keySlot(k, r.ID)
			if !ok {
				return corrupt(fmt.Errorf("%s checkpoint record %q is not keyed by its container %q", s.path, k, r.ID))
			}
			if r.ID != last {
				l.containers++
				last = r.ID
				l.slots.found(r.ID, slot)
			}
			if r.Type == generator.ContainerRemoved {
				l.removed[r.ID] = removedAt(r, now)
			}
			l.checkpoint = append(l.checkpoint, r.event())
			return nil
		})
		if err != nil {
			return err
		}
		if l.spool, err = readSpoolExtent(tx, s.path); err != nil {
			return err
		}
		if opts.RetainWindow > 0 {
			l.retained = newRetained(opts.RetainWindow, opts.RetainMaxBytes, s.logger)
			return l.retained.load(tx, s.path)
		}
		return nil
	})
	if err != nil {
		return l, err
	}
	// Keys sort by slot, then container, so a container's records are
	// adjacent.
	l.checkpoint = dropExpired(l.checkpoint, l.removed, now)
	return l, nil
}

// initBuckets creates the buckets of a fresh store, created now, and
// checks the node and version of an existing one.
func initBuckets(tx *bolt.Tx, node string, now time.Time) error {
	meta := tx.Bucket([]byte(bucketMeta))
	if meta == nil {
		var err error
		if meta, err = tx.CreateBucket([]byte(bucketMeta)); err != nil {
			return fmt.Errorf("create meta bucket: %w", err)
		}
		if err := meta.Put([]byte(keyVersion), []byte(FormatVersion)); err != nil {
			return fmt.Errorf("write format version: %w", err)
		}
		if err := meta.Put([]byte(keyNode), []byte(node)); err != nil {
			return fmt.Errorf("write node name: %w", err)
		}
		if err := meta.Put([]byte(keyCreated), []byte(now.UTC().Format(time.RFC3339Nano))); err != nil {
			return fmt.Errorf("write creation time: %w", err)
		}
	}
	v := string(meta.Get([]byte(keyVersion)))
	if v != FormatVersion && v != formatV1 {
		if newerFormat(v) {
			// Set aside, it would be lost to the newer bridge too, with
			// the spool's events that JetStream never acknowledged.
			return &NewerFormatError{Path: tx.DB().Path(), Version: v}
		}
		return corrupt(fmt.Errorf("%s has format version %q, want %q", tx.DB().Path(), v, FormatVersion))
	}
	if n := string(meta.Get([]byte(keyNode))); n != node {
		return &loadError{reason: "other-node", err: fmt.Errorf("%s belongs to node %q, not %q", tx.DB().Path(), n, node)}
	}
	if v == formatV1 {
		if err := rekeyV1(tx); err != nil {
			return err
		}
		if err := meta.Put([]byte(keyVersion), []byte(FormatVersion)); err != nil {
			return fmt.Errorf("write format version: %w", err)
		}
	}
	for _, name := range []string{bucketCheckpoint, bucketSpool} {
		if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
			return fmt.Errorf("create %s bucket: %w", name, err)
		}
	}
	return nil
}

// removedAt returns when the removal r records was observed, or now if
// that is unknown: the container is kept keepRemoved from now rather than
// dropped at once.
func removedAt(r record, now time.Time) time.Time {
	if r.ObservedAt.IsZero() {
		return now
	}
	return r.ObservedAt
}

// dropExpired returns evs without the events of containers removed more
// than keepRemoved before now.
func dropExpired(evs []generator.Event, removed map[string]time.Time, now time.Time) []generator.Event {
	out := evs[:0]
	for _, ev := range evs {
		if at, ok := removed[ev.Container.ID]; ok && now.Sub(at) > keepRemoved {
			continue
		}
		out = append(out, ev)
	}
	return out
}

// Checkpoint returns the store's checkpoint.
func (s *Store) Checkpoint() *Checkpoint { return s.ckpt }

// Spool returns the store's spool, or nil when Options.SpoolMaxBytes is 0.
func (s *Store) Spool() *Spool { return s.spool }

// Retained returns the acknowledged events the store keeps, or nil when
// Options.RetainWindow is not positive. A store opened without them
// deletes none it holds: a later Open with a window finds them.
func (s *Store) Retained() *Retained { return s.kept }

// Run writes until ctx is done: the checkpoint's acks and the spool's
// appends and removals within 100 ms, and once a minute drops
// the containers removed more than generator.DefaultTombstoneTTL ago. Each
// write is one bbolt transaction, fsynced when it commits; without
// anything new it does no I/O, and it ticks only while something waits to
// be written. When ctx is done it writes what is left and returns nil.
// Write errors are logged, and what failed is retried at the next tick;
// they are never returned.
func (s *Store) Run(ctx context.Context) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	gc := time.NewTicker(gcInterval)
	defer gc.Stop()
	failing := false
	// ticking is false while nothing waits: t's channel is then not waited
	// on, which keeps it from firing (Go 1.23 and later).
	ticking := true
	flush := func(now time.Time, collect bool) {
		err := s.flush(now, collect)
		switch {
		case err != nil && !failing:
			s.logger.Warn("cannot write durable state; retrying", "path", s.path, "err", err)
		case err == nil && failing:
			s.logger.Info("durable state written again", "path", s.path)
		}
		failing = err != nil
		// Wakes that came while ticking are stale: taken before waiting
		// looks, so that one for what came after is not lost.
		select {
		case <-s.wake:
		default:
		}
		ticking = failing || s.waiting()
	}
	// The first tick also collects: a restart may find containers whose
	// time is up.
	first := true
	for {
		// While ticking, wake is not waited on: every ack and spool
		// change sends on it, and a wake for each, under churn, was a
		// goroutine woken for nothing, with its thread, per transition.
		var tc <-chan time.Time
		wake := s.wake
		if ticking || first {
			tc = t.C
		}
		if ticking {
			wake = nil
		}
		select {
		case <-ctx.Done():
			if err := s.flush(time.Now(), false); err != nil {
				s.logger.Warn("write durable state at shutdown; what it missed will be re-published after the restart", "path", s.path, "err", err)
			}
			return nil
		case <-wake:
			// The interval starts from the first thing to write.
			ticking = true
			t.Reset(tick)
		case now := <-gc.C:
			flush(now, true)
		case now := <-tc:
			flush(now, first)
			first = false
		}
	}
}

// waiting reports whether the spool or the checkpoint holds something
// that is not written yet.
func (s *Store) waiting() bool {
	return s.ckpt.waiting() || (s.spool != nil && s.spool.waiting()) || (s.kept != nil && s.kept.waiting())
}

// Close writes what Run has not (nothing, after Run returned) and closes
// the file. Call it once, after Run returned.
func (s *Store) Close() error {
	if err := s.flush(time.Now(), false); err != nil {
		s.logger.Warn("write durable state at close", "path", s.path, "err", err)
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close %s: %w", s.path, err)
	}
	return nil
}

// flush writes, in one transaction, the spool's appends and removals, the
// checkpoint's acks (always with the spool's changes, so that an entry's
// removal and its ack reach the disk together, and with a collection; else
// only when withCheckpoint), the checkpoint's change of stream after
// them, and, when collect, deletes the containers removed more than
// keepRemoved before now. It does nothing when there is nothing to write. On failure everything it took is put back for the next flush.
func (s *Store) flush(now time.Time, collect bool) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	// The spool's changes first, then the acks: an entry's ack is recorded
	// before its Done, so a Done this flush writes comes with its ack, and
	// no crash finds an entry gone from the spool and missing from the
	// checkpoint (that event would be published again as new).
	var w spoolWrites
	if s.spool != nil {
		w = s.spool.writes()
	}
	cw := s.ckpt.take(collect, now)
	var rw retainedWrites
	if s.kept != nil {
		rw = s.kept.take(now)
	}
	prefixes := s.ckpt.prefixes(cw.expired)
	keys := slices.Sorted(maps.Keys(cw.acks))
	for {
		// The acks go in key order, ackBudget a transaction; the last
		// transaction also writes the change of stream and the sequence
		// (after every ack they vouch for), the collection and the spool's
		// changes (the removals after their acks).
		chunk := keys[:min(len(keys), ackBudget)]
		keys = keys[len(chunk):]
		final := len(keys) == 0
		if final && len(chunk) == 0 && cw.writesNothing() && w.writesNothing() && rw.writesNothing() {
			if s.spool != nil {
				s.spool.written(w) // drops the appends Done before any write
			}
		} else {
			err := s.db.Update(func(tx *bolt.Tx) error {
				if err := putAcks(tx, cw.acks, chunk); err != nil {
					return err
				}
				if !final {
					return nil
				}
				if err := putStream(tx, cw.stream); err != nil {
					return err
				}
				if err := putRewind(tx, cw.rewind); err != nil {
					return err
				}
				if err := putSequence(tx, cw.seq); err != nil {
					return err
				}
				if err := deleteContainers(tx, prefixes); err != nil {
					return err
				}
				if err := putRetained(tx, rw); err != nil {
					return err
				}
				return putSpool(tx, w)
			})
			if err != nil {
				// Acks written by an earlier transaction of this flush are
				// written again by the next: the same records.
				s.ckpt.putBack(cw)
				if s.spool != nil {
					s.spool.writeFailed(w)
				}
				if s.kept != nil {
					s.kept.writeFailed(rw)
				}
				return fmt.Errorf("write %s: %w", s.path, err)
			}
			if !final {
				continue
			}
			s.ckpt.collected(cw.expired)
			if s.spool != nil {
				s.spool.written(w)
			}
			if s.kept != nil {
				s.kept.written(rw)
			}
		}
		if !w.more {
			return nil
		}
		// The rest of the spool's appends, a transaction per budget.
		w, cw, rw, prefixes = s.spool.writes(), ckptWrites{}, retainedWrites{}, nil
	}
}

// ckptKey is a checkpoint record's key: the container's slot (8 bytes,
// big-endian), its ID, a NUL (which no ID holds), and the event type, so
// that a container's records are adjacent and prefixed by its slot and ID
// (ckptPrefix).
//
// A container's slot is given when its first ack is recorded, from a
// counter (Checkpoint.keyLocked), so that new containers' records go to
// the end of the file's key order, and a short-lived container's later
// records beside its first: the pages a write changes are those of the
// newest containers, not one page per ack. Keyed by container ID alone
// (format "1"), which a runtime makes random, each ack of a write landed
// on a page of its own: under churn at 10,000 transitions a second on a
// checkpoint of 30,000 containers, a write changed 1,139 pages, each
// written with a system call and each a fresh 4 KB buffer
// (BenchmarkChurnFlush).
func ckptKey(slot uint64, id string, typ generator.LifecycleEventType) string {
	return slotKey(slot, id, string(typ))
}

// ckptPrefix is the prefix of the keys of a container's records.
func ckptPrefix(slot uint64, id string) string { return slotKey(slot, id, "") }

// slotKey returns slot, id, a NUL and suffix, in one allocation.
func slotKey(slot uint64, id, suffix string) string {
	var b strings.Builder
	b.Grow(8 + len(id) + 1 + len(suffix))
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], slot)
	b.Write(s[:])
	b.WriteString(id)
	b.WriteByte(0)
	b.WriteString(suffix)
	return b.String()
}

// keySlot returns the slot of a record's key, checking that the key is
// that of container id.
func keySlot(k []byte, id string) (uint64, bool) {
	if len(k) < 8+len(id)+1 || string(k[8:8+len(id)]) != id || k[8+len(id)] != 0 {
		return 0, false
	}
	return binary.BigEndian.Uint64(k), true
}

// rekeyV1 rewrites the checkpoint of a store of format "1", keyed by
// container ID and type, with a slot per container (ckptKey), in the
// order of the old keys.
func rekeyV1(tx *bolt.Tx) error {
	old := tx.Bucket([]byte(bucketCheckpoint))
	if old == nil {
		return nil
	}
	type kv struct{ k, v []byte }
	var recs []kv
	slots := newSlots()
	err := old.ForEach(func(k, v []byte) error {
		id, typ, ok := strings.Cut(string(k), "\x00")
		if !ok {
			return corrupt(fmt.Errorf("%s checkpoint key %q has no NUL", tx.DB().Path(), k))
		}
		recs = append(recs, kv{[]byte(ckptKey(slots.get(id), id, generator.LifecycleEventType(typ))), bytes.Clone(v)})
		return nil
	})
	if err != nil {
		return err
	}
	if err := tx.DeleteBucket([]byte(bucketCheckpoint)); err != nil {
		return fmt.Errorf("rewrite checkpoint bucket: %w", err)
	}
	b, err := tx.CreateBucket([]byte(bucketCheckpoint))
	if err != nil {
		return fmt.Errorf("rewrite checkpoint bucket: %w", err)
	}
	for _, r := range recs {
		if err := b.Put(r.k, r.v); err != nil {
			return fmt.Errorf("rewrite checkpoint record: %w", err)
		}
	}
	return nil
}

// slotsAfter returns slots that give slots after the highest in the
// checkpoint bucket b: its last key's, as keys sort by slot first.
func slotsAfter(b *bolt.Bucket) slots {
	s := newSlots()
	if k, _ := b.Cursor().Last(); len(k) >= 8 {
		s.next = binary.BigEndian.Uint64(k) + 1
	}
	return s
}

// ackBudget bounds the acks of one transaction. bbolt holds a page buffer
// for every page a transaction changes, and the encoded records, until it
// commits: a first relist's acks (6,000 at 1,000/5,000) in one transaction
// took 8.5 MB of page buffers and 2.8 MB of records at the bridge's peak.
// Written in key order, a transaction changes only the pages of its key
// range, so the chunks do not rewrite each other's pages.
const ackBudget = 1024

// putAcks writes the acks of keys in tx.
func putAcks(tx *bolt.Tx, acks map[string]record, keys []string) error {
	b := tx.Bucket([]byte(bucketCheckpoint))
	for _, k := range keys {
		data, err := encodeRecord(acks[k])
		if err != nil {
			return err
		}
		if err := b.Put([]byte(k), data); err != nil {
			return fmt.Errorf("put checkpoint record: %w", err)
		}
	}
	return nil
}

// putSequence writes seq (0: none) as the checkpoint's sequence unless a
// higher one is written already. Write it in the transaction of the last
// acks it came with, or after, so that no crash leaves the sequence
// without the acks it vouches for.
func putSequence(tx *bolt.Tx, seq uint64) error {
	if seq == 0 {
		return nil
	}
	meta := tx.Bucket([]byte(bucketMeta))
	if v := meta.Get([]byte(keySequence)); len(v) != 8 || binary.BigEndian.Uint64(v) < seq {
		if err := meta.Put([]byte(keySequence), binary.BigEndian.AppendUint64(nil, seq)); err != nil {
			return fmt.Errorf("put checkpoint sequence: %w", err)
		}
	}
	return nil
}

// putRewind writes *seq as the checkpoint's sequence, lower or not
// (Checkpoint.Rewind); nil writes nothing. A rewind to 0 deletes it.
func putRewind(tx *bolt.Tx, seq *uint64) error {
	if seq == nil {
		return nil
	}
	meta := tx.Bucket([]byte(bucketMeta))
	if *seq == 0 {
		return meta.Delete([]byte(keySequence))
	}
	if err := meta.Put([]byte(keySequence), binary.BigEndian.AppendUint64(nil, *seq)); err != nil {
		return fmt.Errorf("put checkpoint sequence: %w", err)
	}
	return nil
}

// deleteContainers deletes the records under prefixes (ckptPrefix).
func deleteContainers(tx *bolt.Tx, prefixes []string) error {
	if len(prefixes) == 0 {
		return nil
	}
	b := tx.Bucket([]byte(bucketCheckpoint))
	var keys [][]byte
	for _, p := range prefixes {
		prefix := []byte(p)
		c := b.Cursor()
		// Collected first: a cursor that deletes as it goes skips keys.
		for k, _ := c.Seek(prefix); k != nil && strings.HasPrefix(string(k), string(prefix)); k, _ = c.Next() {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return fmt.Errorf("delete checkpoint record: %w", err)
		}
	}
	return nil
}

// seqKey is a spool entry's key: its sequence number, big-endian, so that
// keys sort in append order.
func seqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

// isNotExist reports whether err says a file does not exist.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
