package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

const (
	// checkpointInterval keeps the checkpoint within a second of the acks it
	// records (DESIGN.md §7).
	checkpointInterval = 500 * time.Millisecond
	// checkpointKeepRemoved is how long a removed container stays in the
	// checkpoint: as long as the generator's tombstones, so that a stale
	// replay after a restart is recognised.
	checkpointKeepRemoved = generator.DefaultTombstoneTTL
	checkpointVersion     = 1
	// checkpointJournalMin is the journal size below which it is never
	// compacted: on a small node the snapshot is a few KiB, and rewriting it
	// every few flushes would bring back the cost the journal removes, while
	// replaying a MiB of journal at start takes milliseconds.
	checkpointJournalMin = 1 << 20
	// checkpointTempPattern names the files written before being renamed
	// into place.
	checkpointTempPattern = ".checkpoint-*"
)

// checkpoint records what JetStream acknowledged, per container, under
// PLEG_DATA_DIR, so that a restarted bridge neither re-publishes everything
// as new nor forgets what changed while it was down.
//
// It keeps two files. The snapshot (checkpoint.json) holds every tracked
// container; the journal (checkpoint.journal, see checkpoint_journal.go)
// holds, one JSON line each, the acks since that snapshot. A flush appends
// the acks since the last flush to the journal and fsyncs it; a compaction
// rewrites the snapshot and starts an empty journal, when the journal has
// outgrown the snapshot, on the first flush after a start, and at shutdown.
// Loading applies the journal on top of the snapshot. Acks that arrived
// after the last flush are lost by a crash, and re-published after it,
// which the event ids make harmless within the stream's duplicate window.
//
// OnAck is safe for concurrent use. Run owns the writing: the fields after
// pending are its own (or a test's calling flush, compact and finish in its
// stead), never touched by OnAck.
type checkpoint struct {
	path        string // the snapshot
	journalPath string
	node        string
	logger      *slog.Logger

	mu      sync.Mutex
	acked   map[string][]checkpointEvent // guarded by mu; by container ID, one event per type
	pending []checkpointEvent            // guarded by mu; acked, in order, but not yet on disk

	// gen is the generation of the snapshot on disk and of the journal
	// that extends it; after a checkpoint was set aside, the highest one
	// found on disk.
	gen uint64
	// journal is open for appending to the journal of generation gen; nil
	// until a compaction has created it.
	journal *os.File
	// journalSize counts the journal's bytes, and journalRecords the records
	// this process appended since its last compaction.
	journalSize    int64
	journalRecords int
	// snapshotSize is the size of the snapshot on disk.
	snapshotSize int64
	// buf is where appends encode the records.
	buf bytes.Buffer
	// compactNext makes the next flush a compaction. It is set at start and
	// after a failed append, so that this process only ever appends to a
	// journal it created and wrote whole: never after a torn line, nor to a
	// journal the snapshot no longer names.
	compactNext bool
}

// checkpointEvent is an acked event as the files keep it: whole in the
// snapshot, one per line in the journal.
type checkpointEvent struct {
	Type       generator.LifecycleEventType `json:"type"`
	PodUID     string                       `json:"podUID"`
	Namespace  string                       `json:"namespace,omitempty"`
	PodName    string                       `json:"podName,omitempty"`
	ID         string                       `json:"id"`
	Name       string                       `json:"name,omitempty"`
	Attempt    uint32                       `json:"attempt,omitempty"`
	Sandbox    bool                         `json:"sandbox,omitempty"`
	Image      string                       `json:"image,omitempty"`
	ImageRef   string                       `json:"imageRef,omitempty"`
	State      generator.State              `json:"state"`
	ExitCode   *int32                       `json:"exitCode,omitempty"`
	Reason     string                       `json:"reason,omitempty"`
	Message    string                       `json:"message,omitempty"`
	StartedAt  time.Time                    `json:"startedAt,omitzero"`
	FinishedAt time.Time                    `json:"finishedAt,omitzero"`
	Time       time.Time                    `json:"time,omitzero"`
	ObservedAt time.Time                    `json:"observedAt,omitzero"`
}

// checkpointFile is the snapshot. Journal was added to version 1 without a
// version bump: an older bridge ignores the field, so a downgrade still
// loads the snapshot (missing only the journal's acks, which it re-publishes
// harmlessly), and a snapshot an older bridge wrote has no Journal, so an
// upgrade does not mistake a journal left from before the downgrade for the
// acks that followed the snapshot.
type checkpointFile struct {
	Version int       `json:"version"`
	Node    string    `json:"node"`
	Written time.Time `json:"written"`
	// Journal is the generation of the journal that extends this snapshot;
	// zero (absent) for a snapshot without one.
	Journal uint64                       `json:"journal,omitempty"`
	Acked   map[string][]checkpointEvent `json:"acked"`
}

