package natsauth_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/natsauth/natsauthtest"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// readerTimeout is the JetStream API timeout of a reader's connection. The
// consumer package's probe for legacy-layout events, which a reader may
// not make, waits that long before each Subscribe and Replay.
const readerTimeout = 2 * time.Second

// reader is a connection with a reader's credentials. NATS refuses a
// request by dropping it and telling the connection's error handler, so a
// refused call would wait out its timeout: as the pleg-bridge commands do,
// the handler ends the running call's context with the violation as its
// cause. The violations go to errs too.
type reader struct {
	node
	mu     *sync.Mutex
	cancel *context.CancelCauseFunc // guarded by mu; the running call's
}

func connectReader(t *testing.T, url, creds, inbox string) reader {
	t.Helper()
	r := reader{node: node{errs: make(chan error, 64)}, mu: &sync.Mutex{}, cancel: new(context.CancelCauseFunc)}
	nc, err := nats.Connect(url, nats.UserCredentials(creds), nats.CustomInboxPrefix(inbox),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) && !consumer.LegacyProbeRefused(err, "PLEG") {
				r.mu.Lock()
				cancel := *r.cancel
				r.mu.Unlock()
				if cancel != nil {
					cancel(err)
				}
			}
			select {
			case r.errs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("connect with %s: %v", creds, err)
	}
	t.Cleanup(nc.Close)
	r.nc = nc
	if r.js, err = jetstream.New(nc, jetstream.WithDefaultTimeout(readerTimeout)); err != nil {
		t.Fatal(err)
	}
	return r
}

// call runs fn under a context that the reader's next refusal ends, and
// returns fn's error and the refusal.
func (r reader) call(t *testing.T, fn func(ctx context.Context) error) (err, refusal error) {
	t.Helper()
	ctx, cancel := context.WithCancelCause(t.Context())
	r.mu.Lock()
	*r.cancel = cancel
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		*r.cancel = nil
		r.mu.Unlock()
		cancel(nil)
	}()
	err = fn(ctx)
	if cause := context.Cause(ctx); errors.Is(cause, nats.ErrPermissionViolation) {
		refusal = cause
	}
	return err, refusal
}

// wantRefused fails the test unless refusal is a permissions violation
// whose subject has every one of parts.
func wantRefused(t *testing.T, what string, err, refusal error, parts ...string) {
	t.Helper()
	if refusal == nil {
		t.Errorf("%s: returned %v, want a permission refused", what, err)
		return
	}
	for _, p := range parts {
		if !strings.Contains(refusal.Error(), p) {
			t.Errorf("%s: refused %q, want a subject with %q", what, refusal, p)
		}
	}
}

// cluster is what TestReaderReadsOnlyItsNamespaces publishes: events and
// state keys of the namespaces shop and payments.
type cluster struct {
	admin node
	enc   *publish.Encoder
	t     *testing.T
}

// newCluster returns the cluster in which admin publishes the events of
// nodeName.
func newCluster(t *testing.T, admin node, nodeName string) cluster {
	t.Helper()
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: nodeName, SubjectPrefix: "pleg"})
	if err != nil {
		t.Fatal(err)
	}
	return cluster{admin: admin, enc: enc, t: t}
}

// publishWebAndPay publishes shop's web-0 started, payments' pay-0
// started and web-0 died, in that order, and returns the ids of shop's
// two events.
func (c cluster) publishWebAndPay() (shop []string) {
	c.t.Helper()
	shop = append(shop, c.publish(c.event(generator.ContainerStarted, "shop", "web-0", "u-web", "c1"), ""))
	c.publish(c.event(generator.ContainerStarted, "payments", "pay-0", "u-pay", "c2"), "")
	shop = append(shop, c.publish(c.event(generator.ContainerDied, "shop", "web-0", "u-web", "c1"), ""))
	return shop
}

