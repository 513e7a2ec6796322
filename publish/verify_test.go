package publish_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// replyGate is a TCP proxy between a NATS client and a server that can
// swallow what the server sends on the connections open at a moment: the
// client's publishes still reach the server and are stored, their acks
// never come back. A connection made after that passes both ways.
type replyGate struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns []*gatedConn // guarded by mu
	wg    sync.WaitGroup
}

type gatedConn struct {
	client, server net.Conn
	swallow        atomic.Bool
}

func newReplyGate(t *testing.T, target string) *replyGate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &replyGate{ln: ln, target: target}
	g.wg.Go(g.accept)
	t.Cleanup(func() {
		ln.Close()
		g.mu.Lock()
		for _, c := range g.conns {
			c.client.Close()
			c.server.Close()
		}
		g.mu.Unlock()
		g.wg.Wait()
	})
	return g
}

func (g *replyGate) url() string { return "nats://" + g.ln.Addr().String() }

func (g *replyGate) accept() {
	for {
		client, err := g.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", g.target)
		if err != nil {
			// The server is down: the client sees a failed connect and
			// tries again.
			client.Close()
			continue
		}
		c := &gatedConn{client: client, server: server}
		g.mu.Lock()
		g.conns = append(g.conns, c)
		g.mu.Unlock()
		g.wg.Go(func() {
			io.Copy(server, client)
			server.Close()
		})
		g.wg.Go(func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 && !c.swallow.Load() {
					if _, werr := client.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			client.Close()
		})
	}
}

// swallowReplies makes the open connections drop everything the server
// sends from now on.
func (g *replyGate) swallowReplies() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		c.swallow.Store(true)
	}
}

// TestARetryAfterTheDuplicateWindowDoesNotStoreAStoredEventTwice loses the
// ack of a stored event, keeps NATS down longer than the stream's
// duplicate window, and brings it back: the retry finds the event in the
// stream and does not publish it again.
func TestARetryAfterTheDuplicateWindowDoesNotStoreAStoredEventTwice(t *testing.T) {
	t.Parallel()
	const window = 2 * time.Second
	// The outage, the scenario itself: longer than the window, so that
	// JetStream has forgotten the event's id when the retry comes.
	const outage = 3 * time.Second

	rs, stop := newRestartableServer(t)
	_, direct := publishtest.Connect(t, rs.url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if _, err := publish.EnsureStream(t.Context(), direct, publish.StreamOptions{SubjectPrefix: "pleg", DuplicateWindow: window}); err != nil {
		t.Fatal(err)
	}
	gate := newReplyGate(t, rs.url[len("nats://"):])
	_, js := publishtest.Connect(t, gate.url(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	f := newFixtureOn(t, js, publish.Options{
		Stream:          "PLEG", // the other test finds it by subject
		DuplicateWindow: window,
		AckTimeout:      time.Second,
		RetryBackoffMin: 50 * time.Millisecond,
		RetryBackoffMax: 200 * time.Millisecond,
	})
	f.run(t)

	// The publish reaches the server and is stored; its ack is lost.
	gate.swallowReplies()
	ev := testEvent("pod-a", 0)
	f.send(t, ev)
	watch := watchStream(t, direct)
	if got := watch.next(t); got != publish.EventID(ev.Container.ID, ev.Type) {
		t.Fatalf("stream stored %q, want the event", got)
	}
	// The server goes down right after it stored: the publisher never
	// learns the outcome.
	stop()
	f.waitLog(t, "publishing stalled")
	<-time.After(outage)
	rs.start(t)

	if got := f.waitAcks(t, 1); got[0].Container.ID != ev.Container.ID {
		t.Fatalf("acked %s, want %s", got[0].Container.ID, ev.Container.ID)
	}
	// One more event, to know that everything before it has landed.
	next := testEvent("pod-a", 1)
	f.send(t, next)
	f.waitAcks(t, 1)
	checkPerPodOrder(t, fetchAll(t, direct, 2), []generator.Event{ev, next})
	if got := metricstest.Value(t, f.reg, "pleg_bridge_publish_checks_total", map[string]string{"result": "stored"}); got != 1 {
		t.Errorf("pleg_bridge_publish_checks_total{result=\"stored\"} = %v, want 1", got)
	}
}

// TestASpoolEntryOfAnEarlierRunThatLandedIsNotPublishedAgain: the earlier
// run published the entry and crashed before it learned of the ack.
func TestASpoolEntryOfAnEarlierRunThatLandedIsNotPublishedAgain(t *testing.T) {
	t.Parallel()
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)
	ensureStream(t, js)
	enc := newEncoder(t, publish.EncoderOptions{})
	landed, notLanded := testEvent("pod-a", 0), testEvent("pod-a", 1)

	dir := t.TempDir()
	st, closeStore := openStore(t, dir, 1<<20)
	if n := st.Spool().Append([]generator.Event{landed, notLanded}); n != 2 {
		t.Fatalf("Append stored %d events, want 2", n)
	}
	msg, err := enc.Encode(landed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	closeStore()

	st, _ = openStore(t, dir, 1<<20)
	f := newFixtureOn(t, js, publish.Options{Encoder: enc, Spool: st.Spool()})
	f.run(t)
	later := testEvent("pod-a", 2)
	f.send(t, later)

	f.waitAcks(t, 3)
	checkPerPodOrder(t, fetchAll(t, js, 3), []generator.Event{landed, notLanded, later})
	for result, want := range map[string]float64{"stored": 1, "missing": 1} {
		if got := metricstest.Value(t, f.reg, "pleg_bridge_publish_checks_total", map[string]string{"result": result}); got != want {
			t.Errorf("pleg_bridge_publish_checks_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	// The landed entry was not published again: 2 publishes, no duplicate.
	if got := metricstest.Value(t, f.reg, "pleg_bridge_publish_total", map[string]string{"result": "acked"}); got != 2 {
		t.Errorf("pleg_bridge_publish_total{result=\"acked\"} = %v, want 2", got)
	}
	if got := metricstest.Value(t, f.reg, "pleg_bridge_publish_total", map[string]string{"result": "duplicate"}); got != 0 {
		t.Errorf("pleg_bridge_publish_total{result=\"duplicate\"} = %v, want 0", got)
	}
	if got := st.Spool().Len(); got != 0 {
		t.Errorf("spool holds %d entries after delivery, want 0", got)
	}
}

// streamWatch reads the stream's messages as they are stored.
type streamWatch struct{ cons jetstream.Consumer }

func watchStream(t *testing.T, js jetstream.JetStream) *streamWatch {
	t.Helper()
	cons, err := js.OrderedConsumer(t.Context(), "PLEG", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &streamWatch{cons: cons}
}

// next returns the Nats-Msg-Id of the next message stored.
func (w *streamWatch) next(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	m, err := w.cons.Next(jetstream.FetchContext(ctx))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("no message stored within %s", waitTimeout)
		}
		t.Fatal(err)
	}
	return m.Headers().Get(jetstream.MsgIDHeader)
}