func toCheckpoint(ev generator.Event) checkpointEvent {
	return checkpointEvent{
		Type: ev.Type, PodUID: ev.Pod.UID, Namespace: ev.Pod.Namespace, PodName: ev.Pod.Name,
		ID: ev.Container.ID, Name: ev.Container.Name, Attempt: ev.Container.Attempt, Sandbox: ev.Container.Sandbox,
		Image: ev.Container.Image, ImageRef: ev.Container.ImageRef, State: ev.State, ExitCode: ev.ExitCode,
		Reason: ev.Reason, Message: ev.Message, StartedAt: ev.StartedAt, FinishedAt: ev.FinishedAt,
		Time: ev.Time, ObservedAt: ev.ObservedAt,
	}
}

func (c checkpointEvent) event() generator.Event {
	return generator.Event{
		Type: c.Type, Pod: generator.Pod{UID: c.PodUID, Namespace: c.Namespace, Name: c.PodName},
		Container: generator.Container{ID: c.ID, Name: c.Name, Attempt: c.Attempt, Sandbox: c.Sandbox, Image: c.Image, ImageRef: c.ImageRef},
		State:     c.State, ExitCode: c.ExitCode, Reason: c.Reason, Message: c.Message,
		StartedAt: c.StartedAt, FinishedAt: c.FinishedAt, Time: c.Time, ObservedAt: c.ObservedAt,
	}
}

// openCheckpoint reads the checkpoint of node from dataDir, if any, and
// returns the events it records. It only reads: the first flush writes.
//
// Missing files are a first start. A snapshot or journal that cannot be
// read, is corrupt (garbage anywhere but on the journal's last line), or
// belongs to another node sets the whole checkpoint aside with a warning,
// never fatal: the cost is re-publishing, which the event ids make harmless
// within the stream's duplicate window. A torn last journal line, which a
// crash during an append leaves, is skipped with a warning. A journal that
// does not extend the snapshot is ignored: silently when the snapshot
// already holds it (a stop between the two steps of a compaction), with a
// warning otherwise.
func openCheckpoint(dataDir, node string, logger *slog.Logger) (*checkpoint, []generator.Event) {
	c := &checkpoint{
		path:        filepath.Join(dataDir, "checkpoint.json"),
		journalPath: filepath.Join(dataDir, "checkpoint.journal"),
		node:        node,
		logger:      logger.With("component", "checkpoint"),
		acked:       map[string][]checkpointEvent{},
		compactNext: true,
	}
	c.removeTemps(dataDir)
	snap, found, serr := readSnapshot(c.path)
	j, jfound, jerr := readJournal(c.journalPath)
	// Whatever is kept, the next snapshot's generation exceeds every one on
	// disk, so that no journal left there, of a checkpoint set aside or of
	// an older life, can pass for the one that extends it.
	c.gen = max(snap.Journal, j.header.Generation)
	switch {
	case serr != nil:
		c.logger.Warn("ignoring checkpoint", "path", c.path, "err", serr)
		return c, nil
	case found && (snap.Version != checkpointVersion || snap.Node != node):
		c.logger.Warn("ignoring checkpoint", "path", c.path, "version", snap.Version, "checkpoint_node", snap.Node, "node", node)
		return c, nil
	case jerr != nil:
		c.logger.Warn("ignoring checkpoint", "path", c.journalPath, "err", jerr)
		return c, nil
	case jfound && j.header.Node != node:
		c.logger.Warn("ignoring checkpoint", "path", c.journalPath, "checkpoint_node", j.header.Node, "node", node)
		return c, nil
	}
	if !found && !jfound {
		c.logger.Info("no checkpoint: first start reports what is running", "path", c.path)
		return c, nil
	}
	if j.tornLine > 0 {
		c.logger.Warn("skipping the torn last line of the checkpoint journal, left by a stop during a write; its acks will be re-published",
			"path", c.journalPath, "line", j.tornLine, "err", j.tornErr)
	}
	for _, evs := range snap.Acked {
		for _, e := range evs {
			c.record(e)
		}
	}
	applied := 0
	switch {
	case !jfound:
	case snap.Journal != 0 && j.header.Generation == snap.Journal:
		for _, e := range j.records {
			c.record(e)
		}
		applied = len(j.records)
	case j.header.Generation+1 == snap.Journal:
		// The snapshot was renamed into place but the journal not yet
		// replaced: the snapshot already holds every record of it.
		c.logger.Debug("checkpoint journal already in the snapshot", "path", c.journalPath, "generation", j.header.Generation)
	default:
		// Left beside a snapshot that does not name it: by a downgrade that
		// rewrote the snapshot, or a snapshot restored by hand. Its acks may
		// be older than the snapshot's, so applying them could resurrect
		// containers the snapshot has dropped.
		c.logger.Warn("ignoring a checkpoint journal that does not extend the snapshot", "path", c.journalPath,
			"generation", j.header.Generation, "snapshot_journal", snap.Journal)
	}
	var events []generator.Event
	for _, evs := range c.acked {
		for _, e := range evs {
			events = append(events, e.event())
		}
	}
	c.logger.Info("restored checkpoint", "path", c.path, "containers", len(c.acked), "written", snap.Written, "journal_records", applied)
	return c, events
}

