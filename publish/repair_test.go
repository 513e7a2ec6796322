package publish_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/pleg-bridge/pleg-bridge/datadir"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/metricstest"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// openRetaining opens and runs a durable store in a new directory that
// keeps the acked events for five minutes (datadir.Retained).
func openRetaining(t *testing.T) *datadir.Retained {
	t.Helper()
	st, err := datadir.Open(t.TempDir(), datadir.Options{Node: "node-1", RetainWindow: 5 * time.Minute, RetainMaxBytes: 16 << 20})
	if err != nil {
		t.Fatalf("open durable store: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = st.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = st.Close()
	})
	return st.Retained()
}

// snapshot copies the server's store as it is on disk, to roll it back to
// later: the server is stopped, so the copy is what a machine that lost
// power would find.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	snap := t.TempDir()
	if err := os.CopyFS(snap, os.DirFS(dir)); err != nil {
		t.Fatalf("copy the server's store: %v", err)
	}
	return snap
}

// rollBack puts the server's store back as snap held it.
func rollBack(t *testing.T, dir, snap string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(dir, os.DirFS(snap)); err != nil {
		t.Fatalf("roll the server's store back: %v", err)
	}
}

// TestTheRepairPublishesAgainWhatTheServerLostAfterAckingIt acks events,
// then rolls the server's store back to before some of them, as a power
// loss does to what nats-server had not flushed. With the repair, the
// stream ends holding every event once, in per-pod order (those lost
// before the events sent after the loss), and the loss is logged and
// counted; without it, the lost events are gone for good.
func TestTheRepairPublishesAgainWhatTheServerLostAfterAckingIt(t *testing.T) {
	t.Parallel()
	for _, repair := range []bool{true, false} {
		name := "with the repair"
		if !repair {
			name = "without the repair"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rs, stop := newRestartableServer(t)
			_, js := publishtest.Connect(t, rs.url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
			ensureStream(t, js)
			opts := publish.Options{
				Stream:          "PLEG",
				MaxInFlight:     8,
				Repair:          publish.Repair{QuickHold: waitTimeout},
				AckTimeout:      500 * time.Millisecond,
				RetryBackoffMin: 10 * time.Millisecond,
				RetryBackoffMax: 100 * time.Millisecond,
			}
			if repair {
				opts.Repair.Retained = openRetaining(t)
			}
			f := newFixtureOn(t, js, opts)
			f.run(t)

			before := churn(20, 2, 0)
			f.send(t, before...)
			f.waitAcks(t, len(before))
			stop()
			snap := snapshot(t, rs.dir)
			stop = rs.start(t)

			// Acked, and then lost with the power.
			lost := churn(20, 2, 100)
			f.send(t, lost...)
			f.waitAcks(t, len(lost))
			stop()
			rollBack(t, rs.dir, snap)
			rs.start(t)

			after := churn(20, 1, 200)
			if repair {
				// The events after the loss are sent once the check after
				// the reconnect put the lost ones back: a publish racing
				// the reconnect itself can reach the server before the
				// check (the closing note of the repair says so).
				if r := f.waitLog(t, "the NATS servers lost events they had acknowledged"); r.Level != slog.LevelWarn {
					t.Errorf("the loss logged at %v, want WARN", r.Level)
				}
			}
			f.send(t, after...)
			if !repair {
				f.waitAcks(t, len(after))
				fetchAll(t, js, len(before)+len(after)) // the lost events are not there
				return
			}
			f.waitAcks(t, len(lost)+len(after))
			want := append(append(append([]generator.Event{}, before...), lost...), after...)
			checkPerPodOrder(t, fetchAll(t, js, len(want)), want)
			if got := metricstest.Value(t, f.reg, "pleg_bridge_events_republished_total", map[string]string{"reason": "lost_by_server"}); got != float64(len(lost)) {
				t.Errorf("pleg_bridge_events_republished_total = %v, want %d", got, len(lost))
			}
		})
	}
}

