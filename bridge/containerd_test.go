package bridge_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/crisim/crisimtest"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// TestContainerdEventsFromTheirOwnEndpoint runs the bridge on containerd
// 1.7 in auto mode with PLEG_CONTAINERD_ENDPOINT apart from the CRI socket
// (the same runtime served twice): it subscribes there and only there,
// never opens the CRI stream, and a pod's life reaches JetStream with a
// safety-net relist too slow to have found it.
func TestContainerdEventsFromTheirOwnEndpoint(t *testing.T) {
	t.Parallel()
	model := crisim.NewRuntime(crisim.Containerd17Options())
	criSrv, criEndpoint := crisimtest.Serve(t, model)
	ctrdSrv, ctrdEndpoint := crisimtest.Serve(t, model)
	_, url := publishtest.NewServer(t)
	_, js := publishtest.Connect(t, url)

	opts := testOptions(criEndpoint, url, t.TempDir())
	opts.Mode = generator.ModeAuto
	opts.EventedRelistPeriod = time.Hour
	opts.ContainerdEndpoint = ctrdEndpoint
	b, _ := runBridge(t, opts)
	publishtest.WaitStream(t, js, "PLEG")
	waittest.Until(t, 30*time.Second, "the bridge to subscribe to containerd's events", func() (bool, error) {
		st, subs := b.Status(), model.Stats().TaskSubscribers
		return st.Mode == generator.ModeEvented && subs != 0, fmt.Errorf("status %+v, %d subscribers", st, subs)
	})

	sb, err := model.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.CreateContainer(sb, crisim.ContainerConfig{Name: "app"})
	if err != nil {
		t.Fatal(err)
	}
	// Each step once the previous one is published: a container removed
	// before any listing showed it could not be reported (the events carry
	// no state).
	cons, err := js.OrderedConsumer(t.Context(), "PLEG", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	next := func() {
		t.Helper()
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		e, err := consumer.DecodeMsg(msg)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.LifecycleType()+" "+e.Subject)
	}
	next() // the sandbox
	for _, step := range []func() error{
		func() error { return model.StartContainer(c) },
		func() error { return model.StopContainer(c, 2, "Error", "") },
		func() error { return model.RemoveContainer(c) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
		next()
	}
	checkLines(t, got, []string{
		"ContainerStarted shop/web-0",
		"ContainerStarted shop/web-0/app",
		"ContainerDied shop/web-0/app",
		"ContainerRemoved shop/web-0/app",
	})
	const subscribe = "/containerd.services.events.v1.Events/Subscribe"
	if n := ctrdSrv.Calls()[subscribe]; n == 0 {
		t.Errorf("no Subscribe on the containerd endpoint")
	}
	if n := criSrv.Calls()[subscribe]; n != 0 {
		t.Errorf("%d Subscribe calls on the CRI endpoint, want none", n)
	}
	for _, srv := range []*crisim.Server{criSrv, ctrdSrv} {
		if n := srv.Calls()["/runtime.v1.RuntimeService/GetContainerEvents"]; n != 0 {
			t.Errorf("GetContainerEvents called %d times on containerd 1.7", n)
		}
	}
}
