package bridge

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/natsauth/natsauthtest"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// records is a slog.Handler that sends each record's message and
// attributes, as one line, to a channel the test reads.
type records chan string

func (r records) Enabled(context.Context, slog.Level) bool { return true }
func (r records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r records) WithGroup(string) slog.Handler            { return r }
func (r records) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	select {
	case r <- b.String():
	default: // a test that stopped reading does not block the bridge
	}
	return nil
}

// waitLog returns the first record that contains every one of want, or
// fails the test after 30s.
func (r records) waitLog(t *testing.T, want ...string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l := <-r:
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(l, w)
			}
			if ok {
				return l
			}
		case <-timeout:
			t.Fatalf("no log record with %q", want)
			return ""
		}
	}
}

// nodeFixture is a server in operator mode (natsauthtest) and a pipeline,
// built but not running, of node-1.example.com with that node's minted
// credentials and no other NATS setting, its logs in logs.
type nodeFixture struct {
	srv   *natsauthtest.Server
	admin jetstream.JetStream
	logs  records
}

func newNodeFixture(t *testing.T, stream bool) *nodeFixture {
	t.Helper()
	f := &nodeFixture{srv: natsauthtest.Start(t, natsauth.Names{}), logs: make(records, 256)}
	_, f.admin = publishtest.Connect(t, f.srv.URL, nats.UserCredentials(f.srv.AdminCreds))
	if stream {
		if _, err := f.admin.CreateStream(t.Context(), jetstream.StreamConfig{Name: schemas.DefaultStream, Subjects: []string{"pleg.>"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.admin.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: schemas.DefaultStateBucket}); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// build builds the pipeline of opts (NATS URL and credentials, the runtime
// and the logger set here) and relists once.
func (f *nodeFixture) build(t *testing.T, opts Options) *pipeline {
	t.Helper()
	model := crisim.NewRuntime(crisim.Options{})
	_, endpoint := crisimtest.Serve(t, model)
	opts.Node = "node-1.example.com"
	opts.CRIEndpoint, opts.Mode, opts.DataDir = endpoint, generator.ModeGeneric, t.TempDir()
	opts.NATS.URL, opts.NATS.Creds = f.srv.URL, f.srv.Mint(t, opts.Node)
	opts.StateBucket = schemas.DefaultStateBucket
	opts.Logger = slog.New(f.logs)
	p, err := build(opts.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	if err := p.gen.Relist(t.Context()); err != nil {
		t.Fatal(err)
	}
	return p
}

// readyz serves /readyz through p's handler.
func readyz(t *testing.T, p *pipeline) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	p.handler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/readyz", nil))
	return rec.Code, rec.Body.String()
}

// TestNodeCredentialsAloneMakeTheBridgeReady starts the bridge as the
// DaemonSet does with a node's credentials from pleg-bridge creds and no
// other setting (the default PLEG_STREAM_MANAGE=true included), against a
// server whose operator created the stream and the bucket: the bridge
// receives replies on the node's inbox prefix, leaves the stream alone,
// and is ready.
func TestNodeCredentialsAloneMakeTheBridgeReady(t *testing.T) {
	t.Parallel()
	f := newNodeFixture(t, true)
	p := f.build(t, Options{Stream: StreamOptions{Manage: true}})
	if code, body := readyz(t, p); code != http.StatusOK {
		t.Errorf("/readyz with the node's credentials alone: %d %q", code, body)
	}
	if got := p.opts.NATS.InboxPrefix; got != "_INBOX_node-1_example_com" {
		t.Errorf("inbox prefix %q, want the node's", got)
	}
	if p.opts.Stream.Manage {
		t.Error("the bridge would create or update the stream, which its credentials may not")
	}
	f.logs.waitLog(t, "this node's own user", "inbox_prefix=_INBOX_node-1_example_com", "stream_manage=false")

	// Credentials of a user that is not the node's leave the settings
	// alone; another node's are warned of.
	opts := Options{Node: "node-2", NATS: NATSOptions{Creds: f.srv.Mint(t, "node-1")}, Stream: StreamOptions{Manage: true}, Logger: slog.New(f.logs)}
	if got := withNodeCredentials(opts); got.NATS.InboxPrefix != "" || !got.Stream.Manage {
		t.Errorf("node-1's credentials on node-2 set inbox %q and manage %v", got.NATS.InboxPrefix, got.Stream.Manage)
	}
	f.logs.waitLog(t, "WARN", "named for another node", "creds_user=node-1", "node_user=node-2")
	opts.NATS.Creds = f.srv.AdminCreds // a user with permissions of its own
	if got := withNodeCredentials(opts); got.NATS.InboxPrefix != "" || !got.Stream.Manage {
		t.Errorf("the administrator's credentials set inbox %q and manage %v", got.NATS.InboxPrefix, got.Stream.Manage)
	}
}

// TestARefusedInboxNamesTheSetting runs a node's credentials with the
// inbox prefix set to nats.go's default, as a user may have copied: the
// server refuses the subscription to the replies, and /readyz and the
// stream set-up's repeated log line name the setting that fixes it.
func TestARefusedInboxNamesTheSetting(t *testing.T) {
	t.Parallel()
	f := newNodeFixture(t, true)
	p := f.build(t, Options{NATS: NATSOptions{InboxPrefix: "_INBOX"}, Stream: StreamOptions{Manage: true}})
	const fix = "set PLEG_NATS_INBOX_PREFIX=_INBOX_{node}"
	code, body := readyz(t, p)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "stream PLEG is not reachable") || !strings.Contains(body, fix) {
		t.Errorf("/readyz with a refused inbox: %d %q, want it to say %q", code, body, fix)
	}
	f.logs.waitLog(t, "ERROR", "refuses the bridge a call it needs", fix)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- ensureStream(ctx, p.js, p.opts, p.refused.advice) }()
	f.logs.waitLog(t, "cannot reach JetStream to set up the stream, retrying", "fix=", fix)
	cancel()
	<-done
}

// TestARefusedStreamSetUpNamesTheSetting runs the stream set-up with a
// node's credentials against a server without the stream: the server
// refuses the creation, and the retries' log line says to set
// PLEG_STREAM_MANAGE=false and create the stream; /readyz, with the
// bridge leaving the stream to the operator as node credentials make it,
// says how to create it.
func TestARefusedStreamSetUpNamesTheSetting(t *testing.T) {
	t.Parallel()
	f := newNodeFixture(t, false)
	p := f.build(t, Options{})
	code, body := readyz(t, p)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "stream not found") || !strings.Contains(body, "Creating the stream yourself") {
		t.Errorf("/readyz without the stream: %d %q, want how to create it", code, body)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- ensureStream(ctx, p.js, p.opts, p.refused.advice) }()
	f.logs.waitLog(t, "cannot reach JetStream to set up the stream, retrying", "$JS.API.STREAM.CREATE.PLEG", "set PLEG_STREAM_MANAGE=false")
	cancel()
	<-done
}
