package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// ckptEvent is an acked event of container id in pod uid, at t0+offset.
func ckptEvent(uid, id string, typ generator.LifecycleEventType, offset time.Duration) generator.Event {
	at := t0.Add(offset)
	ev := generator.Event{
		Type: typ, Pod: generator.Pod{UID: uid, Namespace: "shop", Name: "web-" + uid},
		Container: generator.Container{ID: id, Name: "app", Image: "nginx:1.27"},
		State:     generator.StateRunning, StartedAt: t0, Time: at, ObservedAt: at,
	}
	switch typ {
	case generator.ContainerDied:
		code := int32(2)
		ev.State, ev.ExitCode, ev.Reason, ev.FinishedAt = generator.StateExited, &code, "Error", at
	case generator.ContainerRemoved:
		ev.State = generator.StateRemoved
	}
	return ev
}

func ack(c *checkpoint, evs ...generator.Event) {
	for _, ev := range evs {
		c.OnAck(ev)
	}
}

func mustFlush(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// restart loads the checkpoint in dir as a restarted bridge does, and
// returns the events it restores, sorted, and what it logged.
func restart(t *testing.T, dir string) (*checkpoint, []generator.Event, string) {
	t.Helper()
	var logs bytes.Buffer
	c, evs := openCheckpoint(dir, "node-1", slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(c.closeJournal)
	return c, sortEvents(evs), logs.String()
}

func sortEvents(evs []generator.Event) []generator.Event {
	order := func(typ generator.LifecycleEventType) int {
		return slices.Index(generator.LifecycleEventTypes[:], typ)
	}
	slices.SortFunc(evs, func(a, b generator.Event) int {
		return cmp.Or(strings.Compare(a.Container.ID, b.Container.ID), cmp.Compare(order(a.Type), order(b.Type)))
	})
	return evs
}

func wantEvents(evs ...generator.Event) []generator.Event {
	return sortEvents(slices.Clone(evs))
}

func checkEvents(t *testing.T, got []generator.Event, want ...generator.Event) {
	t.Helper()
	if diff := gocmp.Diff(wantEvents(want...), got); diff != "" {
		t.Errorf("restored events (-want +got):\n%s", diff)
	}
}

// logRecords returns the records logged at level.
func logRecords(t *testing.T, logs, level string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(logs) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["level"] == level {
			out = append(out, rec)
		}
	}
	return out
}

func readSnapshotT(t *testing.T, dir string) checkpointFile {
	t.Helper()
	f, found, err := readSnapshot(filepath.Join(dir, "checkpoint.json"))
	if err != nil || !found {
		t.Fatalf("read snapshot: found %v, %v", found, err)
	}
	return f
}

func readJournalT(t *testing.T, dir string) journalContents {
	t.Helper()
	j, found, err := readJournal(filepath.Join(dir, "checkpoint.journal"))
	if err != nil || !found {
		t.Fatalf("read journal: found %v, %v", found, err)
	}
	return j
}

func TestCheckpointRestoresAcksThatAreOnlyInTheJournal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, evs, _ := restart(t, dir)
	if len(evs) != 0 {
		t.Fatalf("an empty directory restores %v", evs)
	}
	a, b := ckptEvent("u1", "a", generator.ContainerStarted, 0), ckptEvent("u1", "b", generator.ContainerStarted, 0)
	ack(c, a, b)
	mustFlush(t, c.flush(t0)) // the first flush after a start compacts
	bDied, cStarted := ckptEvent("u1", "b", generator.ContainerDied, time.Second), ckptEvent("u2", "c", generator.ContainerStarted, time.Second)
	ack(c, bDied, cStarted)
	mustFlush(t, c.flush(t0.Add(time.Second)))

	if snap := readSnapshotT(t, dir); len(snap.Acked) != 2 || len(snap.Acked["b"]) != 1 {
		t.Fatalf("the second flush rewrote the snapshot: %+v", snap.Acked)
	}
	if j := readJournalT(t, dir); len(j.records) != 2 {
		t.Fatalf("journal holds %d records, want the 2 acks since the snapshot", len(j.records))
	}
	// The process dies without a final compaction.
	c.closeJournal()
	_, got, logs := restart(t, dir)
	checkEvents(t, got, a, b, bDied, cStarted)
	if w := logRecords(t, logs, "WARN"); len(w) != 0 {
		t.Errorf("warnings on a clean restart: %v", w)
	}
}

