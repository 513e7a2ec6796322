package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// TestCredsInitMakesAnAccountWithoutNsc runs creds --init, starts a real
// nats-server from a configuration that includes the resolver.conf it
// wrote, and follows the steps it prints: the administrator creates the
// stream and the bucket, creds --node and creds --reader mint from the
// keys and the account JWT it wrote, the node publishes its own events and
// is refused another node's, and the reader reads its namespace and is
// refused another. A second --init into the same directory is refused.
func TestCredsInitMakesAnAccountWithoutNsc(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "pleg-nats")
	var stdout bytes.Buffer
	if err := run(t.Context(), []string{"creds", "--init", dir}, envFrom(t, nil), &stdout, io.Discard); err != nil {
		t.Fatalf("creds --init: %v", err)
	}
	for _, name := range []string{"resolver.conf", "pleg.jwt", "pleg-node.nk", "pleg-reader.nk", "admin.creds"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("creds --init wrote %s: %v, mode %v; want mode 0600", name, err, fi.Mode())
		}
		if !strings.Contains(stdout.String(), name) {
			t.Errorf("creds --init does not list %s: %s", name, stdout.String())
		}
	}
	if err := run(t.Context(), []string{"creds", "--init", dir}, envFrom(t, nil), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Errorf("a second creds --init into %s: %v, want a refusal", dir, err)
	}

	// nats-server reads an include relative to the including file.
	conf := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(conf, []byte("host: 127.0.0.1\nport: -1\njetstream { store_dir: \""+filepath.Join(t.TempDir(), "js")+"\" }\ninclude resolver.conf\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server with resolver.conf: %v", err)
	}
	url := publishtest.RunServer(t, opts).ClientURL()
	ctx := t.Context()
	_, admin := publishtest.Connect(t, url, nats.UserCredentials(filepath.Join(dir, "admin.creds")))
	if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "PLEG", Subjects: []string{"pleg.>"}}); err != nil {
		t.Fatalf("admin.creds cannot create the stream: %v", err)
	}

	nodeCreds := filepath.Join(t.TempDir(), "node-1.creds")
	var stderr bytes.Buffer
	if err := run(ctx, []string{"creds", "--signing-key", filepath.Join(dir, "pleg-node.nk"), "--account-jwt", filepath.Join(dir, "pleg.jwt"),
		"--node", "node-1", "--out", nodeCreds}, envFrom(t, nil), io.Discard, &stderr); err != nil {
		t.Fatalf("creds --node with the keys of --init: %v", err)
	}
	_, node := publishtest.Connect(t, url, nats.UserCredentials(nodeCreds), nats.CustomInboxPrefix(natsauth.InboxPrefix("node-1")))
	if _, err := node.Publish(ctx, "pleg.node-1.shop.u1.ContainerStarted", []byte(`{}`)); err != nil {
		t.Errorf("node-1 cannot publish its event: %v", err)
	}
	if _, err := node.Publish(ctx, "pleg.node-1.payments.u2.ContainerStarted", []byte(`{}`)); err != nil {
		t.Errorf("node-1 cannot publish its event: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := node.Publish(short, "pleg.node-2.shop.u1.ContainerStarted", []byte(`{}`)); err == nil {
		t.Error("node-1 publishes as node-2")
	}

	readerCreds := filepath.Join(t.TempDir(), "shop.creds")
	stderr.Reset()
	if err := run(ctx, []string{"creds", "--reader", "-n", "shop", "--signing-key", filepath.Join(dir, "pleg-reader.nk"), "--account-jwt", filepath.Join(dir, "pleg.jwt"),
		"--out", readerCreds}, envFrom(t, nil), io.Discard, &stderr); err != nil {
		t.Fatalf("creds --reader with the keys of --init: %v", err)
	}
	b, err := os.ReadFile(readerCreds)
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := natsauth.ReaderInboxPrefix(b)
	if err != nil {
		t.Fatal(err)
	}
	_, reader := publishtest.Connect(t, url, nats.UserCredentials(readerCreds), nats.CustomInboxPrefix(inbox))
	cons, err := reader.OrderedConsumer(ctx, "PLEG", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"pleg.*.shop.>"}})
	if err != nil {
		t.Fatalf("the reader of shop cannot read shop: %v", err)
	}
	if m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second)); err != nil || m.Subject() != "pleg.node-1.shop.u1.ContainerStarted" {
		t.Errorf("the reader of shop reads %v, %v", m, err)
	}
	if _, err := reader.OrderedConsumer(ctx, "PLEG", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"pleg.*.payments.>"}}); err == nil {
		t.Error("the reader of shop reads payments")
	}
}
