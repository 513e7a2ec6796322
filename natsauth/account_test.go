package natsauth_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// writeFile writes b to dir/name and returns the path.
func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNewAccountRunsInARealServer starts nats-server from a configuration
// that includes ServerConfig, as a server configured by hand would, and
// checks the whole path without nsc: the administrator creates the stream
// and the bucket, a node minted with the node key publishes and writes its
// own subjects and keys only, and a reader minted with the reader key
// reads its namespace only.
func TestNewAccountRunsInARealServer(t *testing.T) {
	t.Parallel()
	a, err := natsauth.NewAccount(natsauth.AccountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeFile(t, dir, "resolver.conf", []byte(a.ServerConfig()))
	conf := writeFile(t, dir, "nats-server.conf", []byte("host: 127.0.0.1\nport: -1\njetstream { store_dir: \""+filepath.Join(dir, "js")+"\" }\ninclude resolver.conf\n"))
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("the configuration with ServerConfig: %v", err)
	}
	s := publishtest.RunServer(t, opts)
	url := s.ClientURL()
	ctx := t.Context()

	admin := connect(t, url, writeFile(t, dir, "admin.creds", a.AdminCreds))
	if _, err := admin.js.CreateStream(ctx, jetstream.StreamConfig{Name: schemas.DefaultStream, Subjects: []string{"pleg.>"}}); err != nil {
		t.Fatalf("the administrator cannot create the stream: %v", err)
	}
	kv, err := admin.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: schemas.DefaultStateBucket})
	if err != nil {
		t.Fatalf("the administrator cannot create the bucket: %v", err)
	}
	connect(t, url, writeFile(t, dir, "sys.creds", a.SystemCreds)) // the system account's user connects

	accPub, _ := a.Account.PublicKey()
	creds, err := natsauth.Mint(natsauth.MintOptions{SigningKey: a.NodeSigner, Account: accPub, Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	n := connect(t, url, writeFile(t, dir, "node-1.creds", creds), nats.CustomInboxPrefix(natsauth.InboxPrefix("node-1")))
	for _, ns := range []string{"shop", "payments"} {
		subject := schemas.Subject("pleg", "node-1", ns, "u-"+ns, "ContainerStarted")
		if _, err := n.js.Publish(ctx, subject, []byte(`{}`)); err != nil {
			t.Fatalf("node-1 cannot publish %s: %v", subject, err)
		}
	}
	nkv, err := n.js.KeyValue(ctx, schemas.DefaultStateBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nkv.Put(ctx, "node-1.shop.web-0.u1.c1", []byte(`{}`)); err != nil {
		t.Errorf("node-1 cannot write its key: %v", err)
	}
	n.refused(t, "publish", schemas.Subject("pleg", "node-2", "shop", "u1", "ContainerStarted"))
	n.refused(t, "publish", "$KV.PLEG_STATE.node-2.shop.web-0.u1.c1")
	n.refused(t, "publish", "$JS.API.STREAM.UPDATE.PLEG")
	if _, err := kv.Get(ctx, "node-1.shop.web-0.u1.c1"); err != nil {
		t.Errorf("the bucket does not hold node-1's key: %v", err)
	}

	rcreds, err := natsauth.MintReader(natsauth.ReaderOptions{SigningKey: a.ReaderSigner, Account: accPub, Namespaces: []string{"shop"}})
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := natsauth.ReaderInboxPrefix(rcreds)
	if err != nil {
		t.Fatal(err)
	}
	r := connect(t, url, writeFile(t, dir, "shop.creds", rcreds), nats.CustomInboxPrefix(inbox))
	cons, err := r.js.OrderedConsumer(ctx, schemas.DefaultStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"pleg.*.shop.>"}})
	if err != nil {
		t.Fatalf("the reader of shop cannot read shop: %v", err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil || !strings.Contains(m.Subject(), ".shop.") {
		t.Errorf("the reader of shop reads %v, %v; want shop's event", m, err)
	}
	if _, err := r.js.OrderedConsumer(ctx, schemas.DefaultStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"pleg.*.payments.>"}}); err == nil {
		t.Error("the reader of shop may read payments")
	}
	r.refused(t, "subscribe", "pleg.*.payments.>")
	r.refused(t, "publish", schemas.Subject("pleg", "node-1", "shop", "u1", "ContainerStarted"))
}

// TestNewAccountNamesItsParts checks what NewAccount signs: the operator
// names the system account, both accounts are the operator's, and the
// account holds the two scoped keys with their roles and templates, for
// the names asked.
func TestNewAccountNamesItsParts(t *testing.T) {
	t.Parallel()
	names := natsauth.Names{SubjectPrefix: "ev", Stream: "EV", StateBucket: "EV_STATE"}
	a, err := natsauth.NewAccount(natsauth.AccountOptions{Names: names, Operator: "acme", Account: "EVENTS"})
	if err != nil {
		t.Fatal(err)
	}
	oc, err := jwt.DecodeOperatorClaims(a.OperatorJWT)
	if err != nil {
		t.Fatal(err)
	}
	sysPub, _ := a.System.PublicKey()
	if oc.Name != "acme" || oc.SystemAccount != sysPub {
		t.Errorf("operator %q with system account %s, want acme with %s", oc.Name, oc.SystemAccount, sysPub)
	}
	ac, err := jwt.DecodeAccountClaims(a.AccountJWT)
	if err != nil {
		t.Fatal(err)
	}
	if ac.Name != "EVENTS" || ac.Issuer != oc.Subject || ac.Limits.JetStreamLimits.DiskStorage != -1 {
		t.Errorf("account %q issued by %s with JetStream %+v", ac.Name, ac.Issuer, ac.Limits.JetStreamLimits)
	}
	for key, want := range map[string]struct {
		role string
		sub  string
	}{
		pubOf(t, a.NodeSigner):   {natsauth.Role, "_INBOX_{{name()}}.>"},
		pubOf(t, a.ReaderSigner): {natsauth.ReaderRole, "ev.*.{{tag(namespace)}}.>"},
	} {
		scope, ok := ac.SigningKeys.GetScope(key)
		us, isUser := scope.(*jwt.UserScope)
		if !ok || !isUser || us.Role != want.role || !us.Template.Sub.Allow.Contains(want.sub) {
			t.Errorf("signing key %s: scope %+v, want role %s allowing %s", key, scope, want.role, want.sub)
		}
	}
	conf := a.ServerConfig()
	if !strings.Contains(conf, "resolver: MEMORY") || !strings.Contains(conf, a.AccountJWT) || !strings.Contains(conf, a.SystemJWT) {
		t.Errorf("ServerConfig does not preload both accounts:\n%s", conf)
	}
	for _, kp := range []nkeys.KeyPair{a.Operator, a.System, a.Account, a.NodeSigner, a.ReaderSigner} {
		if seed, _ := kp.Seed(); strings.Contains(conf, string(seed)) {
			t.Errorf("ServerConfig holds a seed:\n%s", conf)
		}
	}
}

func pubOf(t *testing.T, kp nkeys.KeyPair) string {
	t.Helper()
	p, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
