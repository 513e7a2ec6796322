package natsauth_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/natsauth/natsauthtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// node is a connection with a node's minted credentials and the
// asynchronous errors (permission violations) the server sends it.
type node struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

func connect(t *testing.T, url, creds string, opts ...nats.Option) node {
	t.Helper()
	errs := make(chan error, 64)
	opts = append(opts, nats.UserCredentials(creds),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect with %s: %v", creds, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return node{nc: nc, js: js, errs: errs}
}

// startOperated starts a server in operator mode (natsauthtest.Start) in
// which the administrator has created the event stream
// (schemas.DefaultStream, on pleg.>) and, with bucket, the state bucket
// (schemas.DefaultStateBucket), as an operator does for bridges run with
// PLEG_STREAM_MANAGE=false. It returns the server, the administrator's
// connection and the bucket (nil without).
func startOperated(t *testing.T, bucket bool) (*natsauthtest.Server, node, jetstream.KeyValue) {
	t.Helper()
	srv := natsauthtest.Start(t, natsauth.Names{})
	admin := connect(t, srv.URL, srv.AdminCreds)
	if _, err := admin.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: schemas.DefaultStream, Subjects: []string{"pleg.>"}}); err != nil {
		t.Fatal(err)
	}
	if !bucket {
		return srv, admin, nil
	}
	kv, err := admin.js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: schemas.DefaultStateBucket})
	if err != nil {
		t.Fatal(err)
	}
	return srv, admin, kv
}

// refused fails the test unless the server answers the publish (or
// subscribe) on subject with a permissions violation naming it.
func (n node) refused(t *testing.T, verb, subject string) {
	t.Helper()
	var err error
	if verb == "subscribe" {
		_, err = n.nc.SubscribeSync(subject)
	} else {
		err = n.nc.Publish(subject, []byte("x"))
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := n.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case err := <-n.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
				return
			}
		case <-timeout:
			t.Errorf("a node may %s %s", verb, subject)
			return
		}
	}
}

