// Package publishtest provides an in-process NATS server with JetStream and a
// client connection to it, for tests of publish and its callers.
package publishtest

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
)

// NewServer starts an in-process NATS server with JetStream on a random
// loopback port, its store in t.TempDir(), and returns it with its client
// URL. The server is shut down by t.Cleanup. It fails the test if the server
// does not start.
func NewServer(t testing.TB) (*server.Server, string) {
	t.Helper()
	return StartServer(t, natsembed.Options{DataDir: t.TempDir(), Port: -1})
}

// StartServer starts an in-process NATS server with JetStream from opts and
// registers its shutdown with t.Cleanup. A test that restarts a server passes
// the same DataDir and a fixed Port both times.
func StartServer(t testing.TB, opts natsembed.Options) (*server.Server, string) {
	t.Helper()
	s, err := natsembed.Start(opts)
	if err != nil {
		t.Fatalf("start nats server: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s, s.ClientURL()
}

// RunServer runs a NATS server with opts, quiet and without signal
// handlers, until the test ends: for servers natsembed.Options cannot
// describe (a config file, an authorization token). It fails the test if the
// server does not start.
func RunServer(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("start nats server: %v", err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready for connections after 10s")
	}
	return s
}

// NewAuthServer runs a NATS server with JetStream on a random loopback
// port, its store in t.TempDir(), until the test ends (RunServer), with
// what else opts says: the users, token, nkeys or TLS it requires. It sets
// opts' Host, Port, JetStream and StoreDir.
func NewAuthServer(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	return RunServer(t, opts)
}

// RestartableServer is an in-process NATS server with JetStream that a
// test stops and starts again on the same port and store: for what must
// hold across an outage.
type RestartableServer struct {
	// URL is the server's client URL, the same after every start.
	URL  string
	dir  string
	port int
}

// NewRestartableServer starts a RestartableServer, its store in
// t.TempDir(), on a random loopback port, and returns it with the function
// that shuts it down and waits until it is down. t.Cleanup shuts down
// every start of it that is still running. It fails the test if the
// server does not start.
func NewRestartableServer(t testing.TB) (*RestartableServer, func()) {
	t.Helper()
	dir := t.TempDir()
	s, url := StartServer(t, natsembed.Options{DataDir: dir, Port: -1})
	rs := &RestartableServer{URL: url, dir: dir, port: s.Addr().(*net.TCPAddr).Port}
	return rs, stopper(s)
}

// Start starts the server again, on its port and store, and returns the
// function that stops it.
func (rs *RestartableServer) Start(t testing.TB) (stop func()) {
	t.Helper()
	s, _ := StartServer(t, natsembed.Options{DataDir: rs.dir, Port: rs.port})
	return stopper(s)
}

// stopper returns the function that shuts s down and waits until it is
// down.
func stopper(s *server.Server) func() {
	return func() {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// NewCluster starts a JetStream cluster of n in-process servers on loopback
// (natsembed.StartCluster), their stores in t.TempDir(), and returns it once
// a meta leader sees every server. The cluster is shut down by t.Cleanup. It
// fails the test if the cluster does not start.
func NewCluster(t testing.TB, n int) *natsembed.Cluster {
	t.Helper()
	c, err := natsembed.StartCluster(natsembed.ClusterOptions{Servers: n, DataDir: t.TempDir()})
	if err != nil {
		t.Fatalf("start nats cluster: %v", err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

// Connect connects to url with opts and returns the connection and a
// JetStream handle on it. The connection is closed by t.Cleanup. It fails
// the test if the connection fails.
func Connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect to nats at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("create jetstream handle: %v", err)
	}
	return nc, js
}

// WaitStream returns once stream exists and can be used, or fails the test
// after 30 s. It waits on JetStream's API audit advisory of the create call,
// which the server sends after answering it; the stream-created advisory
// comes before the stream is registered, too early to use the stream.
func WaitStream(t testing.TB, js jetstream.JetStream, stream string) {
	t.Helper()
	audits, err := js.Conn().SubscribeSync("$JS.EVENT.ADVISORY.API")
	if err != nil {
		t.Fatal(err)
	}
	defer audits.Unsubscribe()
	if _, err := js.Stream(context.Background(), stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		msg, err := audits.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("stream %s was not created within 30s: %v", stream, err)
		}
		var audit struct {
			Subject  string `json:"subject"`
			Response string `json:"response"`
		}
		if json.Unmarshal(msg.Data, &audit) == nil && audit.Subject == "$JS.API.STREAM.CREATE."+stream &&
			!strings.Contains(audit.Response, `"error"`) {
			return
		}
	}
}

// ReadStream returns the first n messages of stream, read in order from
// its start by an ordered consumer, or fails the test if they do not all
// arrive within 20 s.
func ReadStream(t testing.TB, js jetstream.JetStream, stream string, n int) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("consumer on %s: %v", stream, err)
	}
	var msgs []jetstream.Msg
	for len(msgs) < n {
		batch, err := cons.Fetch(n-len(msgs), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatalf("fetch from %s: %v", stream, err)
		}
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if ctx.Err() != nil {
			t.Fatalf("%s holds %d messages, want %d", stream, len(msgs), n)
		}
	}
	return msgs
}

// WaitOutDuplicateWindow returns once the stream has forgotten every
// message id stored before the call, or fails the test after 30 s. It
// stores a probe id of its own (another at each call, so that calls in
// quick succession do not find each other's) on <prefix>.probe, a subject
// no node's events use (the stream's first subject is <prefix>.>), and
// publishes it again until the stream stores it a second time: JetStream forgets ids in the order it stored them, so every earlier
// one is forgotten by then. Both probes are deleted again, so that the
// stream holds what the test published. No clock is read: the server's
// own expiry decides.
func WaitOutDuplicateWindow(t testing.TB, js jetstream.JetStream, stream string) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("look up stream %s: %v", stream, err)
	}
	subjects := s.CachedInfo().Config.Subjects
	if len(subjects) == 0 || !strings.HasSuffix(subjects[0], ".>") {
		t.Fatalf("stream %s has subjects %q, want <prefix>.> first", stream, subjects)
	}
	subject := strings.TrimSuffix(subjects[0], ">") + "probe"
	id := "probe-" + nats.NewInbox()
	probe := func() *jetstream.PubAck {
		msg := &nats.Msg{Subject: subject, Header: nats.Header{jetstream.MsgIDHeader: {id}}}
		ack, err := js.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatalf("publish probe: %v", err)
		}
		return ack
	}
	first := probe()
	if first.Duplicate {
		t.Fatalf("the first probe %s is a duplicate", id)
	}
	var again *jetstream.PubAck
	waittest.Until(t, 30*time.Second, "the probe id to be forgotten after it was stored", func() (bool, error) {
		again = probe()
		return !again.Duplicate, nil
	})
	for _, seq := range []uint64{first.Sequence, again.Sequence} {
		if err := s.DeleteMsg(ctx, seq); err != nil {
			t.Fatalf("delete probe %d: %v", seq, err)
		}
	}
}
