package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// The checkpoint journal is JSON lines: a header, then one checkpointEvent
// per line, in the order JetStream acked them. A record is keyed by
// container ID and event type, so applying one twice changes nothing.
//
// A journal is only ever created whole (header written, fsynced, renamed
// into place) and then appended to, each append fsynced. A crash during an
// append can therefore only damage the last line: cut short, or, on some
// filesystems, filled with zeros. Such a line is skipped, and the acks in
// it are re-published after the restart. Anything else that does not
// decode is corruption, which no crash of ours produces, so the journal
// cannot be trusted to hold the acks it should: that is an error naming
// the file and line, and the caller sets the checkpoint aside as it does a
// corrupt snapshot.

// journalHeader is the first line of a journal.
type journalHeader struct {
	Version int    `json:"version"`
	Node    string `json:"node"`
	// Generation matches the Journal field of the snapshot this journal
	// extends; it starts at 1.
	Generation uint64 `json:"generation"`
}

// journalContents is a journal as read from disk.
type journalContents struct {
	header  journalHeader
	records []checkpointEvent
	// tornLine is the number of a torn last line that was skipped, or 0;
	// tornErr says why it did not decode.
	tornLine int
	tornErr  error
}

// readJournal reads the journal at path. found is false if there is none,
// or if it is empty, which has nothing to apply.
func readJournal(path string) (j journalContents, found bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) || err == nil && len(data) == 0 {
		return j, false, nil
	}
	if err != nil {
		return j, false, fmt.Errorf("read checkpoint journal: %w", err)
	}
	j, err = parseJournal(path, data)
	return j, true, err
}

// parseJournal decodes a journal; path only names it in errors.
func parseJournal(path string, data []byte) (journalContents, error) {
	var j journalContents
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	if err := json.Unmarshal(lines[0], &j.header); err != nil {
		return j, fmt.Errorf("decode %s line 1 (header): %w", path, err)
	}
	if j.header.Version != checkpointVersion || j.header.Generation == 0 {
		return j, fmt.Errorf("decode %s line 1 (header): version %d generation %d", path, j.header.Version, j.header.Generation)
	}
	for i, line := range lines[1:] {
		n := i + 2
		e, err := decodeJournalRecord(line)
		if err == nil {
			j.records = append(j.records, e)
			continue
		}
		if n == len(lines) {
			j.tornLine, j.tornErr = n, err
			break
		}
		return j, fmt.Errorf("decode %s line %d: %w", path, n, err)
	}
	return j, nil
}

func decodeJournalRecord(line []byte) (checkpointEvent, error) {
	var e checkpointEvent
	if err := json.Unmarshal(line, &e); err != nil {
		return e, err
	}
	if e.ID == "" || e.Type == "" {
		return e, errors.New("record without container id or event type")
	}
	return e, nil
}

// appendJournal appends recs to the journal f, fsyncs it, and returns the
// number of bytes written. buf is scratch space, reused between calls so
// that a flush does not regrow it. A failed write may leave part of a line
// behind.
func appendJournal(f *os.File, buf *bytes.Buffer, recs []checkpointEvent) (int, error) {
	buf.Reset()
	enc := json.NewEncoder(buf) // one record per line
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return 0, fmt.Errorf("encode checkpoint journal record: %w", err)
		}
	}
	if err := writeSync(f, buf.Bytes()); err != nil {
		return 0, err
	}
	return buf.Len(), nil
}

// createJournal atomically replaces the journal at path with one holding
// only h, and returns it open for appending, with its size.
func createJournal(path string, h journalHeader) (*os.File, int64, error) {
	line, err := json.Marshal(h)
	if err != nil {
		return nil, 0, fmt.Errorf("encode checkpoint journal header: %w", err)
	}
	line = append(line, '\n')
	f, err := createTemp(path)
	if err != nil {
		return nil, 0, err
	}
	// The file stays open across the rename: appends then go to the file
	// now named path.
	if err := writeSync(f, line); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, 0, err
	}
	if err := renameSync(f.Name(), path); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, 0, err
	}
	return f, int64(len(line)), nil
}
