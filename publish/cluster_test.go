package publish_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// globalAccount is the account of clients on servers without accounts.
const globalAccount = "$G"

// clusterFixture is a 3-server JetStream cluster with an R3 stream, and a
// publisher whose connection knows all three servers.
type clusterFixture struct {
	*fixture
	c     *natsembed.Cluster
	nc    *nats.Conn
	admin jetstream.JetStream
	// Roles at the start: the stream leader, the meta leader, and the
	// server the publisher is connected to.
	streamLeader, metaLeader, connected int
}

// newClusterFixture starts the cluster and the stream, and connects the
// publisher first to the server pick chooses from the roles (the client
// goes on to the others, in index order, when that one fails).
func newClusterFixture(t *testing.T, pick func(streamLeader, metaLeader int) int, tweaks ...func(*publish.Options)) *clusterFixture {
	t.Helper()
	c := publishtest.NewCluster(t, 3)
	_, admin := publishtest.Connect(t, strings.Join(c.URLs(), ","))
	cf := &clusterFixture{c: c, admin: admin}
	// A stream leader apart from the meta leader, so that the failover of
	// one is not also the other's: the stream is created again if the
	// election put both on one server (one time in three).
	for attempt := 0; ; attempt++ {
		if _, err := publish.EnsureStream(t.Context(), admin, publish.StreamOptions{SubjectPrefix: "pleg", Replicas: 3}); err != nil {
			t.Fatalf("EnsureStream: %v", err)
		}
		cf.streamLeader, cf.metaLeader = c.StreamLeader(globalAccount, "PLEG"), c.MetaLeader()
		if cf.streamLeader >= 0 && cf.streamLeader != cf.metaLeader || attempt == 5 {
			break
		}
		if err := admin.DeleteStream(t.Context(), "PLEG"); err != nil {
			t.Fatal(err)
		}
	}
	first := pick(cf.streamLeader, cf.metaLeader)
	urls := c.URLs()
	ordered := append([]string{urls[first]}, append(urls[:first:first], urls[first+1:]...)...)
	cf.nc, _ = publishtest.Connect(t, strings.Join(ordered, ","),
		nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		// A server going down is the test; what nats.go would print to
		// stderr about it is not news.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	js, err := jetstream.New(cf.nc)
	if err != nil {
		t.Fatal(err)
	}
	cf.connected = serverIndex(t, c, cf.nc.ConnectedUrl())
	opts := publish.Options{
		// Short, so that what was in flight to a server that died is
		// retried soon; the default (5 s) only lengthens the stall.
		AckTimeout:      time.Second,
		RetryBackoffMin: 20 * time.Millisecond,
		RetryBackoffMax: 200 * time.Millisecond,
	}
	for _, tweak := range tweaks {
		tweak(&opts)
	}
	cf.fixture = newFixtureOn(t, js, opts)
	t.Logf("stream leader %d, meta leader %d, publisher connected to %d", cf.streamLeader, cf.metaLeader, cf.connected)
	return cf
}

func serverIndex(t *testing.T, c *natsembed.Cluster, url string) int {
	t.Helper()
	for i := range 3 {
		if c.Server(i).ClientURL() == url {
			return i
		}
	}
	t.Fatalf("no server at %s", url)
	return -1
}

// churn sends events of many pods, a few every millisecond or two, from one
// goroutine as the generator does, until stop; stop returns what it sent.
type churner struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	sent   []generator.Event // guarded by mu
	err    error             // guarded by mu
}

