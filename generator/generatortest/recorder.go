package generatortest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// Recorder is a generator.Sink that keeps every event it is sent, in order.
// It has room for everything unless SetRoom says otherwise. Safe for
// concurrent use.
type Recorder struct {
	mu      sync.Mutex
	events  []generator.Event // guarded by mu
	changed chan struct{}     // guarded by mu; closed and replaced on every Send
	room    int               // guarded by mu; events it records before it is full; <0: unbounded
}

var _ generator.Sink = (*Recorder)(nil)

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{changed: make(chan struct{}), room: -1} }

// SetRoom makes the Recorder record at most n more events; a Send beyond
// that records what fits and returns *generator.SinkFullError, as a sink
// whose outbox and spool are full does. A negative n means no bound.
func (r *Recorder) SetRoom(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.room = n
}

// Send implements generator.Sink.
func (r *Recorder) Send(_ context.Context, events []generator.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(events)
	if r.room >= 0 {
		n = min(n, r.room)
		r.room -= n
	}
	r.events = append(r.events, events[:n]...)
	close(r.changed)
	r.changed = make(chan struct{})
	if n < len(events) {
		return &generator.SinkFullError{Recorded: n}
	}
	return nil
}

// Events returns a copy of what was recorded so far.
func (r *Recorder) Events() []generator.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]generator.Event(nil), r.events...)
}

// Wait blocks until at least n events were recorded and returns them all, or
// fails the test after timeout (virtual time inside a synctest bubble).
func (r *Recorder) Wait(t testing.TB, n int, timeout time.Duration) []generator.Event {
	t.Helper()
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		evs, changed := append([]generator.Event(nil), r.events...), r.changed
		r.mu.Unlock()
		if len(evs) >= n {
			return evs
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("got %d events after %v, want %d:\n%s", len(evs), timeout, n, Summary(evs))
			return nil
		}
	}
}

// Summary renders events one per line as "Type container-id state exit", for
// failure messages and comparisons.
func Summary(evs []generator.Event) string {
	var s string
	for _, e := range evs {
		s += Line(e) + "\n"
	}
	return s
}

// Line renders one event as "Type container-id state exit source".
func Line(e generator.Event) string {
	exit := "-"
	if e.ExitCode != nil {
		exit = fmt.Sprint(*e.ExitCode)
	}
	return fmt.Sprintf("%s %s %s %s %s", e.Type, e.Container.ID, e.State, exit, e.DetectedBy)
}

// Lines renders events as Line does, with each container ID that names has
// replaced by its name there.
func Lines(evs []generator.Event, names map[string]string) []string {
	var out []string
	for _, e := range evs {
		l := Line(e)
		if n, ok := names[e.Container.ID]; ok {
			l = strings.Replace(l, e.Container.ID, n, 1)
		}
		out = append(out, l)
	}
	return out
}