func (c cluster) event(typ generator.LifecycleEventType, ns, pod, uid, container string) *nats.Msg {
	c.t.Helper()
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	m, err := c.enc.Encode(generator.Event{
		Type:      typ,
		Pod:       generator.Pod{UID: uid, Namespace: ns, Name: pod},
		Container: generator.Container{ID: container, Name: "app", Image: "registry.example/app:1"},
		State:     map[generator.LifecycleEventType]generator.State{generator.ContainerStarted: generator.StateRunning, generator.ContainerDied: generator.StateExited}[typ],
		Time:      at, ObservedAt: at, DetectedBy: generator.SourceRelist,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return m
}

// publish stores m on its subject (or on subject, if given) and returns its
// event id.
func (c cluster) publish(m *nats.Msg, subject string) string {
	c.t.Helper()
	if subject != "" {
		m.Subject = subject
	}
	if _, err := c.admin.js.PublishMsg(c.t.Context(), m); err != nil {
		c.t.Fatal(err)
	}
	return m.Header.Get(jetstream.MsgIDHeader)
}

func ids(events []consumer.Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

// TestReaderReadsOnlyItsNamespaces runs the account of natsauth in a
// server in operator mode: a reader minted for shop replays and follows
// every event of shop and lists shop's containers, through the consumer
// package as tail, replay and ps do; and it is refused payments' events,
// the stream without a namespace filter, payments' state keys and a
// durable group, each with an error naming the refused subject, and every
// subject beyond them.
func TestReaderReadsOnlyItsNamespaces(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, admin, kv := startOperated(t, true)
	c := newCluster(t, admin, "node-1.example.com")

	// shop and payments interleaved, and a shop event of the legacy
	// layout, which has no namespace token.
	var shop []string
	shop = append(shop, c.publish(c.event(generator.ContainerStarted, "shop", "web-0", "u-web", "c1"), ""))
	c.publish(c.event(generator.ContainerStarted, "payments", "pay-0", "u-pay", "c2"), "")
	shop = append(shop, c.publish(c.event(generator.ContainerStarted, "shop", "api-0", "u-api", "c3"), ""))
	c.publish(c.event(generator.ContainerDied, "payments", "pay-0", "u-pay", "c2"), "")
	c.publish(c.event(generator.ContainerDied, "shop", "api-0", "u-api", "c0"), schemas.LegacySubject("pleg", "node-1.example.com", "u-api", "ContainerDied"))
	shop = append(shop, c.publish(c.event(generator.ContainerDied, "shop", "web-0", "u-web", "c1"), ""))
	keys := map[string]string{}
	for _, k := range []struct{ ns, pod, uid, cid string }{{"shop", "web-0", "u-web", "c1"}, {"shop", "api-0", "u-api", "c3"}, {"payments", "pay-0", "u-pay", "c2"}} {
		key := schemas.StateKey(schemas.StateRef{Node: "node-1.example.com", Namespace: k.ns, Pod: k.pod, PodUID: k.uid, ContainerID: k.cid})
		if _, err := kv.Put(ctx, key, c.event(generator.ContainerStarted, k.ns, k.pod, k.uid, k.cid).Data); err != nil {
			t.Fatal(err)
		}
		keys[key] = k.ns
	}

	creds, inbox := srv.MintReader(t, []string{"shop"}, nil)
	r := connectReader(t, srv.URL, creds, inbox)

	t.Run("replay of its namespace gives every event of it, the legacy one excepted", func(t *testing.T) {
		var got []consumer.Event
		err, refusal := r.call(t, func(ctx context.Context) error {
			return consumer.Replay(ctx, r.js, consumer.Options{Filter: consumer.Filter{Namespace: "shop"}}, func(e consumer.Event) error {
				got = append(got, e)
				return nil
			})
		})
		if err != nil || refusal != nil {
			t.Fatalf("Replay: %v (refused %v)", err, refusal)
		}
		if diff := cmp.Diff(shop, ids(got)); diff != "" {
			t.Errorf("Replay of shop (-want +got):\n%s", diff)
		}
	})

	t.Run("subscribe to its namespace gives every event of it, stored and live", func(t *testing.T) {
		var got []consumer.Event
		var live string
		errStop := errors.New("the live event came")
		err, refusal := r.call(t, func(ctx context.Context) error {
			return consumer.Subscribe(ctx, r.js, consumer.Options{
				Filter: consumer.Filter{Namespace: "shop"}, DeliverAll: true,
				OnCaughtUp: func() {
					c.publish(c.event(generator.ContainerStarted, "payments", "pay-1", "u-pay1", "c4"), "")
					live = c.publish(c.event(generator.ContainerStarted, "shop", "web-1", "u-web1", "c5"), "")
				},
			}, func(e consumer.Event) error {
				got = append(got, e)
				if live != "" && e.ID == live {
					return errStop
				}
				return nil
			})
		})
		if !errors.Is(err, errStop) || refusal != nil {
			t.Fatalf("Subscribe: %v (refused %v), want it to end with the live event", err, refusal)
		}
		if diff := cmp.Diff(append(slices.Clone(shop), live), ids(got)); diff != "" {
			t.Errorf("Subscribe to shop (-want +got):\n%s", diff)
		}
	})

	t.Run("its namespace's state keys are listed", func(t *testing.T) {
		var got []consumer.ContainerState
		err, refusal := r.call(t, func(ctx context.Context) (err error) {
			got, err = consumer.ListState(ctx, r.js, consumer.StateOptions{Filter: consumer.StateFilter{Namespace: "shop"}})
			return err
		})
		if err != nil || refusal != nil {
			t.Fatalf("ListState: %v (refused %v)", err, refusal)
		}
		var want, gotKeys []string
		for k, ns := range keys {
			if ns == "shop" {
				want = append(want, k)
			}
		}
		slices.Sort(want)
		for _, s := range got {
			gotKeys = append(gotKeys, s.Key)
		}
		if diff := cmp.Diff(want, gotKeys); diff != "" {
			t.Errorf("ListState of shop (-want +got):\n%s", diff)
		}
	})

	t.Run("its namespace's keys may be got, no others", func(t *testing.T) {
		kv, err := r.js.KeyValue(ctx, schemas.DefaultStateBucket)
		if err != nil {
			t.Fatal(err)
		}
		for key, ns := range keys {
			err, refusal := r.call(t, func(ctx context.Context) error {
				_, err := kv.Get(ctx, key)
				return err
			})
			switch {
			case ns == "shop" && (err != nil || refusal != nil):
				t.Errorf("Get %s: %v (refused %v)", key, err, refusal)
			case ns != "shop":
				wantRefused(t, "Get "+key, err, refusal, "$JS.API.DIRECT.GET.KV_PLEG_STATE.$KV.PLEG_STATE."+key)
			}
		}
	})

	t.Run("a consumer whose request asks for more than its subject says is refused by the server", func(t *testing.T) {
		for _, body := range []string{
			`{"stream_name":"PLEG","config":{"name":"x","filter_subject":"pleg.>","ack_policy":"none"}}`,
			`{"stream_name":"PLEG","config":{"name":"x","filter_subjects":["pleg.*.shop.>","pleg.*.payments.>"],"ack_policy":"none"}}`,
		} {
			m, err := r.nc.Request("$JS.API.CONSUMER.CREATE.PLEG.x.pleg.*.shop.>", []byte(body), 10*time.Second)
			if err != nil {
				t.Fatalf("create a consumer with %s: %v", body, err)
			}
			if !strings.Contains(string(m.Data), `"error"`) {
				t.Errorf("create a consumer on pleg.*.shop.> with %s: %s, want an error", body, m.Data)
			}
		}
	})

	for _, tt := range []struct {
		name   string
		filter consumer.Filter
		want   string
	}{
		{"another namespace", consumer.Filter{Namespace: "payments"}, ".pleg.*.payments.>"},
		{"no filter", consumer.Filter{}, ".pleg.>"},
		{"a node without a namespace", consumer.Filter{Node: "node-1.example.com"}, ".pleg.node-1_example_com.>"},
		{"a pod without its namespace", consumer.Filter{PodUID: "u-web"}, ".pleg.*.*.u-web.>"},
	} {
		t.Run("replay of "+tt.name+" is refused", func(t *testing.T) {
			err, refusal := r.call(t, func(ctx context.Context) error {
				return consumer.Replay(ctx, r.js, consumer.Options{Filter: tt.filter}, func(e consumer.Event) error {
					t.Errorf("Replay of %+v gives %s %s", tt.filter, e.Subject, e.ID)
					return nil
				})
			})
			if err == nil {
				t.Error("Replay returns nil")
			}
			wantRefused(t, "Replay", err, refusal, "$JS.API.CONSUMER.CREATE.PLEG.", tt.want)
		})
	}

	t.Run("subscribe to another namespace is refused", func(t *testing.T) {
		// Subscribe ends without an error when its ctx ends: the refusal
		// is the cause of the context's end.
		err, refusal := r.call(t, func(ctx context.Context) error {
			return consumer.Subscribe(ctx, r.js, consumer.Options{Filter: consumer.Filter{Namespace: "payments"}, DeliverAll: true}, func(e consumer.Event) error {
				t.Errorf("Subscribe to payments gives %s %s", e.Subject, e.ID)
				return nil
			})
		})
		wantRefused(t, "Subscribe", err, refusal, "$JS.API.CONSUMER.CREATE.PLEG.", ".pleg.*.payments.>")
	})

	t.Run("another namespace's state keys are refused", func(t *testing.T) {
		for _, f := range []consumer.StateFilter{{Namespace: "payments"}, {}, {Node: "node-1.example.com"}} {
			err, refusal := r.call(t, func(ctx context.Context) error {
				got, err := consumer.ListState(ctx, r.js, consumer.StateOptions{Filter: f})
				if len(got) > 0 {
					t.Errorf("ListState of %+v gives %d containers", f, len(got))
				}
				return err
			})
			if err == nil {
				t.Errorf("ListState of %+v returns nil", f)
			}
			wantRefused(t, "ListState", err, refusal, "$JS.API.CONSUMER.CREATE.KV_PLEG_STATE.", ".$KV.PLEG_STATE."+f.Key())
		}
	})

	t.Run("a durable group is refused", func(t *testing.T) {
		err, refusal := r.call(t, func(ctx context.Context) error {
			return consumer.Consume(ctx, r.js, consumer.DurableOptions{
				Name: "shop-audit", Filter: consumer.Filter{Namespace: "shop"}, OnDeadLetter: func(consumer.DeadLetter) {},
			}, func(context.Context, consumer.Event) error { return nil })
		})
		wantRefused(t, "Consume", err, refusal, "$JS.API.STREAM.INFO.PLEG_shop-audit")
	})

	t.Run("its namespace's subjects may be subscribed to, no others", func(t *testing.T) {
		sub, err := r.nc.SubscribeSync("pleg.*.shop.>")
		if err != nil {
			t.Fatal(err)
		}
		if err := r.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		want := c.publish(c.event(generator.ContainerDied, "shop", "web-1", "u-web1", "c5"), "")
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil || m.Header.Get(jetstream.MsgIDHeader) != want {
			t.Errorf("the subscription to pleg.*.shop.> gives %v, %v; want the event %s", m, err, want)
		}
		for _, s := range []string{"pleg.*.payments.>", "pleg.>", "pleg.*.*.u-web.>", "_INBOX.>", "$KV.PLEG_STATE.>", ">"} {
			r.refused(t, "subscribe", s)
		}
	})

	t.Run("nothing else is allowed", func(t *testing.T) {
		for _, s := range []string{
			"pleg.node-1_example_com.shop.u-web.ContainerStarted",
			"$KV.PLEG_STATE.node-1_example_com.shop.web-0.u-web.c1",
			"$JS.API.INFO",
			"$JS.API.STREAM.MSG.GET.PLEG",
			"$JS.API.DIRECT.GET.PLEG",
			"$JS.API.DIRECT.GET.PLEG.pleg.node-1_example_com.u-pay.ContainerStarted",
			"$JS.API.STREAM.MSG.GET.KV_PLEG_STATE",
			"$JS.API.DIRECT.GET.KV_PLEG_STATE.$KV.PLEG_STATE.node-1_example_com.payments.pay-0.u-pay.c2",
			"$JS.API.STREAM.CREATE.PLEG_shop",
			"$JS.API.STREAM.UPDATE.PLEG",
			"$JS.API.STREAM.PURGE.PLEG",
			"$JS.API.STREAM.DELETE.KV_PLEG_STATE",
			"$JS.API.CONSUMER.CREATE.PLEG.x",
			"$JS.API.CONSUMER.CREATE.PLEG.x.pleg.*.*.>",
			"$JS.API.CONSUMER.DURABLE.CREATE.PLEG.x",
			"$JS.API.CONSUMER.CREATE.KV_PLEG_STATE.x",
			"$JS.ACK.PLEG.x.1.1.1.1.0",
		} {
			r.refused(t, "publish", s)
		}
	})
}

// TestReaderConsumesTheGroupsItIsGranted: a durable group's work stream is
// made by an operator (here the administrator's first member), with a
// filter within the reader's namespace; a reader minted with the group
// consumes it as any member does, and a reader without it, or with it
// for another group, is refused.
func TestReaderConsumesTheGroupsItIsGranted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, admin, _ := startOperated(t, false)
	shop := newCluster(t, admin, "node-1").publishWebAndPay()

	// The operator makes the groups: its member creates the work stream
	// and stops at the first event, which it leaves to the group.
	group := func(name string, f consumer.Filter) consumer.DurableOptions {
		return consumer.DurableOptions{Name: name, Filter: f, DeliverAll: true, Partitions: 1, AckWait: time.Second, OnDeadLetter: func(d consumer.DeadLetter) {
			t.Errorf("group %s dead-letters %s: %v", name, d.Event.ID, d.Err)
		}}
	}
	for _, g := range []consumer.DurableOptions{group("shop-billing", consumer.Filter{Namespace: "shop"}), group("everything", consumer.Filter{})} {
		made, stop := context.WithCancel(ctx)
		err := consumer.Consume(made, admin.js, g, func(ctx context.Context, _ consumer.Event) error {
			stop()
			return ctx.Err()
		})
		stop()
		if err != nil {
			t.Fatalf("the operator cannot make group %s: %v", g.Name, err)
		}
	}

	creds, inbox := srv.MintReader(t, []string{"shop"}, []string{"shop-billing"})
	r := connectReader(t, srv.URL, creds, inbox)
	var got []string
	err, refusal := r.call(t, func(ctx context.Context) error {
		ctx, stop := context.WithCancel(ctx)
		defer stop()
		return consumer.Consume(ctx, r.js, group("shop-billing", consumer.Filter{Namespace: "shop"}), func(_ context.Context, e consumer.Event) error {
			got = append(got, e.ID)
			if len(got) == len(shop) {
				stop()
			}
			return nil
		})
	})
	if err != nil || refusal != nil {
		t.Fatalf("the reader cannot consume its group: %v (refused %v)", err, refusal)
	}
	if diff := cmp.Diff(shop, got); diff != "" {
		t.Errorf("the reader's group gives (-want +got):\n%s", diff)
	}

	err, refusal = r.call(t, func(ctx context.Context) error {
		return consumer.Consume(ctx, r.js, group("everything", consumer.Filter{}), func(_ context.Context, e consumer.Event) error {
			t.Errorf("the reader consumes %s %s from a group across namespaces", e.Subject, e.ID)
			return nil
		})
	})
	wantRefused(t, "Consume of a group across namespaces", err, refusal, "$JS.API.STREAM.INFO.PLEG_everything")

	creds, inbox = srv.MintReader(t, []string{"shop"}, nil)
	other := connectReader(t, srv.URL, creds, inbox)
	err, refusal = other.call(t, func(ctx context.Context) error {
		return consumer.Consume(ctx, other.js, group("shop-billing", consumer.Filter{Namespace: "shop"}), func(_ context.Context, e consumer.Event) error {
			t.Errorf("a reader not granted the group consumes %s", e.ID)
			return nil
		})
	})
	wantRefused(t, "Consume of a group not granted", err, refusal, "$JS.API.STREAM.INFO.PLEG_shop-billing")
}

// TestReaderWithoutItsInboxPrefixIsRefusedItsReplies: replies reach a
// reader only on its own inbox prefix; a reader that connects without it
// is refused the subscription to its replies.
func TestReaderWithoutItsInboxPrefixIsRefusedItsReplies(t *testing.T) {
	t.Parallel()
	srv := natsauthtest.Start(t, natsauth.Names{})
	creds, _ := srv.MintReader(t, []string{"shop"}, nil)
	r := connectReader(t, srv.URL, creds, "_INBOX")
	err, refusal := r.call(t, func(ctx context.Context) error {
		_, err := r.js.Stream(ctx, schemas.DefaultStream)
		return err
	})
	wantRefused(t, "a stream lookup", err, refusal, `Subscription to "_INBOX.`)
}

// TestMintReaderTagsTheUserWithItsNamespaces checks the credentials file
// of a reader: a user JWT issued by the readers' key, without permissions
// of its own, tagged with each namespace and group once; and that names
// that are not namespaces or groups are refused, naming them, before
// anything else.
func TestMintReaderTagsTheUserWithItsNamespaces(t *testing.T) {
	t.Parallel()
	signer, spub, apub := signingKey(t)
	creds, err := natsauth.MintReader(natsauth.ReaderOptions{
		SigningKey: signer, Account: apub,
		Namespaces: []string{"shop", "payments", "shop"}, Groups: []string{"shop-billing"},
	})
	if err != nil {
		t.Fatal(err)
	}
	uc := userClaims(t, creds)
	switch {
	case uc.Issuer != spub || uc.IssuerAccount != apub:
		t.Errorf("issuer %s for account %s, want %s for %s", uc.Issuer, uc.IssuerAccount, spub, apub)
	case !uc.HasEmptyPermissions():
		t.Errorf("the user has permissions of its own: %+v", uc.Permissions)
	case uc.Name != "reader:shop,payments":
		t.Errorf("name %q", uc.Name)
	}
	if diff := cmp.Diff([]string{"namespace:shop", "namespace:payments", "group:shop-billing"}, []string(uc.Tags)); diff != "" {
		t.Errorf("tags (-want +got):\n%s", diff)
	}
	if inbox, err := natsauth.ReaderInboxPrefix(creds); err != nil || inbox != "_INBOX_"+uc.Subject {
		t.Errorf("ReaderInboxPrefix = %q, %v; want _INBOX_%s", inbox, err, uc.Subject)
	}

	for _, tt := range []struct {
		name string
		opts natsauth.ReaderOptions
		want string
	}{
		{"no namespace", natsauth.ReaderOptions{SigningKey: signer, Account: apub}, "no namespace"},
		{"a namespace with a wildcard", natsauth.ReaderOptions{Namespaces: []string{"shop", "*"}}, `"*"`},
		{"a namespace with a dot", natsauth.ReaderOptions{Namespaces: []string{"shop.payments"}}, `"shop.payments"`},
		{"a namespace in upper case", natsauth.ReaderOptions{Namespaces: []string{"Shop"}}, `"Shop"`},
		{"a group with a dot", natsauth.ReaderOptions{SigningKey: signer, Account: apub, Namespaces: []string{"shop"}, Groups: []string{"a.b"}}, `"a.b"`},
		{"a user key as signer", natsauth.ReaderOptions{SigningKey: mustUser(t), Account: apub, Namespaces: []string{"shop"}}, "not an account signing key"},
	} {
		_, err := natsauth.MintReader(tt.opts)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("MintReader with %s = %v, want an error with %s", tt.name, err, tt.want)
		}
		if strings.Contains(tt.name, "namespace") && tt.name != "no namespace" && !errors.Is(err, consumer.ErrInvalidNamespace) {
			t.Errorf("MintReader with %s = %v, want consumer.ErrInvalidNamespace", tt.name, err)
		}
	}
}

func mustUser(t *testing.T) nkeys.KeyPair {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// TestReaderPermissionsWriteTheTemplateOut: the permissions of a static
// reader are the template's, with its namespaces, groups and inbox in the
// stand-ins' places.
func TestReaderPermissionsWriteTheTemplateOut(t *testing.T) {
	t.Parallel()
	tmpl := natsauth.ReaderTemplate(natsauth.Names{})
	got, err := natsauth.ReaderPermissions(natsauth.Names{}, []string{"shop"}, []string{"shop-billing"}, "_INBOX_reader-shop")
	if err != nil {
		t.Fatal(err)
	}
	expand := func(list []string) []string {
		var out []string
		for _, s := range list {
			s = strings.ReplaceAll(s, "{{tag(namespace)}}", "shop")
			s = strings.ReplaceAll(s, "{{tag(group)}}", "shop-billing")
			out = append(out, strings.ReplaceAll(s, "_INBOX_{{subject()}}", "_INBOX_reader-shop"))
		}
		return out
	}
	if diff := cmp.Diff(expand(tmpl.Pub.Allow), []string(got.Pub.Allow)); diff != "" {
		t.Errorf("publish (-template +ReaderPermissions):\n%s", diff)
	}
	if diff := cmp.Diff(expand(tmpl.Sub.Allow), []string(got.Sub.Allow)); diff != "" {
		t.Errorf("subscribe (-template +ReaderPermissions):\n%s", diff)
	}
	for _, inbox := range []string{"", "_INBOX.>", "_INBOX.*", "a b"} {
		if _, err := natsauth.ReaderPermissions(natsauth.Names{}, []string{"shop"}, nil, inbox); err == nil {
			t.Errorf("ReaderPermissions with inbox %q: no error", inbox)
		}
	}
}

// A reader of shop reads shop's events in the archive of
// PLEG_ARCHIVE_MAX_AGE too, where a pod's history lives once the event
// stream has dropped it, and is refused payments' there as in the stream.
func TestReaderReadsItsNamespacesInTheArchive(t *testing.T) {
	t.Parallel()
	srv := natsauthtest.Start(t, natsauth.Names{})
	ctx := t.Context()
	admin := connect(t, srv.URL, srv.AdminCreds)
	if _, err := publish.EnsureStream(ctx, admin.js, publish.StreamOptions{SubjectPrefix: "pleg"}); err != nil {
		t.Fatal(err)
	}
	archive, err := publish.EnsureArchive(ctx, admin.js, publish.ArchiveOptions{SubjectPrefix: "pleg"})
	if err != nil {
		t.Fatal(err)
	}
	shop := newCluster(t, admin, "node-1").publishWebAndPay()
	// The archive has copied them all: its last message is the fourth...
	// read as an administrator, with a deadline.
	cons, err := archive.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second)); err != nil {
			t.Fatalf("the archive has not copied the events: %v", err)
		}
	}

	creds, inbox := srv.MintReader(t, []string{"shop"}, nil)
	r := connectReader(t, srv.URL, creds, inbox)
	replay := func(f consumer.Filter) ([]consumer.Event, error, error) {
		var got []consumer.Event
		err, refusal := r.call(t, func(ctx context.Context) error {
			return consumer.Replay(ctx, r.js, consumer.Options{Archive: true, Legacy: consumer.LegacyNever, Filter: f}, func(e consumer.Event) error {
				got = append(got, e)
				return nil
			})
		})
		return got, err, refusal
	}
	got, err, refusal := replay(consumer.Filter{Namespace: "shop", PodUID: "u-web"})
	if err != nil || refusal != nil {
		t.Fatalf("Replay of the archive: %v (refused %v)", err, refusal)
	}
	if diff := cmp.Diff(shop, ids(got)); diff != "" {
		t.Errorf("Replay of shop's web-0 in the archive (-want +got):\n%s", diff)
	}
	got, err, refusal = replay(consumer.Filter{Namespace: "payments"})
	wantRefused(t, "Replay of payments in the archive", err, refusal, "$JS.API.CONSUMER.CREATE.PLEG_ARCHIVE.", ".pleg.*.payments.>")
	if len(got) > 0 {
		t.Errorf("Replay of payments in the archive delivered %d events", len(got))
	}
}