// TestNodeCredentialsReachOnlyTheirNode runs the account of natsauth in a
// server in operator mode: credentials minted for node-1.example.com (token
// node-1_example_com) publish that node's events, write and read back its
// state keys, read back what it stored, and are refused every subject of
// node-2, the stream's and bucket's administration, other users' inboxes and
// the events themselves.
func TestNodeCredentialsReachOnlyTheirNode(t *testing.T) {
	t.Parallel()
	const nodeA, tokA, tokB = "node-1.example.com", "node-1_example_com", "node-2"
	ctx := t.Context()

	// The operator creates the stream and the bucket, as with
	// PLEG_STREAM_MANAGE=false.
	srv, _, _ := startOperated(t, true)

	a := connect(t, srv.URL, srv.Mint(t, nodeA), nats.CustomInboxPrefix(natsauth.InboxPrefix(nodeA)))
	subject := schemas.Subject("pleg", nodeA, "shop", "6f1c2a7e", "ContainerStarted")
	ack, err := a.js.Publish(ctx, subject, []byte(`{}`), jetstream.WithMsgID("e1"))
	if err != nil {
		t.Fatalf("node A cannot publish its event: %v", err)
	}
	stream, err := a.js.Stream(ctx, schemas.DefaultStream)
	if err != nil {
		t.Fatalf("node A cannot read the stream's info: %v", err)
	}
	if m, err := stream.GetLastMsgForSubject(ctx, subject); err != nil || m.Sequence != ack.Sequence {
		t.Errorf("node A cannot get the last message of its subject: %v", err)
	}
	// The publisher's reconcile: a consumer filtered to the node's subjects.
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject: "pleg." + tokA + ".>", AckPolicy: jetstream.AckNonePolicy, HeadersOnly: true,
	})
	if err != nil {
		t.Fatalf("node A cannot read back its subjects: %v", err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := <-batch.Messages(); !ok || m.Subject() != subject {
		t.Errorf("node A reads back %v, want its event (%v)", m, batch.Error())
	}
	if err := stream.DeleteConsumer(ctx, cons.CachedInfo().Name); err != nil {
		t.Errorf("node A cannot delete its consumer: %v", err)
	}
	if _, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{FilterSubject: "pleg." + tokB + ".>"}); err == nil {
		t.Error("node A may read node B's events")
	}

	// The state writer: puts, purges and a watch of the node's keys.
	kv, err := a.js.KeyValue(ctx, schemas.DefaultStateBucket)
	if err != nil {
		t.Fatalf("node A cannot look up the state bucket: %v", err)
	}
	key := schemas.StateKey(schemas.StateRef{Node: nodeA, Namespace: "shop", Pod: "web-0", PodUID: "u1", ContainerID: "c1"})
	if _, err := kv.Put(ctx, key, []byte(`{"id":"x"}`)); err != nil {
		t.Fatalf("node A cannot write its key %s: %v", key, err)
	}
	if err := kv.Purge(ctx, schemas.StateKey(schemas.StateRef{Node: nodeA, Namespace: "shop", Pod: "web-0", PodUID: "u1", ContainerID: "c0"})); err != nil {
		t.Errorf("node A cannot purge its key: %v", err)
	}
	w, err := kv.Watch(ctx, schemas.StateKeyFilter(schemas.StateRef{Node: nodeA}), jetstream.IgnoreDeletes())
	if err != nil {
		t.Fatalf("node A cannot watch its keys: %v", err)
	}
	select {
	case e := <-w.Updates():
		if e == nil || e.Key() != key {
			t.Errorf("node A's watch gives %v, want its key %s", e, key)
		}
	case <-time.After(10 * time.Second):
		t.Error("node A's watch of its keys gives nothing")
	}
	w.Stop()
	if _, err := kv.Watch(ctx, schemas.StateKeyFilter(schemas.StateRef{Node: "node-2"})); err == nil {
		t.Error("node A may watch node B's keys")
	}

	for _, s := range []string{
		"pleg." + tokB + ".shop.6f1c2a7e.ContainerStarted",
		"pleg.node-1.shop.6f1c2a7e.ContainerStarted", // a prefix of A's name is another node
		"pleg.*.shop.6f1c2a7e.ContainerStarted",
		"$KV.PLEG_STATE." + tokB + ".shop.web-0.u1.c1",
		"$JS.API.STREAM.CREATE.PLEG",
		"$JS.API.STREAM.UPDATE.PLEG",
		"$JS.API.STREAM.DELETE.PLEG",
		"$JS.API.STREAM.PURGE.PLEG",
		"$JS.API.STREAM.DELETE.KV_PLEG_STATE",
		"$JS.API.STREAM.PURGE.KV_PLEG_STATE",
		"$JS.API.CONSUMER.CREATE.PLEG.x",
		"$JS.API.CONSUMER.CREATE.PLEG.x.pleg." + tokB + ".>",
		"$JS.API.CONSUMER.CREATE.PLEG.x.pleg.>",
		"$JS.API.CONSUMER.CREATE.KV_PLEG_STATE.x.$KV.PLEG_STATE.>",
		"$JS.API.CONSUMER.DURABLE.CREATE.PLEG.x",
		"$JS.API.DIRECT.GET.PLEG.pleg." + tokB + ".shop.6f1c2a7e.ContainerStarted",
	} {
		a.refused(t, "publish", s)
	}
	for _, s := range []string{"_INBOX.>", "_INBOX_" + tokB + ".>", "_INBOX_node-1.>", "pleg.>", "$KV.PLEG_STATE.>", ">",
		"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.KV_PLEG_STATE", "$JS.EVENT.ADVISORY.>"} {
		a.refused(t, "subscribe", s)
	}
	// The stream's leader elections, which the bridge listens for.
	adv := connect(t, srv.URL, srv.Mint(t, nodeA), nats.CustomInboxPrefix(natsauth.InboxPrefix(nodeA)))
	if _, err := adv.nc.SubscribeSync("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.PLEG"); err != nil {
		t.Fatal(err)
	}
	if err := adv.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := adv.nc.LastError(); err != nil {
		t.Errorf("node A may not hear of the stream's leader elections: %v", err)
	}

	// With the default inbox prefix, no reply reaches the node.
	plain := connect(t, srv.URL, srv.Mint(t, nodeA))
	plain.refused(t, "subscribe", plain.nc.NewInbox())

	// Node B, from the same key, publishes its own events only.
	b := connect(t, srv.URL, srv.Mint(t, "node-2"), nats.CustomInboxPrefix(natsauth.InboxPrefix("node-2")))
	if _, err := b.js.Publish(ctx, schemas.Subject("pleg", "node-2", "shop", "u2", "ContainerDied"), []byte(`{}`)); err != nil {
		t.Errorf("node B cannot publish its event: %v", err)
	}
	b.refused(t, "publish", subject)
	b.refused(t, "subscribe", natsauth.InboxPrefix(nodeA)+".>")
}

func TestUserNameIsTheSubjectToken(t *testing.T) {
	t.Parallel()
	for node, want := range map[string]string{"node-1": "node-1", "node-1.example.com": "node-1_example_com", "Ip-10-0-0-1.EC2.internal": "Ip-10-0-0-1_EC2_internal"} {
		if got, err := natsauth.UserName(node); err != nil || got != want {
			t.Errorf("UserName(%q) = %q, %v; want %q", node, got, err, want)
		}
	}
	for _, node := range []string{"", "node_1", "node 1", "nöde"} {
		if got, err := natsauth.UserName(node); err == nil {
			t.Errorf("UserName(%q) = %q, want an error", node, got)
		}
	}
}

// signingKey returns a new account signing key, its public key, and the
// public key of a new account, for minting without a server.
func signingKey(t *testing.T) (signer nkeys.KeyPair, spub, apub string) {
	t.Helper()
	signer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	account, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	if spub, err = signer.PublicKey(); err != nil {
		t.Fatal(err)
	}
	if apub, err = account.PublicKey(); err != nil {
		t.Fatal(err)
	}
	return signer, spub, apub
}

