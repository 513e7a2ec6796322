package bridge

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// logRecord is what recordingHandler keeps of a record.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// recordingHandler sends every record to records, which the test reads
// with a deadline; it never blocks the logger: the channel is large
// enough for a test's records.
type recordingHandler struct {
	records chan logRecord
	attrs   []slog.Attr
}

func newRecordingHandler() *recordingHandler {
	return &recordingHandler{records: make(chan logRecord, 1000)}
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	select {
	case h.records <- rec:
	default:
	}
	return nil
}

func (h *recordingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &recordingHandler{records: h.records, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h *recordingHandler) WithGroup(string) slog.Handler { return h }

// waitFor returns the first record of h whose message starts with msg,
// with every record before it, failing the test after 15 s.
func (h *recordingHandler) waitFor(t *testing.T, msg string) (logRecord, []logRecord) {
	t.Helper()
	var seen []logRecord
	deadline := time.After(15 * time.Second)
	for {
		select {
		case r := <-h.records:
			if strings.HasPrefix(r.msg, msg) {
				return r, seen
			}
			seen = append(seen, r)
		case <-deadline:
			t.Fatalf("no log %q within 15s; logged: %+v", msg, seen)
		}
	}
}

// TestNATSRefusingConnectionsIsLoggedWithTheReasonOnce connects to a
// loopback port nothing listens on: the log says "connection refused" and
// the URL without its password, at Warn once, and every further attempt
// at Debug.
func TestNATSRefusingConnectionsIsLoggedWithTheReasonOnce(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // closed: a connection is refused

	h := newRecordingHandler()
	g := newNATSConnectedGauge()
	nc, err := connectNATS("nats://bridge:s3cret@"+addr, "pleg-bridge node-1", NATSOptions{}, nil, g, slog.New(h))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	// Three attempts (the first reports only that no server was
	// available; nats.go drops its reason), one of them at Warn.
	var warns []logRecord
	for range 3 {
		r, seen := h.waitFor(t, "cannot connect to NATS")
		for _, r := range append(seen, r) {
			if strings.Contains(r.msg+strings.Join(mapValues(r.attrs), " "), "s3cret") {
				t.Errorf("the password is in the log: %+v", r)
			}
		}
		if r.level == slog.LevelWarn {
			warns = append(warns, r)
		} else if r.level != slog.LevelDebug {
			t.Errorf("a failure logged at %v, want Warn once, then Debug", r.level)
		}
	}
	if len(warns) != 1 {
		t.Fatalf("%d of 3 failures logged at Warn, want 1: %+v", len(warns), warns)
	}
	warn := warns[0]
	if !strings.Contains(warn.attrs["err"], "connection refused") || !strings.Contains(warn.attrs["err"], addr) {
		t.Errorf("err = %q, want the dial error: connection refused at %s", warn.attrs["err"], addr)
	}
	if got, want := warn.attrs["url"], "nats://bridge:xxxxx@"+addr; got != want {
		t.Errorf("url = %q, want %q", got, want)
	}
	if v := testutil.ToFloat64(g); v != 0 {
		t.Errorf("pleg_bridge_nats_connected = %v while refused, want 0", v)
	}
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// TestNATSConnectedGaugeFollowsTheConnection: 1 once connected, 0 when the
// server goes away, 1 again once reconnected, as the exposition shows it.
func TestNATSConnectedGaugeFollowsTheConnection(t *testing.T) {
	t.Parallel()
	opts := &server.Options{Host: "127.0.0.1", Port: -1}
	s := publishtest.RunServer(t, opts)
	port := s.Addr().(*net.TCPAddr).Port

	reg := prometheus.NewRegistry()
	g := newNATSConnectedGauge()
	reg.MustRegister(g)
	expose := func(v string) string {
		return "# HELP pleg_bridge_nats_connected 1 while the bridge is connected to NATS, 0 while it is not (connecting, or reconnecting after a disconnect).\n" +
			"# TYPE pleg_bridge_nats_connected gauge\npleg_bridge_nats_connected " + v + "\n"
	}
	h := newRecordingHandler()
	nc, err := connectNATS(s.ClientURL(), "pleg-bridge node-1", NATSOptions{}, nil, g, slog.New(h))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	h.waitFor(t, "connected to NATS")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expose("1")), "pleg_bridge_nats_connected"); err != nil {
		t.Errorf("connected: %v", err)
	}

	s.Shutdown()
	s.WaitForShutdown()
	h.waitFor(t, "disconnected from NATS")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expose("0")), "pleg_bridge_nats_connected"); err != nil {
		t.Errorf("disconnected: %v", err)
	}

	again := opts.Clone()
	again.Port = port
	publishtest.RunServer(t, again)
	h.waitFor(t, "reconnected to NATS")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expose("1")), "pleg_bridge_nats_connected"); err != nil {
		t.Errorf("reconnected: %v", err)
	}
}

func TestRedactURLsHidesPasswordsAndTokens(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                          "nats://127.0.0.1:4222",
		"nats://u:p@a:4222, nats://tok@b:4222,tls://c:1": "nats://u:xxxxx@a:4222,nats://xxxxx@b:4222,tls://c:1",
		"nats://u:p%zz@a:4222":                           "(a URL that does not parse)",
	} {
		if got := RedactURLs(in); got != want {
			t.Errorf("RedactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}
