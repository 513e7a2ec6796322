package bridge_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/natsembed"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

// waitState follows node-1's containers in the state bucket, as `ps
// --watch` does, until they are want ("<pod>/<container>" or "<pod>
// (sandbox)" to "<lifecycle type>[ exit=<code>]"), or fails the test after
// 30s.
func waitState(t *testing.T, js jetstream.JetStream, want map[string]string) {
	t.Helper()
	publishtest.WaitStream(t, js, "KV_PLEG_STATE")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	state := map[string]consumer.ContainerState{}
	summary := func() map[string]string {
		out := map[string]string{}
		for _, c := range state {
			d := c.Event.Data
			name := d.Pod.Name + "/" + d.Container.Name
			if d.Container.Sandbox {
				name = d.Pod.Name + " (sandbox)"
			}
			v := c.Event.LifecycleType()
			if d.ExitCode != nil {
				v += fmt.Sprintf(" exit=%d", *d.ExitCode)
			}
			out[name] = v
		}
		return out
	}
	synced, done := false, false
	err := consumer.WatchState(ctx, js, consumer.StateOptions{Filter: consumer.StateFilter{Node: "node-1"}},
		func(ch consumer.StateChange) error {
			switch ch.Op {
			case consumer.StateSynced:
				synced = true
			case consumer.StateRemoved:
				delete(state, ch.Container.Key)
			default:
				state[ch.Container.Key] = ch.Container
			}
			if synced && cmp.Equal(summary(), want) {
				for _, c := range state {
					b, err := c.Event.CloudEventJSON()
					if err != nil {
						t.Fatal(err)
					}
					schemastest.ValidateCloudEvent(t, b)
				}
				done = true
				cancel()
			}
			return nil
		})
	if err != nil {
		t.Fatalf("watch the state: %v", err)
	}
	if !done {
		t.Fatalf("state did not become what the runtime holds (-want +got):\n%s", cmp.Diff(want, summary()))
	}
}

// TestStateBucketHoldsTheNodesContainersAfterChurn runs the production
// wiring against the simulated runtime: after containers crash, are
// removed and start, the bucket holds each live container's latest event
// and nothing of the removed one.
func TestStateBucketHoldsTheNodesContainersAfterChurn(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	sb, ids := n.startPod(t, "app", "crash", "gone")
	opts := testOptions(n.endpoint, n.url, t.TempDir())
	opts.StateBucket = "PLEG_STATE"
	runBridge(t, opts)
	waitState(t, n.js, map[string]string{
		"web-0 (sandbox)": "ContainerStarted",
		"web-0/app":       "ContainerStarted",
		"web-0/crash":     "ContainerStarted",
		"web-0/gone":      "ContainerStarted",
	})

	if err := n.model.StopContainer(ids[1], 137, "OOMKilled", ""); err != nil {
		t.Fatal(err)
	}
	if err := n.model.StopContainer(ids[2], 0, "Completed", ""); err != nil {
		t.Fatal(err)
	}
	if err := n.model.RemoveContainer(ids[2]); err != nil {
		t.Fatal(err)
	}
	n.startContainer(t, sb, "fresh")
	waitState(t, n.js, map[string]string{
		"web-0 (sandbox)": "ContainerStarted",
		"web-0/app":       "ContainerStarted",
		"web-0/crash":     "ContainerDied exit=137",
		"web-0/fresh":     "ContainerStarted",
	})
}

// TestStateBucketForgetsWhatWentAwayWhileNoBridgeRan: a bridge without a
// checkpoint cannot report a container removed while it was down, but
// once its first relist is acked it reconciles the node's keys, and the
// removed container's key goes.
func TestStateBucketForgetsWhatWentAwayWhileNoBridgeRan(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	_, ids := n.startPod(t, "app", "gone")
	opts := testOptions(n.endpoint, n.url, "")
	opts.StateBucket = "PLEG_STATE"
	_, stop := runBridge(t, opts)
	waitState(t, n.js, map[string]string{
		"web-0 (sandbox)": "ContainerStarted",
		"web-0/app":       "ContainerStarted",
		"web-0/gone":      "ContainerStarted",
	})
	stop()

	if err := n.model.RemoveContainer(ids[1]); err != nil {
		t.Fatal(err)
	}
	runBridge(t, opts)
	waitState(t, n.js, map[string]string{
		"web-0 (sandbox)": "ContainerStarted",
		"web-0/app":       "ContainerStarted",
	})
}

// TestStateBucketConvergesAfterANATSOutage stops NATS while a container
// crashes and another is removed: the events wait for the stream, the
// state waits for the events' acks, and once the server is back the bucket
// holds what the runtime holds.
func TestStateBucketConvergesAfterANATSOutage(t *testing.T) {
	t.Parallel()
	n := &testNode{model: crisim.NewRuntime(crisim.Options{})}
	_, n.endpoint = crisimtest.Serve(t, n.model)
	natsDir := t.TempDir()
	s, url := publishtest.StartServer(t, natsembed.Options{DataDir: natsDir, Port: -1})
	port := s.Addr().(*net.TCPAddr).Port
	n.url = url
	_, n.js = publishtest.Connect(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	sb, ids := n.startPod(t, "app", "crash", "gone")
	opts := testOptions(n.endpoint, n.url, t.TempDir())
	opts.StateBucket = "PLEG_STATE"
	// fresh is sent to the publisher while NATS is down: the changes
	// happen during the outage, not after it.
	freshSent := make(chan struct{})
	opts.Hooks.WrapSink = func(sink generator.Sink) generator.Sink {
		return notifySink{Sink: sink, name: "fresh", sent: freshSent}
	}
	runBridge(t, opts)
	waitState(t, n.js, map[string]string{
		"web-0 (sandbox)": "ContainerStarted",
		"web-0/app":       "ContainerStarted",
		"web-0/crash":     "ContainerStarted",
		"web-0/gone":      "ContainerStarted",
	})

	s.Shutdown()
	s.WaitForShutdown()
	if err := n.model.StopContainer(ids[1], 1, "Error", ""); err != nil {
		t.Fatal(err)
	}
	if err := n.model.RemoveContainer(ids[2]); err != nil {
		t.Fatal(err)
	}
	n.startContainer(t, sb, "fresh")
	select {
	case <-freshSent:
	case <-time.After(30 * time.Second):
		t.Fatal("the bridge did not see the changes while NATS was down")
	}
	publishtest.StartServer(t, natsembed.Options{DataDir: natsDir, Port: port})
	waitState(t, n.js, map[string]string{
		"web-0 (sandbox)": "ContainerStarted",
		"web-0/app":       "ContainerStarted",
		"web-0/crash":     "ContainerDied exit=1",
		"web-0/fresh":     "ContainerStarted",
	})
}

// notifySink closes sent once it is sent an event of the container name.
type notifySink struct {
	generator.Sink
	name string
	sent chan struct{}
}

func (s notifySink) Send(ctx context.Context, events []generator.Event) error {
	for _, ev := range events {
		if ev.Container.Name == s.name {
			select {
			case <-s.sent:
			default:
				close(s.sent)
			}
		}
	}
	return s.Sink.Send(ctx, events)
}
