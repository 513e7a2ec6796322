package datadir

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The bridge kept its checkpoint in two files before this package: a
// snapshot (checkpoint.json) and an append-only journal beside it
// (checkpoint.journal, JSON lines: a header, then one record per ack). Open
// imports them once, read-only, into the checkpoint bucket and removes
// them. The import and the mark that it was done (keyImported) are one
// transaction: a crash before the files are removed leaves files that the
// next Open only removes, so acks of this store are never overwritten by
// the older ones of the files.

const (
	legacySnapshot = "checkpoint.json"
	legacyJournal  = "checkpoint.journal"
	// legacyTemps names the temporary files an interrupted write of the
	// snapshot or the journal left.
	legacyTemps   = ".checkpoint-*"
	legacyVersion = 1
)

// legacySnapshotFile is the snapshot. Journal names the generation of the
// journal that extends it; zero for a snapshot without one.
type legacySnapshotFile struct {
	Version int                 `json:"version"`
	Node    string              `json:"node"`
	Written time.Time           `json:"written"`
	Journal uint64              `json:"journal,omitempty"`
	Acked   map[string][]record `json:"acked"`
}

// legacyJournalHeader is the journal's first line.
type legacyJournalHeader struct {
	Version    int    `json:"version"`
	Node       string `json:"node"`
	Generation uint64 `json:"generation"`
}

// importLegacy imports the earlier checkpoint files of dir into db, then
// removes them. Files that cannot be trusted (they do not decode, name
// another node, or a journal line before the last is garbage) are renamed
// aside with a warning, and nothing of them is imported. A torn last
// journal line, which a crash during an append left, is skipped with a
// warning: its acks are re-published. A journal that does not extend the
// snapshot is skipped: silently when the snapshot already holds it (a stop
// during a compaction), with a warning otherwise.
func importLegacy(db *bolt.DB, dir, node string, logger *slog.Logger, now time.Time) error {
	removeLegacyTemps(dir, logger)
	snapPath, journalPath := filepath.Join(dir, legacySnapshot), filepath.Join(dir, legacyJournal)
	snapData, snapFound, err := readLegacyFile(snapPath)
	if err != nil {
		return err
	}
	journalData, journalFound, err := readLegacyFile(journalPath)
	if err != nil {
		return err
	}
	if !snapFound && !journalFound {
		return nil
	}
	var imported bool
	if err := db.View(func(tx *bolt.Tx) error {
		imported = tx.Bucket([]byte(bucketMeta)).Get([]byte(keyImported)) != nil
		return nil
	}); err != nil {
		return fmt.Errorf("read %s: %w", db.Path(), err)
	}
	files := []string{snapPath, journalPath}
	if imported {
		logger.Info("removing the earlier checkpoint files, imported before", "path", snapPath)
		return removeFiles(dir, files)
	}
	recs, err := parseLegacy(snapPath, snapData, snapFound, journalPath, journalData, journalFound, node, logger)
	if err != nil {
		logger.Warn("not importing the earlier checkpoint files; what they held will be re-published", "path", snapPath, "err", err)
		for _, f := range files {
			if aside, rerr := setAside(f, "unusable", now); rerr == nil {
				logger.Warn("set an earlier checkpoint file aside", "path", f, "aside", aside)
			} else if !isNotExist(rerr) {
				return fmt.Errorf("set aside %s: %w", f, rerr)
			}
		}
		return nil
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucketCheckpoint))
		slots := slotsAfter(b)
		for _, r := range recs {
			data, err := encodeRecord(r)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(ckptKey(slots.get(r.ID), r.ID, r.Type)), data); err != nil {
				return fmt.Errorf("put checkpoint record: %w", err)
			}
		}
		return tx.Bucket([]byte(bucketMeta)).Put([]byte(keyImported), []byte(now.UTC().Format(time.RFC3339)))
	})
	if err != nil {
		return fmt.Errorf("import the earlier checkpoint into %s: %w", db.Path(), err)
	}
	logger.Info("imported the earlier checkpoint files", "path", snapPath, "records", len(recs))
	return removeFiles(dir, files)
}

// readLegacyFile reads path; found is false if it does not exist or is
// empty.
func readLegacyFile(path string) (data []byte, found bool, err error) {
	data, err = os.ReadFile(path)
	switch {
	case isNotExist(err):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("read earlier checkpoint: %w", err)
	}
	return data, len(data) > 0, nil
}

