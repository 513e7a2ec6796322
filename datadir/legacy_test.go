package datadir_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// The earlier bridge's checkpoint files, written by hand in their formats:
// a snapshot, and a journal of JSON lines (a header, then one record per
// ack) whose generation the snapshot names.

// legacySnapshot holds three acks, byte for byte as the bridge before the
// journal wrote them (no "journal" field).
const legacySnapshot = `{"version":1,"node":"node-1","written":"2025-06-01T12:02:00Z","acked":{"c1":[{"type":"ContainerStarted","podUID":"uid-1","namespace":"shop","podName":"web-0","id":"c1","name":"app","image":"nginx:1.27","state":"running","startedAt":"2025-06-01T12:00:00Z","time":"2025-06-01T12:00:00Z","observedAt":"2025-06-01T12:00:00Z"},{"type":"ContainerDied","podUID":"uid-1","namespace":"shop","podName":"web-0","id":"c1","name":"app","image":"nginx:1.27","state":"exited","exitCode":1,"reason":"Error","startedAt":"2025-06-01T12:00:00Z","finishedAt":"2025-06-01T12:01:00Z","time":"2025-06-01T12:01:00Z","observedAt":"2025-06-01T12:01:00Z"}],"sb1":[{"type":"ContainerStarted","podUID":"uid-1","namespace":"shop","podName":"web-0","id":"sb1","sandbox":true,"state":"running","time":"2025-06-01T12:00:00Z","observedAt":"2025-06-01T12:00:00Z"}]}}`

func legacySnapshotEvents() []generator.Event {
	pod := generator.Pod{UID: "uid-1", Namespace: "shop", Name: "web-0"}
	app := generator.Container{ID: "c1", Name: "app", Image: "nginx:1.27"}
	code := int32(1)
	return []generator.Event{
		{Type: generator.ContainerStarted, Pod: pod, Container: generator.Container{ID: "sb1", Sandbox: true}, State: generator.StateRunning, Time: t0, ObservedAt: t0},
		{Type: generator.ContainerStarted, Pod: pod, Container: app, State: generator.StateRunning, StartedAt: t0, Time: t0, ObservedAt: t0},
		{Type: generator.ContainerDied, Pod: pod, Container: app, State: generator.StateExited, ExitCode: &code, Reason: "Error",
			StartedAt: t0, FinishedAt: t0.Add(time.Minute), Time: t0.Add(time.Minute), ObservedAt: t0.Add(time.Minute)},
	}
}

// legacySnapshotGen3 is the same snapshot as the journal bridge wrote it,
// naming the journal of generation 3 that extends it.
var legacySnapshotGen3 = strings.Replace(legacySnapshot, `"written":"2025-06-01T12:02:00Z",`, `"written":"2025-06-01T12:02:00Z","journal":3,`, 1)

const (
	legacyHeaderGen3 = `{"version":1,"node":"node-1","generation":3}` + "\n"
	legacyHeaderGen2 = `{"version":1,"node":"node-1","generation":2}` + "\n"
	// legacyRemoved and legacyStarted are journal lines.
	legacyRemoved = `{"type":"ContainerRemoved","podUID":"uid-1","namespace":"shop","podName":"web-0","id":"c1","name":"app","image":"nginx:1.27","state":"removed","time":"2025-06-01T12:02:00Z","observedAt":"2025-06-01T12:02:00Z"}` + "\n"
	legacyStarted = `{"type":"ContainerStarted","podUID":"uid-2","namespace":"shop","podName":"web-1","id":"c2","name":"app","image":"nginx:1.27","state":"running","startedAt":"2025-06-01T12:03:00Z","time":"2025-06-01T12:03:00Z","observedAt":"2025-06-01T12:03:00Z"}` + "\n"
)

// legacyStartedEvent is legacyStarted's event.
func legacyStartedEvent() generator.Event {
	return generator.Event{Type: generator.ContainerStarted, Pod: generator.Pod{UID: "uid-2", Namespace: "shop", Name: "web-1"},
		Container: generator.Container{ID: "c2", Name: "app", Image: "nginx:1.27"}, State: generator.StateRunning,
		StartedAt: t0.Add(3 * time.Minute), Time: t0.Add(3 * time.Minute), ObservedAt: t0.Add(3 * time.Minute)}
}

