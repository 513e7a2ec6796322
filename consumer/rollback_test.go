package consumer_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// The tests in this file roll a server's store back, as a power loss does
// to what nats-server had acknowledged but not yet written to disk: the
// server is stopped cleanly, its store copied, started again and given
// more messages, stopped again and its store put back as the copy held it.

// rollbackServer is an in-process JetStream server that a test stops,
// starts again on the same port and store, and rolls back.
type rollbackServer struct {
	dir  string
	port int
	url  string
	stop func()
}

func newRollbackServer(t *testing.T) *rollbackServer {
	t.Helper()
	dir := t.TempDir()
	s, url := publishtest.StartServer(t, natsembed.Options{DataDir: dir, Port: -1})
	rs := &rollbackServer{dir: dir, port: s.Addr().(*net.TCPAddr).Port, url: url}
	rs.stop = func() { s.Shutdown(); s.WaitForShutdown() }
	return rs
}

// restart stops the server and starts it again, on its store as it is, or
// as snap holds it if snap is not empty. nc, which must have been
// connected to it, is connected again when restart returns.
func (rs *rollbackServer) restart(t *testing.T, nc *nats.Conn, snap string) {
	t.Helper()
	connected := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(connected)
	rs.stop()
	if snap != "" {
		if err := os.RemoveAll(rs.dir); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(rs.dir, os.DirFS(snap)); err != nil {
			t.Fatalf("roll the server's store back: %v", err)
		}
	}
	s, _ := publishtest.StartServer(t, natsembed.Options{DataDir: rs.dir, Port: rs.port})
	rs.stop = func() { s.Shutdown(); s.WaitForShutdown() }
	select {
	case <-connected:
	case <-time.After(waitTimeout):
		t.Fatalf("the client did not reconnect within %s", waitTimeout)
	}
}

// snapshot stops the server, copies its store and starts it again.
func (rs *rollbackServer) snapshot(t *testing.T, nc *nats.Conn) string {
	t.Helper()
	connected := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(connected)
	rs.stop()
	snap := t.TempDir()
	if err := os.CopyFS(snap, os.DirFS(rs.dir)); err != nil {
		t.Fatalf("copy the server's store: %v", err)
	}
	s, _ := publishtest.StartServer(t, natsembed.Options{DataDir: rs.dir, Port: rs.port})
	rs.stop = func() { s.Shutdown(); s.WaitForShutdown() }
	select {
	case <-connected:
	case <-time.After(waitTimeout):
		t.Fatalf("the client did not reconnect within %s", waitTimeout)
	}
	return snap
}

// rollbackStream starts a rollbackServer with the pleg-bridge stream
// (prefix "pleg") and returns it with a connection that reconnects at
// once, for ever.
func rollbackStream(t *testing.T) (*rollbackServer, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	rs := newRollbackServer(t)
	nc, js := publishtest.Connect(t, rs.url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{SubjectPrefix: "pleg"}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	return rs, nc, js
}

// rollbacksOf returns an OnRollback that sends each rollback to the
// returned channel, which holds up to 16.
func rollbacksOf() (func(consumer.Rollback), chan consumer.Rollback) {
	ch := make(chan consumer.Rollback, 16)
	return func(r consumer.Rollback) { ch <- r }, ch
}

// TestSubscribeReadsAgainWhatARolledBackStreamStoresAtSequencesItHadRead:
// Subscribe read sequences 1 to 6; the server came back with 1 to 3 only
// and then stored another node's event, a bridge's repeat of the event
// first read at 5, and two more events at 4 to 7. Subscribe delivers the
// three new events, drops the repeat and reports the rollback once; an
// ordered consumer left to itself resumes at 7 and never delivers what
// is now at 4 and 6.
func TestSubscribeReadsAgainWhatARolledBackStreamStoresAtSequencesItHadRead(t *testing.T) {
	t.Parallel()
	rs, nc, js := rollbackStream(t)
	fs := containers(9)
	before := publishAsBridge(t, js, fs[:3]...)
	repeats, repeated := repeatsOf()
	onRollback, rolledBack := rollbacksOf()
	s := subscribe(t, js, consumer.Options{DeliverAll: true, Repeats: repeats, OnRollback: onRollback})
	if diff := cmp.Diff(before, s.next(t, 3)); diff != "" {
		t.Fatalf("Subscribe delivered (-want +got):\n%s", diff)
	}

	snap := rs.snapshot(t, nc)
	lost := publishAsBridge(t, js, fs[3:6]...)
	if diff := cmp.Diff(lost, s.next(t, 3)); diff != "" {
		t.Fatalf("after a restart Subscribe delivered (-want +got):\n%s", diff)
	}
	rs.restart(t, nc, snap)

	after := publishAsBridge(t, js, fs[6])
	again := publishAsBridge(t, js, fs[4])[0]
	after = append(after, publishAsBridge(t, js, fs[7:9]...)...)
	if got := []uint64{after[0].Sequence, again.Sequence, after[1].Sequence, after[2].Sequence}; !cmp.Equal(got, []uint64{4, 5, 6, 7}) {
		t.Fatalf("the rolled-back stream stored the new events at %v, want 4 to 7", got)
	}
	if diff := cmp.Diff(after, s.next(t, 3)); diff != "" {
		t.Errorf("after the rollback Subscribe delivered (-want +got):\n%s", diff)
	}
	select {
	case r := <-rolledBack:
		if r.LastRead != 6 || r.From != 4 {
			t.Errorf("rollback reported as %+v, want LastRead 6, From 4", r)
		}
	default:
		t.Error("the rollback was not reported")
	}
	if n := len(rolledBack); n != 0 {
		t.Errorf("%d more rollbacks reported, want 1 in all", n)
	}
	checkRepeats(t, repeated, consumer.Repeat{Event: again, FirstSequence: lost[1].Sequence})
}

// startReconnectingMember runs Consume in a goroutine, with a connection of
// its own that reconnects at once, for ever, until the test ends.
func startReconnectingMember(t *testing.T, url string, opts consumer.DurableOptions, fn consumer.Handler) {
	t.Helper()
	_, js := publishtest.Connect(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- consumer.Consume(ctx, js, opts, fn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Consume = %v, want nil", err)
		}
	})
}

