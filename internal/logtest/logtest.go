package logtest

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Buffer collects what a logger writes; it is safe for concurrent use. The
// zero value is empty and ready to use.
type Buffer struct {
	mu      sync.Mutex
	b       bytes.Buffer  // guarded by mu
	changed chan struct{} // guarded by mu; nil until Changed is called
}

// Write appends p, and signals Changed if anyone asked for it.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.changed != nil {
		select {
		case b.changed <- struct{}{}:
		default:
		}
	}
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Take returns what was written since the last Take, and forgets it.
func (b *Buffer) Take() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.b.String()
	b.b.Reset()
	return s
}

// Changed returns a channel that receives after a write: one signal stands
// for every write since the last receive. Read the buffer after the signal.
func (b *Buffer) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.changed == nil {
		b.changed = make(chan struct{}, 1)
	}
	return b.changed
}

// JSONLogger returns a logger that writes JSON records to b from level up.
func (b *Buffer) JSONLogger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: level}))
}

// Records returns everything written so far as JSON records, those at
// level ("WARN", "INFO", ...) only, or all of them if level is "". A line
// that is not a JSON object fails the test.
func (b *Buffer) Records(t testing.TB, level string) []map[string]any {
	t.Helper()
	return records(t, b.String(), level)
}

// TakeRecords is Records of what was written since the last Take or
// TakeRecords, which it forgets, whatever the level.
func (b *Buffer) TakeRecords(t testing.TB, level string) []map[string]any {
	t.Helper()
	return records(t, b.Take(), level)
}

func records(t testing.TB, logs, level string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(logs) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q is not a JSON record: %v", line, err)
		}
		if level == "" || rec["level"] == level {
			out = append(out, rec)
		}
	}
	return out
}
