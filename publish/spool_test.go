package publish_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// openStore opens the durable store in dir with a spool of maxBytes, and
// runs it. close stops Run and closes the store, as a bridge does at
// shutdown; t.Cleanup calls it too.
func openStore(t *testing.T, dir string, maxBytes int64) (_ *datadir.Store, close func()) {
	t.Helper()
	st, err := datadir.Open(dir, datadir.Options{Node: "node-1", SpoolMaxBytes: maxBytes})
	if err != nil {
		t.Fatalf("open durable store: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- st.Run(ctx) }()
	var once sync.Once
	close = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("store Run: %v", err)
			}
			if err := st.Close(); err != nil {
				t.Errorf("close store: %v", err)
			}
		})
	}
	t.Cleanup(close)
	return st, close
}

// newSpool returns the spool of a fresh store of maxBytes in t.TempDir().
func newSpool(t *testing.T, maxBytes int64) *datadir.Spool {
	t.Helper()
	st, _ := openStore(t, t.TempDir(), maxBytes)
	return st.Spool()
}

// restartableServer is an in-process server that a test stops and starts
// again on the same port and store.
type restartableServer struct {
	dir  string
	port int
	url  string
}

func newRestartableServer(t *testing.T) (*restartableServer, func()) {
	t.Helper()
	dir := t.TempDir()
	s, url := publishtest.StartServer(t, natsembed.Options{DataDir: dir, Port: -1})
	rs := &restartableServer{dir: dir, port: s.Addr().(*net.TCPAddr).Port, url: url}
	return rs, func() {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// start starts the server again and returns the function that stops it.
func (rs *restartableServer) start(t *testing.T) (stop func()) {
	t.Helper()
	s, _ := publishtest.StartServer(t, natsembed.Options{DataDir: rs.dir, Port: rs.port})
	return func() {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// churn returns perPod events of each of pods pods, interleaved as the
// relists of a busy node make them; first numbers the events, so that
// later batches have ids of their own.
func churn(pods, perPod, first int) []generator.Event {
	var evs []generator.Event
	for i := range perPod {
		for p := range pods {
			evs = append(evs, testEvent(fmt.Sprintf("pod-%03d", p), first+i))
		}
	}
	return evs
}

// sendWithin sends events in chunks of 10, as a generator's relists do, and
// fails the test unless every Send returns nil and all of them return within
// a second: Send must never wait for NATS.
func sendWithin(t *testing.T, pub *publish.Publisher, events []generator.Event) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < len(events); i += 10 {
			if err := pub.Send(context.Background(), events[i:min(i+10, len(events))]); err != nil {
				errc <- fmt.Errorf("Send of events %d..: %w", i, err)
				return
			}
		}
		errc <- nil
	}()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Second):
		t.Fatalf("Send of %d events blocked for a second", len(events))
	}
}