// removeTemps deletes the temporary files a stop during a write left in
// dir: on a large node each is a whole snapshot, and nothing reads them.
func (c *checkpoint) removeTemps(dir string) {
	temps, err := filepath.Glob(filepath.Join(dir, checkpointTempPattern))
	if err != nil {
		return // only a malformed pattern fails, and this one is constant
	}
	for _, t := range temps {
		if err := os.Remove(t); err != nil {
			c.logger.Warn("cannot remove a temporary checkpoint file left by an interrupted write", "path", t, "err", err)
			continue
		}
		c.logger.Info("removed a temporary checkpoint file left by an interrupted write", "path", t)
	}
}

// readSnapshot reads the snapshot at path. found is false if there is none.
func readSnapshot(path string) (f checkpointFile, found bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return f, false, nil
	}
	if err != nil {
		return f, false, fmt.Errorf("read checkpoint: %w", err)
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return f, false, fmt.Errorf("decode checkpoint %s: %w", path, err)
	}
	return f, true, nil
}

// record adds e to the acked events, replacing an event of the same
// container and type: an ack recorded twice, as a journal replay may do, is
// recorded once. It stores a new slice rather than change the one in acked,
// so that compact can encode a copy of the map outside mu. The caller holds
// mu, or owns c alone.
func (c *checkpoint) record(e checkpointEvent) {
	old := c.acked[e.ID]
	evs := make([]checkpointEvent, len(old), len(old)+1)
	copy(evs, old)
	if i := slices.IndexFunc(evs, func(x checkpointEvent) bool { return x.Type == e.Type }); i >= 0 {
		evs[i] = e
	} else {
		evs = append(evs, e)
	}
	c.acked[e.ID] = evs
}

// OnAck records an event JetStream acknowledged. It does no I/O and is safe
// for concurrent use.
func (c *checkpoint) OnAck(ev generator.Event) {
	e := toCheckpoint(ev)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.record(e)
	c.pending = append(c.pending, e)
}

// Run flushes the checkpoint every checkpointInterval while acks come in,
// until ctx is done; then it compacts it a last time, so that the next start
// reads one snapshot. Write errors are logged and retried, never returned.
func (c *checkpoint) Run(ctx context.Context) error {
	t := time.NewTicker(checkpointInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			if err := c.finish(time.Now()); err != nil {
				c.logger.Warn("write final checkpoint", "err", err)
			}
			return nil
		case now := <-t.C:
			err := c.flush(now)
			switch {
			case err != nil && !failing:
				c.logger.Warn("cannot write checkpoint; a restart will re-publish what is running", "err", err)
			case err == nil && failing:
				c.logger.Info("checkpoint written again")
			}
			failing = err != nil
		}
	}
}

// flush makes the acks since the last flush durable: it appends them to the
// journal, or compacts when the journal has outgrown the snapshot (or must
// be replaced, see compactNext). It does nothing without new acks.
func (c *checkpoint) flush(now time.Time) error {
	c.mu.Lock()
	n := len(c.pending)
	c.mu.Unlock()
	if n == 0 {
		return nil
	}
	if c.compactNext || c.journalSize >= max(c.snapshotSize, checkpointJournalMin) {
		return c.compact(now)
	}
	return c.appendPending()
}

// finish compacts the checkpoint at shutdown if this process changed it,
// and closes the journal.
func (c *checkpoint) finish(now time.Time) error {
	defer c.closeJournal()
	c.mu.Lock()
	n := len(c.pending)
	c.mu.Unlock()
	if n == 0 && c.journalRecords == 0 {
		return nil
	}
	return c.compact(now)
}