// parseLegacy returns the records of the earlier snapshot and journal:
// the snapshot's, then, if the journal extends it, the journal's, in the
// order they were acked (a later record of a key replaces an earlier one).
func parseLegacy(snapPath string, snapData []byte, snapFound bool, journalPath string, journalData []byte, journalFound bool, node string, logger *slog.Logger) ([]record, error) {
	var snap legacySnapshotFile
	var recs []record
	if snapFound {
		if err := json.Unmarshal(snapData, &snap); err != nil {
			return nil, fmt.Errorf("decode %s: %w", snapPath, err)
		}
		if snap.Version != legacyVersion || snap.Node != node {
			return nil, fmt.Errorf("%s is version %d of node %q, want version %d of node %q", snapPath, snap.Version, snap.Node, legacyVersion, node)
		}
		for _, evs := range snap.Acked {
			for _, r := range evs {
				if r.ID == "" || r.Type == "" {
					return nil, fmt.Errorf("decode %s: record without container id or event type", snapPath)
				}
				recs = append(recs, r)
			}
		}
	}
	if !journalFound {
		return recs, nil
	}
	h, jrecs, err := parseLegacyJournal(journalPath, journalData, logger)
	if err != nil {
		return nil, err
	}
	if h.Node != node {
		return nil, fmt.Errorf("%s belongs to node %q, not %q", journalPath, h.Node, node)
	}
	switch {
	case snap.Journal != 0 && h.Generation == snap.Journal:
		recs = append(recs, jrecs...)
	case h.Generation+1 == snap.Journal:
		// The snapshot was renamed into place but the journal not yet
		// replaced: the snapshot holds every record of it.
	default:
		// Left beside a snapshot that does not name it (a downgrade that
		// rewrote the snapshot): its acks may be older than the
		// snapshot's, and would resurrect containers it dropped.
		logger.Warn("ignoring an earlier checkpoint journal that does not extend the snapshot", "path", journalPath,
			"generation", h.Generation, "snapshot_journal", snap.Journal)
	}
	return recs, nil
}

// parseLegacyJournal decodes a journal. Only its last line may be garbage:
// a crash during an append can damage nothing else.
func parseLegacyJournal(path string, data []byte, logger *slog.Logger) (legacyJournalHeader, []record, error) {
	var h legacyJournalHeader
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	if err := json.Unmarshal(lines[0], &h); err != nil {
		return h, nil, fmt.Errorf("decode %s line 1 (header): %w", path, err)
	}
	if h.Version != legacyVersion || h.Generation == 0 {
		return h, nil, fmt.Errorf("decode %s line 1 (header): version %d generation %d", path, h.Version, h.Generation)
	}
	var recs []record
	for i, line := range lines[1:] {
		n := i + 2
		r, err := decodeRecord(line)
		if err == nil {
			recs = append(recs, r)
			continue
		}
		if n == len(lines) {
			logger.Warn("skipping the torn last line of the earlier checkpoint journal, left by a stop during a write; its acks will be re-published",
				"path", path, "line", n, "err", err)
			break
		}
		return h, nil, fmt.Errorf("decode %s line %d: %w", path, n, err)
	}
	return h, recs, nil
}

// removeFiles removes the files that exist of paths, and makes the removal
// durable.
func removeFiles(dir string, paths []string) error {
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !isNotExist(err) {
			return fmt.Errorf("remove earlier checkpoint file: %w", err)
		}
	}
	return syncDir(dir)
}

// removeLegacyTemps deletes the temporary files an interrupted write of
// the earlier checkpoint left in dir: each may be a whole snapshot, and
// nothing reads them.
func removeLegacyTemps(dir string, logger *slog.Logger) {
	temps, err := filepath.Glob(filepath.Join(dir, legacyTemps))
	if err != nil {
		return // only a malformed pattern fails, and this one is constant
	}
	for _, t := range temps {
		if err := os.Remove(t); err != nil && !errors.Is(err, os.ErrNotExist) {
			logger.Warn("cannot remove a temporary checkpoint file left by an interrupted write", "path", t, "err", err)
			continue
		}
		logger.Info("removed a temporary checkpoint file left by an interrupted write", "path", t)
	}
}