func TestPublisherSpoolsWhileNATSIsDownAndDeliversEverythingInOrder(t *testing.T) {
	t.Parallel()
	rs, stop := newRestartableServer(t)
	_, js := publishtest.Connect(t, rs.url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	ensureStream(t, js)
	spool := newSpool(t, 16<<20)
	f := newFixtureOn(t, js, publish.Options{
		OutboxSize:      8,
		MaxInFlight:     4,
		Spool:           spool,
		AckTimeout:      200 * time.Millisecond,
		RetryBackoffMin: 10 * time.Millisecond,
		RetryBackoffMax: 100 * time.Millisecond,
	})
	f.run(t)

	stop()
	sent := churn(100, 5, 0)
	sendWithin(t, f.pub, sent)
	if r := f.waitLog(t, "outbox full: spooling events to disk"); r.Level != slog.LevelWarn {
		t.Errorf("spilling logged at %v, want WARN", r.Level)
	}
	// 8 in memory, the rest on disk.
	if got := metricstest.Value(t, f.reg, "pleg_bridge_events_spooled_total", nil); got != float64(len(sent)-8) {
		t.Errorf("pleg_bridge_events_spooled_total = %v, want %d", got, len(sent)-8)
	}
	if got := f.pub.Pending(); got != len(sent) {
		t.Errorf("Pending() = %d, want %d", got, len(sent))
	}
	checkProgress(t, f.pub, len(sent), 0)

	rs.start(t)
	f.waitAcks(t, len(sent))
	checkPerPodOrder(t, fetchAll(t, f.js, len(sent)), sent)
	checkProgress(t, f.pub, len(sent), len(sent)) // in memory and spooled alike
	if r := f.waitLog(t, "spool empty"); r.Level != slog.LevelInfo {
		t.Errorf("spool emptied logged at %v, want INFO", r.Level)
	}
	for _, name := range []string{"pleg_bridge_spool_events", "pleg_bridge_spool_bytes", "pleg_bridge_events_dropped_total", "pleg_bridge_events_refused_total"} {
		if got := metricstest.Value(t, f.reg, name, nil); got != 0 {
			t.Errorf("%s = %v after delivery, want 0", name, got)
		}
	}

	// Memory is used again once the spool is empty.
	after := churn(3, 1, 100)
	f.send(t, after...)
	f.waitAcks(t, len(after))
	if got := metricstest.Value(t, f.reg, "pleg_bridge_events_spooled_total", nil); got != float64(len(sent)-8) {
		t.Errorf("pleg_bridge_events_spooled_total = %v after the spool emptied, want it unchanged at %d", got, len(sent)-8)
	}
}

// twoPublishersOverAnOutage returns a stopped server with the stream (rs
// starts it again), a connection that waits for it, the data directory
// two publishers share, one after the other, and their options: an outbox
// of 8 and short timeouts.
func twoPublishersOverAnOutage(t *testing.T) (*restartableServer, jetstream.JetStream, string, publish.Options) {
	t.Helper()
	rs, stop := newRestartableServer(t)
	_, js := publishtest.Connect(t, rs.url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	ensureStream(t, js)
	stop()
	return rs, js, t.TempDir(), publish.Options{
		OutboxSize:      8,
		MaxInFlight:     4,
		AckTimeout:      200 * time.Millisecond,
		RetryBackoffMin: 10 * time.Millisecond,
		RetryBackoffMax: 100 * time.Millisecond,
		DrainTimeout:    100 * time.Millisecond,
	}
}

// TestPublisherDeliversWhatAnEarlierPublisherLeftBeforeNewerEvents runs a
// publisher through an outage that outlasts it, then a second one over the
// same data directory. Without write-through, the 8 events the first held
// in memory are given up at its drain deadline and only what it spooled is
// delivered by the second; with write-through, those 8 were written to the
// spool as well and are delivered too. Either way the second delivers the
// earlier run's entries first, each checked against the stream (the first
// may have published it before it stopped), then its own, in per-pod order.
func TestPublisherDeliversWhatAnEarlierPublisherLeftBeforeNewerEvents(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		writeThrough bool
		givenUp      int // of the first publisher's events: those in memory only
	}{
		{"memory only", false, 8},
		{"write-through", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rs, js, dir, opts := twoPublishersOverAnOutage(t)
			opts.WriteThrough = tc.writeThrough

			// The first bridge: NATS is down all its life.
			st, closeStore := openStore(t, dir, 16<<20)
			opts.Spool = st.Spool()
			first := newFixtureOn(t, js, opts)
			stopFirst := first.run(t)
			before := churn(40, 5, 0)
			sendWithin(t, first.pub, before)
			stopFirst()
			if got := metricstest.Value(t, first.reg, "pleg_bridge_events_dropped_total", nil); got != float64(tc.givenUp) {
				t.Errorf("first publisher dropped %v events, want %d", got, tc.givenUp)
			}
			// What it gave up is settled; what it left in the spool is not.
			checkProgress(t, first.pub, len(before), tc.givenUp)
			closeStore()

			// The second bridge, over the same data directory.
			kept := before[tc.givenUp:]
			st, _ = openStore(t, dir, 16<<20)
			opts.Spool = st.Spool()
			if got := opts.Spool.Len(); got != len(kept) {
				t.Fatalf("reopened spool holds %d entries, want %d", got, len(kept))
			}
			second := newFixtureOn(t, js, opts)
			second.run(t)
			after := churn(40, 2, 100)
			sendWithin(t, second.pub, after)
			rs.start(t)

			want := append(kept, after...)
			second.waitAcks(t, len(want))
			checkPerPodOrder(t, fetchAll(t, js, len(want)), want)
			// The earlier run's entries are not the second's to count.
			checkProgress(t, second.pub, len(after), len(after))
			if got := metricstest.Value(t, second.reg, "pleg_bridge_publish_checks_total", map[string]string{"result": "missing"}); got != float64(len(kept)) {
				t.Errorf("pleg_bridge_publish_checks_total{result=\"missing\"} = %v, want %d", got, len(kept))
			}
			second.waitLog(t, "spool empty: every spooled event is delivered")
			if n := opts.Spool.Len(); n != 0 {
				t.Errorf("spool holds %d entries after every event was delivered, want 0", n)
			}
		})
	}
}