// appendPending appends the pending acks to the journal and fsyncs it. On
// failure the acks stay pending and the next flush compacts, because a
// failed write may have left part of a line that later appends would bury.
func (c *checkpoint) appendPending() error {
	c.mu.Lock()
	recs := c.pending
	c.pending = nil
	c.mu.Unlock()
	n, err := appendJournal(c.journal, &c.buf, recs)
	if c.buf.Cap() > checkpointJournalMin {
		c.buf = bytes.Buffer{} // a burst of acks need not be kept
	}
	if err != nil {
		c.mu.Lock()
		c.pending = append(recs, c.pending...)
		c.mu.Unlock()
		c.compactNext = true
		return fmt.Errorf("append to %s: %w", c.journalPath, err)
	}
	c.journalSize += int64(n)
	c.journalRecords += len(recs)
	return nil
}

// compact rewrites the snapshot with every tracked container, dropping
// those removed more than checkpointKeepRemoved before now, and starts an
// empty journal. The order makes each crash window safe:
//
//  1. The snapshot of generation gen+1 is written to a temporary file,
//     fsynced, renamed over the old one, and the directory fsynced. A crash
//     before the rename leaves the old snapshot and its journal as they were.
//  2. A crash after it leaves the new snapshot beside the journal of
//     generation gen, which it already holds: loading recognises the
//     generation and skips that journal (replaying it would also be
//     harmless, records being idempotent). The directory fsync makes sure a
//     crash cannot keep the new journal of step 3 but lose this rename.
//  3. An empty journal of generation gen+1 (just its header) is written the
//     same way and renamed over the old one. From then on flushes append
//     to it.
//
// Under mu it only copies the map (its slices are never modified, see
// record) and takes the pending acks, which the copy holds; acks after that
// go to the new journal. OnAck is not held up while the snapshot is encoded.
func (c *checkpoint) compact(now time.Time) error {
	c.mu.Lock()
	acked := make(map[string][]checkpointEvent, len(c.acked))
	for id, evs := range c.acked {
		if at, ok := removedAt(evs); ok && now.Sub(at) > checkpointKeepRemoved {
			delete(c.acked, id)
			continue
		}
		acked[id] = evs
	}
	recs := c.pending
	c.pending = nil
	c.mu.Unlock()
	gen := c.gen + 1
	data, err := json.Marshal(checkpointFile{Version: checkpointVersion, Node: c.node, Written: now.UTC(), Journal: gen, Acked: acked})
	if err != nil {
		return c.compactFailed(recs, fmt.Errorf("encode checkpoint: %w", err))
	}
	if err := writeFileAtomic(c.path, data); err != nil {
		return c.compactFailed(recs, err)
	}
	// The acks are durable from here, and the journal of generation gen-1
	// is dead: compactNext stays set until a journal of gen exists.
	c.gen = gen
	c.snapshotSize = int64(len(data))
	c.journalRecords = 0
	c.closeJournal()
	f, size, err := createJournal(c.journalPath, journalHeader{Version: checkpointVersion, Node: c.node, Generation: gen})
	if err != nil {
		c.compactNext = true
		return err
	}
	c.journal, c.journalSize, c.compactNext = f, size, false
	return nil
}

// compactFailed puts recs back in front of the pending acks, so that the
// next flush retries the compaction, and returns err.
func (c *checkpoint) compactFailed(recs []checkpointEvent, err error) error {
	c.mu.Lock()
	c.pending = append(recs, c.pending...)
	c.mu.Unlock()
	c.compactNext = true
	return err
}

func (c *checkpoint) closeJournal() {
	if c.journal != nil {
		// Every append was fsynced, so a close error loses nothing.
		_ = c.journal.Close()
		c.journal = nil
	}
}

// removedAt returns when the container was observed removed, if it was.
func removedAt(evs []checkpointEvent) (time.Time, bool) {
	for _, e := range evs {
		if e.Type == generator.ContainerRemoved {
			return e.ObservedAt, true
		}
	}
	return time.Time{}, false
}

// writeFileAtomic replaces path with data so that a crash leaves either the
// old file or the new one, whole: temporary file, fsync, rename, and an
// fsync of the directory, without which the rename itself may not survive
// a crash.
func writeFileAtomic(path string, data []byte) error {
	f, err := createTemp(path)
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // a no-op once renamed
	if err := writeSync(f, data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close checkpoint: %w", err)
	}
	return renameSync(f.Name(), path)
}

// createTemp creates a temporary file beside path, creating the directory
// if need be.
func createTemp(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create checkpoint directory: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), checkpointTempPattern)
	if err != nil {
		return nil, fmt.Errorf("create checkpoint: %w", err)
	}
	return f, nil
}

func writeSync(f *os.File, data []byte) error {
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", f.Name(), err)
	}
	return nil
}

// renameSync renames tmp to path and fsyncs their directory.
func renameSync(tmp, path string) error {
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("open checkpoint directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync checkpoint directory: %w", err)
	}
	return nil
}