func TestOpenImportsTheEarlierCheckpointFiles(t *testing.T) {
	t.Parallel()
	snapshot := legacySnapshotEvents()
	// legacyRemoved removes c1, long before now: its events are imported
	// and not restored, as a container removed more than the tombstone TTL
	// ago.
	sandbox := snapshot[:1]
	for _, tt := range []struct {
		name            string
		snapshot, jrnl  string // file contents; "" for no file
		want            []generator.Event
		warn            string // the path the one warning names, or ""
		wantWarnContain string
	}{
		{name: "a snapshot without a journal", snapshot: legacySnapshot, want: snapshot},
		{name: "a snapshot and the journal it names", snapshot: legacySnapshotGen3, jrnl: legacyHeaderGen3 + legacyRemoved + legacyStarted,
			want: slices.Concat(sandbox, []generator.Event{legacyStartedEvent()})},
		{name: "a journal with a torn last line", snapshot: legacySnapshotGen3, jrnl: legacyHeaderGen3 + legacyStarted + legacyRemoved[:40],
			want: slices.Concat(snapshot, []generator.Event{legacyStartedEvent()}), warn: "checkpoint.journal", wantWarnContain: "torn"},
		{name: "a journal the snapshot already holds (a stop during a compaction)", snapshot: legacySnapshotGen3, jrnl: legacyHeaderGen2 + legacyStarted,
			want: snapshot},
		{name: "a journal the snapshot does not name", snapshot: legacySnapshot, jrnl: legacyHeaderGen3 + legacyStarted,
			want: snapshot, warn: "checkpoint.journal", wantWarnContain: "does not extend"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "checkpoint.json"), []byte(tt.snapshot))
			if tt.jrnl != "" {
				writeFile(t, filepath.Join(dir, "checkpoint.journal"), []byte(tt.jrnl))
			}
			// A temporary file an interrupted write of the earlier bridge left.
			writeFile(t, filepath.Join(dir, ".checkpoint-123456"), []byte(`{"version":1,"node":"node-1","acked":{}}`))

			s, logs := open(t, dir, datadir.Options{})
			checkEvents(t, "imported", s.Checkpoint().Restored(), tt.want...)
			w := logs.Records(t, "WARN")
			switch {
			case tt.warn == "" && len(w) != 0:
				t.Errorf("warnings: %v", w)
			case tt.warn != "" && (len(w) != 1 || w[0]["path"] != filepath.Join(dir, tt.warn) || !strings.Contains(w[0]["msg"].(string), tt.wantWarnContain)):
				t.Errorf("want one warning naming %s and saying %q, got %v", tt.warn, tt.wantWarnContain, w)
			}
			if left := glob(t, dir, "*checkpoint*"); len(left) != 0 {
				t.Errorf("files left after the import: %v", left)
			}
			closeStore(t, s)
			s, _ = open(t, dir, datadir.Options{})
			defer closeStore(t, s)
			checkEvents(t, "restored after the import", s.Checkpoint().Restored(), tt.want...)
		})
	}
}

func TestOpenSetsUnusableEarlierCheckpointFilesAside(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name           string
		snapshot, jrnl string
		path, err      string // the file the warning's error names, and what else it says
	}{
		{"when the snapshot is not JSON", `{"version":1,"node":"node-1","acked":{`, "", "checkpoint.json", "decode"},
		{"when the snapshot belongs to another node", strings.Replace(legacySnapshot, `"node-1"`, `"node-2"`, 1), "", "checkpoint.json", `"node-2"`},
		{"when a journal line before the last is garbage", legacySnapshotGen3, legacyHeaderGen3 + "garbage\n" + legacyStarted, "checkpoint.journal", "line 2"},
		{"when the journal header is garbage", legacySnapshotGen3, "{\"version\":\n" + legacyStarted, "checkpoint.journal", "line 1"},
		{"when the journal belongs to another node", legacySnapshotGen3, strings.Replace(legacyHeaderGen3, "node-1", "node-2", 1) + legacyStarted, "checkpoint.journal", `"node-2"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "checkpoint.json"), []byte(tt.snapshot))
			if tt.jrnl != "" {
				writeFile(t, filepath.Join(dir, "checkpoint.journal"), []byte(tt.jrnl))
			}
			s, logs := open(t, dir, datadir.Options{})
			defer closeStore(t, s)
			if got := s.Checkpoint().Restored(); len(got) != 0 {
				t.Errorf("imported %v from unusable files", got)
			}
			w := logs.Records(t, "WARN")
			if len(w) == 0 {
				t.Fatal("no warning")
			}
			if errText, _ := w[0]["err"].(string); !strings.Contains(errText, filepath.Join(dir, tt.path)) || !strings.Contains(errText, tt.err) {
				t.Errorf("warning's err %q does not name %s and %q", errText, tt.path, tt.err)
			}
			if left := glob(t, dir, "checkpoint.*"); len(left) != 0 && !strings.Contains(strings.Join(left, " "), "unusable") {
				t.Errorf("files left in place: %v", left)
			}
			if aside := glob(t, dir, "checkpoint.json.unusable-*"); len(aside) != 1 {
				t.Errorf("the snapshot was not set aside: %v", aside)
			}
		})
	}
}

// TestOpenImportsTheEarlierCheckpointOnlyOnce: files found beside a store
// they were imported into (a stop before their removal) are only removed;
// their older acks must not overwrite the store's.
func TestOpenImportsTheEarlierCheckpointOnlyOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "checkpoint.json"), []byte(legacySnapshot))
	s, _ := open(t, dir, datadir.Options{})
	closeStore(t, s)

	writeFile(t, filepath.Join(dir, "checkpoint.json"), []byte(legacySnapshotGen3))
	writeFile(t, filepath.Join(dir, "checkpoint.journal"), []byte(legacyHeaderGen3+legacyStarted))
	s, logs := open(t, dir, datadir.Options{})
	defer closeStore(t, s)
	checkEvents(t, "restored", s.Checkpoint().Restored(), legacySnapshotEvents()...)
	if left := glob(t, dir, "checkpoint.*"); len(left) != 0 {
		t.Errorf("files left: %v", left)
	}
	if w := logs.Records(t, "WARN"); len(w) != 0 {
		t.Errorf("warnings: %v", w)
	}
	if _, err := os.Stat(filepath.Join(dir, ".checkpoint-123456")); !os.IsNotExist(err) {
		t.Errorf("stat of a temporary file: %v", err)
	}
}