// userClaims returns the claims of the user JWT in a credentials file.
func userClaims(t *testing.T, creds []byte) *jwt.UserClaims {
	t.Helper()
	token, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

// TestMintIssuesAScopedUserNamedByTheNode checks the credentials file: a
// user JWT issued by the signing key for the account, named by the node's
// token, without permissions of its own (the server refuses a scoped user
// that has some), expiring when asked, and the seed of its user key.
func TestMintIssuesAScopedUserNamedByTheNode(t *testing.T) {
	t.Parallel()
	signer, spub, apub := signingKey(t)
	creds, err := natsauth.Mint(natsauth.MintOptions{SigningKey: signer, Account: apub, Node: "node-1.example.com", Expiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	uc := userClaims(t, creds)
	kp, err := jwt.ParseDecoratedUserNKey(creds)
	if err != nil {
		t.Fatal(err)
	}
	upub, _ := kp.PublicKey()
	switch {
	case uc.Name != "node-1_example_com":
		t.Errorf("name %q", uc.Name)
	case uc.Issuer != spub || uc.IssuerAccount != apub:
		t.Errorf("issuer %s for account %s, want %s for %s", uc.Issuer, uc.IssuerAccount, spub, apub)
	case uc.Subject != upub:
		t.Errorf("the JWT is for %s, the seed for %s", uc.Subject, upub)
	case !uc.HasEmptyPermissions():
		t.Errorf("the user has permissions of its own: %+v", uc.Permissions)
	case uc.Expires == 0 || time.Until(time.Unix(uc.Expires, 0)) > time.Hour:
		t.Errorf("expires %d, want within the hour", uc.Expires)
	}

	for name, opts := range map[string]natsauth.MintOptions{
		"no signing key":           {Account: apub, Node: "n"},
		"a user key as signer":     {SigningKey: kp, Account: apub, Node: "n"},
		"a signing key as account": {SigningKey: signer, Account: upub, Node: "n"},
		"no node":                  {SigningKey: signer, Account: apub},
		"a negative expiry":        {SigningKey: signer, Account: apub, Node: "n", Expiry: -time.Second},
	} {
		if _, err := natsauth.Mint(opts); err == nil {
			t.Errorf("Mint with %s: no error", name)
		}
	}
}

// TestADeliverySubjectCannotForgeAnotherNode checks the one way around the
// template a node has: a push consumer on its own subjects may deliver to
// any subject, the node's permissions do not apply to it. JetStream
// delivers each message under its stored subject, and no stream stores a
// delivery: pointing a consumer at node B's subjects or keys stores nothing
// as node B.
func TestADeliverySubjectCannotForgeAnotherNode(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, admin, _ := startOperated(t, true) // PLEG and PLEG_STATE
	a := connect(t, srv.URL, srv.Mint(t, "node-1"), nats.CustomInboxPrefix(natsauth.InboxPrefix("node-1")))
	if _, err := a.js.Publish(ctx, schemas.Subject("pleg", "node-1", "shop", "u1", "ContainerStarted"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	kv, err := a.js.KeyValue(ctx, "PLEG_STATE")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "node-1.shop.web-0.u1.c1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct{ stream, filter, deliver string }{
		{"PLEG", "pleg.node-1.>", "$KV.PLEG_STATE.node-2.shop.web-0.u1.c1"},
		{"KV_PLEG_STATE", "$KV.PLEG_STATE.node-1.>", schemas.Subject("pleg", "node-2", "shop", "u1", "ContainerStarted")},
	} {
		// Someone listens on the delivery subject, so that the consumer
		// delivers.
		sub, err := admin.nc.SubscribeSync(tt.deliver)
		if err != nil {
			t.Fatal(err)
		}
		s, err := a.js.Stream(ctx, tt.stream)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{FilterSubject: tt.filter, DeliverSubject: tt.deliver}); err != nil {
			t.Fatalf("push consumer on %s: %v", tt.stream, err)
		}
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no delivery to %s: %v", tt.deliver, err)
		}
		if !strings.Contains(m.Subject, "node-1") {
			t.Errorf("the delivery to %s comes as %s, not under node-1's subject", tt.deliver, m.Subject)
		}
	}
	// A message published after the deliveries is stored after them, if
	// they were stored: once it is there, nothing of node-2 is.
	if _, err := admin.js.Publish(ctx, schemas.Subject("pleg", "node-3", "shop", "u1", "ContainerStarted"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.js.Publish(ctx, "$KV.PLEG_STATE.node-3.shop.web-0.u1.c1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for _, stream := range []string{"PLEG", "KV_PLEG_STATE"} {
		s, err := admin.js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		for subj := range info.State.Subjects {
			if strings.Contains(subj, "node-2") {
				t.Errorf("stream %s stores %s: node-1 forged node-2", stream, subj)
			}
		}
	}
}
