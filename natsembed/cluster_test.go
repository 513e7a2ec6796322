package natsembed_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/natsembed"
)

// clusterWait bounds each wait on the cluster; elections take well under a
// second on loopback, so reaching it means a bug.
const clusterWait = 30 * time.Second

func TestClusterSurvivesTheLossAndReturnOfItsStreamLeader(t *testing.T) {
	t.Parallel()
	c, err := natsembed.StartCluster(natsembed.ClusterOptions{DataDir: t.TempDir()})
	if err != nil {
		t.Fatalf("StartCluster: %v", err)
	}
	t.Cleanup(c.Shutdown)
	if got := len(c.URLs()); got != 3 {
		t.Fatalf("URLs() has %d entries, want 3", got)
	}
	if c.MetaLeader() < 0 {
		t.Fatal("no meta leader after StartCluster returned")
	}

	nc, err := nats.Connect(strings.Join(c.URLs(), ","), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), clusterWait)
	defer cancel()
	// A stream on every server can be created at once: StartCluster waited
	// until the meta leader saw all three.
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
	if err != nil {
		t.Fatalf("create an R3 stream: %v", err)
	}
	if _, err := js.Publish(ctx, "s.1", []byte("before")); err != nil {
		t.Fatalf("publish: %v", err)
	}

	leader := c.StreamLeader("$G", "S")
	if leader < 0 {
		t.Fatal("StreamLeader = -1 with the stream just used")
	}
	c.Stop(leader)
	if c.Server(leader).Running() {
		t.Fatalf("server %d runs after Stop", leader)
	}
	if got := len(c.URLs()); got != 2 {
		t.Errorf("URLs() has %d entries with one server stopped, want 2", got)
	}
	// The remaining two elect a new leader; the publish is retried until
	// then, with the same message id, as a publisher would.
	publishUntilAcked(ctx, t, js, "s.2", "during")
	if now := c.StreamLeader("$G", "S"); now < 0 || now == leader {
		t.Errorf("StreamLeader = %d after the publish, want another running server than %d", now, leader)
	}

	if err := c.Restart(leader); err != nil {
		t.Fatalf("Restart(%d): %v", leader, err)
	}
	if err := c.Restart(leader); err == nil {
		t.Error("Restart of a running server succeeded")
	}
	if got := len(c.URLs()); got != 3 {
		t.Errorf("URLs() has %d entries after the restart, want 3", got)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Errorf("stream holds %d messages, want 2", info.State.Msgs)
	}
}

// publishUntilAcked publishes data on subject until an attempt is acked,
// each attempt waiting a second at most: an attempt sent while the client
// reconnects, or while the stream has no leader, gets no answer at all.
func publishUntilAcked(ctx context.Context, t *testing.T, js jetstream.JetStream, subject, data string) {
	t.Helper()
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := js.Publish(actx, subject, []byte(data), jetstream.WithMsgID(subject))
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("publish on %s: no ack within %s: %v", subject, clusterWait, err)
		}
	}
}

func TestStartClusterNamesWhatFailed(t *testing.T) {
	t.Parallel()
	_, err := natsembed.StartCluster(natsembed.ClusterOptions{})
	if err == nil || !strings.Contains(err.Error(), "data dir is empty") {
		t.Errorf("StartCluster without a data dir: error = %v, want one about the data dir", err)
	}
	_, err = natsembed.StartCluster(natsembed.ClusterOptions{DataDir: t.TempDir(), Servers: -1})
	if err == nil || !strings.Contains(err.Error(), "servers -1") {
		t.Errorf("StartCluster with -1 servers: error = %v, want one naming the count", err)
	}
}