func TestCheckpointCompactsAtShutdownAndRestartsFromTheSnapshot(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, _, _ := restart(t, dir)
	a := ckptEvent("u1", "a", generator.ContainerStarted, 0)
	ack(c, a)
	mustFlush(t, c.flush(t0))
	aDied := ckptEvent("u1", "a", generator.ContainerDied, time.Second)
	ack(c, aDied)
	mustFlush(t, c.flush(t0.Add(time.Second)))
	aRemoved := ckptEvent("u1", "a", generator.ContainerRemoved, 2*time.Second) // acked, not yet flushed
	ack(c, aRemoved)
	mustFlush(t, c.finish(t0.Add(3*time.Second)))

	if j := readJournalT(t, dir); len(j.records) != 0 || j.header.Generation != readSnapshotT(t, dir).Journal {
		t.Errorf("after shutdown the journal holds %d records, generation %d; want none, extending the snapshot", len(j.records), j.header.Generation)
	}
	c2, got, _ := restart(t, dir)
	checkEvents(t, got, a, aDied, aRemoved)

	// A start that acks nothing leaves the files as they are.
	mustFlush(t, c2.flush(t0.Add(4*time.Second)))
	mustFlush(t, c2.finish(t0.Add(5*time.Second)))
	_, got, _ = restart(t, dir)
	checkEvents(t, got, a, aDied, aRemoved)
}

func TestCheckpointCompactsWhenTheJournalOutgrowsTheSnapshot(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, _, _ := restart(t, dir)
	var all []generator.Event
	var batch int64
	for i := range 60 {
		for j := range 100 {
			ev := ckptEvent("u"+strconv.Itoa(i), fmt.Sprintf("%064d", i*100+j), generator.ContainerStarted, time.Duration(i)*time.Second)
			all = append(all, ev)
			ack(c, ev)
		}
		before := c.journalSize
		mustFlush(t, c.flush(t0.Add(time.Duration(i)*time.Second)))
		batch = max(batch, c.journalSize-before)
		st, err := os.Stat(filepath.Join(dir, "checkpoint.journal"))
		if err != nil {
			t.Fatal(err)
		}
		if bound := max(c.snapshotSize, checkpointJournalMin) + batch; st.Size() > bound {
			t.Fatalf("flush %d: journal is %d bytes, over %d (the larger of the snapshot and %d, plus one flush)", i, st.Size(), bound, checkpointJournalMin)
		}
	}
	if gen := readSnapshotT(t, dir).Journal; gen < 2 {
		t.Errorf("snapshot generation %d: the journal was never compacted", gen)
	}
	c.closeJournal()
	_, got, _ := restart(t, dir)
	checkEvents(t, got, all...)
}

func TestCheckpointCrashBetweenSnapshotAndJournalRestoresEachAckOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	journal := filepath.Join(dir, "checkpoint.journal")
	c, _, _ := restart(t, dir)
	a := ckptEvent("u1", "a", generator.ContainerStarted, 0)
	ack(c, a)
	mustFlush(t, c.flush(t0))
	aDied, b := ckptEvent("u1", "a", generator.ContainerDied, time.Second), ckptEvent("u1", "b", generator.ContainerStarted, time.Second)
	ack(c, aDied, b)
	mustFlush(t, c.flush(t0.Add(time.Second)))
	old, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	bDied := ckptEvent("u1", "b", generator.ContainerDied, 2*time.Second)
	ack(c, bDied)
	mustFlush(t, c.compact(t0.Add(2*time.Second)))
	c.closeJournal()
	// The crash came after the snapshot's rename and before the journal's:
	// the new snapshot sits beside the journal it already holds.
	if err := os.WriteFile(journal, old, 0o600); err != nil {
		t.Fatal(err)
	}
	c2, got, logs := restart(t, dir)
	checkEvents(t, got, a, aDied, b, bDied)
	if w := logRecords(t, logs, "WARN"); len(w) != 0 {
		t.Errorf("warnings for a crash the compaction expects: %v", w)
	}

	// The restarted bridge carries on: its first flush replaces the stale journal.
	bRemoved := ckptEvent("u1", "b", generator.ContainerRemoved, 3*time.Second)
	ack(c2, bRemoved)
	mustFlush(t, c2.flush(t0.Add(3*time.Second)))
	c2.closeJournal()
	_, got, _ = restart(t, dir)
	checkEvents(t, got, a, aDied, b, bDied, bRemoved)
}