// TestTheRepairNeverStoresAnEventTwice restarts the server, without
// losing anything, after the stream's duplicate window has passed: the
// check after the reconnect reads that the stream holds every acked event
// and publishes none again. A repair that republished what it kept,
// trusting the duplicate window, would store each twice here.
func TestTheRepairNeverStoresAnEventTwice(t *testing.T) {
	t.Parallel()
	rs, stop := newRestartableServer(t)
	_, js := publishtest.Connect(t, rs.url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if _, err := publish.EnsureStream(context.Background(), js, publish.StreamOptions{
		SubjectPrefix: "pleg", DuplicateWindow: 100 * time.Millisecond,
	}); err != nil {
		t.Fatal(err)
	}
	f := newFixtureOn(t, js, publish.Options{
		Stream: "PLEG", Repair: publish.Repair{Retained: openRetaining(t)}, DuplicateWindow: 100 * time.Millisecond,
		AckTimeout: 500 * time.Millisecond, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
	})
	f.run(t)
	sent := churn(10, 3, 0)
	f.send(t, sent...)
	f.waitAcks(t, len(sent))
	publishtest.WaitOutDuplicateWindow(t, js, "PLEG")

	stop()
	rs.start(t)
	after := churn(10, 1, 100)
	f.send(t, after...) // published once the check is done
	f.waitAcks(t, len(after))
	checkPerPodOrder(t, fetchAll(t, js, len(sent)+len(after)), append(sent, after...))
	if got := metricstest.Value(t, f.reg, "pleg_bridge_repair_checks_total", map[string]string{"result": "intact"}); got < 1 {
		t.Errorf("pleg_bridge_repair_checks_total{result=\"intact\"} = %v, want at least 1: the reconnect's check", got)
	}
	if got := metricstest.Value(t, f.reg, "pleg_bridge_events_republished_total", map[string]string{"reason": "lost_by_server"}); got != 0 {
		t.Errorf("pleg_bridge_events_republished_total = %v, want 0", got)
	}
}

// TestTheRepairLeavesWhatTheStreamsLimitsRemoved: a purge, like the
// stream's max age, removes events from the front; they are not lost,
// and the check after a reconnect publishes none of them again.
func TestTheRepairLeavesWhatTheStreamsLimitsRemoved(t *testing.T) {
	t.Parallel()
	rs, stop := newRestartableServer(t)
	_, js := publishtest.Connect(t, rs.url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	ensureStream(t, js)
	f := newFixtureOn(t, js, publish.Options{
		Stream: "PLEG", Repair: publish.Repair{Retained: openRetaining(t)},
		AckTimeout: 500 * time.Millisecond, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
	})
	f.run(t)
	sent := churn(5, 2, 0)
	f.send(t, sent...)
	f.waitAcks(t, len(sent))
	s, err := js.Stream(t.Context(), "PLEG")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	stop()
	rs.start(t)
	after := churn(5, 1, 100)
	f.send(t, after...)
	f.waitAcks(t, len(after))
	checkPerPodOrder(t, fetchAll(t, js, len(after)), after)
}

// TestACheckRefusedByPermissionsIsReportedOnceAndPublishingGoesOn: a node
// whose credentials may publish but not read the stream back cannot check
// what it kept; it says so once at Warn, and its events are published all
// the same.
func TestACheckRefusedByPermissionsIsReportedOnceAndPublishingGoesOn(t *testing.T) {
	t.Parallel()
	s := publishtest.NewAuthServer(t, &server.Options{
		Users: []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "node", Password: "node", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{
					"pleg.node-1.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.PLEG", "$JS.API.STREAM.NAMES",
				}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
		},
	})
	_, admin := publishtest.Connect(t, s.ClientURL(), nats.UserInfo("admin", "admin"))
	ensureStream(t, admin)
	_, js := publishtest.Connect(t, s.ClientURL(), nats.UserInfo("node", "node"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	kept := openRetaining(t)
	opts := publish.Options{Stream: "PLEG", Repair: publish.Repair{Retained: kept}, AckTimeout: 300 * time.Millisecond,
		RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond}

	first := newFixtureOn(t, js, opts)
	stop := first.run(t)
	sent := churn(4, 2, 0)
	first.send(t, sent...)
	first.waitAcks(t, len(sent))
	stop()

	// The next run checks what the first kept, and is refused.
	second := newFixtureOn(t, js, opts)
	second.run(t)
	after := churn(4, 1, 100)
	second.send(t, after...)
	second.waitAcks(t, len(after))
	checkPerPodOrder(t, fetchAll(t, admin, len(sent)+len(after)), append(sent, after...))
	r := second.waitLog(t, "cannot check that the stream still holds the acknowledged events")
	if r.Level != slog.LevelWarn {
		t.Errorf("the refusal logged at %v, want WARN", r.Level)
	}
	if got := metricstest.Value(t, second.reg, "pleg_bridge_repair_checks_total", map[string]string{"result": "error"}); got < 1 {
		t.Errorf("pleg_bridge_repair_checks_total{result=\"error\"} = %v, want at least 1", got)
	}
	// The next tries fail too, and are not reported again at Warn.
	deadline := time.After(waitTimeout)
	for retries := 0; retries < 3; {
		select {
		case r := <-second.logs:
			switch {
			case strings.HasPrefix(r.Message, "check that the stream still holds the acknowledged events, will try again"):
				retries++
			case strings.HasPrefix(r.Message, "cannot check") && r.Level == slog.LevelWarn:
				t.Fatal("the refusal was reported at Warn more than once")
			}
		case <-deadline:
			t.Fatalf("the check was not tried again within %s", waitTimeout)
		}
	}
}