func TestSendRefusesWhatFitsNeitherTheOutboxNorTheSpool(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{Options: publish.Options{OutboxSize: 2, Spool: newSpool(t, 4096)}})
	sent := churn(5, 20, 0)

	// Nothing delivers yet (no Run): 2 events fit in memory, the spool
	// takes what fits in 4 KiB, and Send says where it stopped.
	err := f.pub.Send(t.Context(), sent)
	var full *generator.SinkFullError
	if !errors.As(err, &full) {
		t.Fatalf("Send of %d events: error = %v, want a SinkFullError", len(sent), err)
	}
	spooled := int(metricstest.Value(t, f.reg, "pleg_bridge_events_spooled_total", nil))
	if spooled == 0 || full.Recorded != 2+spooled || full.Recorded >= len(sent) {
		t.Fatalf("Recorded = %d with %d spooled, want 2 in memory plus the spooled, fewer than %d", full.Recorded, spooled, len(sent))
	}
	if got := metricstest.Value(t, f.reg, "pleg_bridge_events_refused_total", nil); got != float64(len(sent)-full.Recorded) {
		t.Errorf("pleg_bridge_events_refused_total = %v, want %d", got, len(sent)-full.Recorded)
	}
	if r := f.waitLog(t, "outbox and spool full"); r.Level != slog.LevelWarn {
		t.Errorf("refusal logged at %v, want WARN", r.Level)
	}
	if got := f.pub.Pending(); got != full.Recorded {
		t.Errorf("Pending() = %d, want %d", got, full.Recorded)
	}

	// The caller keeps the rest and sends it again, in pieces, as room
	// appears: everything arrives once, in order.
	f.run(t)
	rest := sent[full.Recorded:]
	acked := f.waitAcks(t, full.Recorded)
	for len(rest) > 0 {
		err := f.pub.Send(t.Context(), rest)
		if err == nil {
			break
		}
		if !errors.As(err, &full) {
			t.Fatalf("Send: %v", err)
		}
		rest = rest[full.Recorded:]
		acked = append(acked, f.waitAcks(t, 1)...)
	}
	f.waitAcks(t, len(sent)-len(acked))
	checkPerPodOrder(t, fetchAll(t, f.js, len(sent)), sent)
}

func TestMetricsExportTheOutboxAndSpoolBoundsBesideTheirFill(t *testing.T) {
	t.Parallel()
	// An alert on "80% full" divides the fill by these; without a spool
	// its bound is 0, which an alert must treat as "no spool".
	for _, c := range []struct {
		name     string
		spool    *datadir.Spool
		spoolCap string
	}{
		{"with a spool, both bounds are the configured ones", newSpool(t, 4096), "4096"},
		{"without a spool, the spool's bound is 0", nil, "0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{Options: publish.Options{OutboxSize: 32, Spool: c.spool}})
			want := `
# HELP pleg_bridge_outbox_capacity_events The memory outbox's bound (PLEG_OUTBOX_SIZE): beyond it events go to the disk spool, or are refused.
# TYPE pleg_bridge_outbox_capacity_events gauge
pleg_bridge_outbox_capacity_events 32
# HELP pleg_bridge_spool_capacity_bytes The disk spool's bound on pleg_bridge_spool_bytes (PLEG_SPOOL_MAX_BYTES); 0 without a spool.
# TYPE pleg_bridge_spool_capacity_bytes gauge
pleg_bridge_spool_capacity_bytes ` + c.spoolCap + "\n"
			if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want),
				"pleg_bridge_outbox_capacity_events", "pleg_bridge_spool_capacity_bytes"); err != nil {
				t.Error(err)
			}
		})
	}
}

// checkProgress checks what pub.Progress reports.
func checkProgress(t *testing.T, pub *publish.Publisher, recorded, settled int) {
	t.Helper()
	if r, s := pub.Progress(); r != uint64(recorded) || s != uint64(settled) {
		t.Errorf("Progress() = %d recorded, %d settled, want %d, %d", r, s, recorded, settled)
	}
}