func TestCheckpointJournalRecordsAreIdempotent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, aDied := ckptEvent("u1", "a", generator.ContainerStarted, 0), ckptEvent("u1", "a", generator.ContainerDied, time.Second)
	snap, err := json.Marshal(checkpointFile{Version: checkpointVersion, Node: "node-1", Written: t0, Journal: 4,
		Acked: map[string][]checkpointEvent{"a": {toCheckpoint(a), toCheckpoint(aDied)}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(filepath.Join(dir, "checkpoint.json"), snap); err != nil {
		t.Fatal(err)
	}
	f, _, err := createJournal(filepath.Join(dir, "checkpoint.journal"), journalHeader{Version: checkpointVersion, Node: "node-1", Generation: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The journal repeats what the snapshot holds, and itself.
	if _, err := appendJournal(f, &bytes.Buffer{}, []checkpointEvent{toCheckpoint(aDied), toCheckpoint(a), toCheckpoint(aDied)}); err != nil {
		t.Fatal(err)
	}
	_, got, _ := restart(t, dir)
	checkEvents(t, got, a, aDied)
}

func TestCheckpointSkipsATornLastJournalLine(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		tail func(line []byte) []byte
	}{
		{"when an append was cut short", func(line []byte) []byte { return line[:len(line)/2] }},
		{"when the filesystem left zeros", func(line []byte) []byte { return make([]byte, len(line)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			journal := filepath.Join(dir, "checkpoint.journal")
			c, _, _ := restart(t, dir)
			a, b := ckptEvent("u1", "a", generator.ContainerStarted, 0), ckptEvent("u1", "b", generator.ContainerStarted, time.Second)
			ack(c, a)
			mustFlush(t, c.flush(t0))
			ack(c, b)
			mustFlush(t, c.flush(t0.Add(time.Second)))
			c.closeJournal()
			line, err := json.Marshal(toCheckpoint(ckptEvent("u1", "c", generator.ContainerStarted, 2*time.Second)))
			if err != nil {
				t.Fatal(err)
			}
			appendFile(t, journal, tt.tail(line))

			c2, got, logs := restart(t, dir)
			checkEvents(t, got, a, b)
			w := logRecords(t, logs, "WARN")
			if len(w) != 1 || w[0]["path"] != journal || w[0]["line"] != 3.0 {
				t.Errorf("want one warning naming %s line 3, got %v", journal, w)
			}

			// The restarted bridge does not append after the torn line.
			cStarted := ckptEvent("u1", "c", generator.ContainerStarted, 3*time.Second)
			ack(c2, cStarted)
			mustFlush(t, c2.flush(t0.Add(3*time.Second)))
			c2.closeJournal()
			_, got, logs = restart(t, dir)
			checkEvents(t, got, a, b, cStarted)
			if w := logRecords(t, logs, "WARN"); len(w) != 0 {
				t.Errorf("warnings after the torn line was compacted away: %v", w)
			}
		})
	}
}

func appendFile(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointSetsABadCheckpointAside covers what no crash of the bridge
// leaves: the bridge warns, naming the file (and the line), starts without
// the checkpoint, and writes a good one at its first flush.
func TestCheckpointSetsABadCheckpointAside(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		spoil   func(t *testing.T, snapshot, journal string)
		path    string // "snapshot" or "journal": the file the warning names
		wantErr string
	}{
		{"when the snapshot is not JSON", func(t *testing.T, snapshot, _ string) {
			writeFile(t, snapshot, []byte(`{"version":1,"node":"node-1","acked":{`))
		}, "snapshot", "decode "},
		{"when the snapshot belongs to another node", func(t *testing.T, snapshot, _ string) {
			data, err := os.ReadFile(snapshot)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, snapshot, bytes.Replace(data, []byte(`"node":"node-1"`), []byte(`"node":"node-2"`), 1))
		}, "snapshot", ""},
		{"when a journal line before the last is garbage", func(t *testing.T, _, journal string) {
			data, err := os.ReadFile(journal)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.SplitAfter(string(data), "\n")
			writeFile(t, journal, []byte(lines[0]+"garbage\n"+strings.Join(lines[1:], "")))
		}, "journal", "line 2"},
		{"when the journal header is garbage", func(t *testing.T, _, journal string) {
			data, err := os.ReadFile(journal)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, journal, append([]byte("{\"version\":\n"), data...))
		}, "journal", "line 1"},
		{"when the journal belongs to another node", func(t *testing.T, _, journal string) {
			data, err := os.ReadFile(journal)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, journal, bytes.Replace(data, []byte(`"node":"node-1"`), []byte(`"node":"node-2"`), 1))
		}, "journal", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			files := map[string]string{"snapshot": filepath.Join(dir, "checkpoint.json"), "journal": filepath.Join(dir, "checkpoint.journal")}
			c, _, _ := restart(t, dir)
			ack(c, ckptEvent("u1", "a", generator.ContainerStarted, 0))
			mustFlush(t, c.flush(t0))
			ack(c, ckptEvent("u1", "b", generator.ContainerStarted, time.Second), ckptEvent("u1", "c", generator.ContainerStarted, time.Second))
			mustFlush(t, c.flush(t0.Add(time.Second)))
			c.closeJournal()
			tt.spoil(t, files["snapshot"], files["journal"])

			c2, got, logs := restart(t, dir)
			if len(got) != 0 {
				t.Errorf("restored %v from a bad checkpoint", got)
			}
			w := logRecords(t, logs, "WARN")
			if len(w) != 1 || w[0]["path"] != files[tt.path] {
				t.Fatalf("want one warning naming %s, got %v", files[tt.path], w)
			}
			if errText, _ := w[0]["err"].(string); tt.wantErr != "" && (!strings.Contains(errText, files[tt.path]) || !strings.Contains(errText, tt.wantErr)) {
				t.Errorf("warning's err %q does not name %s and %q", errText, files[tt.path], tt.wantErr)
			}

			d := ckptEvent("u1", "d", generator.ContainerStarted, 2*time.Second)
			ack(c2, d)
			mustFlush(t, c2.flush(t0.Add(2*time.Second)))
			c2.closeJournal()
			_, got, logs = restart(t, dir)
			checkEvents(t, got, d)
			if w := logRecords(t, logs, "WARN"); len(w) != 0 {
				t.Errorf("warnings after the first flush replaced the bad checkpoint: %v", w)
			}
		})
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCheckpointDropsRemovedContainersAtCompactionAfterKeepRemoved(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, _, _ := restart(t, dir)
	old := []generator.Event{
		ckptEvent("u1", "old", generator.ContainerStarted, 0),
		ckptEvent("u1", "old", generator.ContainerDied, time.Minute),
	}
	recent := []generator.Event{
		ckptEvent("u2", "recent", generator.ContainerStarted, 0),
		ckptEvent("u2", "recent", generator.ContainerDied, 5*time.Minute),
	}
	running := ckptEvent("u3", "running", generator.ContainerStarted, 0)
	ack(c, old[0], old[1], recent[0], recent[1], running)
	mustFlush(t, c.flush(t0.Add(5*time.Minute)))
	old = append(old, ckptEvent("u1", "old", generator.ContainerRemoved, time.Minute))
	recent = append(recent, ckptEvent("u2", "recent", generator.ContainerRemoved, 5*time.Minute))
	ack(c, old[2], recent[2])
	mustFlush(t, c.flush(t0.Add(5*time.Minute))) // appended: nothing dropped yet

	all := slices.Concat(old, recent, []generator.Event{running})
	_, got, _ := restart(t, dir)
	checkEvents(t, got, all...)

	// Keep removed is measured from the observed removal.
	at := t0.Add(time.Minute + checkpointKeepRemoved + time.Second)
	mustFlush(t, c.compact(at))
	c.closeJournal()
	_, got, _ = restart(t, dir)
	checkEvents(t, got, slices.Concat(recent, []generator.Event{running})...)
}

// checkpointV1 is a checkpoint as the bridge wrote it before the journal:
// byte for byte what that code wrote for three acks.
const checkpointV1 = `{"version":1,"node":"node-1","written":"2025-06-01T12:02:00Z","acked":{"c1":[{"type":"ContainerStarted","podUID":"uid-1","namespace":"shop","podName":"web-0","id":"c1","name":"app","image":"nginx:1.27","state":"running","startedAt":"2025-06-01T12:00:00Z","time":"2025-06-01T12:00:00Z","observedAt":"2025-06-01T12:00:00Z"},{"type":"ContainerDied","podUID":"uid-1","namespace":"shop","podName":"web-0","id":"c1","name":"app","image":"nginx:1.27","state":"exited","exitCode":1,"reason":"Error","startedAt":"2025-06-01T12:00:00Z","finishedAt":"2025-06-01T12:01:00Z","time":"2025-06-01T12:01:00Z","observedAt":"2025-06-01T12:01:00Z"}],"sb1":[{"type":"ContainerStarted","podUID":"uid-1","namespace":"shop","podName":"web-0","id":"sb1","sandbox":true,"state":"running","time":"2025-06-01T12:00:00Z","observedAt":"2025-06-01T12:00:00Z"}]}}`

func checkpointV1Events() []generator.Event {
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

func TestCheckpointLoadsTheFileOfTheBridgeBeforeTheJournal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "checkpoint.json"), []byte(checkpointV1))
	c, got, logs := restart(t, dir)
	v1 := checkpointV1Events()
	checkEvents(t, got, v1...)
	if w := logRecords(t, logs, "WARN"); len(w) != 0 {
		t.Errorf("warnings loading a v1 checkpoint: %v", w)
	}

	removed := ckptEvent("uid-1", "c1", generator.ContainerRemoved, 2*time.Minute)
	ack(c, removed)
	mustFlush(t, c.flush(t0.Add(2*time.Minute)))
	c.closeJournal()
	if snap := readSnapshotT(t, dir); snap.Version != 1 || snap.Journal == 0 {
		t.Errorf("the first flush after the upgrade wrote version %d journal %d, want version 1 with a journal", snap.Version, snap.Journal)
	}
	_, got, _ = restart(t, dir)
	checkEvents(t, got, append(v1, removed)...)
}