// TestConsumeGroupReceivesWhatARolledBackStreamStoresAtSequencesItHadCopied:
// the group's work stream copied sequences 1 to 6 of the event stream, and
// its member handled them; the event stream came back with 1 to 3 only and
// then stored another node's event, a bridge's repeat of the event at 5,
// and two more events at 4 to 7. The server's source, left to itself,
// resumes after the last sequence it copied (6) when the work stream kept
// what it had copied, and never copies what is now at 4 and 6. The member
// notices the rollback and has the source copy again from 4: it receives
// the three new events, not the repeat, and reports the rollback once.
// When the work stream was rolled back with the event stream (one store),
// the source resumes at 4 anyway, and the restart changes nothing.
func TestConsumeGroupReceivesWhatARolledBackStreamStoresAtSequencesItHadCopied(t *testing.T) {
	t.Parallel()
	for _, whole := range []bool{false, true} {
		name := "the event stream rolled back, the work stream not"
		if whole {
			name = "the whole store rolled back"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rs, nc, js := rollbackStream(t)
			fs := podEvents(1, 9)
			onRollback, rolledBack := rollbacksOf()
			opts := consumer.DurableOptions{Name: "rollback", DeliverAll: true, OnDeadLetter: ignoreDeadLetters, OnRollback: onRollback}
			calls := make(chan consumer.Event)
			before := publishAsBridge(t, js, fs[:3]...)
			startReconnectingMember(t, rs.url, opts, handled(calls, nil))
			if diff := cmp.Diff(before, receive(t, calls, 3)); diff != "" {
				t.Fatalf("handler got (-want +got):\n%s", diff)
			}
			snap := rs.snapshot(t, nc)
			lost := publishAsBridge(t, js, fs[3:6]...)
			if diff := cmp.Diff(lost, receive(t, calls, 3)); diff != "" {
				t.Fatalf("handler got (-want +got):\n%s", diff)
			}
			if !whole {
				// Put the work stream as it is now into the rolled-back
				// copy, as a server that flushed it but not the event
				// stream would have it.
				rs.stop()
				work := filepath.Join(snap, "jetstream", "$G", "streams", opts.WorkStream())
				if err := os.RemoveAll(work); err != nil {
					t.Fatal(err)
				}
				if err := os.CopyFS(work, os.DirFS(filepath.Join(rs.dir, "jetstream", "$G", "streams", opts.WorkStream()))); err != nil {
					t.Fatalf("copy the work stream's store: %v", err)
				}
			}
			rs.restart(t, nc, snap)
			// The member notices at once, as its connection comes back.
			// (Events stored before it does and copied by the source
			// that resumed after 6 would reach the handler first.)
			select {
			case r := <-rolledBack:
				if r.LastRead != 6 || r.From != 4 {
					t.Errorf("rollback reported as %+v, want LastRead 6, From 4", r)
				}
			case <-time.After(waitTimeout):
				t.Fatal("the rollback was not reported")
			}

			after := publishAsBridge(t, js, fs[6])
			publishAsBridge(t, js, fs[4])
			after = append(after, publishAsBridge(t, js, fs[7:9]...)...)
			if diff := cmp.Diff(after, receive(t, calls, 3)); diff != "" {
				t.Errorf("after the rollback the handler got (-want +got):\n%s", diff)
			}
			if n := len(rolledBack); n != 0 {
				t.Errorf("%d more rollbacks reported, want 1 in all", n)
			}
		})
	}
}
