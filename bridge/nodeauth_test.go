package bridge_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/natsauth/natsauthtest"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// readSubjects reads the first n messages of stream and returns their
// subjects.
func readSubjects(t *testing.T, js jetstream.JetStream, stream string, n int) []string {
	t.Helper()
	cons, err := js.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for len(out) < n {
		msg, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
		if err != nil {
			t.Fatalf("after %d of %d messages: %v (got %q)", len(out), n, err, out)
		}
		out = append(out, msg.Subject())
	}
	return out
}

// TestBridgeRunsWithItsNodesMintedCredentials runs the production wiring
// against a server in operator mode with credentials minted for
// node-1.example.com from the scoped signing key and no other setting, the
// stream and the state bucket created by the operator: the bridge takes
// the node's inbox prefix and leaves the stream and the bucket alone. Every
// JetStream call of the bridge must get through the node's permissions,
// replies on _INBOX_node-1_example_com: the events and the state keys
// arrive, the state writer reads its keys back, and a restart reads back
// what the first run stored after its checkpoint (the publisher's
// reconcile consumer) before it publishes again.
func TestBridgeRunsWithItsNodesMintedCredentials(t *testing.T) {
	t.Parallel()
	const node, tok = "node-1.example.com", "node-1_example_com"
	srv := natsauthtest.Start(t, natsauth.Names{})
	_, admin := publishtest.Connect(t, srv.URL, nats.UserCredentials(srv.AdminCreds))
	if _, err := admin.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: schemas.DefaultStream, Subjects: []string{schemas.DefaultSubjectPrefix + ".>"}, Duplicates: time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	kv, err := admin.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: schemas.DefaultStateBucket})
	if err != nil {
		t.Fatal(err)
	}

	model := crisim.NewRuntime(crisim.Options{})
	_, endpoint := crisimtest.Serve(t, model)
	sb, err := model.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1"})
	if err != nil {
		t.Fatal(err)
	}
	start := func(name string) string {
		t.Helper()
		c, err := model.CreateContainer(sb, crisim.ContainerConfig{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if err := model.StartContainer(c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	app := start("app")

	logs := &logtest.Buffer{}
	opts := testOptions(endpoint, srv.URL, t.TempDir())
	opts.Node = node
	opts.NATS.Creds = srv.Mint(t, node)
	opts.StateBucket = schemas.DefaultStateBucket
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))

	_, stop := runBridge(t, opts)
	if err := model.StopContainer(app, 0, "Completed", ""); err != nil {
		t.Fatal(err)
	}
	subject := func(typ string) string { return "pleg." + tok + ".shop.uid-1." + typ }
	checkLines(t, readSubjects(t, admin, schemas.DefaultStream, 3),
		[]string{subject("ContainerStarted"), subject("ContainerStarted"), subject("ContainerDied")})
	waitKeys(t, kv, tok+".>", 2)
	stop()

	// A message of this node stored after the checkpoint, as when a crash
	// lost its ack: the next run reads it back before it publishes.
	if _, err := admin.Publish(t.Context(), subject("ContainerRemoved"), []byte(`{}`), jetstream.WithMsgID("stored-after-checkpoint")); err != nil {
		t.Fatal(err)
	}
	_, stop = runBridge(t, opts)
	start("sidecar")
	got := readSubjects(t, admin, schemas.DefaultStream, 5)
	if got[4] != subject("ContainerStarted") {
		t.Errorf("after the restart the stream has %q, want the sidecar's start last", got)
	}
	waitKeys(t, kv, tok+".>", 3)
	stop()

	l := logs.String()
	for _, want := range []string{"read the messages an earlier run stored after its checkpoint", "reconciled the node's keys"} {
		if !strings.Contains(l, want) {
			t.Errorf("the bridge did not log %q:\n%s", want, l)
		}
	}
	if strings.Contains(strings.ToLower(l), "permissions violation") {
		t.Errorf("the bridge was refused a call:\n%s", l)
	}
}

// waitKeys waits until kv holds n keys matching filter, or fails the test
// after 30s.
func waitKeys(t *testing.T, kv jetstream.KeyValue, filter string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	keys := map[string]bool{}
	for {
		select {
		case e := <-w.Updates():
			if e != nil {
				keys[e.Key()] = true
			}
			if len(keys) == n {
				return
			}
		case <-ctx.Done():
			t.Fatalf("the state bucket holds %d keys under %s, want %d: %v", len(keys), filter, n, keys)
		}
	}
}

func TestInboxPrefixNamesTheNodeByItsSubjectToken(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ pattern, node, want string }{
		{"", "node-1", ""},
		{"_INBOX", "node-1", "_INBOX"},
		{"_INBOX_{node}", "node-1.example.com", "_INBOX_node-1_example_com"},
		{"replies.{node}", "node 1", "replies.node%201"},
	} {
		if got, err := bridge.ExpandInboxPrefix(tt.pattern, tt.node); err != nil || got != tt.want {
			t.Errorf("ExpandInboxPrefix(%q, %q) = %q, %v; want %q", tt.pattern, tt.node, got, err, tt.want)
		}
	}
	for _, pattern := range []string{"_INBOX.>", "_INBOX.*", "_INBOX.", "a..b", "_INBOX {node}"} {
		if got, err := bridge.ExpandInboxPrefix(pattern, "node-1"); err == nil {
			t.Errorf("ExpandInboxPrefix(%q) = %q, want an error", pattern, got)
		}
		opts := testOptions("unix:///nonexistent/cri.sock", "nats://127.0.0.1:1", t.TempDir())
		opts.NATS.InboxPrefix = pattern
		if _, err := bridge.New(opts); err == nil || !strings.Contains(err.Error(), "inbox prefix") {
			t.Errorf("New with inbox prefix %q = %v, want an error naming it", pattern, err)
		}
	}
}