// TestCheckpointIgnoresAJournalTheSnapshotDoesNotName covers a downgrade and
// upgrade: the older bridge loads the snapshot, rewrites it without naming
// a journal, and leaves the journal; its acks may predate the snapshot's.
func TestCheckpointIgnoresAJournalTheSnapshotDoesNotName(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, _, _ := restart(t, dir)
	stale := ckptEvent("u9", "gone-long-ago", generator.ContainerStarted, 0)
	ack(c, ckptEvent("u9", "first", generator.ContainerStarted, 0))
	mustFlush(t, c.flush(t0))
	ack(c, stale)
	mustFlush(t, c.flush(t0))
	c.closeJournal()
	writeFile(t, filepath.Join(dir, "checkpoint.json"), []byte(checkpointV1)) // the older bridge's rewrite

	_, got, logs := restart(t, dir)
	checkEvents(t, got, checkpointV1Events()...)
	w := logRecords(t, logs, "WARN")
	if len(w) != 1 || w[0]["path"] != filepath.Join(dir, "checkpoint.journal") {
		t.Errorf("want one warning naming the journal, got %v", w)
	}
}

func TestCheckpointCompactsAfterAFailedAppend(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, _, _ := restart(t, dir)
	a, b := ckptEvent("u1", "a", generator.ContainerStarted, 0), ckptEvent("u1", "b", generator.ContainerStarted, time.Second)
	ack(c, a)
	mustFlush(t, c.flush(t0))
	ack(c, b)
	c.journal.Close() // the next write fails
	if err := c.flush(t0.Add(time.Second)); err == nil {
		t.Fatal("flush to a closed journal succeeded")
	}
	mustFlush(t, c.flush(t0.Add(2*time.Second)))
	c.closeJournal()
	_, got, _ := restart(t, dir)
	checkEvents(t, got, a, b)
}