func startChurn(t *testing.T, pub *publish.Publisher) *churner {
	t.Helper()
	const pods, perTick = 60, 3
	ctx, cancel := context.WithCancel(t.Context())
	ch := &churner{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ch.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for n := 0; ; {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var batch []generator.Event
			for range perTick {
				batch = append(batch, testEvent(fmt.Sprintf("pod-%02d", n%pods), n))
				n++
			}
			err := pub.Send(ctx, batch)
			ch.mu.Lock()
			if err == nil {
				ch.sent = append(ch.sent, batch...)
			} else {
				ch.err = err
			}
			ch.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(ch.stop)
	return ch
}

func (ch *churner) stop() {
	ch.cancel()
	<-ch.done
}

func (ch *churner) result(t *testing.T) []generator.Event {
	t.Helper()
	ch.stop()
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.err != nil {
		t.Fatalf("Send during churn: %v", ch.err)
	}
	return ch.sent
}

// ackWatch collects acks and the longest gap between two of them, by the
// time OnAck reported them (not when the test reads them: it may be busy
// stopping a server).
type ackWatch struct {
	f      *fixture
	n      int
	last   time.Time
	maxGap time.Duration
}

// wait returns once n more acks arrived.
func (w *ackWatch) wait(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for target := w.n + n; w.n < target; {
		select {
		case a := <-w.f.acks:
			if !w.last.IsZero() {
				w.maxGap = max(w.maxGap, a.at.Sub(w.last))
			}
			w.last = a.at
			w.n++
		case <-deadline:
			t.Fatalf("%d acks within %s, want %d", w.n, waitTimeout, target)
		}
	}
}

// failover runs churn through fault and recovery: some acks before the
// fault, some after it (publication recovered without a restart), then
// recover (a server back), some more, and the rest. It checks that the
// stream holds every event exactly once in per-pod order, and reports the
// figures.
func (cf *clusterFixture) failover(t *testing.T, fault, recover func()) {
	t.Helper()
	cf.run(t)
	ch := startChurn(t, cf.pub)
	w := &ackWatch{f: cf.fixture}
	w.wait(t, 300)
	w.maxGap = 0
	faultAt := time.Now()
	fault()
	w.wait(t, 300)
	recoveredIn := w.last.Sub(faultAt)
	stallGap := w.maxGap
	recover()
	w.wait(t, 300)
	sent := ch.result(t)
	w.wait(t, len(sent)-w.n)

	got := tally(t, cf.admin, sent)
	t.Logf("figures: sent %d, stored %d, missing %d, duplicated %d, out of order %d; longest ack gap across the fault %s, 300 acks within %s of the fault's start",
		len(sent), got.stored, got.missing, got.duplicated, got.outOfOrder, stallGap.Round(time.Millisecond), recoveredIn.Round(time.Millisecond))
	if got.stored != len(sent) || got.missing != 0 || got.duplicated != 0 || got.outOfOrder != 0 {
		t.Errorf("stream: %+v for %d events sent, want each stored once, in per-pod order", got, len(sent))
	}
	if got := metricstest.Value(t, cf.reg, "pleg_bridge_events_dropped_total", nil); got != 0 {
		t.Errorf("pleg_bridge_events_dropped_total = %v, want 0", got)
	}
}

type streamTally struct{ stored, missing, duplicated, outOfOrder int }

// readIDs reads the whole stream PLEG with an ordered consumer and returns
// the Nats-Msg-Id of each message, in stream order.
func readIDs(ctx context.Context, js jetstream.JetStream, deadline time.Time) ([]string, error) {
	s, err := js.Stream(ctx, "PLEG")
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	cons, err := js.OrderedConsumer(ctx, "PLEG", jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	var ids []string
	for uint64(len(ids)) < info.State.Msgs && time.Now().Before(deadline) {
		batch, err := cons.Fetch(int(info.State.Msgs)-len(ids), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, err
		}
		for m := range batch.Messages() {
			ids = append(ids, m.Headers().Get(jetstream.MsgIDHeader))
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, err
		}
	}
	if uint64(len(ids)) != info.State.Msgs {
		return nil, fmt.Errorf("read %d of the stream's %d messages", len(ids), info.State.Msgs)
	}
	return ids, nil
}

// tally reads the whole stream and counts, by Nats-Msg-Id, the events of
// sent stored, missing and stored more than once, and the pods whose
// events are not in Send order.
func tally(t *testing.T, js jetstream.JetStream, sent []generator.Event) streamTally {
	t.Helper()
	// Right after a server's restart, the client may be connected to it
	// before its JetStream answers: "no responders" then means "not yet",
	// and the reading starts over.
	deadline := time.Now().Add(waitTimeout)
	var ids []string
	waittest.Until(t, waitTimeout, "the stream to be read back", func() (bool, error) {
		var err error
		ids, err = readIDs(t.Context(), js, deadline)
		if err != nil && !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("read the stream back: %v", err)
		}
		return err == nil, err
	})

	byID := map[string]generator.Event{}
	wantOrder := map[string][]string{}
	for _, ev := range sent {
		id := publish.EventID(ev.Container.ID, ev.Type)
		byID[id] = ev
		wantOrder[ev.Pod.UID] = append(wantOrder[ev.Pod.UID], id)
	}
	var r streamTally
	seen := map[string]int{}
	gotOrder := map[string][]string{}
	for _, id := range ids {
		seen[id]++
		if seen[id] > 1 {
			r.duplicated++
			continue
		}
		ev, ok := byID[id]
		if !ok {
			t.Errorf("stream holds a message with unknown id %q", id)
			continue
		}
		r.stored++
		gotOrder[ev.Pod.UID] = append(gotOrder[ev.Pod.UID], id)
	}
	r.missing = len(sent) - r.stored
	for pod, want := range wantOrder {
		got := gotOrder[pod]
		// Missing events are counted apart; the order is that of what
		// is there.
		var present []string
		for _, id := range want {
			if seen[id] > 0 {
				present = append(present, id)
			}
		}
		if strings.Join(got, " ") != strings.Join(present, " ") {
			r.outOfOrder++
		}
	}
	return r
}

func TestPublisherSurvivesTheLossOfTheStreamLeader(t *testing.T) {
	t.Parallel()
	// Connected to a follower, so that only the stream fails over.
	cf := newClusterFixture(t, func(streamLeader, _ int) int { return (streamLeader + 1) % 3 })
	leader := cf.streamLeader
	cf.failover(t,
		func() { cf.c.Stop(leader) },
		func() {
			if err := cf.c.Restart(leader); err != nil {
				t.Fatal(err)
			}
		})
	// Publishes may just be acked late by the new leader, within a
	// second and without a failure: then no stall is logged.
	cf.checkStallLogs(t, false)
	if now := cf.c.StreamLeader(globalAccount, "PLEG"); now == leader {
		t.Errorf("stream leader is server %d again, the one that was stopped", now)
	}
}

// TestAMessageLostWithItsLeaderIsRetriedBeforeItsAckTimeout loses the
// stream leader with an ack timeout of a minute: what was in flight to it
// is never answered, while what is sent after the election is acked. The
// unanswered messages are retried once later ones are acked, not a minute
// later: every event is stored well within the test's wait, each once.
func TestAMessageLostWithItsLeaderIsRetriedBeforeItsAckTimeout(t *testing.T) {
	t.Parallel()
	cf := newClusterFixture(t, func(streamLeader, _ int) int { return (streamLeader + 1) % 3 },
		func(o *publish.Options) { o.AckTimeout = time.Minute })
	leader := cf.streamLeader
	cf.failover(t,
		func() { cf.c.Stop(leader) },
		func() {
			if err := cf.c.Restart(leader); err != nil {
				t.Fatal(err)
			}
		})
}

func TestPublisherSurvivesTheLossOfItsServer(t *testing.T) {
	t.Parallel()
	// Connected to a server that leads neither the stream nor the meta
	// group, so that only the connection fails over.
	cf := newClusterFixture(t, func(streamLeader, metaLeader int) int {
		for i := range 3 {
			if i != streamLeader && i != metaLeader {
				return i
			}
		}
		return (streamLeader + 1) % 3
	})
	server := cf.connected
	cf.failover(t,
		func() { cf.c.Stop(server) },
		func() {
			if err := cf.c.Restart(server); err != nil {
				t.Fatal(err)
			}
		})
	if now := serverIndex(t, cf.c, cf.nc.ConnectedUrl()); now == server {
		t.Errorf("publisher connected to server %d, the one that was stopped", now)
	}
	// What was in flight fails with the connection: a stall, always.
	cf.checkStallLogs(t, true)
}

func TestPublisherSurvivesAChangeOfMetaLeader(t *testing.T) {
	t.Parallel()
	// Connected to the stream leader, which is not the meta leader: only
	// the meta group fails over.
	cf := newClusterFixture(t, func(streamLeader, _ int) int { return streamLeader })
	leader := cf.metaLeader
	if leader == cf.streamLeader || leader == cf.connected {
		t.Logf("the meta leader also has another role: this failover is not the meta group's alone")
	}
	cf.failover(t,
		func() { cf.c.Stop(leader) },
		func() {
			// Publishing does not wait for the meta group: the stream's
			// acks can resume before the others have elected a new leader.
			now, err := cf.c.WaitMetaLeader()
			if err != nil {
				t.Fatal(err)
			}
			if now == leader {
				t.Errorf("meta leader is %d with server %d stopped, want another", now, leader)
			}
			if err := cf.c.Restart(leader); err != nil {
				t.Fatal(err)
			}
		})
	cf.checkStallLogs(t, false)
}

// checkStallLogs checks the publisher's account of the failover, once
// every event is acked: each stall logged at Warn is followed by an Info
// that publishing resumed, and (if want) there was one.
func (cf *clusterFixture) checkStallLogs(t *testing.T, want bool) {
	t.Helper()
	stalls, open := 0, false
	for {
		var r slog.Record
		select {
		case r = <-cf.logs:
		default:
			if open {
				t.Error("a stall logged without the Info that publishing resumed")
			}
			if want && stalls == 0 {
				t.Error("no stall logged")
			}
			return
		}
		switch {
		case strings.HasPrefix(r.Message, "publishing stalled"):
			if r.Level != slog.LevelWarn {
				t.Errorf("stall logged at %v, want WARN", r.Level)
			}
			stalls++
			open = true
		case strings.HasPrefix(r.Message, "publishing resumed"):
			if r.Level != slog.LevelInfo || !open {
				t.Errorf("%s at %v after %d stalls, want INFO after a stall", r.Message, r.Level, stalls)
			}
			open = false
			t.Logf("logged: %s %s", r.Message, attrsOf(r))
		}
	}
}

func attrsOf(r slog.Record) string {
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, "%s=%v ", a.Key, a.Value)
		return true
	})
	return b.String()
}
