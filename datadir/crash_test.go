package datadir_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
)

// crashChildEnv names the data directory of a child process that
// TestStoreSurvivesSIGKILL runs and kills.
const crashChildEnv = "DURABLE_CRASH_CHILD_DIR"

// TestStoreSurvivesSIGKILL kills a bridge-like process while it records
// acks and spools events as fast as a busy node does, with Run writing
// them: the store it leaves opens without being set aside, and holds every
// ack and entry recorded more than the crash window (plus a margin for a
// slow fsync on a loaded machine) before the kill, in order, and nothing
// out of order.
func TestStoreSurvivesSIGKILL(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(t, dir)
		return
	}
	t.Parallel()
	const margin = 2 * time.Second
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestStoreSurvivesSIGKILL$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child prints "<n> <unix nanoseconds>" after recording n acks and
	// spooling n events.
	type progress struct {
		n  int
		at time.Time
	}
	var seen []progress
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) != 2 {
			continue // the test framework's own output
		}
		n, err1 := strconv.Atoi(f[0])
		ns, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		seen = append(seen, progress{n, time.Unix(0, ns)})
		if seen[len(seen)-1].at.Sub(seen[0].at) > margin+time.Second/2 {
			break
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = cmd.Wait() // killed: the error says so
	if len(seen) == 0 {
		t.Fatal("the child reported no progress")
	}
	durableN := 0 // recorded long enough before the kill to be on disk
	for _, p := range seen {
		if killed.Sub(p.at) > margin {
			durableN = p.n
		}
	}

	s, logs := open(t, dir, datadir.Options{SpoolMaxBytes: 1 << 30})
	defer closeStore(t, s)
	if w := logs.Records(t, "WARN"); len(w) != 0 {
		t.Fatalf("warnings opening the store a SIGKILL left: %v", w)
	}
	acked := map[string]bool{}
	for _, ev := range s.Checkpoint().Restored() {
		acked[ev.Container.ID] = true
	}
	if len(acked) < durableN {
		t.Fatalf("%d acks restored, want at least the %d recorded %v before the kill", len(acked), durableN, margin)
	}
	// One flush writes every ack recorded before it: what survives is the
	// first n.
	for i := range len(acked) {
		if !acked[crashID(i)] {
			t.Fatalf("ack %d lost while %d later ones survived", i, len(acked)-i)
		}
	}
	// Ack i came with sequence i+1: the sequence written is never past
	// the last ack written. It may lag behind it, by the acks a flush
	// killed in its last transaction wrote in its earlier ones, but not
	// behind the acks recorded long enough before the kill.
	if got := s.Checkpoint().Sequence(); got > uint64(len(acked)) || got < uint64(durableN) {
		t.Errorf("Sequence() = %d with %d acks restored, %d of them due; want between", got, len(acked), durableN)
	}
	entries := s.Spool().Take(len(acked) + 1000)
	if len(entries) < durableN {
		t.Fatalf("the spool holds %d entries, want at least the %d appended %v before the kill", len(entries), durableN, margin)
	}
	for i, e := range entries {
		if e.Event.Container.ID != crashID(i) || !e.Earlier {
			t.Fatalf("spool entry %d is %s (Earlier %v), want %s", i, e.Event.Container.ID, e.Earlier, crashID(i))
		}
	}
	t.Logf("killed after %d acks; %d survived (%d were due), and %d spool entries", seen[len(seen)-1].n, len(acked), durableN, len(entries))
}

func crashID(i int) string { return fmt.Sprintf("c%08d", i) }

// crashChild records acks and spools events until it is killed. Its
// pace, 5 of each per millisecond, is a busy node's churn many times over.
// It acks each container's ContainerStarted and spools its ContainerDied:
// a spooled event that is acked too would be dropped at Open.
func crashChild(t *testing.T, dir string) {
	s, err := datadir.Open(dir, datadir.Options{Node: "node-1", SpoolMaxBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	go s.Run(t.Context()) // until the kill
	tick := time.NewTicker(time.Millisecond)
	n := 0
	for range tick.C {
		evs := make([]generator.Event, 5)
		for i := range evs {
			s.Checkpoint().RecordAck(event("u", crashID(n+i), generator.ContainerStarted, t0), uint64(n+i+1))
			evs[i] = event("u", crashID(n+i), generator.ContainerDied, t0)
		}
		if got := s.Spool().Append(evs); got != len(evs) {
			t.Fatalf("appended %d of %d", got, len(evs))
		}
		n += len(evs)
		if n%100 == 0 {
			fmt.Printf("%d %d\n", n, time.Now().UnixNano())
		}
	}
}