// advanceCheckpoint moves a synctest bubble's virtual clock on by d and
// returns once every goroutine in it is blocked again.
func advanceCheckpoint(d time.Duration) {
	time.Sleep(d) // inside a bubble, sleeping is how the clock moves
	synctest.Wait()
}

func TestCheckpointRunFlushesWithinAnIntervalAndCompactsAtShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		c, _, _ := restart(t, dir)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()

		a := ckptEvent("u1", "a", generator.ContainerStarted, 0)
		ack(c, a)
		advanceCheckpoint(checkpointInterval)
		_, got, _ := restart(t, dir)
		checkEvents(t, got, a)

		aDied := ckptEvent("u1", "a", generator.ContainerDied, time.Second)
		ack(c, aDied)
		advanceCheckpoint(checkpointInterval)
		_, got, _ = restart(t, dir)
		checkEvents(t, got, a, aDied)
		if j := readJournalT(t, dir); len(j.records) != 1 {
			t.Errorf("the second flush put %d records in the journal, want 1", len(j.records))
		}

		aRemoved := ckptEvent("u1", "a", generator.ContainerRemoved, 2*time.Second)
		ack(c, aRemoved)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		if j := readJournalT(t, dir); len(j.records) != 0 {
			t.Errorf("after shutdown the journal holds %d records, want none", len(j.records))
		}
		_, got, _ = restart(t, dir)
		checkEvents(t, got, a, aDied, aRemoved)
	})
}

// TestCheckpointSetAsideStaysAsideAfterACrashInCompaction: a journal of a
// checkpoint that was set aside must not pass for the one that extends the
// next snapshot when a crash leaves it beside that snapshot.
func TestCheckpointSetAsideStaysAsideAfterACrashInCompaction(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	snapshot, journal := filepath.Join(dir, "checkpoint.json"), filepath.Join(dir, "checkpoint.journal")
	c, _, _ := restart(t, dir)
	ack(c, ckptEvent("u1", "a", generator.ContainerStarted, 0))
	mustFlush(t, c.flush(t0))
	ack(c, ckptEvent("u1", "set-aside", generator.ContainerStarted, time.Second))
	mustFlush(t, c.flush(t0.Add(time.Second)))
	c.closeJournal()
	writeFile(t, snapshot, []byte("{")) // the snapshot is lost
	old, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}

	c2, got, _ := restart(t, dir)
	if len(got) != 0 {
		t.Fatalf("restored %v beside a corrupt snapshot", got)
	}
	b := ckptEvent("u1", "b", generator.ContainerStarted, 2*time.Second)
	ack(c2, b)
	mustFlush(t, c2.flush(t0.Add(2*time.Second)))
	c2.closeJournal()
	writeFile(t, journal, old) // the crash came before the journal was replaced
	_, got, _ = restart(t, dir)
	checkEvents(t, got, b)
}

// TestCheckpointTakesAcksWhileItCompacts runs under -race: OnAck goes on
// while compactions encode the snapshot outside the lock.
func TestCheckpointTakesAcksWhileItCompacts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, _, _ := restart(t, dir)
	var want []generator.Event
	for i := range 200 {
		ev := ckptEvent("u1", "c"+strconv.Itoa(i), generator.ContainerStarted, 0)
		want = append(want, ev)
		ack(c, ev)
	}
	mustFlush(t, c.flush(t0))
	stop, acked := make(chan struct{}), make(chan int)
	go func() {
		// Died, over and over until the compactions are done: a new event
		// the first time, a replaced one after.
		n := 0
		for ; ; n++ {
			select {
			case <-stop:
				acked <- n
				return
			default:
			}
			c.OnAck(ckptEvent("u1", "c"+strconv.Itoa(n%200), generator.ContainerDied, time.Second))
		}
	}()
	for range 20 {
		mustFlush(t, c.compact(t0.Add(time.Second)))
	}
	close(stop)
	for i := range min(<-acked, 200) {
		want = append(want, ckptEvent("u1", "c"+strconv.Itoa(i), generator.ContainerDied, time.Second))
	}
	mustFlush(t, c.finish(t0.Add(time.Second)))
	_, got, _ := restart(t, dir)
	checkEvents(t, got, want...)
}

func TestCheckpointRemovesTheTemporaryFilesOfAnInterruptedWrite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, _, _ := restart(t, dir)
	a := ckptEvent("u1", "a", generator.ContainerStarted, 0)
	ack(c, a)
	mustFlush(t, c.flush(t0))
	c.closeJournal()
	// A stop between CreateTemp and the rename leaves this behind.
	left := filepath.Join(dir, ".checkpoint-123456")
	if err := os.WriteFile(left, []byte(`{"version":1,"node":"node-1","acked":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, got, logs := restart(t, dir)
	checkEvents(t, got, a)
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("the temporary file is still there after a restart (stat: %v)", err)
	}
	if !strings.Contains(logs, "removed a temporary checkpoint file") {
		t.Errorf("the removal was not logged:\n%s", logs)
	}
}
